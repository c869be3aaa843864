//! The dead and failing listings read through a [`Filter`]: the inbox lists by row set and
//! cursor, the page keeps the rows that match, and a page of the page ends with the
//! inbox's own cursor, so paging goes on where the filter stopped.

use super::input::{Filter, Rows};
use crate::inbox::{Cursor, EventSummary, Inbox};
use crate::store::StoreError;

/// Rows read from the inbox per round trip.
const CHUNK: usize = 200;

/// What a scan found.
pub(super) struct Scanned {
    /// The matching rows, in the listing's order.
    pub(super) rows: Vec<EventSummary>,
    /// Where the next page starts, when there may be more.
    pub(super) next: Option<Cursor>,
    /// Whether the scan stopped at its budget with rows left unread (a count is then a
    /// lower bound).
    pub(super) cut: bool,
}

/// Up to `want` rows of `rows` matching `filter`, from `after`, reading at most about
/// `budget` rows of the listing.
pub(super) async fn scan(
    inbox: &Inbox,
    rows: Rows,
    filter: &Filter,
    after: Option<Cursor>,
    want: usize,
    budget: usize,
) -> Result<Scanned, StoreError> {
    let mut base = rows.listing();
    if let Some(name) = &filter.processor {
        // The inbox lists one processor's routes from an index of its own.
        base = base.with_processor(name);
    }
    let (mut found, mut read, mut cursor) = (Vec::new(), 0usize, after);
    loop {
        let mut listing = base.clone().with_limit(CHUNK);
        if let Some(cursor) = cursor.take() {
            listing = listing.after(cursor);
        }
        let page = inbox.list(&listing).await?;
        let n = page.events.len();
        read += n;
        for (i, row) in page.events.into_iter().enumerate() {
            if !filter.matches(&row) {
                continue;
            }
            found.push(row);
            if found.len() == want {
                let more = i + 1 < n || page.next.is_some();
                let next = more.then(|| {
                    let last = found.last().expect("just pushed");
                    Cursor::of(last, listing.rows)
                });
                return Ok(Scanned {
                    rows: found,
                    next,
                    cut: false,
                });
            }
        }
        match page.next {
            None => {
                return Ok(Scanned {
                    rows: found,
                    next: None,
                    cut: false,
                })
            }
            Some(next) if read >= budget => {
                return Ok(Scanned {
                    rows: found,
                    next: Some(next),
                    cut: true,
                })
            }
            Some(next) => cursor = Some(next),
        }
    }
}

//! What an operator reads of the inbox: the dead or failing rows a page at a time
//! ([`Inbox::list`](super::Inbox::list)), and one event whole
//! ([`Inbox::event`](super::Inbox::event)).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

/// Where an inbox row is in its life (the [state diagram](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Waiting for its first or next attempt.
    Queued,
    /// Claimed by a worker now.
    Processing,
    /// Processed.
    Processed,
    /// Gave up after the maximum attempts.
    Dead,
    /// Stored with no route: no processor's filter took it when it was accepted (an
    /// event's state only, never a route's).
    Unrouted,
    /// Stored with no route: its type's JSON Schema refused its body (an event's state
    /// only; terminal: never claimed, never retried, until a requeue finds it valid).
    Invalid,
}

impl State {
    /// Its name in lower case: `queued`, `processing`, `processed`, `dead`, `unrouted`,
    /// `invalid`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Processing => "processing",
            State::Processed => "processed",
            State::Dead => "dead",
            State::Unrouted => "unrouted",
            State::Invalid => "invalid",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which rows a listing reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    /// Dead rows, in the order they went dead (`dead_at`).
    Dead,
    /// Rows not processed nor dead whose last attempt failed (`processing_error` set), in
    /// the order they were received.
    Failing,
}

/// Which rows [`Inbox::list`](super::Inbox::list) reads, in which order, from where, and
/// how many.
///
/// Each processor's route is a row of its own. Both row sets are read through partial
/// indexes of their own (`webhook_routes_dead`, `webhook_routes_failing`, and `_by` ones
/// for [one processor's](Self::with_processor)): a page costs the size of the page, not
/// of the queue or of the history kept.
///
/// ```
/// use tower_webhook::inbox::Listing;
///
/// // The 20 rows that went dead most recently; the next page from `page.next`.
/// let first = Listing::dead().with_limit(20);
/// // The failing rows received first.
/// let oldest = Listing::failing().oldest_first();
/// # let _ = (first, oldest);
/// ```
#[derive(Debug, Clone)]
pub struct Listing {
    pub(crate) rows: Rows,
    pub(crate) oldest_first: bool,
    pub(crate) limit: usize,
    pub(crate) after: Option<Cursor>,
    /// Only this processor's routes.
    pub(crate) processor: Option<String>,
}

impl Listing {
    /// The most rows one page holds.
    pub const MAX_LIMIT: usize = 1000;

    /// How many rows a page holds unless told.
    pub const DEFAULT_LIMIT: usize = 50;

    fn of(rows: Rows) -> Self {
        Self {
            rows,
            oldest_first: false,
            limit: Self::DEFAULT_LIMIT,
            after: None,
            processor: None,
        }
    }

    /// Dead rows, the most recently dead first: events acknowledged to the provider and
    /// never processed, until [requeued](super::Inbox::requeue).
    #[must_use]
    pub fn dead() -> Self {
        Self::of(Rows::Dead)
    }

    /// Failing rows, the most recently received first: queued again (or being retried
    /// now) after at least one failed attempt, with that attempt's error.
    #[must_use]
    pub fn failing() -> Self {
        Self::of(Rows::Failing)
    }

    /// The oldest first instead.
    #[must_use]
    pub fn oldest_first(mut self) -> Self {
        self.oldest_first = true;
        self
    }

    /// At most `limit` rows a page (default [`DEFAULT_LIMIT`](Self::DEFAULT_LIMIT)), cut
    /// to `1..=`[`MAX_LIMIT`](Self::MAX_LIMIT).
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit.clamp(1, Self::MAX_LIMIT);
        self
    }

    /// Only the routes of the processor `name` (by default every processor's, each route
    /// a row).
    #[must_use]
    pub fn with_processor(mut self, name: &str) -> Self {
        self.processor = Some(name.to_owned());
        self
    }

    /// The page after `cursor`: the [`next`](Page::next) of the page before.
    #[must_use]
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }
}

/// A position in a listing: where the page it ends stopped. Opaque; as text (its
/// `Display`, parsed back with `FromStr`) it is URL-safe, for a query string.
///
/// Positions are keys, not offsets: rows requeued, processed or pruned between two pages
/// shift nothing, and a page costs the same however deep it is. A cursor continues the
/// listing it came from (its row set and order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The row's time in the listing's order, in microseconds since the epoch.
    pub(crate) at_us: i64,
    pub(crate) source: String,
    pub(crate) id: String,
    /// The route's processor, which breaks ties between an event's routes (`''` in a
    /// cursor given out before fan-out).
    pub(crate) processor: String,
}

/// The earliest and latest times a cursor may name (years 1 to 9999): any database can
/// compare them.
const CURSOR_RANGE_US: std::ops::RangeInclusive<i64> =
    -62_135_596_800_000_000..=253_402_300_799_999_999;

impl Cursor {
    /// The position of `row` in a listing of `rows`.
    pub(crate) fn of(row: &EventSummary, rows: Rows) -> Self {
        let at = match rows {
            Rows::Dead => row.dead_at.unwrap_or(row.received_at),
            Rows::Failing => row.received_at,
        };
        Self {
            at_us: micros(at),
            source: row.source.clone(),
            id: row.id.clone(),
            processor: row.processor.clone(),
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = (self.at_us, &self.source, &self.id, &self.processor);
        let json = serde_json::to_vec(&key).map_err(|_| fmt::Error)?;
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
    }
}

impl FromStr for Cursor {
    type Err = InvalidCursor;

    fn from_str(s: &str) -> Result<Self, InvalidCursor> {
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| InvalidCursor(()))?;
        // Three parts: a cursor given out before fan-out (no processor).
        let (at_us, source, id, processor) =
            serde_json::from_slice::<(i64, String, String, String)>(&json)
                .or_else(|_| {
                    serde_json::from_slice::<(i64, String, String)>(&json)
                        .map(|(at_us, source, id)| (at_us, source, id, String::new()))
                })
                .map_err(|_| InvalidCursor(()))?;
        // A key no row can have (a NUL, a time past any database's range) is not a
        // position, and would be a database error rather than an empty page.
        let nul = [&source, &id, &processor].iter().any(|s| s.contains('\0'));
        if !CURSOR_RANGE_US.contains(&at_us) || nul {
            return Err(InvalidCursor(()));
        }
        Ok(Self {
            at_us,
            source,
            id,
            processor,
        })
    }
}

/// A cursor that is not one this crate gave out.
#[derive(Debug, Clone)]
pub struct InvalidCursor(());

impl fmt::Display for InvalidCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid cursor")
    }
}

impl std::error::Error for InvalidCursor {}

/// One page of a [`Listing`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Page {
    /// The rows, in the listing's order.
    pub events: Vec<EventSummary>,
    /// Where the next page starts, if there are more rows (list again with
    /// [`Listing::after`]).
    pub next: Option<Cursor>,
}

/// A listed row: everything but the body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventSummary {
    /// Which endpoint or provider.
    pub source: String,
    /// The provider's event id.
    pub id: String,
    /// Whose route it is (the processor's name; an unrouted event's: empty).
    pub processor: String,
    /// The event type, where known.
    pub event_type: Option<String>,
    /// The object the event is about, where known.
    pub object_id: Option<String>,
    /// Where the row is now.
    pub state: State,
    /// Attempts since it was received or last requeued.
    pub attempts: u32,
    /// When it was received (or ingested).
    pub received_at: SystemTime,
    /// When its next attempt is due (for a row being processed, when the running attempt
    /// was: a failure schedules the next); `None` once processed or dead.
    pub next_attempt_at: Option<SystemTime>,
    /// When it went dead.
    pub dead_at: Option<SystemTime>,
    /// The last failed attempt's error (the processor's `Display`), kept until the row is
    /// processed or requeued.
    pub last_error: Option<String>,
}

/// Microseconds since the epoch (negative before it), saturating.
pub(crate) fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

/// The time `us` microseconds from the epoch.
pub(crate) fn from_micros(us: i64) -> SystemTime {
    let d = Duration::from_micros(us.unsigned_abs());
    if us >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// For the dialects' tests: every id `listing` finds, read two to a page by its cursor.
#[cfg(test)]
pub(crate) async fn ids_page_by_page(inbox: &super::Inbox, listing: Listing) -> Vec<String> {
    let (mut ids, mut listing) = (Vec::new(), listing.with_limit(2));
    loop {
        let page = inbox.list(&listing).await.unwrap();
        assert!(page.events.len() <= 2);
        ids.extend(page.events.into_iter().map(|e| e.id));
        let Some(next) = page.next else { break ids };
        listing = listing.after(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_itself() {
        for (at_us, source, id, processor) in [
            (1_700_000_000_123_456, "stripe", "evt_1", "default"),
            (-1, "a/b c", "\"quoted\"\n", "billing"),
            (*CURSOR_RANGE_US.end(), "", "x", ""),
        ] {
            let cursor = Cursor {
                at_us,
                source: source.into(),
                id: id.into(),
                processor: processor.into(),
            };
            let text = cursor.to_string();
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{text}"
            );
            assert_eq!(text.parse::<Cursor>().unwrap(), cursor);
        }
    }

    #[test]
    fn a_cursor_this_crate_did_not_give_is_refused() {
        let encode = |json: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        for bad in [
            String::new(),
            "not base64!".into(),
            encode("{}"),
            encode("[1, \"s\"]"),
            encode("[1.5, \"s\", \"i\"]"),
            encode("[9223372036854775807, \"s\", \"i\"]"),
            encode("[1, \"s\\u0000\", \"i\"]"),
            encode("[1, \"s\", \"i\", \"p\\u0000\"]"),
            encode("[1, \"s\", \"i\", 2]"),
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cursor_given_out_before_fan_out_still_parses_with_no_processor() {
        let old = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("[7, \"s\", \"i\"]");
        let cursor: Cursor = old.parse().unwrap();
        let key = (cursor.at_us, cursor.source.as_str(), cursor.id.as_str());
        assert_eq!((key, cursor.processor.as_str()), ((7, "s", "i"), ""));
    }

    #[test]
    fn times_round_trip_through_microseconds() {
        for us in [0, 1, -1, 1_700_000_000_123_456, -62_135_596_800_000_000] {
            assert_eq!(micros(from_micros(us)), us);
        }
    }

    #[test]
    fn the_limit_is_cut_to_its_bounds() {
        assert_eq!(Listing::dead().limit, Listing::DEFAULT_LIMIT);
        assert_eq!(Listing::dead().with_limit(0).limit, 1);
        assert_eq!(Listing::dead().with_limit(10_000).limit, Listing::MAX_LIMIT);
    }
}

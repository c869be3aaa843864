//! The overview: counts (each processor's too, with fan-out), failing and dead by source,
//! the processing rate, what is paused.

use super::*;

/// How many minutes the overview's chart spans.
const RATE_MINUTES: u32 = 30;

/// The events processed in each of the last [`RATE_MINUTES`], oldest first.
async fn processing_rate(inbox: &Inbox) -> Result<Vec<u64>, StoreError> {
    let minutes = inbox.processed_per_minute(RATE_MINUTES).await?;
    Ok(minutes.into_iter().map(|(_, n)| n).collect())
}

/// Failing and dead rows by source (`source → (failing, dead)`), from the first rows of
/// each listing; and whether a listing had more.
pub(super) async fn by_source(
    inbox: &Inbox,
) -> Result<(BTreeMap<String, (usize, usize)>, bool), StoreError> {
    let everything = Filter::default();
    let mut sources = BTreeMap::<String, (usize, usize)>::new();
    let mut cut = false;
    for rows in [Rows::Failing, Rows::Dead] {
        let scanned = scan(
            inbox,
            rows,
            &everything,
            None,
            BY_SOURCE_ROWS,
            BY_SOURCE_ROWS,
        )
        .await?;
        cut |= scanned.next.is_some();
        for row in scanned.rows {
            let counts = sources.entry(row.source).or_default();
            match rows {
                Rows::Failing => counts.0 += 1,
                Rows::Dead => counts.1 += 1,
            }
        }
    }
    Ok((sources, cut))
}

pub(super) async fn overview(
    State(inbox): State<Inbox>,
    Base(base): Base,
    done: Result<Query<Done>, QueryRejection>,
) -> Result<Response, UiError> {
    let done = query(&base, done)?;
    let by = inbox.counts_by_processor().await.map_err(store(&base))?;
    // The sum over the configured processors, as `Inbox::counts` adds it (one read, not
    // two); an orphaned processor's routes are counted on their own row only.
    let mut counts = by
        .iter()
        .filter(|(name, _)| inbox.has_processor(name))
        .fold(Counts::default(), |sum, (_, c)| sum.plus(*c));
    counts.invalid = inbox.invalid_count().await.map_err(store(&base))?;
    // Each processor's row with more than one counted (one: the page before fan-out).
    let by_processor: Vec<(String, Counts, bool)> = match by.len() {
        0 | 1 => Vec::new(),
        _ => by
            .into_iter()
            .map(|(name, c)| {
                let orphaned = !inbox.has_processor(&name);
                (name, c, orphaned)
            })
            .collect(),
    };
    let pauses = inbox.pauses().await.map_err(store(&base))?;
    let (sources, cut) = by_source(&inbox).await.map_err(store(&base))?;
    let rate = processing_rate(&inbox).await.map_err(store(&base))?;
    let by_source: Vec<_> = sources.into_iter().map(|(s, (f, d))| (s, f, d)).collect();
    let processors = fanned_out(&inbox);
    let overview = Overview {
        counts: &counts,
        by_processor: &by_processor,
        processors: processors.as_deref().unwrap_or_default(),
        by_source: &by_source,
        by_source_cut: cut,
        pauses: &pauses,
        rate: &rate,
    };
    Ok(page(
        StatusCode::OK,
        pages::overview(&base, &overview, done.flash()),
    ))
}

//! What operators read: the inbox's counts, its listings of failing and dead rows, and
//! one event with its body.

use sqlx::postgres::PgPool;

use super::super::shared::{self, listing_statement, listing_statements};
use super::super::{store_error, CountsRow};
use crate::inbox::{Counts, EventSummary, Listing, StoredEvent};
use crate::store::StoreFuture;

/// The queue from its partial index (`webhook_events_due`), the dead rows from theirs,
/// and the processed ones from the log the triggers keep (`webhook_counts`): the answer
/// costs the size of the queue, not of the history kept.
const COUNTS: &str = "
SELECT q.queued, q.processing, l.processed, l.log_rows,
    (SELECT count(*) FROM webhook_events
     WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL) AS dead,
    CASE WHEN EXISTS (SELECT 1 FROM webhook_pauses) THEN (
        SELECT count(*) FROM webhook_events e
        WHERE e.next_attempt_at IS NOT NULL AND e.processed_at IS NULL AND e.dead_at IS NULL
          AND (e.locked_until IS NULL OR e.locked_until <= now())
          AND EXISTS (SELECT 1 FROM webhook_pauses p WHERE p.source IN ('', e.source)
              AND p.event_type IN ('', coalesce(e.event_type, ''))))
    ELSE 0 END AS paused,
    q.oldest_due_ms
FROM (
    SELECT
        count(*) FILTER (WHERE locked_until IS NULL OR locked_until <= now()) AS queued,
        count(*) FILTER (WHERE locked_until > now()) AS processing,
        (extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE
            (locked_until IS NULL OR locked_until <= now()) AND next_attempt_at <= now()))
            * 1000)::int8 AS oldest_due_ms
    FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
) q, (SELECT coalesce(sum(delta), 0)::int8 AS processed, count(*) AS log_rows
      FROM webhook_counts) l";

/// `counts` folds the log into one row once it holds more than this many.
const FOLD_AFTER: i64 = 4096;

/// The log summed into one row, in a file of its own: `TRUNCATE` gives the space back at
/// once, where deleted rows would leave pages every later sum reads through. It needs
/// the table to itself for a moment: a fold that cannot have it within 50 ms gives up
/// (the next one folds), rather than hold the processed rows' writes queued behind it. A
/// role without `TRUNCATE` on the table deletes the rows instead.
pub(super) const FOLD_COUNTS: &str = "
DO $$
DECLARE
    total BIGINT;
    entries BIGINT;
BEGIN
    PERFORM set_config('lock_timeout', '50ms', true);
    LOCK TABLE webhook_counts IN ACCESS EXCLUSIVE MODE;
    SELECT coalesce(sum(delta), 0), count(*) INTO total, entries FROM webhook_counts;
    IF entries > 1 THEN
        BEGIN
            TRUNCATE webhook_counts;
        EXCEPTION WHEN insufficient_privilege THEN
            DELETE FROM webhook_counts;
        END;
        INSERT INTO webhook_counts (delta) VALUES (total);
    END IF;
END $$";

// The listings' position is `$1`, `$2`, `$3` (the time in microseconds, the source and
// id that break ties in time; `NULL` for the first page: before or after every row),
// always bound, so a generic plan starts the scan there too.
listing_statements!(
    columns: "source, event_id, event_type, object_id, attempts::int8 AS attempts,
    (extract(epoch FROM received_at) * 1000000)::int8 AS received_us,
    (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS next_attempt_us,
    (extract(epoch FROM processed_at) * 1000000)::int8 AS processed_us,
    (extract(epoch FROM dead_at) * 1000000)::int8 AS dead_us,
    coalesce(locked_until > now(), false) AS locked, processing_error",
    newest: "(coalesce(to_timestamp($1::int8 / 1000000.0), 'infinity'), coalesce($2::text, ''), coalesce($3::text, ''))",
    oldest: "(coalesce(to_timestamp($1::int8 / 1000000.0), '-infinity'), coalesce($2::text, ''), coalesce($3::text, ''))",
    limit: "$4",
    key: "source = $1 AND event_id = $2"
);

/// [`COUNTS`]' row: the counts, and how long the log has grown.
#[derive(sqlx::FromRow)]
struct CountsWithLog {
    #[sqlx(flatten)]
    counts: CountsRow,
    log_rows: i64,
}

/// The inbox's counts; folds the log of processed rows once it has grown.
pub(super) fn counts(pool: &PgPool) -> StoreFuture<Counts> {
    let pool = pool.clone();
    Box::pin(async move {
        let row = sqlx::query_as::<_, CountsWithLog>(COUNTS)
            .fetch_one(&pool)
            .await
            .map_err(|e| store_error("inbox counts", e))?;
        if row.log_rows > FOLD_AFTER {
            // Housekeeping, not the answer: a fold that fails is done by a later call.
            let _ = sqlx::raw_sql(FOLD_COUNTS).execute(&pool).await;
        }
        Ok(Counts::from(row.counts))
    })
}

/// A page of failing or dead rows (one more than asked: whether a next page exists).
pub(super) fn list(pool: &PgPool, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
    let query = sqlx::query_as(listing_statement(listing, LISTINGS));
    shared::list(pool, query, listing, |us| us)
}

/// An event's newest `$3` attempt records, oldest first: `webhook_attempts`' rows, and
/// the processed attempt the row itself records (its start and `processed_at`).
const ATTEMPTS: &str = "
SELECT attempt::int8 AS attempt,
    (extract(epoch FROM started_at) * 1000000)::int8 AS started_us,
    (extract(epoch FROM finished_at) * 1000000)::int8 AS finished_us, outcome, error
FROM (
    SELECT * FROM (
        SELECT attempt, started_at, finished_at, outcome, error FROM webhook_attempts
        WHERE source = $1 AND event_id = $2
        UNION ALL
        SELECT attempts, attempt_started_at, greatest(processed_at, attempt_started_at),
            'processed', NULL
        FROM webhook_events
        WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL
          AND processed_at IS NOT NULL AND attempt_started_at IS NOT NULL
    ) every
    ORDER BY started_at DESC, finished_at DESC LIMIT $3
) newest
ORDER BY started_at, finished_at";

/// How many inbox rows were processed in each of the last `$1` minutes that had any, by
/// the minute's start in milliseconds, and the current minute's start: a range of the
/// processed rows' index (`webhook_events_processed_at`), the minutes asked for and no
/// more.
const PROCESSED_PER_MINUTE: &str = "
SELECT (extract(epoch FROM date_trunc('minute', now())) * 1000)::int8 AS current_ms,
    coalesce(array_agg(minute_ms), '{}') AS minutes, coalesce(array_agg(n), '{}') AS counts
FROM (
    SELECT (extract(epoch FROM date_trunc('minute', processed_at)) * 1000)::int8 AS minute_ms,
        count(*)::int8 AS n
    FROM webhook_events
    WHERE processed_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
      AND next_attempt_at IS NOT NULL
    GROUP BY 1
) m";

/// One row of the inbox, its body, headers and attempts included.
pub(super) fn event(pool: &PgPool, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
    let attempts = sqlx::query_as(ATTEMPTS);
    shared::event(pool, sqlx::query_as(EVENT), attempts, source, id)
}

/// The current minute's start and the counts of the last `minutes` minutes that had any.
pub(super) fn processed_per_minute(
    pool: &PgPool,
    minutes: u32,
) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
    let pool = pool.clone();
    let minutes = i32::try_from(minutes).unwrap_or(i32::MAX);
    Box::pin(async move {
        let (current, starts, counts) =
            sqlx::query_as::<_, (i64, Vec<i64>, Vec<i64>)>(PROCESSED_PER_MINUTE)
                .bind(minutes)
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox processed per minute", e))?;
        Ok((current, starts.into_iter().zip(counts).collect()))
    })
}

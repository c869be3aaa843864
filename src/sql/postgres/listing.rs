//! What operators read: the inbox's counts, its listings of failing and dead routes, and
//! one event with its body.

/// PostgreSQL's listing statements on `webhook_routes` (the shape of
/// `shared::listing_statements!`, whose tables are SQLite's too): `LISTINGS`, eight in
/// `listing_statement`'s order, each a range of its partial index read in the index's
/// order from a position: every processor's routes on `webhook_routes_dead` and
/// `webhook_routes_failing` (the time, the key, then the processor: `$5` the position's),
/// then one processor's (`$5`) on `webhook_routes_dead_by` and `webhook_routes_failing_by`;
/// and `ROUTES`, one event's routes by its key.
macro_rules! listings {
    (columns: $columns:literal, newest: $newest:literal, oldest: $oldest:literal) => {
        /// The listings: dead newest and oldest first, failing newest and oldest first, of
        /// every processor, then of one.
        pub(super) const LISTINGS: [&str; 8] = [
            listings!(@all $columns, DEAD, "dead_at", "<", $newest, " DESC"),
            listings!(@all $columns, DEAD, "dead_at", ">", $oldest, ""),
            listings!(@all $columns, FAILING, "received_at", "<", $newest, " DESC"),
            listings!(@all $columns, FAILING, "received_at", ">", $oldest, ""),
            listings!(@by $columns, DEAD, "dead_at", "<", $newest, " DESC"),
            listings!(@by $columns, DEAD, "dead_at", ">", $oldest, ""),
            listings!(@by $columns, FAILING, "received_at", "<", $newest, " DESC"),
            listings!(@by $columns, FAILING, "received_at", ">", $oldest, ""),
        ];

        /// One event's routes by its key (`$1`, `$2`), by processor name (tombstones
        /// left out).
        const ROUTES: &str = concat!(
            "SELECT ",
            $columns,
            "
FROM webhook_routes
WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL
ORDER BY processor"
        );
    };
    (@rows DEAD) => { "dead_at IS NOT NULL AND next_attempt_at IS NOT NULL" };
    (@rows FAILING) => {
        "next_attempt_at IS NOT NULL AND processed_at IS NULL
  AND dead_at IS NULL AND processing_error IS NOT NULL"
    };
    (@all $columns:literal, $rows:ident, $time:literal, $cmp:literal, $position:literal,
        $desc:literal) => {
        concat!(
            "SELECT ", $columns, "
FROM webhook_routes
WHERE ", listings!(@rows $rows), "
  AND (", $time, ", source, event_id, processor) ", $cmp, "
      (", $position, ", coalesce($5::text, ''))
ORDER BY ", $time, $desc, ", source", $desc, ", event_id", $desc, ", processor", $desc, "
LIMIT $4"
        )
    };
    (@by $columns:literal, $rows:ident, $time:literal, $cmp:literal, $position:literal,
        $desc:literal) => {
        concat!(
            "SELECT ", $columns, "
FROM webhook_routes
WHERE processor = $5::text AND ", listings!(@rows $rows), "
  AND (", $time, ", source, event_id) ", $cmp, "
      (", $position, ")
ORDER BY ", $time, $desc, ", source", $desc, ", event_id", $desc, "
LIMIT $4"
        )
    };
}

use std::sync::Arc;

use sqlx::postgres::PgPool;

use super::super::sealed::Ring;
use super::super::shared::{self, listing_statement};
use super::super::stored::{self, EventStatements};
use super::super::{store_error, CountsRow};
use crate::inbox::{Counts, EventSummary, Listing, StoredEvent};
use crate::store::StoreFuture;

/// The processors `$1`'s routes, summed: the queue from its partial index
/// (`webhook_routes_due`), the dead routes from theirs, and the processed ones from the
/// log the triggers keep (`webhook_counts`): the answer costs the size of the queue, not
/// of the history kept.
const COUNTS: &str = "
SELECT q.queued, q.processing, l.processed, l.log_rows,
    (SELECT count(*) FROM webhook_routes
     WHERE processor = ANY($1) AND dead_at IS NOT NULL AND next_attempt_at IS NOT NULL) AS dead,
    CASE WHEN EXISTS (SELECT 1 FROM webhook_pauses) THEN (
        SELECT count(*) FROM webhook_routes e
        WHERE e.processor = ANY($1)
          AND e.next_attempt_at IS NOT NULL AND e.processed_at IS NULL AND e.dead_at IS NULL
          AND (e.locked_until IS NULL OR e.locked_until <= now())
          AND EXISTS (SELECT 1 FROM webhook_pauses p
              WHERE p.processor IN ('', e.processor) AND p.source IN ('', e.source)
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
    FROM webhook_routes
    WHERE processor = ANY($1)
      AND next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
) q, (SELECT coalesce(sum(delta) FILTER (WHERE processor = ANY($1)), 0)::int8 AS processed,
          count(*) AS log_rows
      FROM webhook_counts) l";

/// `counts` folds the log into one row once it holds more than this many.
const FOLD_AFTER: i64 = 4096;

/// The log summed into one row a processor, in a file of its own: `TRUNCATE` gives the space back at
/// once, where deleted rows would leave pages every later sum reads through. It needs
/// the table to itself for a moment: a fold that cannot have it within 50 ms gives up
/// (the next one folds), rather than hold the processed rows' writes queued behind it. A
/// role without `TRUNCATE` on the table deletes the rows instead.
pub(super) const FOLD_COUNTS: &str = "
DO $$
DECLARE
    processors TEXT[];
    totals BIGINT[];
    entries BIGINT;
BEGIN
    PERFORM set_config('lock_timeout', '50ms', true);
    LOCK TABLE webhook_counts IN ACCESS EXCLUSIVE MODE;
    SELECT coalesce(array_agg(processor), '{}'), coalesce(array_agg(total), '{}'), sum(n)
    INTO processors, totals, entries
    FROM (SELECT processor, coalesce(sum(delta), 0)::int8 AS total, count(*) AS n
          FROM webhook_counts GROUP BY processor) every;
    IF entries > cardinality(processors) THEN
        BEGIN
            TRUNCATE webhook_counts;
        EXCEPTION WHEN insufficient_privilege THEN
            DELETE FROM webhook_counts;
        END;
        INSERT INTO webhook_counts (processor, delta) SELECT * FROM unnest(processors, totals);
    END IF;
END $$";

// The listings' position is `$1`, `$2`, `$3` (the time in microseconds, the source and
// id that break ties in time; `NULL` for the first page: before or after every row),
// always bound, so a generic plan starts the scan there too; `$4` the limit, `$5` the
// processor (the position's, or the one listed).
listings!(
    columns: "source, event_id, processor, event_type, object_id, attempts::int8 AS attempts,
    (extract(epoch FROM received_at) * 1000000)::int8 AS received_us,
    (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS next_attempt_us,
    (extract(epoch FROM processed_at) * 1000000)::int8 AS processed_us,
    (extract(epoch FROM dead_at) * 1000000)::int8 AS dead_us,
    coalesce(locked_until > now(), false) AS locked, processing_error",
    newest: "coalesce(to_timestamp($1::int8 / 1000000.0), 'infinity'), coalesce($2::text, ''), coalesce($3::text, '')",
    oldest: "coalesce(to_timestamp($1::int8 / 1000000.0), '-infinity'), coalesce($2::text, ''), coalesce($3::text, '')"
);

/// [`COUNTS`]' row: the counts, and how long the log has grown.
#[derive(sqlx::FromRow)]
struct CountsWithLog {
    #[sqlx(flatten)]
    counts: CountsRow,
    log_rows: i64,
}

/// The inbox's counts; folds the log of processed rows once it has grown.
pub(super) fn counts(pool: &PgPool, processor: Arc<str>) -> StoreFuture<Counts> {
    let pool = pool.clone();
    Box::pin(async move {
        let row = sqlx::query_as::<_, CountsWithLog>(COUNTS)
            .bind([&*processor])
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
pub(super) fn list(
    pool: &PgPool,
    listing: &Listing,
    ring: &Ring,
) -> StoreFuture<Vec<EventSummary>> {
    let query = sqlx::query_as(listing_statement(listing, LISTINGS));
    shared::list(pool, query, listing, |us| us, ring)
}

/// An event's newest `$3` attempt records of each route, oldest first: `webhook_attempts`'
/// rows, and the processed attempt each route itself records (its start and
/// `processed_at`). Per route, as the cap: one processor's many snoozes hide no other's
/// history.
const ATTEMPTS: &str = "
SELECT processor, attempt::int8 AS attempt,
    (extract(epoch FROM started_at) * 1000000)::int8 AS started_us,
    (extract(epoch FROM finished_at) * 1000000)::int8 AS finished_us, outcome, error
FROM (
    SELECT *, row_number() OVER (
        PARTITION BY processor ORDER BY started_at DESC, finished_at DESC
    ) AS newest
    FROM (
        SELECT processor, attempt, started_at, finished_at, outcome, error
        FROM webhook_attempts WHERE source = $1 AND event_id = $2
        UNION ALL
        SELECT processor, attempts, attempt_started_at, greatest(processed_at, attempt_started_at),
            'processed', NULL
        FROM webhook_routes
        WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL
          AND processed_at IS NOT NULL AND attempt_started_at IS NOT NULL
    ) every
) numbered
WHERE newest <= $3
ORDER BY started_at, finished_at";

/// How many inbox rows were processed in each of the last `$1` minutes that had any, by
/// the minute's start in milliseconds, and the current minute's start: a range of the
/// processed routes' index (`webhook_routes_processed_at`), the minutes asked for and no
/// more.
const PROCESSED_PER_MINUTE: &str = "
SELECT (extract(epoch FROM date_trunc('minute', now())) * 1000)::int8 AS current_ms,
    coalesce(array_agg(minute_ms), '{}') AS minutes, coalesce(array_agg(n), '{}') AS counts
FROM (
    SELECT (extract(epoch FROM date_trunc('minute', processed_at)) * 1000)::int8 AS minute_ms,
        count(*)::int8 AS n
    FROM webhook_routes
    WHERE processed_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
      AND next_attempt_at IS NOT NULL
    GROUP BY 1
) m";

/// An inbox event by its key (`$1`, `$2`) with its body and headers, or the event without
/// them once its body is gone (expired, erased, or deleted outside the crate: P4 of
/// `docs/design/payload-protection.md`); none when every route of it is a tombstone
/// (`prune_dead`: the event stays the key only — its body gone `expired`, but with no
/// route left to show, it would read as an event no processor took).
const EVENT: &str = "
SELECT e.source, e.event_id, e.event_type, e.object_id,
    (extract(epoch FROM e.received_at) * 1000000)::int8 AS received_us,
    e.livemode, b.source IS NOT NULL AS has_body, b.body, b.headers, b.key_id, b.body_nonce,
    b.sealed_headers, b.headers_nonce, e.body_state
FROM webhook_events e
LEFT JOIN webhook_bodies b ON b.source = e.source AND b.event_id = e.event_id
WHERE e.source = $1 AND e.event_id = $2 AND e.next_attempt_at IS NOT NULL
  AND (b.source IS NOT NULL
    OR EXISTS (SELECT 1 FROM webhook_routes r
        WHERE r.source = e.source AND r.event_id = e.event_id AND r.next_attempt_at IS NOT NULL)
    OR (e.body_state IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhook_routes r
        WHERE r.source = e.source AND r.event_id = e.event_id)))";

/// One event of the inbox, its body, headers, routes and attempts included.
pub(super) fn event(
    pool: &PgPool,
    source: String,
    id: String,
    ring: &Ring,
) -> StoreFuture<Option<StoredEvent>> {
    let statements = EventStatements {
        event: sqlx::query_as(EVENT),
        routes: sqlx::query_as(ROUTES),
        attempts: sqlx::query_as(ATTEMPTS),
    };
    stored::event(pool, statements, source, id, ring)
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

//! What operators read: the inbox's counts, its listings of failing and dead rows, and
//! one event with its body.

use sqlx::sqlite::SqlitePool;

use super::super::sealed::Ring;
use super::super::shared::{self, listing_statement, listing_statements};
use super::super::stored::{self, EventStatements};
use super::super::{store_error, CountsRow};
use crate::inbox::{Counts, EventSummary, Listing, StoredEvent};
use crate::store::StoreFuture;
use std::sync::Arc;

/// Processor `?2`'s queue from the due routes' partial index (`webhook_routes_due`), its
/// dead routes from theirs, and its processed ones from the counter the triggers keep
/// (`webhook_route_counts`): the answer costs the size of the queue, not of the history.
const COUNTS: &str = "
SELECT q.queued, q.processing,
    coalesce((SELECT processed FROM webhook_route_counts WHERE processor = ?2), 0)
        AS processed,
    (SELECT count(*) FROM webhook_routes
     WHERE processor = ?2 AND dead_at IS NOT NULL AND next_attempt_at IS NOT NULL) AS dead,
    CASE WHEN EXISTS (SELECT 1 FROM webhook_pauses) THEN (
        SELECT count(*) FROM webhook_routes e
        WHERE e.processor = ?2 AND e.next_attempt_at IS NOT NULL AND e.processed_at IS NULL
          AND e.dead_at IS NULL AND (e.locked_until IS NULL OR e.locked_until <= ?1)
          AND EXISTS (SELECT 1 FROM webhook_pauses p
              WHERE p.processor IN ('', e.processor) AND p.source IN ('', e.source)
              AND p.event_type IN ('', coalesce(e.event_type, ''))))
    ELSE 0 END AS paused,
    q.oldest_due_ms
FROM (
    SELECT
        count(*) FILTER (WHERE locked_until IS NULL OR locked_until <= ?1) AS queued,
        count(*) FILTER (WHERE locked_until > ?1) AS processing,
        ?1 - min(next_attempt_at) FILTER (WHERE
            (locked_until IS NULL OR locked_until <= ?1) AND next_attempt_at <= ?1)
            AS oldest_due_ms
    FROM webhook_routes
    WHERE processor = ?2 AND next_attempt_at IS NOT NULL AND processed_at IS NULL
      AND dead_at IS NULL
) q";

// `?1` is now (whether a worker holds the route). The terms of each index's `WHERE` are
// repeated, so SQLite sees it applies. The listings' position is `?2`, `?3`, `?4` (the
// time in milliseconds, the source and id that break ties in time; `NULL` for the first
// page: before or after every row), `?6` the processor (the position's, or the one
// listed); one event's routes are `ROUTES`.
listing_statements!(
    from: "webhook_routes",
    columns: "source, event_id, processor, event_type, object_id, attempts,
    received_at * 1000 AS received_us, next_attempt_at * 1000 AS next_attempt_us,
    processed_at * 1000 AS processed_us, dead_at * 1000 AS dead_us,
    coalesce(locked_until > ?1, 0) AS locked, processing_error",
    newest: "coalesce(?2, 9223372036854775807), coalesce(?3, ''), coalesce(?4, '')",
    oldest: "coalesce(?2, -9223372036854775808), coalesce(?3, ''), coalesce(?4, '')",
    limit: "?5",
    processor: "?6",
    key: "source = ?2 AND event_id = ?3"
);

/// An inbox event by its key (`?1`, `?2`) with its body and headers, or the event without
/// them once its body is gone (expired, erased, or deleted outside the crate: P4 of
/// `docs/design/payload-protection.md`); none when every route of it is a tombstone
/// (`prune_dead`: the event stays the key only — its body gone `expired`, but with no
/// route left to show, it would read as an event no processor took).
const EVENT: &str = "
SELECT e.source, e.event_id, e.event_type, e.object_id, e.received_at * 1000 AS received_us,
    e.livemode, b.source IS NOT NULL AS has_body, b.body, b.headers, b.key_id, b.body_nonce,
    b.sealed_headers, b.headers_nonce, e.body_state
FROM webhook_events e
LEFT JOIN webhook_bodies b ON b.source = e.source AND b.event_id = e.event_id
WHERE e.source = ?1 AND e.event_id = ?2 AND e.next_attempt_at IS NOT NULL
  AND (b.source IS NOT NULL
    OR EXISTS (SELECT 1 FROM webhook_routes r
        WHERE r.source = e.source AND r.event_id = e.event_id AND r.next_attempt_at IS NOT NULL)
    OR (e.body_state IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhook_routes r
        WHERE r.source = e.source AND r.event_id = e.event_id)))";

/// The partial index each of [`LISTINGS`] reads, in their order.
#[cfg(test)]
pub(super) const LISTING_INDEXES: [&str; 8] = [
    "webhook_routes_dead",
    "webhook_routes_dead",
    "webhook_routes_failing",
    "webhook_routes_failing",
    "webhook_routes_dead_by",
    "webhook_routes_dead_by",
    "webhook_routes_failing_by",
    "webhook_routes_failing_by",
];

/// The inbox's counts at `now`.
pub(super) fn counts(pool: &SqlitePool, now: i64, processor: Arc<str>) -> StoreFuture<Counts> {
    let pool = pool.clone();
    Box::pin(async move {
        sqlx::query_as::<_, CountsRow>(COUNTS)
            .bind(now)
            .bind(&*processor)
            .fetch_one(&pool)
            .await
            .map(Counts::from)
            .map_err(|e| store_error("inbox counts", e))
    })
}

/// A page of failing or dead rows (one more than asked: whether a next page exists).
pub(super) fn list(
    pool: &SqlitePool,
    now: i64,
    listing: &Listing,
    ring: &Ring,
) -> StoreFuture<Vec<EventSummary>> {
    let query = sqlx::query_as(listing_statement(listing, LISTINGS)).bind(now);
    shared::list(pool, query, listing, |us| us.div_euclid(1000), ring)
}

/// An event's newest `?3` attempt records of each route, oldest first (ties in time in
/// the order they were written): `webhook_attempts`' rows, and the processed attempt each
/// route itself records (its start and `processed_at`; after every other). Per route, as
/// the cap: one processor's many snoozes hide no other's history.
const ATTEMPTS: &str = "
SELECT processor, attempt, started_at * 1000 AS started_us, finished_at * 1000 AS finished_us,
    outcome, error
FROM (
    SELECT *, row_number() OVER (
        PARTITION BY processor ORDER BY started_at DESC, finished_at DESC, n DESC
    ) AS newest
    FROM (
        SELECT rowid AS n, processor, attempt, started_at, finished_at, outcome, error
        FROM webhook_attempts WHERE source = ?1 AND event_id = ?2
        UNION ALL
        SELECT 9223372036854775807, processor, attempts, attempt_started_at,
            max(processed_at, attempt_started_at), 'processed', NULL
        FROM webhook_routes
        WHERE source = ?1 AND event_id = ?2 AND next_attempt_at IS NOT NULL
          AND processed_at IS NOT NULL AND attempt_started_at IS NOT NULL
    )
)
WHERE newest <= ?3
ORDER BY started_at, finished_at, n";

/// How many routes were processed in each minute since `?1` (a minute's start, in
/// milliseconds) that had any, by the minute's start: a range of the processed routes'
/// index (`webhook_routes_processed_at`), the minutes asked for and no more.
const PROCESSED_PER_MINUTE: &str = "
SELECT processed_at - processed_at % 60000 AS minute_ms, count(*) AS n
FROM webhook_routes
WHERE processed_at IS NOT NULL AND processed_at >= ?1 AND next_attempt_at IS NOT NULL
GROUP BY 1";

/// One event of the inbox, its body, headers, routes and attempts included.
pub(super) fn event(
    pool: &SqlitePool,
    now: i64,
    source: String,
    id: String,
    ring: &Ring,
) -> StoreFuture<Option<StoredEvent>> {
    let statements = EventStatements {
        event: sqlx::query_as(EVENT),
        routes: sqlx::query_as(ROUTES).bind(now),
        attempts: sqlx::query_as(ATTEMPTS),
    };
    stored::event(pool, statements, source, id, ring)
}

/// The current minute's start (at `now`) and the counts of the last `minutes` minutes
/// that had any.
pub(super) fn processed_per_minute(
    pool: &SqlitePool,
    now: i64,
    minutes: u32,
) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
    let pool = pool.clone();
    let current = now - now.rem_euclid(60_000);
    let since = current.saturating_sub(i64::from(minutes.saturating_sub(1)) * 60_000);
    Box::pin(async move {
        let counted = sqlx::query_as::<_, (i64, i64)>(PROCESSED_PER_MINUTE)
            .bind(since)
            .fetch_all(&pool)
            .await
            .map_err(|e| store_error("inbox processed per minute", e))?;
        Ok((current, counted))
    })
}

//! The inbox's prunes: events whose every route finished long ago, the keys deleted dead
//! rows left before routes, and dead routes made tombstones.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::super::store_error;
use super::listing::FOLD_COUNTS;
use crate::inbox::DeadRows;
use crate::store::StoreFuture;

/// Inbox events received more than `$1` seconds ago whose every route finished (was
/// processed, or deleted dead) that long ago, deleted (a trigger takes their routes,
/// bodies and history; `webhook_events_inbox` finds them); dead ones only by name
/// (`PRUNE_DEAD`). Kept events (no signed time: only the row refuses a replay) are pruned
/// by name only.
const PRUNE_EVENTS: &str = "
DELETE FROM webhook_events e
WHERE e.next_attempt_at IS NOT NULL AND e.received_at < now() - make_interval(secs => $1)
  AND e.kind = 'event'
  AND NOT EXISTS (SELECT 1 FROM webhook_routes r
      WHERE r.source = e.source AND r.event_id = e.event_id
        AND (r.processed_at IS NULL OR r.processed_at >= now() - make_interval(secs => $1)))";

/// The keys dead rows deleted before the routes left (done, without a token: the
/// migration `webhook_events_deleted`), done more than `$1` seconds ago, deleted.
const PRUNE_TOMBSTONES: &str = "
DELETE FROM webhook_events WHERE kind = 'event' AND processed_at IS NOT NULL
AND processed_at < now() - make_interval(secs => $1)
AND next_attempt_at IS NULL AND lock_token IS NULL";

/// Dead routes that went dead more than `$1` seconds ago, of source `$2` and type `$3`
/// where given, deleted: each becomes a tombstone, done now (`next_attempt_at` NULL: no
/// longer queued or counted; its error and history go), and the event's body and headers
/// go once every route of it is one, its `body_state` set to `expired` (a requeue and a
/// backfill leave it out). The event stays, the key: its delivery posted again is a
/// duplicate until the retention has passed since (the inbox prune), and `Inbox::event`
/// no longer finds it (no route of it is left to show).
const PRUNE_DEAD: &str = "
WITH gone AS (
    UPDATE webhook_routes SET next_attempt_at = NULL, processed_at = now(), dead_at = NULL,
        processing_error = NULL, attempt_started_at = NULL, locked_until = NULL,
        lock_token = NULL
    WHERE next_attempt_at IS NOT NULL
      AND dead_at IS NOT NULL AND dead_at < now() - make_interval(secs => $1)
      AND ($2::text IS NULL OR source = $2) AND ($3::text IS NULL OR event_type = $3)
    RETURNING source, event_id, processor
), bodies AS (
    DELETE FROM webhook_bodies b USING (SELECT DISTINCT source, event_id FROM gone) g
    WHERE b.source = g.source AND b.event_id = g.event_id
      AND NOT EXISTS (SELECT 1 FROM webhook_routes r
          WHERE r.source = g.source AND r.event_id = g.event_id
            AND r.next_attempt_at IS NOT NULL
            AND (r.source, r.event_id, r.processor) NOT IN (SELECT * FROM gone))
    RETURNING b.source, b.event_id
), expired AS (
    UPDATE webhook_events e SET body_state = 'expired' FROM bodies
    WHERE e.source = bodies.source AND e.event_id = bodies.event_id AND e.body_state IS NULL
)
SELECT count(*) FROM gone";

/// Prunes as [`Backend::prune`](crate::inbox::backend::Backend::prune) says: how many
/// events (or dead routes) it deleted.
pub(super) fn prune(
    pool: &PgPool,
    older_than: Duration,
    dead: Option<&DeadRows>,
) -> StoreFuture<u64> {
    let pool = pool.clone();
    let dead = dead.cloned();
    Box::pin(async move {
        let err = |e| store_error("inbox prune", e);
        let secs = older_than.as_secs_f64();
        let Some(rows) = &dead else {
            let events = sqlx::query(PRUNE_EVENTS).bind(secs).execute(&pool).await;
            let keys = sqlx::query(PRUNE_TOMBSTONES)
                .bind(secs)
                .execute(&pool)
                .await;
            let pruned = events.map_err(err)?.rows_affected();
            // The pruned routes' -1s, and what was processed since, into one row a
            // processor.
            let _ = sqlx::raw_sql(FOLD_COUNTS).execute(&pool).await;
            return Ok(pruned + keys.map_err(err)?.rows_affected());
        };
        let gone = sqlx::query_scalar::<_, i64>(PRUNE_DEAD)
            .bind(secs)
            .bind(rows.source.as_deref())
            .bind(rows.event_type.as_deref())
            .fetch_one(&pool)
            .await
            .map_err(err)?;
        Ok(gone.unsigned_abs())
    })
}

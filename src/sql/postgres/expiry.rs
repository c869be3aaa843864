//! Body expiry (`Inbox::expire_bodies`, `docs/design/payload-protection.md` §7): one
//! batch a transaction, walking `webhook_routes_processed_at` from the bookmark in
//! `webhook_body_expiry`, by the server's clock.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::super::store_error;
use crate::store::StoreFuture;

/// The bookmark's row locked for the transaction: replicas expire one batch at a time,
/// each starting where the one before ended (the statement after it reads the bookmark
/// it committed).
const LOCK: &str = "SELECT 1 FROM webhook_body_expiry WHERE id = 1 FOR UPDATE";

/// One batch: the routes processed after the bookmark and more than `$1` seconds ago, up
/// to `$2` of them (`until`: the last one's time; ties at it taken whole); the events of
/// those routes whose body state is NULL and whose every route was processed before the
/// cutoff (tombstones are processed: `PRUNE_DEAD` sets their time) lose their body row,
/// their routes' and attempts' error texts, and get `body_state = 'expired'`; the
/// bookmark moves to `until`. An event passed over has a route unprocessed or processed
/// later: that route's time, once set, is after the window, and a later batch finds the
/// event again (a route's time is its statement's clock: one whose transaction commits
/// more than the retention later could be passed — retentions are hours, not seconds).
/// How many events, and whether there was a window at all.
const EXPIRE: &str = "
WITH bookmark AS (
    SELECT processed_until AS since, now() - make_interval(secs => $1) AS cutoff
    FROM webhook_body_expiry WHERE id = 1
), window_end AS (
    SELECT max(w.processed_at) AS until FROM (
        SELECT r.processed_at FROM webhook_routes r, bookmark k
        WHERE r.processed_at IS NOT NULL AND r.processed_at > k.since
          AND r.processed_at < k.cutoff
        ORDER BY r.processed_at LIMIT $2) w
), found AS (
    SELECT DISTINCT r.source, r.event_id
    FROM webhook_routes r, bookmark k, window_end w
    WHERE r.processed_at IS NOT NULL AND r.processed_at > k.since
      AND r.processed_at <= w.until
      AND EXISTS (SELECT 1 FROM webhook_events e
          WHERE e.source = r.source AND e.event_id = r.event_id AND e.body_state IS NULL)
      AND NOT EXISTS (SELECT 1 FROM webhook_routes o
          WHERE o.source = r.source AND o.event_id = r.event_id
            AND (o.processed_at IS NULL OR o.processed_at >= k.cutoff))
), bodies AS (
    DELETE FROM webhook_bodies b USING found f
    WHERE b.source = f.source AND b.event_id = f.event_id
), events AS (
    UPDATE webhook_events e SET body_state = 'expired' FROM found f
    WHERE e.source = f.source AND e.event_id = f.event_id AND e.body_state IS NULL
    RETURNING 1
), errors AS (
    UPDATE webhook_routes r SET processing_error = NULL FROM found f
    WHERE r.source = f.source AND r.event_id = f.event_id AND r.processing_error IS NOT NULL
), attempts AS (
    UPDATE webhook_attempts a SET error = NULL FROM found f
    WHERE a.source = f.source AND a.event_id = f.event_id AND a.error IS NOT NULL
), moved AS (
    UPDATE webhook_body_expiry x SET processed_until = greatest(x.processed_until, w.until)
    FROM window_end w WHERE x.id = 1 AND w.until IS NOT NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM events), EXISTS (SELECT 1 FROM moved)";

/// One batch, as [`Backend::expire_bodies`](crate::inbox::backend::Backend::expire_bodies)
/// says.
pub(super) fn expire(pool: &PgPool, retention: Duration, batch: usize) -> StoreFuture<Option<u64>> {
    let pool = pool.clone();
    // Past a century, never: `make_interval` refuses what `timestamptz` cannot hold.
    let secs = retention.as_secs_f64().min(100.0 * 365.25 * 86_400.0);
    let batch = i64::try_from(batch).unwrap_or(i64::MAX);
    Box::pin(async move {
        let err = |e| store_error("inbox body expiry", e);
        let mut tx = pool.begin().await.map_err(err)?;
        sqlx::query(LOCK).execute(&mut *tx).await.map_err(err)?;
        let (expired, walked): (i64, bool) = sqlx::query_as(EXPIRE)
            .bind(secs)
            .bind(batch)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(walked.then_some(expired.unsigned_abs()))
    })
}

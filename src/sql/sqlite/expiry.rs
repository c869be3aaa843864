//! Body expiry (`Inbox::expire_bodies`, `docs/design/payload-protection.md` §7): one
//! batch a writer's operation, walking `webhook_routes_processed_at` from the bookmark in
//! `webhook_body_expiry`. Times are the writer's milliseconds.

use sqlx::SqliteConnection;

use super::super::store_error;
use crate::store::StoreError;

/// The bookmark: the newest `processed_at` the expiry has passed.
pub(super) const BOOKMARK: &str = "SELECT processed_until FROM webhook_body_expiry WHERE id = 1";

/// Where the batch ends: the `?3`-th route processed after the bookmark `?1` and before
/// the cutoff `?2` (fewer: the last of them); NULL when there is none.
pub(super) const WINDOW_END: &str = "
SELECT max(processed_at) FROM (
    SELECT processed_at FROM webhook_routes INDEXED BY webhook_routes_processed_at
    WHERE processed_at IS NOT NULL AND processed_at > ?1 AND processed_at < ?2
    ORDER BY processed_at LIMIT ?3)";

/// The events of the routes processed in `(?1, ?2]` that still have their body state
/// NULL and whose every route was processed before the cutoff `?3` (tombstones are
/// processed: `prune_dead` sets their time). An event passed over here has a route
/// unprocessed or processed later: that route's `processed_at`, once set, is after the
/// window, and a later batch finds the event again.
pub(super) const EXPIRING: &str = "
SELECT DISTINCT r.source, r.event_id
FROM webhook_routes AS r INDEXED BY webhook_routes_processed_at
JOIN webhook_events AS e ON e.source = r.source AND e.event_id = r.event_id
WHERE r.processed_at IS NOT NULL AND r.processed_at > ?1 AND r.processed_at <= ?2
  AND e.body_state IS NULL
  AND NOT EXISTS (SELECT 1 FROM webhook_routes AS o
      WHERE o.source = r.source AND o.event_id = r.event_id
        AND (o.processed_at IS NULL OR o.processed_at >= ?3))";

/// What goes for each event of `?1` (a JSON array of `[source, id]`): its body row (body,
/// headers, subject), then the state that says why, and every error text of its routes
/// and attempts (`webhook_attempts_route` by the key's prefix).
pub(super) const EXPIRE: [&str; 4] = [
    "DELETE FROM webhook_bodies WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1))",
    "UPDATE webhook_events SET body_state = 'expired' WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1)) AND body_state IS NULL",
    "UPDATE webhook_routes SET processing_error = NULL WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1)) AND processing_error IS NOT NULL",
    "UPDATE webhook_attempts SET error = NULL WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1)) AND error IS NOT NULL",
];

const ADVANCE: &str = "UPDATE webhook_body_expiry SET processed_until = ?1 WHERE id = 1";

/// One batch at `now`, in the writer's transaction: the events whose every route was
/// processed before `cutoff` expired, up to `batch` routes walked; how many events went,
/// `None` when no route was left to walk.
pub(super) async fn expire(
    conn: &mut SqliteConnection,
    cutoff: i64,
    batch: usize,
) -> Result<Option<u64>, StoreError> {
    let err = |e| store_error("inbox body expiry", e);
    let since: i64 = sqlx::query_scalar(BOOKMARK)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    let until: Option<i64> = sqlx::query_scalar(WINDOW_END)
        .bind(since)
        .bind(cutoff)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    let Some(until) = until else { return Ok(None) };
    let events: Vec<(String, String)> = sqlx::query_as(EXPIRING)
        .bind(since)
        .bind(until)
        .bind(cutoff)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let mut expired = 0;
    if !events.is_empty() {
        let keys = serde_json::to_string(&events).expect("strings");
        for (i, sql) in EXPIRE.iter().enumerate() {
            let done = sqlx::query(*sql)
                .bind(keys.as_str())
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            if i == 1 {
                expired = done.rows_affected();
            }
        }
    }
    sqlx::query(ADVANCE)
        .bind(until)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(Some(expired))
}

//! Erasure (`Inbox::erase`, `docs/design/payload-protection.md` §8): events' bodies
//! deleted on request in one writer operation, their error texts with them, their routes
//! that could still run buried. Times are the writer's milliseconds.

use sqlx::SqliteConnection;

use super::super::store_error;
use crate::store::StoreError;

/// The events of `?1` (a JSON array of `[source, id]`) marked erased: the inbox's only
/// (`next_attempt_at` is its events' marker; a `DedupeLayer` claim is no inbox event).
/// An event expired before says erased now: the last thing asked of it.
const MARK: &str = "
UPDATE webhook_events SET body_state = 'erased'
WHERE (source, event_id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?1))
  AND next_attempt_at IS NOT NULL";

/// Then what goes of the marked events: the body row (body, headers, subject), every
/// error text of their routes and attempts (`webhook_attempts_route` by the key's
/// prefix), and each route that could still run — queued, failing, or claimed by a
/// lease that ran out — buried dead at `?2` with the reason `?3` (a route running now
/// keeps its lease: its outcome is fenced as always, and drops its error, P11).
const ERASE: [&str; 4] = [
    "DELETE FROM webhook_bodies WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1))",
    "UPDATE webhook_routes SET processing_error = NULL WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1)) AND processing_error IS NOT NULL",
    "UPDATE webhook_attempts SET error = NULL WHERE (source, event_id) IN
        (SELECT value ->> 0, value ->> 1 FROM json_each(?1)) AND error IS NOT NULL",
    "UPDATE webhook_routes SET dead_at = ?2, processing_error = ?3,
        locked_until = NULL, lock_token = NULL
    WHERE (source, event_id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?1))
      AND next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= ?2)",
];

/// Erases the events `keys` at `now`, in the writer's transaction; how many of them the
/// inbox has (each erased, again if it was).
pub(super) async fn erase(
    conn: &mut SqliteConnection,
    now: i64,
    keys: &[(String, String)],
) -> Result<u64, StoreError> {
    let err = |e| store_error("inbox erase", e);
    let keys = serde_json::to_string(keys).expect("strings");
    let marked = sqlx::query(MARK)
        .bind(keys.as_str())
        .execute(&mut *conn)
        .await
        .map_err(err)?
        .rows_affected();
    if marked == 0 {
        return Ok(0);
    }
    let reason = crate::inbox::BodyState::Erased.dead_reason();
    for sql in ERASE {
        sqlx::query(sql)
            .bind(keys.as_str())
            .bind(now)
            .bind(reason)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    Ok(marked)
}

/// Up to `?2` events whose body row holds one of the subject digests `?1` (a JSON array
/// of hex), by the partial index `webhook_bodies_subject`. An erased event's row is gone,
/// so each batch erased, the next read finds the rest.
#[cfg(feature = "seal")]
const BY_SUBJECT: &str = "
SELECT source, event_id FROM webhook_bodies
WHERE subject_digest IS NOT NULL
  AND subject_digest IN (SELECT unhex(value) FROM json_each(?1))
LIMIT ?2";

/// The events [`BY_SUBJECT`] finds, read from the pool (not a write).
#[cfg(feature = "seal")]
pub(super) fn by_subject(
    pool: &sqlx::SqlitePool,
    digests: Vec<Vec<u8>>,
    limit: usize,
) -> crate::store::StoreFuture<Vec<(String, String)>> {
    let pool = pool.clone();
    Box::pin(async move {
        let hexes: Vec<String> = digests.iter().map(hex::encode).collect();
        sqlx::query_as(BY_SUBJECT)
            .bind(serde_json::to_string(&hexes).expect("strings"))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&pool)
            .await
            .map_err(|e| store_error("inbox erase by subject", e))
    })
}

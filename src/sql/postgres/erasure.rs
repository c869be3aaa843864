//! Erasure (`Inbox::erase`, `docs/design/payload-protection.md` §8): events' bodies
//! deleted on request in one transaction, their error texts with them, their routes that
//! could still run buried. Times are the server's.

use sqlx::postgres::PgPool;

use super::super::store_error;
use crate::store::StoreFuture;

/// The inbox's events of the keys `$1`, `$2` (`next_attempt_at` is its events' marker),
/// locked `FOR UPDATE` in key order: a failing attempt's outcome takes `FOR KEY SHARE` on
/// its event (`queue.rs`, P11), so it either commits before this erase reads the rows it
/// wrote, or waits and then sees the event erased.
const LOCK: &str = "
SELECT e.source, e.event_id FROM webhook_events e
JOIN unnest($1::text[], $2::text[]) AS k(source, event_id)
    ON e.source = k.source AND e.event_id = k.event_id
WHERE e.next_attempt_at IS NOT NULL
ORDER BY e.source, e.event_id
FOR UPDATE OF e";

/// What goes of the locked events (`$1`, `$2`): the state, the body row (body, headers,
/// subject), every error text of their routes and attempts. An event expired before
/// says erased now: the last thing asked of it.
const ERASE: [&str; 4] = [
    "UPDATE webhook_events e SET body_state = 'erased'
    FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
    WHERE e.source = k.source AND e.event_id = k.event_id",
    "DELETE FROM webhook_bodies b USING unnest($1::text[], $2::text[]) AS k(source, event_id)
    WHERE b.source = k.source AND b.event_id = k.event_id",
    "UPDATE webhook_routes r SET processing_error = NULL
    FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
    WHERE r.source = k.source AND r.event_id = k.event_id AND r.processing_error IS NOT NULL",
    "UPDATE webhook_attempts a SET error = NULL
    FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
    WHERE a.source = k.source AND a.event_id = k.event_id AND a.error IS NOT NULL",
];

/// Then each route of them that could still run — queued, failing, or claimed by a
/// lease that ran out — buried dead with the reason `$3` (a route running now keeps its
/// lease: its outcome is fenced as always, and drops its error).
const BURY: &str = "
    UPDATE webhook_routes r SET dead_at = now(), processing_error = $3,
        locked_until = NULL, lock_token = NULL
    FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
    WHERE r.source = k.source AND r.event_id = k.event_id
      AND r.next_attempt_at IS NOT NULL AND r.processed_at IS NULL AND r.dead_at IS NULL
      AND (r.locked_until IS NULL OR r.locked_until <= clock_timestamp())";

/// Erases the events `keys`; how many of them the inbox has (each erased, again if it
/// was).
pub(super) fn erase(pool: &PgPool, keys: Vec<(String, String)>) -> StoreFuture<u64> {
    let pool = pool.clone();
    Box::pin(async move {
        let err = |e| store_error("inbox erase", e);
        let (sources, ids): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
        let mut tx = pool.begin().await.map_err(err)?;
        let found: Vec<(String, String)> = sqlx::query_as(LOCK)
            .bind(&sources)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        if found.is_empty() {
            return Ok(0);
        }
        let (sources, ids): (Vec<String>, Vec<String>) = found.into_iter().unzip();
        let reason = crate::inbox::BodyState::Erased.dead_reason();
        let keyed = |sql| sqlx::query(sql).bind(&sources).bind(&ids);
        for sql in ERASE {
            keyed(sql).execute(&mut *tx).await.map_err(err)?;
        }
        keyed(BURY)
            .bind(reason)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(u64::try_from(sources.len()).unwrap_or(u64::MAX))
    })
}

/// Up to `$2` events whose body row holds one of the subject digests `$1`, by the partial
/// index `webhook_bodies_subject`. An erased event's row is gone, so each batch erased,
/// the next read finds the rest.
#[cfg(feature = "seal")]
const BY_SUBJECT: &str = "
SELECT source, event_id FROM webhook_bodies
WHERE subject_digest IS NOT NULL AND subject_digest = ANY($1::bytea[])
LIMIT $2";

/// The events [`BY_SUBJECT`] finds.
#[cfg(feature = "seal")]
pub(super) fn by_subject(
    pool: &PgPool,
    digests: Vec<Vec<u8>>,
    limit: usize,
) -> StoreFuture<Vec<(String, String)>> {
    let pool = pool.clone();
    Box::pin(async move {
        sqlx::query_as(BY_SUBJECT)
            .bind(digests)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&pool)
            .await
            .map_err(|e| store_error("inbox erase by subject", e))
    })
}

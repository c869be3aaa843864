//! Body expiry (`Inbox::expire_bodies`, `docs/design/payload-protection.md` §7): one
//! batch a transaction, walking `webhook_routes_processed_at` from the bookmark in
//! `webhook_body_expiry`, by the server's clock.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::super::store_error;
use super::PLANNED_EACH_TIME;
use crate::store::StoreFuture;

/// The bookmark's row locked for the transaction: replicas expire one batch at a time,
/// each starting where the one before ended (the statements after it read the bookmark
/// it committed).
const LOCK: &str = "SELECT 1 FROM webhook_body_expiry WHERE id = 1 FOR UPDATE";

/// The batch's window, in microseconds since the epoch: the bookmark (NULL: the start,
/// `-infinity`), the cutoff (`$1` seconds ago), and the last of the first `$2` routes
/// processed after the bookmark and before the cutoff (NULL: none; ties at it are taken
/// whole by [`EXPIRING`]). A `LIMIT`ed walk of `webhook_routes_processed_at`. Times are
/// whole microseconds both ways (`extract` is exact since PostgreSQL 14).
const WINDOW: &str = "
WITH k AS (
    SELECT processed_until AS since, now() - make_interval(secs => $1) AS cutoff
    FROM webhook_body_expiry WHERE id = 1
)
SELECT CASE WHEN k.since = '-infinity' THEN NULL
        ELSE (extract(epoch FROM k.since) * 1000000)::int8 END,
    (extract(epoch FROM k.cutoff) * 1000000)::int8,
    (SELECT (extract(epoch FROM max(w.processed_at)) * 1000000)::int8 FROM (
        SELECT r.processed_at FROM webhook_routes r
        WHERE r.processed_at IS NOT NULL AND r.processed_at > k.since
          AND r.processed_at < k.cutoff
        ORDER BY r.processed_at LIMIT $2) w)
FROM k";

/// The events of the routes processed in `($1, $2]` (microseconds; `$1` NULL: from the
/// start) whose body state is NULL and whose every route was processed before the cutoff
/// `$3` (tombstones are processed: `PRUNE_DEAD` sets their time). An event passed over
/// has a route unprocessed or processed later: that route's time, once set, is after the
/// window, and a later batch finds the event again (a route's time is its statement's
/// clock: one whose transaction commits more than the retention later could be passed —
/// retentions are hours, not seconds). Planned with its values, so the window's few rows
/// are known to be few.
const EXPIRING: &str = "
SELECT DISTINCT r.source, r.event_id FROM webhook_routes r
WHERE r.processed_at IS NOT NULL
  AND r.processed_at > coalesce('epoch'::timestamptz + $1::int8 * interval '1 microsecond',
      '-infinity')
  AND r.processed_at <= 'epoch'::timestamptz + $2::int8 * interval '1 microsecond'
  AND EXISTS (SELECT 1 FROM webhook_events e
      WHERE e.source = r.source AND e.event_id = r.event_id AND e.body_state IS NULL)
  AND NOT EXISTS (SELECT 1 FROM webhook_routes o
      WHERE o.source = r.source AND o.event_id = r.event_id
        AND (o.processed_at IS NULL
          OR o.processed_at >= 'epoch'::timestamptz + $3::int8 * interval '1 microsecond'))";

/// The events `$1`, `$2` lose their body row, their routes' and attempts' error texts,
/// and get `body_state = 'expired'` (how many); the bookmark moves to `$3` (microseconds).
const EXPIRE: &str = "
WITH found AS (
    SELECT * FROM unnest($1::text[], $2::text[]) AS f(source, event_id)
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
    UPDATE webhook_body_expiry SET processed_until = greatest(processed_until,
        'epoch'::timestamptz + $3::int8 * interval '1 microsecond')
    WHERE id = 1
)
SELECT count(*) FROM events";

/// One batch, as [`Backend::expire_bodies`](crate::inbox::backend::Backend::expire_bodies)
/// says: three statements in one transaction after the lock, the last two planned with
/// their values (`PLANNED_EACH_TIME`: a plan that cannot see the window's bounds, or kept
/// from another batch's keys, hashes whole tables).
pub(super) fn expire(pool: &PgPool, retention: Duration, batch: usize) -> StoreFuture<Option<u64>> {
    let pool = pool.clone();
    // Past a century, never: `make_interval` refuses what `timestamptz` cannot hold.
    let secs = retention.as_secs_f64().min(100.0 * 365.25 * 86_400.0);
    let batch = i64::try_from(batch).unwrap_or(i64::MAX);
    Box::pin(async move {
        let err = |e| store_error("inbox body expiry", e);
        let mut tx = pool.begin().await.map_err(err)?;
        sqlx::query(LOCK).execute(&mut *tx).await.map_err(err)?;
        let (since, cutoff, until): (Option<i64>, i64, Option<i64>) = sqlx::query_as(WINDOW)
            .bind(secs)
            .bind(batch)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        let Some(until) = until else { return Ok(None) };
        let found: Vec<(String, String)> = sqlx::query_as(EXPIRING)
            .persistent(PLANNED_EACH_TIME)
            .bind(since)
            .bind(until)
            .bind(cutoff)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let (sources, ids): (Vec<String>, Vec<String>) = found.into_iter().unzip();
        let expired: i64 = sqlx::query_scalar(EXPIRE)
            .persistent(PLANNED_EACH_TIME)
            .bind(sources)
            .bind(ids)
            .bind(until)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(Some(expired.unsigned_abs()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migrated database of its own on the local server.
    async fn fresh() -> PgPool {
        super::super::tests::fresh_pool().await
    }

    /// On 20 000 processed events (a failed attempt's error each), a batch reads the
    /// processed routes' index from the bookmark and each table by its key — no table
    /// scanned — and takes its batch, the ties at its last time whole: the bookmark ends
    /// there, and the next batch starts after it.
    #[tokio::test]
    async fn a_batch_reads_the_processed_index_from_the_bookmark_and_scans_no_table() {
        let pool = fresh().await;
        sqlx::raw_sql(
            "INSERT INTO webhook_events (source, event_id, received_at, next_attempt_at)
             SELECT 's', 'e' || g, now() - interval '2 days', now() - interval '2 days'
             FROM generate_series(1, 20000) g;
             INSERT INTO webhook_bodies (source, event_id, body, headers)
             SELECT 's', 'e' || g, convert_to(repeat('x', 500), 'UTF8'), 'x-a: b'
             FROM generate_series(1, 20000) g;
             -- Processed a second apart, the oldest first; e1..e3 at one time (a tie).
             INSERT INTO webhook_routes (source, event_id, processor, received_at,
                 next_attempt_at, processed_at)
             SELECT 's', 'e' || g, 'default', now() - interval '2 days',
                 now() - interval '2 days',
                 now() - interval '1 day' + make_interval(secs => greatest(g, 3))
             FROM generate_series(1, 20000) g;
             INSERT INTO webhook_attempts (source, event_id, processor, attempt, started_at,
                 finished_at, outcome, error)
             SELECT 's', 'e' || g, 'default', 1, now() - interval '2 days',
                 now() - interval '2 days', 'failed', 'quoting the payload'
             FROM generate_series(1, 20000) g;",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "VACUUM ANALYZE webhook_events, webhook_bodies, webhook_routes, webhook_attempts",
        )
        .execute(&pool)
        .await
        .unwrap();
        // A window of e1..e3 (a tie), planned with its values: the processed routes'
        // index and each table by its key, no table scanned.
        let at = |id: &'static str| {
            sqlx::query_scalar::<_, i64>(
                "SELECT (extract(epoch FROM processed_at) * 1000000)::int8 FROM webhook_routes
                 WHERE event_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
        };
        let (until, cutoff) = (at("e3").await.unwrap(), at("e20000").await.unwrap());
        let explain = |sql: &str| format!("EXPLAIN {sql}");
        let expiring: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain(EXPIRING)))
            .persistent(PLANNED_EACH_TIME)
            .bind(None::<i64>)
            .bind(until)
            .bind(cutoff)
            .fetch_all(&pool)
            .await
            .unwrap();
        // A batch's keys, few beside the table (on a table this small, hundreds are
        // cheaper hashed: the planner's choice, by its values).
        let keys: Vec<String> = (1..=20).map(|i| format!("e{i}")).collect();
        let expiry: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain(EXPIRE)))
            .persistent(PLANNED_EACH_TIME)
            .bind(vec!["s"; 20])
            .bind(keys)
            .bind(until)
            .fetch_all(&pool)
            .await
            .unwrap();
        let (expiring, expiry) = (expiring.join("\n"), expiry.join("\n"));
        assert!(
            expiring.contains("webhook_routes_processed_at"),
            "{expiring}"
        );
        for plan in [&expiring, &expiry] {
            assert!(!plan.contains("Seq Scan"), "{plan}");
        }

        // A batch of 2 takes the three tied routes whole; the next, the fourth.
        let hour = Duration::from_secs(3600);
        assert_eq!(expire(&pool, hour, 2).await.unwrap(), Some(3));
        assert_eq!(expire(&pool, hour, 1).await.unwrap(), Some(1));
        let left: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM webhook_bodies),
                (SELECT count(*) FROM webhook_attempts WHERE error IS NOT NULL),
                (SELECT count(*) FROM webhook_events WHERE body_state = 'expired')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, (19_996, 19_996, 4));
        let at_fourth: bool = sqlx::query_scalar(
            "SELECT processed_until = (SELECT processed_at FROM webhook_routes
                WHERE event_id = 'e4') FROM webhook_body_expiry",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(at_fourth, "the bookmark at the fourth route's time");
        pool.close().await;
    }
}

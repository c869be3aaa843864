//! The inbox's SQL, per database. Both keep the same states in `webhook_events`:
//! queued (`next_attempt_at` set, not locked), processing (locked under a token until the
//! lease ends), processed (`processed_at`), dead (`dead_at`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{Accepted, Counts, InboxEvent, Requeue};
use crate::store::{Delivery, StoreError, StoreFuture, Token};
use crate::Event;

/// What a worker does with a claimed row when it is done with it.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Processed,
    /// Failed; try again this much later.
    Retry(String, Duration),
    /// Failed for the last time.
    Dead(String),
    /// Stopped mid-attempt (shutdown past its grace period): back to the queue at once,
    /// the attempt counted, as a crash's would be.
    Abandoned,
}

pub(crate) trait Backend: Send + Sync + 'static {
    fn accept(&self, event: &Event) -> StoreFuture<Accepted>;
    /// Claims up to `limit` due rows for `lease` under `token`, counting an attempt each;
    /// a due row whose `max_attempts` attempts all ended without an outcome (each crashed
    /// its worker) is marked dead instead, in the same statement.
    fn claim(
        &self,
        limit: usize,
        lease: Duration,
        token: Token,
        max_attempts: u32,
    ) -> StoreFuture<Vec<InboxEvent>>;
    /// Extends the row's lease if `token` still holds it; `false` when fenced out.
    fn renew(&self, source: String, id: String, token: Token, lease: Duration)
        -> StoreFuture<bool>;
    /// Records `outcome` if `token` still holds the row; `false` when fenced out.
    fn finish(
        &self,
        source: String,
        id: String,
        token: Token,
        outcome: Outcome,
    ) -> StoreFuture<bool>;
    fn requeue(&self, which: &Requeue) -> StoreFuture<u64>;
    /// Deletes processed rows (`dead: false`) or dead rows (`dead: true`) older than that.
    fn prune(&self, older_than: Duration, dead: bool) -> StoreFuture<u64>;
    fn counts(&self) -> StoreFuture<Counts>;
    /// Wakes `wake` whenever another process queues a row (PostgreSQL `LISTEN`); `None`
    /// where only this process writes (SQLite).
    fn listen(&self, wake: Arc<Notify>) -> Option<tokio::task::JoinHandle<()>>;
    /// The pool, for transactional processors; `None` on SQLite.
    #[cfg(feature = "postgres")]
    fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        None
    }
}

/// A claimed row as both databases return it (the SQL names and casts the columns).
#[derive(sqlx::FromRow)]
struct ClaimedRow {
    source: String,
    event_id: String,
    event_type: Option<String>,
    object_id: Option<String>,
    livemode: Option<bool>,
    body: Option<Vec<u8>>,
    attempts: i64,
    /// Marked dead by the claim instead of claimed (every attempt crashed).
    buried: bool,
}

impl From<ClaimedRow> for InboxEvent {
    fn from(r: ClaimedRow) -> Self {
        InboxEvent {
            source: r.source,
            id: r.event_id,
            event_type: r.event_type,
            object_id: r.object_id,
            livemode: r.livemode,
            body: r.body.unwrap_or_default().into(),
            attempt: u32::try_from(r.attempts).unwrap_or(u32::MAX),
        }
    }
}

/// [`Counts`] as both databases return them (the lag in milliseconds).
#[derive(sqlx::FromRow)]
struct CountsRow {
    queued: i64,
    processing: i64,
    processed: i64,
    dead: i64,
    oldest_due_ms: Option<i64>,
}

impl From<CountsRow> for Counts {
    fn from(r: CountsRow) -> Self {
        Counts {
            queued: r.queued.unsigned_abs(),
            processing: r.processing.unsigned_abs(),
            processed: r.processed.unsigned_abs(),
            dead: r.dead.unsigned_abs(),
            oldest_due: r
                .oldest_due_ms
                .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        }
    }
}

/// What a row whose last attempt crashed says as its error when it goes dead (after the
/// error of the attempt before, if one failed).
/// What a row stopped past the shutdown's grace period says as its error.
const ABANDONED: &str = "stopped mid-attempt: the worker shut down past its grace period";

/// What a row whose last attempt crashed says as its error when it goes dead (after the
/// error of the attempt before, if one failed).
const CRASHED: &str =
    "the last attempt ended without an outcome (the worker crashed or was stopped)";

/// Runs a claim's rows into events.
fn events(rows: Result<Vec<ClaimedRow>, sqlx::Error>) -> Result<Vec<InboxEvent>, StoreError> {
    rows.map(|rows| {
        rows.into_iter()
            .filter(|row| !row.buried)
            .map(InboxEvent::from)
            .collect()
    })
    .map_err(|e| StoreError::new("inbox claim", e))
}

#[cfg(feature = "sqlite")]
pub(crate) use self::sqlite::Sqlite;

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::super::Clock;
    use super::*;
    use sqlx::SqlitePool;

    pub(crate) struct Sqlite {
        pool: SqlitePool,
        clock: Clock,
    }

    impl Sqlite {
        pub(crate) fn new(pool: SqlitePool, clock: Clock) -> Self {
            Self { pool, clock }
        }

        /// Milliseconds since the epoch, by this inbox's clock (every time SQLite keeps
        /// comes from here: one process's clock).
        fn now_ms(&self) -> i64 {
            (self.clock)()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, ms)
        }
    }

    fn ms(d: Duration) -> i64 {
        i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
    }

    const ACCEPT: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, received_at, attempts, next_attempt_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?7)
ON CONFLICT (source, event_id) DO UPDATE SET next_attempt_at = ?7, attempts = 0
WHERE webhook_events.next_attempt_at IS NULL AND webhook_events.processed_at IS NULL
  AND webhook_events.kind = 'event'";

    // SQLite has one writer: this UPDATE is atomic, no two workers get the same row. A due
    // row whose every attempt ended without an outcome (each crashed its worker) is marked
    // dead in the same statement instead of claimed again (every SET sees the old row).
    const CLAIM: &str = "
UPDATE webhook_events
SET attempts = attempts + (attempts < ?5),
    dead_at = CASE WHEN attempts >= ?5 THEN ?1 END,
    processing_error = CASE WHEN attempts >= ?5
        THEN coalesce(processing_error || '; then ', '') || ?6 ELSE processing_error END,
    locked_until = CASE WHEN attempts < ?5 THEN ?1 + ?2 END,
    lock_token = CASE WHEN attempts < ?5 THEN ?3 END
WHERE rowid IN (
    SELECT rowid FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?1
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= ?1)
    ORDER BY next_attempt_at LIMIT ?4)
RETURNING source, event_id, event_type, object_id, livemode, body, attempts,
    dead_at IS NOT NULL AS buried";

    impl Backend for Sqlite {
        fn accept(&self, event: &Event) -> StoreFuture<Accepted> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            let d = Delivery::from_event(event);
            Box::pin(async move {
                let audit = d.audit();
                let done = sqlx::query(ACCEPT)
                    .bind(d.source())
                    .bind(d.id())
                    .bind(audit.event_type)
                    .bind(audit.object_id)
                    .bind(audit.livemode)
                    .bind(audit.body)
                    .bind(now)
                    .execute(&pool)
                    .await
                    .map_err(|e| StoreError::new("inbox accept", e))?;
                Ok(if done.rows_affected() == 1 {
                    Accepted::New
                } else {
                    Accepted::Duplicate
                })
            })
        }

        fn claim(
            &self,
            limit: usize,
            lease: Duration,
            token: Token,
            max_attempts: u32,
        ) -> StoreFuture<Vec<InboxEvent>> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            Box::pin(async move {
                let rows = sqlx::query_as(CLAIM)
                    .bind(now)
                    .bind(ms(lease))
                    .bind(token.to_string())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .bind(max_attempts)
                    .bind(CRASHED)
                    .fetch_all(&pool)
                    .await;
                events(rows)
            })
        }

        fn renew(
            &self,
            source: String,
            id: String,
            token: Token,
            lease: Duration,
        ) -> StoreFuture<bool> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE webhook_events SET locked_until = ?4
                     WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL",
                )
                .bind(source)
                .bind(id)
                .bind(token.to_string())
                .bind(now.saturating_add(ms(lease)))
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("inbox renew", e))?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn finish(
            &self,
            source: String,
            id: String,
            token: Token,
            outcome: Outcome,
        ) -> StoreFuture<bool> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            Box::pin(async move {
                const KEY: &str = "WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3";
                let query = match outcome {
                    // The token stays: a retry whose acknowledgement was lost matches again.
                    Outcome::Processed => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4),
                         processing_error = NULL, locked_until = NULL {KEY}"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.to_string())
                    .bind(now),
                    Outcome::Retry(error, after) => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET next_attempt_at = ?4, processing_error = ?5,
                         locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.to_string())
                    .bind(now.saturating_add(ms(after)))
                    .bind(error),
                    Outcome::Dead(error) => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET dead_at = ?4, processing_error = ?5,
                         locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.to_string())
                    .bind(now)
                    .bind(error),
                    Outcome::Abandoned => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET processing_error = ?4,
                         locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.to_string())
                    .bind(ABANDONED),
                };
                let done = query
                    .execute(&pool)
                    .await
                    .map_err(|e| StoreError::new("inbox finish", e))?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn requeue(&self, which: &Requeue) -> StoreFuture<u64> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            let which = which.clone();
            Box::pin(async move {
                let (source, id) = which.id.unzip();
                let done = sqlx::query(
                    "UPDATE webhook_events
                     SET next_attempt_at = ?1, attempts = 0, processed_at = NULL, dead_at = NULL,
                         processing_error = NULL, locked_until = NULL, lock_token = NULL
                     WHERE next_attempt_at IS NOT NULL
                       AND (locked_until IS NULL OR locked_until <= ?1)
                       AND (?2 IS NULL OR (source = ?2 AND event_id = ?3))
                       AND (?4 = 0 OR dead_at IS NOT NULL)
                       AND (?5 IS NULL OR event_type = ?5)
                       AND (?6 IS NULL OR received_at >= ?6)
                       AND (?7 IS NULL OR received_at < ?7)",
                )
                .bind(now)
                .bind(source)
                .bind(id)
                .bind(which.dead_only)
                .bind(which.event_type)
                .bind(which.received_from)
                .bind(which.received_before)
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("inbox requeue", e))?;
                Ok(done.rows_affected())
            })
        }

        fn prune(&self, older_than: Duration, dead: bool) -> StoreFuture<u64> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            Box::pin(async move {
                let before = now.saturating_sub(ms(older_than));
                let done = sqlx::query(
                    "DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind = 'event'
                     AND CASE WHEN ?2 THEN dead_at < ?1 ELSE processed_at < ?1 END",
                )
                .bind(before)
                .bind(dead)
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("inbox prune", e))?;
                Ok(done.rows_affected())
            })
        }

        fn counts(&self) -> StoreFuture<Counts> {
            let (pool, now) = (self.pool.clone(), self.now_ms());
            Box::pin(async move {
                sqlx::query_as::<_, CountsRow>(
                    "SELECT
                        count(*) FILTER (WHERE processed_at IS NULL AND dead_at IS NULL AND (locked_until IS NULL OR locked_until <= ?1)) AS queued,
                        count(*) FILTER (WHERE processed_at IS NULL AND dead_at IS NULL AND locked_until > ?1) AS processing,
                        count(*) FILTER (WHERE processed_at IS NOT NULL) AS processed,
                        count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
                        ?1 - min(next_attempt_at) FILTER (WHERE processed_at IS NULL AND dead_at IS NULL
                            AND (locked_until IS NULL OR locked_until <= ?1) AND next_attempt_at <= ?1) AS oldest_due_ms
                     FROM webhook_events WHERE next_attempt_at IS NOT NULL",
                )
                .bind(now)
                .fetch_one(&pool)
                .await
                .map(Counts::from)
                .map_err(|e| StoreError::new("inbox counts", e))
            })
        }

        fn listen(&self, _wake: Arc<Notify>) -> Option<tokio::task::JoinHandle<()>> {
            None
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) use self::postgres::{processed_in, Postgres};

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use sqlx::postgres::{PgListener, PgPool};
    use sqlx::Row;

    const CHANNEL: &str = "webhook_events";

    /// Done, if `$3` still holds the row (or already did this): the token stays, so a
    /// retry whose acknowledgement was lost matches again.
    const PROCESSED: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, now()), processing_error = NULL,
    locked_until = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3";

    /// Marks the row processed in the processor's own transaction; `false` when `token`
    /// was fenced out (its lease ran out and another worker took the row).
    pub(crate) async fn processed_in(
        conn: &mut sqlx::PgConnection,
        source: &str,
        id: &str,
        token: Token,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(PROCESSED)
            .bind(source)
            .bind(id)
            .bind(token.as_uuid())
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) struct Postgres {
        pool: PgPool,
    }

    impl Postgres {
        pub(crate) fn new(pool: PgPool) -> Self {
            Self { pool }
        }
    }

    /// Stores the row and, only if it is new, notifies listening workers — one round trip.
    /// A row `DedupeLayer` left unfinished (released, or claimed) is queued instead, so a
    /// source switched from dedupe to the inbox loses no event; a duplicate of a queued row
    /// matches neither and writes nothing (`DO NOTHING` takes no row lock).
    const ACCEPT: &str = "
WITH inserted AS (
    INSERT INTO webhook_events
        (source, event_id, event_type, object_id, livemode, body, attempts, next_attempt_at)
    VALUES ($1, $2, $3, $4, $5, $6, 0, now())
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING 1
), adopted AS (
    UPDATE webhook_events SET next_attempt_at = now(), attempts = 0
    WHERE source = $1 AND event_id = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
      AND next_attempt_at IS NULL AND processed_at IS NULL AND kind = 'event'
    RETURNING 1
), queued AS (SELECT 1 FROM inserted UNION ALL SELECT 1 FROM adopted)
SELECT EXISTS (SELECT 1 FROM queued) AS new,
       CASE WHEN EXISTS (SELECT 1 FROM queued) THEN pg_notify('webhook_events', '') END";

    /// `SKIP LOCKED`: concurrent workers (in any replica) each take different rows. A due
    /// row whose every attempt ended without an outcome (each crashed its worker) is
    /// marked dead in the same statement instead of claimed again.
    const CLAIM: &str = "
UPDATE webhook_events w
SET attempts = w.attempts + (w.attempts < $4)::int,
    dead_at = CASE WHEN w.attempts >= $4 THEN now() END,
    processing_error = CASE WHEN w.attempts >= $4
        THEN coalesce(w.processing_error || '; then ', '') || $5 ELSE w.processing_error END,
    locked_until = CASE WHEN w.attempts < $4
        THEN clock_timestamp() + make_interval(secs => $1) END,
    lock_token = CASE WHEN w.attempts < $4 THEN $2 END
FROM (
    SELECT source, event_id FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= now()
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= clock_timestamp())
    ORDER BY next_attempt_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
) due
WHERE w.source = due.source AND w.event_id = due.event_id
RETURNING w.source, w.event_id, w.event_type, w.object_id, w.livemode, w.body,
    w.attempts::int8 AS attempts, w.dead_at IS NOT NULL AS buried";

    impl Backend for Postgres {
        fn accept(&self, event: &Event) -> StoreFuture<Accepted> {
            let pool = self.pool.clone();
            let d = Delivery::from_event(event);
            Box::pin(async move {
                let audit = d.audit();
                let new: bool = sqlx::query_scalar(ACCEPT)
                    .bind(d.source())
                    .bind(d.id())
                    .bind(audit.event_type)
                    .bind(audit.object_id)
                    .bind(audit.livemode)
                    .bind(audit.body)
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| StoreError::new("inbox accept", e))?;
                Ok(if new {
                    Accepted::New
                } else {
                    Accepted::Duplicate
                })
            })
        }

        fn claim(
            &self,
            limit: usize,
            lease: Duration,
            token: Token,
            max_attempts: u32,
        ) -> StoreFuture<Vec<InboxEvent>> {
            let pool = self.pool.clone();
            let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
            Box::pin(async move {
                let rows = sqlx::query_as(CLAIM)
                    .bind(lease.as_secs_f64())
                    .bind(token.as_uuid())
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .bind(max_attempts)
                    .bind(CRASHED)
                    .fetch_all(&pool)
                    .await;
                events(rows)
            })
        }

        fn renew(
            &self,
            source: String,
            id: String,
            token: Token,
            lease: Duration,
        ) -> StoreFuture<bool> {
            let pool = self.pool.clone();
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE webhook_events SET locked_until = clock_timestamp() + make_interval(secs => $4)
                     WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL",
                )
                .bind(source)
                .bind(id)
                .bind(token.as_uuid())
                .bind(lease.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("inbox renew", e))?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn finish(
            &self,
            source: String,
            id: String,
            token: Token,
            outcome: Outcome,
        ) -> StoreFuture<bool> {
            let pool = self.pool.clone();
            Box::pin(async move {
                const KEY: &str = "WHERE source = $1 AND event_id = $2 AND lock_token = $3";
                let query = match outcome {
                    Outcome::Processed => sqlx::query(PROCESSED)
                        .bind(source)
                        .bind(id)
                        .bind(token.as_uuid()),
                    Outcome::Retry(error, after) => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET next_attempt_at = now() + make_interval(secs => $5),
                         processing_error = $4, locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.as_uuid())
                    .bind(error)
                    .bind(after.as_secs_f64()),
                    Outcome::Dead(error) => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET dead_at = now(), processing_error = $4,
                         locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.as_uuid())
                    .bind(error),
                    Outcome::Abandoned => sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE webhook_events SET processing_error = $4,
                         locked_until = NULL, lock_token = NULL {KEY} AND processed_at IS NULL"
                    )))
                    .bind(source)
                    .bind(id)
                    .bind(token.as_uuid())
                    .bind(ABANDONED),
                };
                let done = query
                    .execute(&pool)
                    .await
                    .map_err(|e| StoreError::new("inbox finish", e))?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn requeue(&self, which: &Requeue) -> StoreFuture<u64> {
            let pool = self.pool.clone();
            let which = which.clone();
            Box::pin(async move {
                let (source, id) = which.id.unzip();
                let done = sqlx::query(
                    "WITH requeued AS (
                        UPDATE webhook_events
                        SET next_attempt_at = now(), attempts = 0, processed_at = NULL, dead_at = NULL,
                            processing_error = NULL, locked_until = NULL, lock_token = NULL
                        WHERE next_attempt_at IS NOT NULL
                          AND (locked_until IS NULL OR locked_until <= now())
                          AND ($1::text IS NULL OR (source = $1 AND event_id = $2))
                          AND (NOT $3 OR dead_at IS NOT NULL)
                          AND ($4::text IS NULL OR event_type = $4)
                          AND ($5::int8 IS NULL OR received_at >= to_timestamp($5 / 1000.0))
                          AND ($6::int8 IS NULL OR received_at < to_timestamp($6 / 1000.0))
                        RETURNING 1)
                     SELECT count(*), pg_notify('webhook_events', '') FROM requeued",
                )
                .bind(source)
                .bind(id)
                .bind(which.dead_only)
                .bind(which.event_type)
                .bind(which.received_from)
                .bind(which.received_before)
                .fetch_one(&pool)
                .await
                .map_err(|e| StoreError::new("inbox requeue", e))?;
                let n: i64 = done
                    .try_get(0)
                    .map_err(|e| StoreError::new("inbox requeue", e))?;
                Ok(n.unsigned_abs())
            })
        }

        fn prune(&self, older_than: Duration, dead: bool) -> StoreFuture<u64> {
            let pool = self.pool.clone();
            Box::pin(async move {
                let done = sqlx::query(
                    "DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind = 'event'
                     AND CASE WHEN $2 THEN dead_at ELSE processed_at END
                         < now() - make_interval(secs => $1)",
                )
                .bind(older_than.as_secs_f64())
                .bind(dead)
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("inbox prune", e))?;
                Ok(done.rows_affected())
            })
        }

        fn counts(&self) -> StoreFuture<Counts> {
            let pool = self.pool.clone();
            Box::pin(async move {
                sqlx::query_as::<_, CountsRow>(
                    "SELECT
                        count(*) FILTER (WHERE processed_at IS NULL AND dead_at IS NULL AND (locked_until IS NULL OR locked_until <= now())) AS queued,
                        count(*) FILTER (WHERE processed_at IS NULL AND dead_at IS NULL AND locked_until > now()) AS processing,
                        count(*) FILTER (WHERE processed_at IS NOT NULL) AS processed,
                        count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
                        (extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE processed_at IS NULL
                            AND dead_at IS NULL AND (locked_until IS NULL OR locked_until <= now())
                            AND next_attempt_at <= now())) * 1000)::int8 AS oldest_due_ms
                     FROM webhook_events WHERE next_attempt_at IS NOT NULL",
                )
                .fetch_one(&pool)
                .await
                .map(Counts::from)
                .map_err(|e| StoreError::new("inbox counts", e))
            })
        }

        fn pg_pool(&self) -> Option<&PgPool> {
            Some(&self.pool)
        }

        fn listen(&self, wake: Arc<Notify>) -> Option<tokio::task::JoinHandle<()>> {
            let pool = self.pool.clone();
            Some(tokio::spawn(async move {
                // Reconnects after a failure; the worker's polling covers the gap.
                loop {
                    if let Ok(mut listener) = PgListener::connect_with(&pool).await {
                        if listener.listen(CHANNEL).await.is_ok() {
                            while listener.recv().await.is_ok() {
                                wake.notify_waiters();
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }))
        }
    }
}

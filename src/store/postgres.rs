//! [`PgStore`]: claims in PostgreSQL, shared by every replica of a service.

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::{
    Claim, Completed, DedupeStore, Delivery, Renewed, Retention, StoreError, StoreFuture, Token,
    CLAIM_TRIES,
};

/// Claims in PostgreSQL (feature `postgres`), in the `webhook_events` table of
/// `migrations/postgres`. Any number of replicas share it; leases run on the database
/// server's clock (`clock_timestamp()`, not the transaction's start: a claim that waited
/// on a lock still gets its whole lease), so replicas' clocks do not matter. A new event's claim is one round trip
/// (`INSERT … ON CONFLICT DO NOTHING RETURNING`); a duplicate takes a second, which takes
/// over an expired claim or tells *done* from *in flight*, and writes nothing otherwise.
///
/// Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

/// A first-seen event: one round trip. `DO NOTHING` takes no lock on a conflicting row,
/// so a duplicate writes nothing and costs the server no commit flush.
const INSERT: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, attempts, locked_until, lock_token, kind)
VALUES ($1, $2, $3, $4, $5, $6, 1, clock_timestamp() + make_interval(secs => $7), $8, $9)
ON CONFLICT (source, event_id) DO NOTHING
RETURNING lock_token";

/// A row that exists: take it over if it was released or its lease ran out (the `UPDATE`
/// re-checks that under the row lock, so one of several racers wins), and say why not
/// otherwise — in the same round trip.
const TAKE_OVER: &str = "
WITH taken AS (
    UPDATE webhook_events
    SET locked_until = clock_timestamp() + make_interval(secs => $3), lock_token = $4,
        attempts = attempts + 1
    WHERE source = $1 AND event_id = $2 AND processed_at IS NULL
      AND (locked_until IS NULL OR locked_until <= clock_timestamp())
    RETURNING lock_token
)
SELECT EXISTS (SELECT 1 FROM taken),
       processed_at IS NOT NULL,
       (EXTRACT(EPOCH FROM (locked_until - clock_timestamp())) * 1000)::float8
FROM webhook_events WHERE source = $1 AND event_id = $2";

/// The done row keeps its token, so a retry whose first acknowledgement was lost matches
/// again (and changes nothing).
const COMPLETE: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, now()), locked_until = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3";

const RENEW: &str = "
UPDATE webhook_events SET locked_until = clock_timestamp() + make_interval(secs => $4)
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

const RELEASE: &str = "
UPDATE webhook_events SET locked_until = NULL, lock_token = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

/// As `SqliteStore`'s: done event keys older than the cutoff, and event keys given back by
/// a failed attempt first received before it. `Once` keys only by name (`PRUNE_ONCE`).
const PRUNE: &str = "
DELETE FROM webhook_events
WHERE kind = 'event'
  AND ((processed_at IS NOT NULL AND processed_at < now() - make_interval(secs => $1))
    OR (processed_at IS NULL AND next_attempt_at IS NULL
        AND received_at < now() - make_interval(secs => $1)
        AND (locked_until IS NULL OR locked_until <= now())))";

const PRUNE_ONCE: &str = "
DELETE FROM webhook_events
WHERE kind = 'once' AND source = $1
  AND processed_at IS NOT NULL AND processed_at < now() - make_interval(secs => $2)";

impl PgStore {
    /// Connects to `url` (`postgres://…`) and applies the crate's migrations.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or the migrations fail.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPool::connect(url)
            .await
            .map_err(|e| StoreError::new("postgres connect", e))?;
        Self::from_pool(pool).await
    }

    /// Uses `pool`, applying the crate's migrations (other migrations in the same database
    /// are left alone; concurrent replicas take turns through sqlx's migration lock).
    ///
    /// # Errors
    ///
    /// When the migrations fail.
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let mut migrator = sqlx::migrate!("./migrations/postgres");
        migrator.set_ignore_missing(true);
        migrator
            .run(&pool)
            .await
            .map_err(|e| StoreError::new("postgres migrate", e))?;
        Ok(Self { pool })
    }

    /// Uses `pool` as it is, without migrating: for pools whose database is known to be
    /// migrated, or to build a store lazily before the server is up.
    #[must_use]
    pub fn from_migrated_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool, for your own queries (the `webhook_events` table is the audit trail).
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl DedupeStore for PgStore {
    fn claim(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let audit = d.audit();
            let err = |e| StoreError::new("postgres claim", e);
            for _ in 0..CLAIM_TRIES {
                let inserted = sqlx::query(INSERT)
                    .bind(d.source())
                    .bind(d.id())
                    .bind(audit.event_type)
                    .bind(audit.object_id)
                    .bind(audit.livemode)
                    .bind(audit.body)
                    .bind(lease.as_secs_f64())
                    .bind(token.as_uuid())
                    .bind(d.kind())
                    .fetch_optional(&pool)
                    .await
                    .map_err(err)?;
                if inserted.is_some() {
                    return Ok(Claim::New(token));
                }
                let row = sqlx::query(TAKE_OVER)
                    .bind(d.source())
                    .bind(d.id())
                    .bind(lease.as_secs_f64())
                    .bind(token.as_uuid())
                    .fetch_optional(&pool)
                    .await
                    .map_err(err)?;
                // No row: pruned between the two statements; try the insert again.
                let Some(row) = row else { continue };
                let taken: bool = row.try_get(0).map_err(err)?;
                let done: bool = row.try_get(1).map_err(err)?;
                let remaining_ms: Option<f64> = row.try_get(2).map_err(err)?;
                if taken {
                    return Ok(Claim::New(token));
                }
                if done {
                    return Ok(Claim::Done);
                }
                if let Some(ms) = remaining_ms.filter(|ms| *ms > 0.0) {
                    return Ok(Claim::InFlight {
                        retry_after: Duration::from_secs_f64(ms / 1000.0),
                    });
                }
            }
            Ok(Claim::InFlight {
                retry_after: Duration::from_secs(1),
            })
        })
    }

    fn renew(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let renewed = sqlx::query(RENEW)
                .bind(d.source())
                .bind(d.id())
                .bind(token.as_uuid())
                .bind(lease.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("postgres renew", e))?;
            Ok(if renewed.rows_affected() == 1 {
                Renewed::Held
            } else {
                Renewed::Fenced
            })
        })
    }

    fn complete(&self, d: Delivery, token: Token) -> StoreFuture<Completed> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let done = sqlx::query(COMPLETE)
                .bind(d.source())
                .bind(d.id())
                .bind(token.as_uuid())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("postgres complete", e))?;
            Ok(if done.rows_affected() == 1 {
                Completed::Done
            } else {
                Completed::Fenced
            })
        })
    }

    fn release(&self, d: Delivery, token: Token) -> StoreFuture<()> {
        let pool = self.pool.clone();
        Box::pin(async move {
            sqlx::query(RELEASE)
                .bind(d.source())
                .bind(d.id())
                .bind(token.as_uuid())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("postgres release", e))?;
            Ok(())
        })
    }

    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        let older_than = older_than.get();
        let pool = self.pool.clone();
        Box::pin(async move {
            let pruned = sqlx::query(PRUNE)
                .bind(older_than.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("postgres prune", e))?;
            Ok(pruned.rows_affected())
        })
    }

    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        let (pool, namespace) = (self.pool.clone(), namespace.to_owned());
        Box::pin(async move {
            let pruned = sqlx::query(PRUNE_ONCE)
                .bind(namespace)
                .bind(older_than.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("postgres prune", e))?;
            Ok(pruned.rows_affected())
        })
    }
}

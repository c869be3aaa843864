//! [`SqliteStore`]: claims in an embedded SQLite database — durable across restarts, for
//! one host.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

use super::{
    Claim, Completed, DedupeStore, Delivery, Renewed, Retention, StoreError, StoreFuture, Token,
    CLAIM_TRIES,
};

/// Claims in SQLite (feature `sqlite`), in the `webhook_events` table of
/// `migrations/sqlite`. The embedded default: nothing to run beside the server, and done
/// keys survive a restart. Writes are serialized by SQLite; several processes on one host
/// may share the file, replicas on several hosts need [`PgStore`](super::PgStore).
///
/// # Clocks
///
/// Leases run on the wall clock of the processes sharing the file (one host: one clock).
/// A clock stepped *back* only delays the takeover of a crashed attempt's claim by the
/// step. A clock stepped *forward* by more than two thirds of the lease can free a live
/// claim (a running attempt renews every third of its lease, so at least two thirds
/// remain), and a retry may then run beside it — reported as
/// [`ClaimLost`](crate::dedupe::ClaimLost). NTP daemons slew small offsets rather than
/// step; keep the lease longer than any step you expect (the default 60 s covers a 40 s
/// step), or use [`PgStore`](super::PgStore), whose leases run on the database server's
/// clock.
///
/// Cloning shares the pool.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

const CLAIM: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, received_at, attempts, locked_until, lock_token, kind)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10)
ON CONFLICT (source, event_id) DO UPDATE SET
    locked_until = excluded.locked_until,
    lock_token = excluded.lock_token,
    attempts = webhook_events.attempts + 1
WHERE webhook_events.processed_at IS NULL
  AND (webhook_events.locked_until IS NULL OR webhook_events.locked_until <= ?7)
RETURNING lock_token";

const STATE: &str =
    "SELECT processed_at, locked_until FROM webhook_events WHERE source = ?1 AND event_id = ?2";

/// The done row keeps its token, so a retry whose first acknowledgement was lost matches
/// again (and changes nothing).
const COMPLETE: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4), locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3";

const RENEW: &str = "
UPDATE webhook_events SET locked_until = ?4
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

const RELEASE: &str = "
UPDATE webhook_events SET locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

/// Done event keys older than the cutoff, and event keys a failed attempt gave back
/// (released, or a lease long run out) first received before it: the provider has stopped
/// retrying those. The inbox's unprocessed rows (`next_attempt_at` set) are the inbox's to
/// prune; `Once` keys are pruned only by name (`PRUNE_ONCE`).
const PRUNE: &str = "
DELETE FROM webhook_events
WHERE kind = 'event'
  AND ((processed_at IS NOT NULL AND processed_at < ?1)
    OR (processed_at IS NULL AND next_attempt_at IS NULL AND received_at < ?1
        AND (locked_until IS NULL OR locked_until <= ?2)))";

const PRUNE_ONCE: &str = "
DELETE FROM webhook_events
WHERE kind = 'once' AND source = ?1 AND processed_at IS NOT NULL AND processed_at < ?2";

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens the database at `path` (creating it if needed) in WAL mode, and applies the
    /// crate's migrations.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or migrated.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|e| StoreError::new("sqlite options", e))?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A writer waits for another instead of failing at once.
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| StoreError::new("sqlite open", e))?;
        Self::from_pool(pool).await
    }

    /// Uses `pool`, applying the crate's migrations (other migrations in the same database
    /// are left alone).
    ///
    /// # Errors
    ///
    /// When the migrations fail.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        let mut migrator = sqlx::migrate!("./migrations/sqlite");
        migrator.set_ignore_missing(true);
        migrator
            .run(&pool)
            .await
            .map_err(|e| StoreError::new("sqlite migrate", e))?;
        Ok(Self {
            pool,
            clock: Arc::new(SystemTime::now),
        })
    }

    /// Replaces the clock leases and times are read from (default the system's): for
    /// tests that step through leases, or a clock step, without waiting.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The pool, for your own queries (the `webhook_events` table is the audit trail).
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The store's clock, for an inbox in the same database.
    pub(crate) fn clock(&self) -> Arc<dyn Fn() -> SystemTime + Send + Sync> {
        self.clock.clone()
    }

    /// Milliseconds since the epoch, by this store's clock.
    fn now_ms(&self) -> i64 {
        epoch_ms((self.clock)())
    }
}

impl DedupeStore for SqliteStore {
    fn claim(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let store = self.clone();
        Box::pin(async move {
            let (pool, audit) = (&store.pool, d.audit());
            for _ in 0..CLAIM_TRIES {
                let now = store.now_ms();
                let claimed = sqlx::query(CLAIM)
                    .bind(d.source())
                    .bind(d.id())
                    .bind(audit.event_type)
                    .bind(audit.object_id)
                    .bind(audit.livemode)
                    .bind(audit.body)
                    .bind(now)
                    .bind(now.saturating_add(ms(lease)))
                    .bind(token.to_string())
                    .bind(d.kind())
                    .fetch_optional(pool)
                    .await
                    .map_err(|e| StoreError::new("sqlite claim", e))?;
                if claimed.is_some() {
                    return Ok(Claim::New(token));
                }
                let row = sqlx::query(STATE)
                    .bind(d.source())
                    .bind(d.id())
                    .fetch_optional(pool)
                    .await
                    .map_err(|e| StoreError::new("sqlite claim", e))?;
                let Some(row) = row else { continue };
                let processed: Option<i64> = row
                    .try_get(0)
                    .map_err(|e| StoreError::new("sqlite claim", e))?;
                let until: Option<i64> = row
                    .try_get(1)
                    .map_err(|e| StoreError::new("sqlite claim", e))?;
                if processed.is_some() {
                    return Ok(Claim::Done);
                }
                if let Some(until) = until.filter(|u| *u > now) {
                    return Ok(Claim::InFlight {
                        retry_after: Duration::from_millis((until - now).unsigned_abs()),
                    });
                }
            }
            Ok(Claim::InFlight {
                retry_after: Duration::from_secs(1),
            })
        })
    }

    fn renew(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            let renewed = sqlx::query(RENEW)
                .bind(d.source())
                .bind(d.id())
                .bind(token.to_string())
                .bind(now.saturating_add(ms(lease)))
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("sqlite renew", e))?;
            Ok(if renewed.rows_affected() == 1 {
                Renewed::Held
            } else {
                Renewed::Fenced
            })
        })
    }

    fn complete(&self, d: Delivery, token: Token) -> StoreFuture<Completed> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            let done = sqlx::query(COMPLETE)
                .bind(d.source())
                .bind(d.id())
                .bind(token.to_string())
                .bind(now)
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("sqlite complete", e))?;
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
                .bind(token.to_string())
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("sqlite release", e))?;
            Ok(())
        })
    }

    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        let older_than = older_than.get();
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            let pruned = sqlx::query(PRUNE)
                .bind(now.saturating_sub(ms(older_than)))
                .bind(now)
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("sqlite prune", e))?;
            Ok(pruned.rows_affected())
        })
    }

    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        let (pool, namespace, now) = (self.pool.clone(), namespace.to_owned(), self.now_ms());
        Box::pin(async move {
            let pruned = sqlx::query(PRUNE_ONCE)
                .bind(namespace)
                .bind(now.saturating_sub(ms(older_than)))
                .execute(&pool)
                .await
                .map_err(|e| StoreError::new("sqlite prune", e))?;
            Ok(pruned.rows_affected())
        })
    }
}

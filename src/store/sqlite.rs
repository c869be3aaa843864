//! [`SqliteStore`]: claims in an embedded SQLite database — durable across restarts, for
//! one host.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::StoreError;
use crate::sql::sqlite::Sqlite;
use crate::sql::{migrate_error, store_error};

/// Claims in SQLite (feature `sqlite`), in the `webhook_events` table of
/// `migrations/sqlite`. The embedded default: nothing to run beside the server, and done
/// keys survive a restart. Writes are serialized by SQLite; several processes on one host
/// may share the file, replicas on several hosts need [`PgStore`].
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
/// step), or use [`PgStore`], whose leases run on the database server's
/// clock.
///
/// # Writes
///
/// Every write on the table — claims, renewals, completions, releases, and the inbox's
/// accepts, claims, outcomes, requeues and prunes — goes through one writer, on a
/// connection of its own, in one transaction per batch: one commit for many events, and
/// no write of this process waits on SQLite's lock behind another of this process. A
/// batch takes the writes that keep or end a running lease (renewals, completions,
/// releases, a worker's claim and outcomes) before new claims and accepts, so a renewal
/// waits for at most the batch in flight, never behind a storm's backlog. Lease times are
/// read once the batch holds the write lock, so a lease granted after a wait is whole.
///
/// When another process holds the file's write lock, a batch waits up to the busy timeout
/// (5 s; [`with_busy_timeout`](Self::with_busy_timeout)) and then answers each of its
/// writes with an error (503, so the provider retries); a write queued behind it waits
/// for its own batch in turn, so up to twice that in all. Hence the shortest lease the
/// layers accept here: four busy timeouts ([`DedupeStore::min_lease`]).
///
/// [`DedupeStore::min_lease`]: super::DedupeStore::min_lease
///
/// The writer runs on the Tokio runtime of the first write; if that runtime ends, the
/// next write starts it again on its own.
///
/// Cloning shares the pool.
///
#[cfg_attr(feature = "postgres", doc = "[`PgStore`]: super::PgStore")]
#[cfg_attr(not(feature = "postgres"), doc = "[`PgStore`]: crate#features")]
#[derive(Clone, Debug)]
pub struct SqliteStore {
    sql: Sqlite,
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
            .map_err(|e| store_error("sqlite options", e))?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Every commit reaches the disk before a 2xx: what group commit amortises.
            .synchronous(SqliteSynchronous::Full)
            // Checkpoint every ~40 MB of WAL, not SQLite's 4 MB: each one stalls the one
            // writer, and under a storm the default ran several a second (p99 14–45 ms
            // with it, 13–21 ms without, in `benches/throughput`).
            .pragma("wal_autocheckpoint", "10000")
            // A writer waits for another instead of failing at once.
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| store_error("sqlite open", e))?;
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
            .map_err(|e| migrate_error("sqlite migrate", e))?;
        // The pool's options set it on each connection; the writer opens its own with them.
        let busy_ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&pool)
            .await
            .map_err(|e| store_error("sqlite busy timeout", e))?;
        let busy_timeout = Duration::from_millis(busy_ms.unsigned_abs());
        Ok(Self {
            sql: Sqlite::new(pool, Arc::new(SystemTime::now), busy_timeout),
        })
    }

    /// Replaces how long a write waits for another process's lock on the file before it
    /// answers 503 (default: the pool's, 5 s from [`open`](Self::open)). The shortest
    /// lease the layers accept on this store is four times it
    /// ([`min_lease`](super::DedupeStore::min_lease)): lower it for short leases, on a file
    /// no other process holds long.
    #[must_use]
    pub fn with_busy_timeout(self, busy_timeout: Duration) -> Self {
        Self {
            sql: self.sql.with_busy_timeout(busy_timeout),
        }
    }

    /// Replaces the clock leases and times are read from (default the system's): for
    /// tests that step through leases, or a clock step, without waiting.
    #[must_use]
    pub fn with_clock(self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        Self {
            sql: self.sql.with_clock(Arc::new(clock)),
        }
    }

    /// The pool, for your own queries (`webhook_events` keeps each key's type, object id,
    /// livemode and times; a claim row keeps no body).
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        self.sql.pool()
    }

    /// The table, for an inbox in the same database.
    pub(crate) fn sql(&self) -> &Sqlite {
        &self.sql
    }
}

super::sql::sql_dedupe_store!(SqliteStore, {
    /// Four busy timeouts (20 s by default): see
    /// [`DedupeStore::min_lease`](super::DedupeStore::min_lease).
    fn min_lease(&self) -> Duration {
        self.sql.min_lease()
    }
});

//! [`PgStore`]: claims in PostgreSQL, shared by every replica of a service.

use sqlx::postgres::PgPool;

use super::StoreError;
use crate::sql::postgres::Pg;
use crate::sql::{migrate_error, store_error};

/// Claims in PostgreSQL (feature `postgres`), in the `webhook_events` table of
/// `migrations/postgres`. Any number of replicas share it; leases run on the database
/// server's clock (`clock_timestamp()`, not the transaction's start: a claim that waited
/// on a lock still gets its whole lease), so replicas' clocks do not matter. A new event's claim is one round trip
/// (`INSERT … ON CONFLICT DO NOTHING RETURNING`); a duplicate takes a second, which takes
/// over an expired claim or tells *done* from *in flight*, and writes nothing otherwise.
///
/// Under load, concurrent claims and completions (and an inbox's accepts) go out together,
/// one statement and one commit a batch, on up to three connections the store keeps for
/// its batches and an inbox worker's claims beside the pool's (taken out of it, at most a
/// third of the pool's `max_connections`: count them in the server's; closing the pool
/// closes them at the next write).
///
/// Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct PgStore {
    sql: Pg,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) and applies the crate's migrations.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or the migrations fail.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPool::connect(url)
            .await
            .map_err(|e| store_error("postgres connect", e))?;
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
            .map_err(|e| migrate_error("postgres migrate", e))?;
        Ok(Self::from_migrated_pool(pool))
    }

    /// Uses `pool` as it is, without migrating: for pools whose database is known to be
    /// migrated, or to build a store lazily before the server is up.
    #[must_use]
    pub fn from_migrated_pool(pool: PgPool) -> Self {
        Self { sql: Pg::new(pool) }
    }

    /// The pool, for your own queries (`webhook_events` keeps each key's type, object id,
    /// livemode and times; a claim row keeps no body).
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        self.sql.pool()
    }

    /// The table, for an inbox on the same database.
    pub(crate) fn sql(&self) -> &Pg {
        &self.sql
    }
}

super::sql::sql_dedupe_store!(PgStore);

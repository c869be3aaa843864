//! Every store the crate ships, opened fresh for a test: a memory store, a SQLite file of
//! its own, a PostgreSQL database of its own, a Redis key prefix of its own.

use std::sync::Arc;

use tower_webhook::store::{DedupeStore, MemoryStore, PgStore, RedisStore, SqliteStore};

/// Which store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Sqlite,
    Postgres,
    Redis,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Memory, Kind::Sqlite, Kind::Postgres, Kind::Redis];

    /// Whether `prune` deletes done event keys (Redis expires them by itself instead).
    pub fn prunes(self) -> bool {
        self != Kind::Redis
    }

    /// Whether a claim whose lease ran out may be forgotten (Redis expires the key, memory
    /// sweeps it); the SQL stores keep the row under its token until another claim.
    pub fn forgets_lapsed_claims(self) -> bool {
        matches!(self, Kind::Memory | Kind::Redis)
    }
}

/// A fresh SQLite file's path.
pub fn temp_sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "tower-webhook-test-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}

/// A fresh file no other process opens: a 50 ms busy timeout puts the store's lease floor
/// (four busy timeouts) at 200 ms, under the models' short leases.
pub async fn sqlite() -> SqliteStore {
    SqliteStore::open(temp_sqlite_path())
        .await
        .unwrap()
        .with_busy_timeout(std::time::Duration::from_millis(50))
}

pub async fn postgres() -> PgStore {
    PgStore::connect(&super::fresh_pg_url().await)
        .await
        .unwrap()
}

/// A prefix of its own, on the shared server.
pub async fn redis() -> RedisStore {
    let prefix = format!("tower-webhook-test:{}:", uuid::Uuid::new_v4().simple());
    RedisStore::connect(&super::redis_url())
        .await
        .expect("Redis must be running (.ci/services starts it)")
        .with_prefix(&prefix)
}

/// A fresh store of `kind`.
pub async fn open(kind: Kind) -> Arc<dyn DedupeStore> {
    match kind {
        Kind::Memory => Arc::new(MemoryStore::new()),
        Kind::Sqlite => Arc::new(sqlite().await),
        Kind::Postgres => Arc::new(postgres().await),
        Kind::Redis => Arc::new(redis().await),
    }
}

//! The inbox's database, opened from a URL: PostgreSQL, or an existing SQLite file.

use std::path::Path;
use std::time::Duration;

use tower_webhook::inbox::{Inbox, ProcessorSpec};
use tower_webhook::store::{PgStore, SqliteStore, StoreError, StoreErrorKind};

use crate::failure::Failure;

/// A failed connection: a URL that does not parse is the input's fault (exit 2), the
/// rest the server's (exit 1).
fn connect_error(e: sqlx::Error) -> StoreError {
    let kind = match e {
        sqlx::Error::Configuration(_) => StoreErrorKind::InvalidInput,
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::new("postgres connect", e).with_kind(kind)
}

/// The database `url` names, opened as it is.
pub(crate) enum Database {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// A processor's next name after `$1`/`?1` among the routes a predicate keeps, read from
/// the partial index that starts with `processor` (a skip scan: as many index probes as
/// processors, not a read of every route).
macro_rules! next_name {
    ($after:literal, $routes:literal) => {
        concat!(
            "(SELECT processor FROM webhook_routes WHERE processor > ",
            $after,
            " AND ",
            $routes,
            " ORDER BY processor LIMIT 1)"
        )
    };
}

/// The processors with routes: queued, processing or failing ones (`webhook_routes_due`),
/// dead ones (`webhook_routes_dead_by`), and processed ones (the processed counter: a
/// route processed and since deleted is no longer counted), `$processed` the dialect's
/// read of that counter.
macro_rules! routed {
    ($processed:literal) => {
        concat!(
            "WITH RECURSIVE due(name) AS (SELECT ",
            next_name!(
                "''",
                "next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL"
            ),
            " UNION ALL SELECT ",
            next_name!(
                "due.name",
                "next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL"
            ),
            " FROM due WHERE due.name IS NOT NULL), dead(name) AS (SELECT ",
            next_name!("''", "dead_at IS NOT NULL AND next_attempt_at IS NOT NULL"),
            " UNION ALL SELECT ",
            next_name!(
                "dead.name",
                "dead_at IS NOT NULL AND next_attempt_at IS NOT NULL"
            ),
            " FROM dead WHERE dead.name IS NOT NULL) ",
            "SELECT name FROM due WHERE name IS NOT NULL ",
            "UNION SELECT name FROM dead WHERE name IS NOT NULL UNION ",
            $processed,
            " ORDER BY 1"
        )
    };
}

const SQLITE_ROUTED: &str =
    routed!("SELECT processor FROM webhook_route_counts WHERE processed > 0");
const POSTGRES_ROUTED: &str =
    routed!("SELECT processor FROM webhook_counts GROUP BY processor HAVING sum(delta) > 0");

impl Database {
    /// The inbox of the processor `default` alone: what every command without a processor
    /// needs (listings, requeues and events read every processor's routes all the same).
    pub(crate) fn inbox(&self) -> Inbox {
        match self {
            Database::Sqlite(store) => Inbox::sqlite(store),
            Database::Postgres(store) => Inbox::postgres(store),
        }
    }

    /// The inbox of the processors `names` (`default`'s alone when empty).
    pub(crate) fn inbox_of(&self, names: &[String]) -> Result<Inbox, Failure> {
        if names.is_empty() {
            return Ok(self.inbox());
        }
        // Only the names matter: the CLI accepts nothing, so no filter is ever evaluated.
        let specs = names.iter().map(|name| ProcessorSpec::new(name.as_str()));
        let inbox = specs
            .collect::<Result<Vec<_>, _>>()
            .and_then(|specs| self.inbox().with_processors(specs));
        inbox.map_err(|e| Failure::Store(format!("a processor in the database: {e}")))
    }

    /// The names of the processors that have routes in the database, in order.
    pub(crate) async fn routed(&self) -> Result<Vec<String>, Failure> {
        let names = match self {
            Database::Sqlite(store) => {
                sqlx::query_scalar(SQLITE_ROUTED)
                    .fetch_all(store.pool())
                    .await
            }
            Database::Postgres(store) => {
                sqlx::query_scalar(POSTGRES_ROUTED)
                    .fetch_all(store.pool())
                    .await
            }
        };
        names.map_err(|e| Failure::from(StoreError::new("inbox processors", e)))
    }
}

/// The database `url` names, opened as it is.
pub(crate) async fn open(url: &str) -> Result<Database, Failure> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // One connection first: a pool retries until its timeout and then names only
        // the timeout, where this says why (refused, authentication, no such database).
        use sqlx::Connection as _;
        sqlx::PgConnection::connect(url)
            .await
            .map_err(connect_error)?
            .close()
            .await
            .map_err(connect_error)?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(connect_error)?;
        // Migrated by the application; an operator's command changes no schema.
        return Ok(Database::Postgres(PgStore::from_migrated_pool(pool)));
    }
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    if !Path::new(path).is_file() {
        return Err(Failure::Store(format!(
            "no SQLite database at {path} (give an existing file, or a postgres:// URL)"
        )));
    }
    // The store's own open: WAL and busy timeout as the application has them, and its
    // migrations (none to run on a file the application keeps current).
    Ok(Database::Sqlite(SqliteStore::open(path).await?))
}

//! The inbox's database, opened from a URL: PostgreSQL, or an existing SQLite file.

use std::path::Path;
use std::time::Duration;

use tower_webhook::inbox::Inbox;
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

/// The inbox in the database `url` names, opened as it is.
pub(crate) async fn open(url: &str) -> Result<Inbox, Failure> {
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
        return Ok(Inbox::postgres(&PgStore::from_migrated_pool(pool)));
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
    Ok(Inbox::sqlite(&SqliteStore::open(path).await?))
}

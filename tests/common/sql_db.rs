//! A fresh SQL database of either dialect with the inbox on it, read by SQL beside it:
//! for tests of what the inbox leaves in its tables. Their events are `order.paid`s,
//! delivered signed through the inbox's HTTP service.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::FromRow;
use tower::ServiceExt as _;
use tower_webhook::inbox::Inbox;
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use super::seed::SECRET;
use super::{at, verifier, NOW};

/// A fresh database of either dialect, with where it lives (SQLite's file, PostgreSQL's
/// URL).
pub enum Db {
    Sqlite(SqliteStore, PathBuf),
    Pg(PgStore, String),
}

impl Db {
    /// A fresh file no other process opens, with [`super::stores::sqlite`]'s busy timeout.
    pub async fn sqlite() -> Self {
        let path = super::stores::temp_sqlite_path();
        let store = SqliteStore::open(&path).await.unwrap();
        Db::Sqlite(store.with_busy_timeout(Duration::from_millis(50)), path)
    }

    pub async fn postgres() -> Self {
        Db::open_postgres(&super::fresh_pg_url().await).await
    }

    /// The SQLite file at `path`, as another process left it.
    pub async fn open_sqlite(path: &Path) -> Self {
        Db::Sqlite(SqliteStore::open(path).await.unwrap(), path.to_owned())
    }

    /// The PostgreSQL database at `url`, as another process left it.
    pub async fn open_postgres(url: &str) -> Self {
        Db::Pg(PgStore::connect(url).await.unwrap(), url.to_owned())
    }

    /// An inbox on it, without keys.
    pub fn inbox(&self) -> Inbox {
        match self {
            Db::Sqlite(store, _) => Inbox::sqlite(store),
            Db::Pg(store, _) => Inbox::postgres(store),
        }
    }

    /// A number the statement answers.
    pub async fn number(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Sqlite(store, _) => sqlx::query_scalar(sql).fetch_one(store.pool()).await,
            Db::Pg(store, _) => sqlx::query_scalar(sql).fetch_one(store.pool()).await,
        }
        .unwrap()
    }

    /// The rows the statement answers, as stored (nothing opened).
    pub async fn rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Sqlite(store, _) => sqlx::query_as(sql).fetch_all(store.pool()).await,
            Db::Pg(store, _) => sqlx::query_as(sql).fetch_all(store.pool()).await,
        }
        .unwrap()
    }

    /// The first column of the statement's rows, as text.
    pub async fn texts(&self, sql: &str) -> Vec<String> {
        let rows: Vec<(String,)> = self.rows(sql).await;
        rows.into_iter().map(|(text,)| text).collect()
    }

    /// Runs a statement: how many rows it changed.
    pub async fn run(&self, sql: &str) -> u64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Sqlite(store, _) => sqlx::query(sql)
                .execute(store.pool())
                .await
                .map(|done| done.rows_affected()),
            Db::Pg(store, _) => sqlx::query(sql)
                .execute(store.pool())
                .await
                .map(|done| done.rows_affected()),
        }
        .unwrap()
    }

    /// Deletes the database: SQLite's file with its WAL, PostgreSQL's database.
    pub async fn drop_database(self) {
        match self {
            Db::Sqlite(store, path) => {
                drop(store);
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Db::Pg(store, url) => {
                store.pool().close().await;
                let name = url.rsplit('/').next().unwrap().to_owned();
                let admin = sqlx::PgPool::connect(&url.replace(&name, "postgres"))
                    .await
                    .unwrap();
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&admin)
                .await;
            }
        }
    }
}

/// The body of the `order.paid` event `id`.
pub fn order_body(id: &str) -> String {
    format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"pi_{id}"}}}}}}"#)
}

/// A signed delivery of `id`, verified: what the inbox's accept takes.
pub fn order_event(id: &str) -> Event {
    let body = order_body(id);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

/// Accepts `id` through the inbox's HTTP service, its headers stored, `x-customer`
/// among them holding `customer`.
pub async fn deliver_order(inbox: &Inbox, id: &str, customer: &str) {
    let body = order_body(id);
    let mut headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    headers.insert("x-customer", customer.parse().unwrap());
    let req: http::Request<http_body_util::Full<Bytes>> = super::request(headers, body);
    let svc = tower::ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(inbox.accept_service());
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 204);
}

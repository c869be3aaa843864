//! A fresh SQL database of either dialect with the inbox on it, read by SQL beside it:
//! for tests of what the inbox leaves in its tables. Their events are `order.paid`s,
//! delivered signed through the inbox's HTTP service.

use bytes::Bytes;
use tower::ServiceExt as _;
use tower_webhook::inbox::Inbox;
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use super::seed::SECRET;
use super::{at, verifier, NOW};

/// A fresh database of either dialect.
pub enum Db {
    Sqlite(SqliteStore),
    Pg(PgStore),
}

impl Db {
    pub async fn sqlite() -> Self {
        Db::Sqlite(super::stores::sqlite().await)
    }

    pub async fn postgres() -> Self {
        Db::Pg(super::stores::postgres().await)
    }

    pub fn inbox(&self) -> Inbox {
        match self {
            Db::Sqlite(store) => Inbox::sqlite(store),
            Db::Pg(store) => Inbox::postgres(store),
        }
    }

    /// A number the statement answers.
    pub async fn number(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Sqlite(store) => sqlx::query_scalar(sql).fetch_one(store.pool()).await,
            Db::Pg(store) => sqlx::query_scalar(sql).fetch_one(store.pool()).await,
        }
        .unwrap()
    }

    /// Runs a statement.
    pub async fn run(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Sqlite(store) => sqlx::query(sql).execute(store.pool()).await.map(drop),
            Db::Pg(store) => sqlx::query(sql).execute(store.pool()).await.map(drop),
        }
        .unwrap()
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

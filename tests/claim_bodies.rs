//! Payload protection (issue 34, step 7): a `DedupeLayer` or `TxDedupeLayer` claim row
//! keeps no body. A canary in the bodies of requests handled through them — new claims
//! (batched), a claim released by a failed attempt and taken over by its retry, a
//! duplicate, `TxDedupeLayer`'s done rows — never reaches the SQLite file or its WAL, nor
//! PostgreSQL's data (`pg_dump --data-only`, a raw select). A row as older versions wrote
//! it (its body kept) is found by the same searches: they can fail.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use common::stores::temp_sqlite_path;
use common::{fresh_pg_url, post as http_post, signed_headers};
use http::{HeaderMap, HeaderValue, StatusCode};
use tower::ServiceBuilder;
use tower_webhook::dedupe::TxDedupeLayer;
use tower_webhook::store::{DedupeStore, PgStore, SqliteStore};
use tower_webhook::{DedupeLayer, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How many new events each layer gets at once (PostgreSQL gathers their claims into
/// `CLAIM_AND_COMPLETE_MANY` batches).
const AT_ONCE: usize = 16;

fn verify() -> VerifyWebhookLayer {
    VerifyWebhookLayer::new(Verifier::new(Scheme::standard(), [SECRET]).unwrap())
}

/// 500 when `x-behave: fail` (the claim is released), else 204.
async fn handler(headers: HeaderMap) -> StatusCode {
    match headers.get("x-behave").and_then(|v| v.to_str().ok()) {
        Some("fail") => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::NO_CONTENT,
    }
}

/// Serves `app` on a port of its own: the URL to post to.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn dedupe_app(store: Arc<dyn DedupeStore>) -> String {
    let layers = ServiceBuilder::new()
        .layer(verify())
        .layer(DedupeLayer::from_arc(store));
    serve(Router::new().route("/webhooks", post(handler).layer(layers))).await
}

/// A random canary, unique to one test.
fn new_canary() -> String {
    format!("canary-{}", uuid::Uuid::new_v4().simple())
}

/// Posts event `id` whose body carries `canary`: the response's status.
async fn deliver(url: &str, id: &str, canary: &str, behave: &str) -> StatusCode {
    let body = format!(r#"{{"type":"order.paid","data":{{"id":"{id}","email":"{canary}"}}}}"#);
    let mut headers = signed_headers(&Scheme::standard(), SECRET, id, body.as_bytes());
    headers.insert("x-behave", HeaderValue::from_str(behave).unwrap());
    http_post(url, headers, body.into_bytes()).await.unwrap().0
}

/// Every path of a claim on `url`, with `prefix`ed ids: `AT_ONCE` new events at once; a
/// failed attempt (released) and its retry (taken over); a duplicate of a done event.
async fn claim_every_way(url: &str, prefix: &str, canary: &str) {
    let new = (0..AT_ONCE).map(|i| {
        let id = format!("{prefix}_{i}");
        async move { deliver(url, &id, canary, "ok").await }
    });
    for status in futures_util::future::join_all(new).await {
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let failed = format!("{prefix}_failed");
    let status = deliver(url, &failed, canary, "fail").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        deliver(url, &failed, canary, "ok").await,
        StatusCode::NO_CONTENT
    );
    let again = deliver(url, &format!("{prefix}_0"), canary, "ok").await;
    assert_eq!(again, StatusCode::NO_CONTENT, "a duplicate");
}

/// Whether `bytes` hold `needle`.
fn holds(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// Whether the file at `path` holds `needle` (a missing file holds nothing).
fn file_holds(path: &Path, needle: &str) -> bool {
    std::fs::read(path).is_ok_and(|bytes| holds(&bytes, needle.as_bytes()))
}

fn wal(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", path.display()))
}

#[tokio::test]
async fn sqlite_claim_rows_keep_no_body() {
    let path = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.unwrap();
    let url = dedupe_app(Arc::new(store.clone())).await;
    let canary = new_canary();
    claim_every_way(&url, "evt_sqlite", &canary).await;

    assert!(!file_holds(&path, &canary), "the database file");
    assert!(!file_holds(&wal(&path), &canary), "the WAL");
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(!file_holds(&path, &canary), "the file, checkpointed");
    let (rows, bodies): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(body) FROM webhook_events")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        (rows, bodies),
        (AT_ONCE as i64 + 1, 0),
        "the rows, none with a body"
    );

    // The searches can fail: a claim row as older versions wrote it, its body kept, is
    // found in the WAL, then in the file once checkpointed.
    let old = format!("old-{}", new_canary());
    sqlx::query(
        "INSERT INTO webhook_events (source, event_id, event_type, livemode, body,
             received_at, attempts, processed_at, kind)
         VALUES ('standard', 'evt_old', 'order.paid', NULL, ?1, 0, 1, 0, 'event')",
    )
    .bind(old.as_bytes())
    .execute(store.pool())
    .await
    .unwrap();
    assert!(
        file_holds(&wal(&path), &old),
        "an old row's body, in the WAL"
    );
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(file_holds(&path, &old), "an old row's body, in the file");
    store.pool().close().await;
    for file in [path.clone(), wal(&path)] {
        let _ = std::fs::remove_file(file);
    }
}

/// The database's data as `pg_dump --data-only` writes it.
async fn pg_dump(url: &str) -> String {
    let out = tokio::process::Command::new("pg_dump")
        .args(["--data-only", "--dbname", url])
        .output()
        .await
        .expect("pg_dump runs (PostgreSQL's client tools)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Whether a dump holds `canary`, in clear (text) or as a `bytea`'s hex.
fn dump_holds(dump: &str, canary: &str) -> bool {
    let hex: String = canary.bytes().map(|b| format!("{b:02x}")).collect();
    dump.contains(canary) || dump.contains(&hex)
}

/// Rows of `webhook_events` whose body, or any other column as text, holds `canary`.
async fn rows_holding(pool: &sqlx::PgPool, canary: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM webhook_events e
         WHERE position(convert_to($1, 'UTF8') IN coalesce(e.body, ''::bytea)) > 0
            OR strpos(e::text, $1) > 0",
    )
    .bind(canary)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn postgres_claim_rows_keep_no_body() {
    let db = fresh_pg_url().await;
    let store = PgStore::connect(&db).await.unwrap();
    let pool = store.pool().clone();
    let canary = new_canary();
    let url = dedupe_app(Arc::new(store)).await;
    claim_every_way(&url, "evt_pg", &canary).await;
    // `TxDedupeLayer`'s done rows, on the same table.
    let tx = TxDedupeLayer::new(pool.clone()).await.unwrap();
    let layers = ServiceBuilder::new().layer(verify()).layer(tx);
    let tx_url = serve(Router::new().route("/webhooks", post(handler).layer(layers))).await;
    claim_every_way(&tx_url, "evt_tx", &canary).await;

    assert!(
        !dump_holds(&pg_dump(&db).await, &canary),
        "pg_dump --data-only"
    );
    assert_eq!(rows_holding(&pool, &canary).await, 0, "a raw select");
    let (rows, bodies): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(body) FROM webhook_events")
            .fetch_one(&pool)
            .await
            .unwrap();
    let claimed = 2 * (AT_ONCE as i64 + 1);
    assert_eq!((rows, bodies), (claimed, 0), "the rows, none with a body");

    // The searches can fail: a claim row as older versions wrote it, its body kept.
    let old = format!("old-{}", new_canary());
    sqlx::query(
        "INSERT INTO webhook_events (source, event_id, event_type, body, attempts,
             processed_at, kind)
         VALUES ('standard', 'evt_old', 'order.paid', $1, 1, now(), 'event')",
    )
    .bind(old.as_bytes())
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows_holding(&pool, &old).await,
        1,
        "an old row's body, selected"
    );
    assert!(
        dump_holds(&pg_dump(&db).await, &old),
        "an old row's body, dumped"
    );
}

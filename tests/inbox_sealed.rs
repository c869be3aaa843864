//! The SQL inbox with a key ring (issue 34 step 2, `docs/design/payload-protection.md`
//! §3–§5), on SQLite and PostgreSQL, each on a fresh database:
//!
//! - a canary — random, in a body, a stored header and a processor's error — is nowhere
//!   at rest with keys (SQLite's file and its WAL read raw, before and after a
//!   checkpoint; PostgreSQL's `pg_dump --data-only` and a raw read of the tables), and is
//!   found there without keys (the search can see plaintext), while the API reads it back
//!   opened; the bodies (JSON with repeated lines) are stored compressed before sealing,
//!   shorter than their plaintext, unless the ring is `without_compression`;
//! - a body sealed under a key the inbox no longer has ends dead with the reason, never
//!   run, and runs once requeued with the key configured again;
//! - a ciphertext moved from one row to another by SQL does not open (the associated
//!   data): dead, never run;
//! - a panicking processor's route reads "the processor panicked" in clear in the raw
//!   rows (the crate's own text, no payload), while a processor's error is sealed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{BodyState, Inbox, Requeue, State, Worker};
use tower_webhook::seal::{Key, KeyRing};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use common::seed::SECRET;
use common::sql_db::Db;

fn ring(keys: &[(&str, u8)]) -> KeyRing {
    KeyRing::new(keys.iter().map(|(id, b)| Key::new(*id, [*b; 32]).unwrap())).unwrap()
}

/// Every byte at rest, as a reader of the database's storage sees it: SQLite's file
/// and WAL (before and after a checkpoint); PostgreSQL's `pg_dump --data-only` and
/// each table's rows as text.
async fn at_rest(db: &Db) -> Vec<u8> {
    match db {
        Db::Sqlite(store, path) => {
            let mut all = Vec::new();
            for suffix in ["", "-wal"] {
                all.extend(
                    std::fs::read(format!("{}{suffix}", path.display())).unwrap_or_default(),
                );
            }
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(store.pool())
                .await
                .unwrap();
            all.extend(std::fs::read(path).unwrap());
            all
        }
        Db::Pg(store, url) => {
            let dump = std::process::Command::new("pg_dump")
                .args(["--data-only", "--dbname", url])
                .output()
                .expect("pg_dump runs");
            assert!(
                dump.status.success(),
                "{}",
                String::from_utf8_lossy(&dump.stderr)
            );
            let mut all = dump.stdout;
            for table in [
                "webhook_events",
                "webhook_bodies",
                "webhook_routes",
                "webhook_attempts",
            ] {
                let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT t::text FROM {table} t"
                )))
                .fetch_all(store.pool())
                .await
                .unwrap();
                all.extend(rows.join("\n").into_bytes());
            }
            all
        }
    }
}

/// Posts a signed delivery of `id` with `body` and the header `x-customer: customer`.
async fn deliver(inbox: &Inbox, id: &str, body: &str, customer: &str) {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(common::verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(inbox.accept_service());
    let mut headers = Scheme::standard()
        .sign([SECRET], id, common::at(common::NOW), body.as_bytes())
        .unwrap();
    headers.insert("x-customer", customer.parse().unwrap());
    let req: http::Request<Full<Bytes>> = common::request(headers, body.to_owned());
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 204);
}

/// The ids and bodies a processor was given.
type Seen = Arc<Mutex<Vec<(String, Bytes)>>>;

/// A worker recording what it runs; `evt_fail` fails with `error`.
fn worker(inbox: &Inbox, seen: &Seen, error: String) -> tower_webhook::inbox::WorkerHandle {
    let seen = seen.clone();
    Worker::new(inbox, move |e: Event, _| {
        let id = e.id().unwrap().to_owned();
        seen.lock().unwrap().push((id.clone(), e.body().clone()));
        let error = error.clone();
        async move {
            match id.as_str() {
                "evt_fail" => Err(error),
                _ => Ok(()),
            }
        }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Accepts two events holding the canary (body, header), processes one and fails the
/// other with an error quoting it; reads them back through the API; answers whether
/// the canary (or its hex, as `pg_dump` prints `bytea`) is anywhere at rest. With keys,
/// each stored body is shorter than its plaintext when the ring compresses, one byte
/// and a tag longer when it does not.
async fn canary_at_rest(db: &Db, keys: Option<KeyRing>) -> bool {
    let canary = format!("canary-{}", uuid::Uuid::new_v4().simple());
    let compresses = keys.as_ref().map(KeyRing::compresses);
    let inbox = match keys {
        Some(keys) => db.inbox().with_keys(keys),
        None => db.inbox(),
    };
    let lines = [r#"{"sku":"tea","qty":1}"#; 40].join(",");
    let body = |id: &str| {
        format!(
            r#"{{"type":"order.paid","id":"{id}","email":"{canary}@example.com","lines":[{lines}]}}"#
        )
    };
    deliver(&inbox, "evt_ok", &body("evt_ok"), &canary).await;
    deliver(&inbox, "evt_fail", &body("evt_fail"), &canary).await;
    let seen = Seen::default();
    let running = worker(&inbox, &seen, format!("invalid type: string \"{canary}\""));
    common::seed::eventually("one processed, one failed", async || {
        let failing = inbox.event("standard", "evt_fail").await.unwrap().unwrap();
        let counts = inbox.counts().await.unwrap();
        counts.processed == 1 && failing.summary.last_error.is_some()
    })
    .await;
    running.shutdown().await;
    // The processor had the plaintext; the API reads everything back opened.
    assert!(seen.lock().unwrap().iter().all(|(id, b)| b == &body(id)));
    let failing = inbox.event("standard", "evt_fail").await.unwrap().unwrap();
    assert_eq!(failing.body_state, BodyState::Stored);
    assert_eq!(failing.body, body("evt_fail"));
    assert!(failing
        .headers
        .contains(&("x-customer".to_owned(), canary.clone())));
    let error = format!("invalid type: string \"{canary}\"");
    assert_eq!(failing.summary.last_error.as_deref(), Some(error.as_str()));
    assert_eq!(failing.attempts[0].error.as_deref(), Some(error.as_str()));
    let page = inbox
        .list(&tower_webhook::inbox::Listing::failing())
        .await
        .unwrap();
    assert_eq!(page.events[0].last_error.as_deref(), Some(error.as_str()));

    let plaintext = i64::try_from(body("evt_fail").len()).unwrap(); // the longer id
    let longest = db
        .number("SELECT CAST(max(length(body)) AS BIGINT) FROM webhook_bodies")
        .await;
    match compresses {
        Some(true) => assert!(longest < plaintext / 2, "{longest} of {plaintext}"),
        Some(false) => assert_eq!(longest, plaintext + 1 + 16, "a frame byte and the tag"),
        None => assert_eq!(longest, plaintext),
    }

    let rest = at_rest(db).await;
    contains(&rest, canary.as_bytes()) || contains(&rest, hex::encode(&canary).as_bytes())
}

async fn canary(db: impl AsyncFn() -> Db) {
    let clear = db().await;
    assert!(
        canary_at_rest(&clear, None).await,
        "without keys the search sees plaintext"
    );
    clear.drop_database().await;
    for keys in [ring(&[("k1", 1)]), ring(&[("k1", 1)]).without_compression()] {
        let sealed = db().await;
        assert!(
            !canary_at_rest(&sealed, Some(keys)).await,
            "with keys: no canary at rest"
        );
        sealed.drop_database().await;
    }
}

/// Accepted under k1; an inbox with k2 alone ends it dead with the reason, never run; one
/// with k2 and k1 requeues and runs it, the plaintext to the processor.
async fn unknown_key_then_restored(db: Db) {
    let body = r#"{"type":"order.paid","email":"ada@example.com"}"#;
    deliver(
        &db.inbox().with_keys(ring(&[("k1", 1)])),
        "evt_1",
        body,
        "ada",
    )
    .await;
    let without = db.inbox().with_keys(ring(&[("k2", 2)]));
    let seen = Seen::default();
    let running = worker(&without, &seen, String::new());
    common::seed::eventually("dead", async || without.counts().await.unwrap().dead == 1).await;
    running.shutdown().await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "never given to the processor"
    );
    let dead = without.event("standard", "evt_1").await.unwrap().unwrap();
    assert_eq!(dead.summary.state, State::Dead);
    assert_eq!(
        dead.summary.last_error.as_deref(),
        Some("the body cannot be opened: sealed under key \"k1\", which no configured key has")
    );
    assert_eq!(
        (dead.body_state, dead.key_id.as_deref()),
        (BodyState::Unreadable, Some("k1"))
    );
    assert!(dead.body.is_empty() && dead.headers.is_empty());

    let restored = db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)]));
    assert_eq!(restored.requeue(Requeue::dead()).await.unwrap(), 1);
    let running = worker(&restored, &seen, String::new());
    common::seed::eventually("processed", async || {
        restored.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    assert_eq!(
        *seen.lock().unwrap(),
        [("evt_1".to_owned(), Bytes::from(body))]
    );
    db.drop_database().await;
}

/// evt_a's body replaced by evt_b's ciphertext and nonce: tampered, dead, never run; evt_b
/// runs.
async fn swapped_ciphertext_is_dead(db: Db) {
    let inbox = db.inbox().with_keys(ring(&[("k1", 1)]));
    deliver(&inbox, "evt_a", r#"{"type":"a"}"#, "a").await;
    deliver(&inbox, "evt_b", r#"{"type":"b"}"#, "b").await;
    let moved = db
        .run(
            "UPDATE webhook_bodies SET
                 body = (SELECT body FROM webhook_bodies WHERE event_id = 'evt_b'),
                 body_nonce = (SELECT body_nonce FROM webhook_bodies WHERE event_id = 'evt_b')
             WHERE event_id = 'evt_a'",
        )
        .await;
    assert_eq!(moved, 1);
    let seen = Seen::default();
    let running = worker(&inbox, &seen, String::new());
    common::seed::eventually("one processed, one dead", async || {
        let counts = inbox.counts().await.unwrap();
        (counts.processed, counts.dead) == (1, 1)
    })
    .await;
    running.shutdown().await;
    let ran: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(ran, ["evt_b"]);
    let a = inbox.event("standard", "evt_a").await.unwrap().unwrap();
    assert_eq!(
        (a.summary.state, a.body_state),
        (State::Dead, BodyState::Unreadable)
    );
    let reason = a.summary.last_error.unwrap();
    assert!(
        reason
            .starts_with("the body cannot be opened: sealed under key \"k1\" but it does not open"),
        "{reason}"
    );
    db.drop_database().await;
}

/// With a ring, `evt_panic`'s processor panics twice (dead after two attempts) and
/// `evt_fail`'s fails with a text: the raw rows hold the panic's text in clear, the
/// failure's sealed.
async fn a_panic_is_stored_in_clear(db: Db) {
    let inbox = db.inbox().with_keys(ring(&[("k1", 1)]));
    deliver(&inbox, "evt_panic", r#"{"type":"a"}"#, "a").await;
    deliver(&inbox, "evt_fail", r#"{"type":"b"}"#, "b").await;
    let running = Worker::new(&inbox, |e: Event, _| async move {
        match e.id() {
            Some("evt_panic") => panic!("ada@example.com"),
            _ => Err("invalid type: string \"ada@example.com\""),
        }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
    .unwrap()
    .with_max_attempts(2)
    .unwrap()
    .spawn();
    common::seed::eventually("both dead", async || {
        inbox.counts().await.unwrap().dead == 2
    })
    .await;
    running.shutdown().await;
    let panicked = "the processor panicked";
    assert_eq!(
        db.texts("SELECT processing_error FROM webhook_routes WHERE event_id = 'evt_panic'")
            .await,
        [panicked]
    );
    assert_eq!(
        db.texts("SELECT error FROM webhook_attempts WHERE event_id = 'evt_panic'")
            .await,
        [panicked, panicked]
    );
    let failed =
        db.texts("SELECT processing_error FROM webhook_routes WHERE event_id = 'evt_fail'");
    let failed = failed.await;
    assert!(failed[0].starts_with("sealed:v1:k1:"), "{failed:?}");
    let dead = inbox.event("standard", "evt_panic").await.unwrap().unwrap();
    assert_eq!(dead.summary.last_error.as_deref(), Some(panicked));
    db.drop_database().await;
}

#[tokio::test]
async fn sqlite_a_panic_is_stored_in_clear_with_keys() {
    a_panic_is_stored_in_clear(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_panic_is_stored_in_clear_with_keys() {
    a_panic_is_stored_in_clear(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_no_canary_at_rest_with_keys() {
    canary(Db::sqlite).await;
}

#[tokio::test]
async fn postgres_no_canary_at_rest_with_keys() {
    canary(Db::postgres).await;
}

#[tokio::test]
async fn sqlite_an_unknown_key_ends_dead_and_runs_once_the_key_is_back() {
    unknown_key_then_restored(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_an_unknown_key_ends_dead_and_runs_once_the_key_is_back() {
    unknown_key_then_restored(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_a_ciphertext_moved_to_another_row_is_dead_never_run() {
    swapped_ciphertext_is_dead(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_ciphertext_moved_to_another_row_is_dead_never_run() {
    swapped_ciphertext_is_dead(Db::postgres().await).await;
}

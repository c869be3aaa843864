//! Payload protection's schema (`20270113000017_webhook_sealed`, issue 34 step 1): the
//! columns a sealed body needs, NULL for every body stored in clear, and an event whose
//! body is gone still shown (`Inbox::event` with its `body_state`) and never run with an
//! empty body: its route ends dead at its claim with the reason, the processor not
//! called. On SQLite and PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_webhook::inbox::{BodyState, Inbox, State, Worker};
use tower_webhook::Event;

use crate::common;

/// The body row's columns migration 17 adds: NULL while the body is in clear.
pub const BODY_COLUMNS: [&str; 7] = [
    "key_id",
    "body_nonce",
    "sealed_headers",
    "headers_nonce",
    "sealed_subject",
    "subject_nonce",
    "subject_digest",
];

/// What the test changes by SQL, per dialect.
enum Db {
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Pg(sqlx::PgPool),
}

impl Db {
    async fn run(&self, sql: &'static str) -> u64 {
        match self {
            Db::Sqlite(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .unwrap()
                .rows_affected(),
            #[cfg(feature = "postgres")]
            Db::Pg(pool) => sqlx::query(sql)
                .execute(pool)
                .await
                .unwrap()
                .rows_affected(),
        }
    }

    async fn count(&self, sql: &'static str) -> i64 {
        match self {
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            #[cfg(feature = "postgres")]
            Db::Pg(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        }
    }
}

/// Three events accepted in clear; then `kept`'s body left alone, `missing`'s body row
/// deleted by hand, `erased`'s deleted with its event marked `erased` (as erasure will):
/// the first shows and runs; the other two show without a body, and a worker ends their
/// routes dead with the reason, never calling the processor.
async fn an_event_without_its_body_shows_and_ends_dead_unrun(inbox: Inbox, db: Db) {
    for id in ["kept", "missing", "erased"] {
        common::seed::deliver(&inbox, id).await;
    }
    let kept = inbox.event("standard", "kept").await.unwrap().unwrap();
    assert_eq!(
        (kept.body_state, kept.key_id.as_deref()),
        (BodyState::Stored, None)
    );
    assert_eq!(kept.body, common::seed::body("kept"));
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_body_expiry WHERE id = 1")
            .await,
        1,
        "expiry's bookmark, one row"
    );
    let deleted = db
        .run("DELETE FROM webhook_bodies WHERE event_id IN ('missing', 'erased')")
        .await;
    assert_eq!(deleted, 2);
    db.run("UPDATE webhook_events SET body_state = 'erased' WHERE event_id = 'erased'")
        .await;
    for (id, state) in [
        ("missing", BodyState::Missing),
        ("erased", BodyState::Erased),
    ] {
        let gone = inbox.event("standard", id).await.unwrap();
        let gone = gone.unwrap_or_else(|| panic!("{id}: shown without its body (P4)"));
        assert_eq!(gone.body_state, state, "{id}");
        assert!(gone.body.is_empty() && gone.headers.is_empty(), "{id}");
        assert_eq!(gone.summary.state, State::Queued, "{id}");
    }
    let json = serde_json::to_value(inbox.event("standard", "missing").await.unwrap()).unwrap();
    assert_eq!(
        (&json["body_state"], &json["key_id"]),
        (&"missing".into(), &serde_json::Value::Null)
    );
    let json = serde_json::to_value(&kept).unwrap();
    assert_eq!(json["body_state"], "stored");

    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let worker = Worker::new(&inbox, move |e: Event, _| {
        seen.lock()
            .unwrap()
            .push((e.id().unwrap().to_owned(), e.body().len()));
        async { Ok::<(), &str>(()) }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    common::seed::eventually("one processed, two dead", async || {
        let counts = inbox.counts().await.unwrap();
        (counts.processed, counts.dead) == (1, 2)
    })
    .await;
    worker.shutdown().await;
    let ran = ran.lock().unwrap().clone();
    assert_eq!(
        ran,
        [("kept".to_owned(), kept.body.len())],
        "only the event with its body"
    );
    for (id, reason) in [
        ("missing", "the body is missing"),
        (
            "erased",
            "the body was erased before the event was processed",
        ),
    ] {
        let dead = inbox.event("standard", id).await.unwrap().unwrap();
        assert_eq!(dead.summary.state, State::Dead, "{id}");
        assert_eq!(dead.summary.last_error.as_deref(), Some(reason), "{id}");
        assert_eq!(
            dead.summary.attempts, 1,
            "{id}: the claim's attempt, ended at once"
        );
    }
}

#[tokio::test]
async fn sqlite_an_event_without_its_body_shows_and_ends_dead_unrun() {
    let path = common::stores::temp_sqlite_path();
    let store = tower_webhook::store::SqliteStore::open(&path)
        .await
        .unwrap();
    let db = Db::Sqlite(store.pool().clone());
    an_event_without_its_body_shows_and_ends_dead_unrun(Inbox::sqlite(&store), db).await;
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_an_event_without_its_body_shows_and_ends_dead_unrun() {
    let store = common::stores::postgres().await;
    let db = Db::Pg(store.pool().clone());
    an_event_without_its_body_shows_and_ends_dead_unrun(Inbox::postgres(&store), db).await;
}

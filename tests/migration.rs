//! Fan-out's in-place migration (`20270111000014_webhook_routes`, issue 33): a database
//! written by the schema before it, one row per state
//! (`tests/fixtures/migration/<dialect>.sql`), migrated, then read row by row — each inbox
//! row is one event (its key, metadata and marker), one body and one `default` route with
//! the old row's state and history; every other row as it was — and used through the API.

mod common;
#[cfg(feature = "postgres")]
#[path = "migration/postgres.rs"]
mod postgres; // the PostgreSQL half
#[path = "migration/sealed.rs"]
mod sealed; // payload protection's schema (migration 17)

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::SqlitePool;
use tower_webhook::inbox::{AttemptOutcome, Inbox, State, StoredEvent, Worker};
use tower_webhook::store::{Claim, DedupeStore, Delivery, Retention, SqliteStore, Token};
use tower_webhook::Event;

/// The last migration before fan-out's.
const BEFORE: i64 = 20270105000013;

/// A table's rows by their key, each column's value as SQLite quotes it (`NULL`, `'text'`,
/// `X'…'`, numbers): byte-equal values compare equal.
type Rows = BTreeMap<Vec<String>, BTreeMap<String, String>>;

async fn rows(pool: &SqlitePool, table: &str, key: &[&str]) -> Rows {
    let columns: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT name FROM pragma_table_info('{table}')"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    let quoted = columns
        .iter()
        .map(|c| format!("quote({c})"))
        .collect::<Vec<_>>()
        .join(" || char(31) || ");
    let read: Vec<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {quoted} FROM {table}")))
            .fetch_all(pool)
            .await
            .unwrap();
    read.into_iter()
        .map(|row| {
            let values: BTreeMap<String, String> = columns
                .iter()
                .cloned()
                .zip(row.split('\u{1f}').map(str::to_owned))
                .collect();
            let k = key.iter().map(|c| values[*c].clone()).collect();
            (k, values)
        })
        .collect()
}

/// `webhook_attempts`' rows (no key: an attempt number repeats), each the columns asked
/// for as SQLite quotes them, sorted.
async fn attempts(pool: &SqlitePool, columns: &[&str]) -> Vec<String> {
    let quoted = columns
        .iter()
        .map(|c| format!("quote({c})"))
        .collect::<Vec<_>>()
        .join(" || ' ' || ");
    let mut read: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {quoted} FROM webhook_attempts"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    read.sort();
    read
}

/// The old row's `columns`, the same values the new row must hold.
fn pick(row: &BTreeMap<String, String>, columns: &[&str]) -> BTreeMap<String, String> {
    columns
        .iter()
        .map(|c| ((*c).to_owned(), row[*c].clone()))
        .collect()
}

/// An attempt record's columns before fan-out.
const ATTEMPT: [&str; 7] = [
    "source",
    "event_id",
    "attempt",
    "started_at",
    "finished_at",
    "outcome",
    "error",
];

const ROUTE_KEPT: [&str; 13] = [
    "source",
    "event_id",
    "event_type",
    "object_id",
    "arrival",
    "received_at",
    "attempts",
    "next_attempt_at",
    "locked_until",
    "lock_token",
    "attempt_started_at",
    "processed_at",
    "processing_error",
];

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn history(e: &StoredEvent) -> Vec<(u32, AttemptOutcome)> {
    e.attempts.iter().map(|a| (a.attempt, a.outcome)).collect()
}

#[tokio::test]
async fn sqlite_every_row_migrates_in_place_and_works_through_the_api() {
    let path = common::stores::temp_sqlite_path();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let mut before = sqlx::migrate!("./migrations/sqlite");
    before.migrations = Cow::Owned(
        before
            .migrations
            .iter()
            .filter(|m| m.version <= BEFORE)
            .cloned()
            .collect(),
    );
    before.run(&pool).await.unwrap();
    sqlx::raw_sql(include_str!("fixtures/migration/sqlite.sql"))
        .execute(&pool)
        .await
        .unwrap();
    let old = rows(&pool, "webhook_events", &["source", "event_id"]).await;
    let old_attempts = attempts(&pool, &ATTEMPT).await;
    let old_counted: i64 = sqlx::query_scalar("SELECT processed FROM webhook_counts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        old_counted, 2,
        "the fixture's processed rows, as the triggers counted them"
    );
    let old_pauses = rows(&pool, "webhook_pauses", &["source", "event_type"]).await;
    let old_arrivals = rows(&pool, "webhook_arrivals", &["last"]).await;

    sqlx::migrate!("./migrations/sqlite")
        .run(&pool)
        .await
        .unwrap();

    // Row by row.
    let mut events = rows(&pool, "webhook_events", &["source", "event_id"]).await;
    for (key, row) in &mut events {
        // Migration 17's column, NULL on every row: no body expired or erased.
        assert_eq!(row.remove("body_state").as_deref(), Some("NULL"), "{key:?}");
        // Migration 20's columns (feature `otel`), NULL on every row from before.
        for column in ["traceparent", "tracestate"] {
            assert_eq!(row.remove(column).as_deref(), Some("NULL"), "{key:?}");
        }
    }
    let bodies = rows(&pool, "webhook_bodies", &["source", "event_id"]).await;
    let routes = rows(
        &pool,
        "webhook_routes",
        &["source", "event_id", "processor"],
    )
    .await;
    assert_eq!(
        events.keys().collect::<Vec<_>>(),
        old.keys().collect::<Vec<_>>()
    );
    let mut inbox_rows = 0;
    for (key, was) in &old {
        let now = &events[key];
        let inbox = was["next_attempt_at"] != "NULL" && was["kind"] != "'once'";
        if !inbox {
            assert_eq!(now, was, "{key:?}: not the inbox's, untouched");
            assert!(!bodies.contains_key(key), "{key:?}");
            continue;
        }
        inbox_rows += 1;
        let mut expected = was.clone();
        for (column, value) in [
            ("body", "NULL"),
            ("headers", "NULL"),
            ("attempts", "0"),
            ("locked_until", "NULL"),
            ("lock_token", "NULL"),
            ("attempt_started_at", "NULL"),
            ("processed_at", "NULL"),
            ("processing_error", "NULL"),
            ("dead_at", "NULL"),
        ] {
            expected.insert(column.to_owned(), value.to_owned());
        }
        assert_eq!(now, &expected, "{key:?}: the event, its state cleared");
        assert_eq!(
            pick(&bodies[key], &["body", "headers"]),
            pick(was, &["body", "headers"]),
            "{key:?}: its body"
        );
        let mut route_key = key.clone();
        route_key.push("'default'".into());
        let route = &routes[&route_key];
        assert_eq!(
            pick(route, &ROUTE_KEPT),
            pick(was, &ROUTE_KEPT),
            "{key:?}: its route"
        );
        assert_eq!(route["dead_at"], was["dead_at"], "{key:?}");
    }
    assert_eq!(inbox_rows, 11);
    assert_eq!((bodies.len(), routes.len()), (11, 11));
    for body in bodies.values() {
        assert_eq!(
            pick(body, &sealed::BODY_COLUMNS),
            sealed::BODY_COLUMNS
                .iter()
                .map(|c| (c.to_string(), "NULL".to_owned()))
                .collect(),
            "migration 17: every body in clear"
        );
    }
    assert_eq!(
        attempts(&pool, &ATTEMPT).await,
        old_attempts,
        "the history, once each"
    );
    let processors = attempts(&pool, &["processor"]).await;
    assert!(
        processors.iter().all(|p| p == "'default'"),
        "{processors:?}"
    );
    // Every pause made before holds every processor (migration 15: `processor` '').
    let mut pauses = rows(&pool, "webhook_pauses", &["source", "event_type"]).await;
    for pause in pauses.values_mut() {
        assert_eq!(
            pause.remove("processor").as_deref(),
            Some("''"),
            "{pause:?}"
        );
    }
    assert_eq!(pauses, old_pauses);
    assert_eq!(
        rows(&pool, "webhook_arrivals", &["last"]).await,
        old_arrivals
    );

    // Through the API.
    let store = SqliteStore::from_pool(pool.clone()).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    let counts = inbox.counts().await.unwrap();
    assert_eq!(
        (
            counts.queued,
            counts.processing,
            counts.processed,
            counts.dead,
            counts.paused
        ),
        (7, 1, 2, 1, 1),
        "{counts:?}"
    );
    let event = |id: &'static str| {
        let inbox = inbox.clone();
        async move { inbox.event("s", id).await.unwrap() }
    };
    let queued = event("queued").await.unwrap();
    assert_eq!(queued.summary.state, State::Queued);
    assert_eq!(&queued.body[..], br#"{"queued""#);
    assert_eq!(queued.livemode, Some(true));
    assert_eq!(
        queued.headers,
        [
            ("content-type".to_owned(), "application/json".to_owned()),
            ("user-agent".to_owned(), "Stripe/1.0".to_owned())
        ]
    );
    let failing = event("failing").await.unwrap();
    assert_eq!(
        (failing.summary.state, failing.summary.attempts),
        (State::Queued, 2)
    );
    assert_eq!(failing.summary.last_error.as_deref(), Some("HTTP 502"));
    assert_eq!(
        history(&failing),
        [(1, AttemptOutcome::Failed), (2, AttemptOutcome::Failed)]
    );
    assert_eq!(
        event("running").await.unwrap().summary.state,
        State::Processing
    );
    assert_eq!(event("lapsed").await.unwrap().summary.state, State::Queued);
    let processed = event("processed").await.unwrap();
    assert_eq!(processed.summary.state, State::Processed);
    assert_eq!(
        history(&processed),
        [(1, AttemptOutcome::Failed), (2, AttemptOutcome::Processed)]
    );
    assert_eq!(
        history(&event("requeued").await.unwrap()),
        [(1, AttemptOutcome::Processed)]
    );
    assert_eq!(
        history(&event("snoozed").await.unwrap()),
        [(1, AttemptOutcome::Snoozed)]
    );
    let dead = event("dead").await.unwrap();
    assert_eq!(dead.summary.state, State::Dead);
    assert_eq!(
        history(&dead),
        [
            (1, AttemptOutcome::Failed),
            (2, AttemptOutcome::Crashed),
            (2, AttemptOutcome::Dead)
        ]
    );
    assert_eq!(event("kept").await.unwrap().summary.state, State::Processed);
    assert_eq!(&event("adopted").await.unwrap().body[..], b"adopted");
    for not_the_inbox in ["tombstone", "claimed", "released", "done"] {
        assert!(event(not_the_inbox).await.is_none(), "{not_the_inbox}");
    }

    // A worker drains the due routes, records the lapsed attempt crashed, and leaves the
    // live one.
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = handled.clone();
    let worker = Worker::new(&inbox, move |e: Event, _| {
        seen.lock().unwrap().push(e.id().unwrap().to_owned());
        async { Ok::<(), &str>(()) }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    eventually("the due routes processed", async || {
        inbox.counts().await.unwrap().processed == 7
    })
    .await;
    worker.shutdown().await;
    let mut handled = handled.lock().unwrap().clone();
    handled.sort();
    assert_eq!(
        handled,
        ["adopted", "lapsed", "queued", "requeued", "unnumbered"]
    );
    assert_eq!(
        history(&event("lapsed").await.unwrap()),
        [(1, AttemptOutcome::Crashed), (2, AttemptOutcome::Processed)]
    );
    assert_eq!(
        event("running").await.unwrap().summary.state,
        State::Processing
    );
    assert_eq!(
        history(&event("requeued").await.unwrap()),
        [
            (1, AttemptOutcome::Processed),
            (1, AttemptOutcome::Processed)
        ]
    );

    // DedupeLayer's claim of a migrated event: done.
    for id in ["processed", "queued", "running", "dead", "tombstone"] {
        let claim = store
            .claim(
                Delivery::new("s", id),
                Token::new(),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Done), "{id}: {claim:?}");
    }

    // The dedupe prune deletes the done keys (the old tombstone among them) and no inbox
    // event; the inbox's prune deletes the processed events past the retention, not the
    // dead one.
    let hour = || Retention::shorter(Duration::from_secs(3600));
    assert_eq!(
        DedupeStore::prune(&store, hour()).await.unwrap(),
        3,
        "released, done, tombstone"
    );
    assert!(event("processed").await.is_some());
    assert_eq!(inbox.prune(hour()).await.unwrap(), 1, "processed");
    assert!(event("processed").await.is_none());
    assert!(event("dead").await.is_some());
    assert!(event("queued").await.is_some(), "processed within the hour");
    let gone: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM webhook_routes WHERE event_id = 'processed')
              + (SELECT count(*) FROM webhook_bodies WHERE event_id = 'processed')
              + (SELECT count(*) FROM webhook_attempts WHERE event_id = 'processed')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(gone, 0, "its route, body and history went with it");

    // A dead route deleted leaves the event as its key.
    assert_eq!(inbox.prune_dead(Duration::ZERO).await.unwrap(), 1);
    assert!(event("dead").await.is_none());
    let claim = store
        .claim(
            Delivery::new("s", "dead"),
            Token::new(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Done), "{claim:?}");
    let _ = std::fs::remove_file(&path);
}

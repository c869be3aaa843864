//! The PostgreSQL half: `tests/fixtures/migration/postgres.sql` on the schema before
//! fan-out, the migration, every row checked, then the API on the migrated database.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tower_webhook::inbox::{AttemptOutcome, Inbox, State, StoredEvent, Worker};
use tower_webhook::store::{Claim, DedupeStore, Delivery, PgStore, Retention, Token};
use tower_webhook::Event;

use crate::common;

/// The last migration before fan-out's.
const BEFORE: i64 = 20270105000013;

/// A table's rows by their key, each as `to_jsonb` gives it (bytes as `\x…` text, times
/// to the microsecond): equal values compare equal.
type Rows = BTreeMap<Vec<String>, BTreeMap<String, Value>>;

async fn rows(pool: &PgPool, table: &str, key: &[&str]) -> Rows {
    let read: Vec<Value> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT to_jsonb(t) FROM {table} t"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    read.into_iter()
        .map(|row| {
            let values: BTreeMap<String, Value> =
                serde_json::from_value(row).expect("a row is an object");
            let k = key.iter().map(|c| values[*c].to_string()).collect();
            (k, values)
        })
        .collect()
}

/// `webhook_attempts`' rows (no key: an attempt number repeats), each the columns asked
/// for, sorted.
async fn attempts(pool: &PgPool, columns: &[&str]) -> Vec<String> {
    let all: Vec<Value> = sqlx::query_scalar("SELECT to_jsonb(a) FROM webhook_attempts a")
        .fetch_all(pool)
        .await
        .unwrap();
    let mut read: Vec<String> = all
        .iter()
        .map(|row| {
            let values: Vec<String> = columns.iter().map(|c| row[*c].to_string()).collect();
            values.join(" ")
        })
        .collect();
    read.sort();
    read
}

/// The old row's `columns`, the same values the new row must hold.
fn pick(row: &BTreeMap<String, Value>, columns: &[&str]) -> BTreeMap<String, Value> {
    columns
        .iter()
        .map(|c| ((*c).to_owned(), row[*c].clone()))
        .collect()
}

const ATTEMPT: [&str; 7] = [
    "source",
    "event_id",
    "attempt",
    "started_at",
    "finished_at",
    "outcome",
    "error",
];

/// What a route keeps of the row it came from.
const ROUTE_KEPT: [&str; 14] = [
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
    "dead_at",
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

/// A fresh database with the schema before fan-out and the fixture's rows.
async fn before_fan_out() -> PgPool {
    let pool = PgPool::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    let mut before = sqlx::migrate!("./migrations/postgres");
    before.migrations = Cow::Owned(
        before
            .migrations
            .iter()
            .filter(|m| m.version <= BEFORE)
            .cloned()
            .collect(),
    );
    before.run(&pool).await.unwrap();
    sqlx::raw_sql(include_str!("../fixtures/migration/postgres.sql"))
        .execute(&pool)
        .await
        .unwrap();
    pool
}

#[tokio::test]
async fn postgres_every_row_migrates_in_place_and_works_through_the_api() {
    let pool = before_fan_out().await;
    let old = rows(&pool, "webhook_events", &["source", "event_id"]).await;
    let old_attempts = attempts(&pool, &ATTEMPT).await;
    let old_counted: i64 = sqlx::query_scalar("SELECT sum(delta)::int8 FROM webhook_counts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        old_counted, 2,
        "the fixture's processed rows, as the triggers logged them"
    );
    let old_pauses = rows(&pool, "webhook_pauses", &["source", "event_type"]).await;

    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .unwrap();

    let mut events = rows(&pool, "webhook_events", &["source", "event_id"]).await;
    for (key, row) in &mut events {
        // Migration 17's column, NULL on every row: no body expired or erased.
        assert_eq!(row.remove("body_state"), Some(Value::Null), "{key:?}");
        // Migration 20's columns (feature `otel`), NULL on every row from before.
        for column in ["traceparent", "tracestate"] {
            assert_eq!(row.remove(column), Some(Value::Null), "{key:?}");
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
        let inbox = !was["next_attempt_at"].is_null() && was["kind"] != "once";
        if !inbox {
            assert_eq!(now, was, "{key:?}: not the inbox's, untouched");
            assert!(!bodies.contains_key(key), "{key:?}");
            continue;
        }
        inbox_rows += 1;
        let mut expected = was.clone();
        for column in [
            "body",
            "headers",
            "locked_until",
            "lock_token",
            "attempt_started_at",
            "processed_at",
            "processing_error",
            "dead_at",
        ] {
            expected.insert(column.to_owned(), Value::Null);
        }
        expected.insert("attempts".to_owned(), 0.into());
        assert_eq!(now, &expected, "{key:?}: the event, its state cleared");
        assert_eq!(
            pick(&bodies[key], &["body", "headers"]),
            pick(was, &["body", "headers"]),
            "{key:?}: its body"
        );
        let mut route_key = key.clone();
        route_key.push("\"default\"".into());
        assert_eq!(
            pick(&routes[&route_key], &ROUTE_KEPT),
            pick(was, &ROUTE_KEPT),
            "{key:?}: its route"
        );
    }
    assert_eq!(inbox_rows, 11);
    assert_eq!((bodies.len(), routes.len()), (11, 11));
    for body in bodies.values() {
        assert_eq!(
            pick(body, &crate::sealed::BODY_COLUMNS),
            crate::sealed::BODY_COLUMNS
                .iter()
                .map(|c| (c.to_string(), Value::Null))
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
        processors.iter().all(|p| p == "\"default\""),
        "{processors:?}"
    );
    // Every pause made before holds every processor (migration 15: `processor` '').
    let mut pauses = rows(&pool, "webhook_pauses", &["source", "event_type"]).await;
    for pause in pauses.values_mut() {
        assert_eq!(
            pause.remove("processor"),
            Some(Value::from("")),
            "{pause:?}"
        );
    }
    assert_eq!(pauses, old_pauses);
    let log: Vec<(String, i64)> = sqlx::query_as("SELECT processor, delta FROM webhook_counts")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(log, [("default".to_owned(), 2)], "recounted, one row");

    let store = PgStore::from_migrated_pool(pool.clone());
    let inbox = Inbox::postgres(&store);
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

    // A worker drains the due routes, records the lapsed one's attempt crashed, and
    // leaves the running one (its lease live) and the paused and later ones.
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

    // DedupeLayer's claim of a migrated event answers done (a duplicate).
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

    let hour = || Retention::shorter(Duration::from_secs(3600));
    assert_eq!(
        DedupeStore::prune(&store, hour()).await.unwrap(),
        3,
        "released, done, tombstone: no inbox event"
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
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.processed, counts.dead), (6, 1), "{counts:?}");

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
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_bodies WHERE event_id = 'dead'),
                (SELECT count(*) FROM webhook_attempts WHERE event_id = 'dead')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        (0, 0),
        "a deleted dead route takes its body and history"
    );
}

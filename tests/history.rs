//! What an operator's page reads of one event, on SQLite and PostgreSQL: the request
//! headers the inbox's accept stored (never its credentials), every attempt with its
//! outcome, error and duration, kept bounded and pruned with the event, and how many
//! events were processed in each of the last minutes.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::{at, fresh_pg_url, request, verifier, NOW};
use http::{HeaderValue, StatusCode};
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{
    Accept, Attempt, AttemptOutcome, AttemptRecord, Inbox, Later, Requeue, StoredEvent,
    StoredHeaders, Worker,
};
use tower_webhook::store::{PgStore, Retention, SqliteStore};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// An inbox and its database, for what the tests read or set behind the inbox's back.
#[derive(Clone)]
enum Db {
    Sqlite(sqlx::SqlitePool),
    Pg(sqlx::PgPool),
}

async fn sqlite() -> (Inbox, Db) {
    let path = std::env::temp_dir().join(format!(
        "tower-webhook-history-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let store = SqliteStore::open(path).await.unwrap();
    let store = store.with_busy_timeout(Duration::from_millis(50));
    (Inbox::sqlite(&store), Db::Sqlite(store.pool().clone()))
}

async fn postgres() -> (Inbox, Db) {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    (Inbox::postgres(&store), Db::Pg(store.pool().clone()))
}

/// Posts a signed delivery of `id` to verify + accept, with `extra` headers beside the
/// signature's; returns the status.
async fn deliver_with(inbox: &Inbox, id: &str, extra: &[(&'static str, &str)]) -> StatusCode {
    deliver_to(inbox.accept_service(), id, extra).await
}

/// [`deliver_with`] through this accept service.
async fn deliver_to(accept: Accept, id: &str, extra: &[(&'static str, &str)]) -> StatusCode {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(accept);
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"pi_{id}"}}}}}}"#);
    let mut headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    for (name, value) in extra {
        headers.append(*name, HeaderValue::from_str(value).unwrap());
    }
    let req: http::Request<Full<Bytes>> = request(headers, body);
    svc.oneshot(req).await.unwrap().status()
}

async fn deliver(inbox: &Inbox, id: &str) -> StatusCode {
    deliver_with(inbox, id, &[]).await
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

async fn stored(inbox: &Inbox, id: &str) -> StoredEvent {
    inbox.event("standard", id).await.unwrap().unwrap()
}

fn outcomes(e: &StoredEvent) -> Vec<(u32, AttemptOutcome, Option<&str>)> {
    e.attempts
        .iter()
        .map(|a| (a.attempt, a.outcome, a.error.as_deref()))
        .collect()
}

/// Each attempt starts after the one before ended, and none ends before it starts.
fn assert_in_order(attempts: &[AttemptRecord]) {
    for a in attempts {
        assert!(a.finished_at >= a.started_at, "{a:?}");
        assert_eq!(
            a.duration(),
            a.finished_at.duration_since(a.started_at).unwrap()
        );
    }
    for pair in attempts.windows(2) {
        assert!(pair[1].started_at >= pair[0].finished_at, "{pair:?}");
    }
}

/// A worker polling every 20 ms, retrying after 20–40 ms.
fn worker(inbox: &Inbox, processor: impl tower_webhook::inbox::Processor) -> Worker {
    Worker::new(inbox, processor)
        .with_backoff(Duration::from_millis(20), Duration::from_millis(40))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
}

async fn an_event_failing_twice_then_succeeding_has_three_attempts_and_errors(inbox: Inbox) {
    assert_eq!(deliver(&inbox, "evt_flaky").await, StatusCode::NO_CONTENT);
    let running = worker(&inbox, |_: Event, a: Attempt| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        match a.number() {
            n @ (1 | 2) => Err(format!("timeout {n}")),
            _ => Ok(()),
        }
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_flaky").await;
    assert_eq!(
        outcomes(&event),
        [
            (1, AttemptOutcome::Failed, Some("timeout 1")),
            (2, AttemptOutcome::Failed, Some("timeout 2")),
            (3, AttemptOutcome::Processed, None),
        ]
    );
    assert_in_order(&event.attempts);
    for a in &event.attempts {
        assert!(a.duration() >= Duration::from_millis(25), "measured: {a:?}");
        assert!(a.duration() < Duration::from_secs(10), "{a:?}");
    }
    assert_eq!(event.summary.attempts, 3);
}

async fn a_dead_events_attempts_end_with_dead(inbox: Inbox) {
    deliver(&inbox, "evt_broken").await;
    let running = worker(&inbox, |_: Event, _: Attempt| async move {
        Err::<(), _>("order not found")
    })
    .with_max_attempts(3)
    .unwrap()
    .spawn();
    eventually("dead", async || inbox.counts().await.unwrap().dead == 1).await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_broken").await;
    assert_eq!(
        outcomes(&event),
        [
            (1, AttemptOutcome::Failed, Some("order not found")),
            (2, AttemptOutcome::Failed, Some("order not found")),
            (3, AttemptOutcome::Dead, Some("order not found")),
        ]
    );
    assert_in_order(&event.attempts);

    // A requeue counts from 1 again; the history keeps the attempts before it.
    assert_eq!(inbox.requeue(Requeue::dead()).await.unwrap(), 1);
    let running = worker(&inbox, |_: Event, _: Attempt| async move {
        Ok::<_, std::io::Error>(())
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_broken").await;
    assert_eq!(event.attempts.len(), 4);
    assert_eq!(
        outcomes(&event)[3],
        (1, AttemptOutcome::Processed, None),
        "{:?}",
        event.attempts
    );
    assert_in_order(&event.attempts);
}

async fn a_replay_of_a_processed_event_keeps_its_first_processed_attempt(inbox: Inbox) {
    deliver(&inbox, "evt_replayed").await;
    let running = worker(&inbox, |_: Event, _: Attempt| async move {
        Ok::<_, std::io::Error>(())
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await; // no worker takes the requeued row before it is read
    let first = stored(&inbox, "evt_replayed").await;
    assert_eq!(outcomes(&first), [(1, AttemptOutcome::Processed, None)]);
    let requeued = inbox.requeue(Requeue::id("standard", "evt_replayed"));
    assert_eq!(requeued.await.unwrap(), 1);
    let queued = stored(&inbox, "evt_replayed").await;
    assert_eq!(queued.attempts, first.attempts, "kept through the requeue");
    let running = worker(&inbox, |_: Event, _: Attempt| async move {
        Ok::<_, std::io::Error>(())
    })
    .spawn();
    eventually("processed again", async || {
        inbox.counts().await.unwrap().processed == 1
            && stored(&inbox, "evt_replayed").await.attempts.len() == 2
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_replayed").await;
    assert_eq!(
        outcomes(&event),
        [
            (1, AttemptOutcome::Processed, None),
            (1, AttemptOutcome::Processed, None),
        ]
    );
    assert_eq!(event.attempts[0], first.attempts[0]);
    assert_in_order(&event.attempts);
}

async fn a_snoozed_attempt_is_recorded_as_snoozed(inbox: Inbox) {
    deliver(&inbox, "evt_busy").await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let running = worker(&inbox, move |_: Event, _: Attempt| {
        let first = c.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                return Err(Later::after(Duration::from_millis(50)).into());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_busy").await;
    assert_eq!(
        outcomes(&event),
        [
            (1, AttemptOutcome::Snoozed, None),
            (1, AttemptOutcome::Processed, None),
        ],
        "the snooze is not counted: the attempt after it has its number"
    );
    assert_in_order(&event.attempts);
}

async fn a_crashed_attempt_is_recorded_when_its_row_is_claimed_again(inbox: Inbox) {
    deliver(&inbox, "evt_crash").await;
    let claimed = Arc::new(AtomicU32::new(0));
    let c = claimed.clone();
    let stuck = Worker::new(&inbox, move |_: Event, _: Attempt| {
        c.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<(), std::io::Error>>()
    })
    .with_lease(Duration::from_millis(300))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    eventually("claimed", async || claimed.load(Ordering::SeqCst) == 1).await;
    stuck.abort(); // the process died mid-event
    let running = worker(&inbox, |_: Event, _: Attempt| async move {
        Ok::<_, std::io::Error>(())
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_crash").await;
    assert_eq!(
        outcomes(&event),
        [
            (1, AttemptOutcome::Crashed, None),
            (2, AttemptOutcome::Processed, None),
        ]
    );
    assert_in_order(&event.attempts);
    let crashed = &event.attempts[0];
    assert!(
        crashed.duration() >= Duration::from_millis(250),
        "it ran until its lease ran out: {crashed:?}"
    );
}

async fn headers_are_stored_without_credentials(inbox: Inbox) {
    let status = deliver_with(
        &inbox,
        "evt_headers",
        &[
            ("authorization", "Bearer sk_live_secret"),
            ("cookie", "session=secret"),
            ("proxy-authorization", "Basic secret"),
            ("x-request-id", "req_1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let event = stored(&inbox, "evt_headers").await;
    let names: Vec<&str> = event.headers.iter().map(|(n, _)| n.as_str()).collect();
    for kept in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert!(names.contains(&kept), "{kept} in {names:?}");
    }
    assert_eq!(
        event
            .headers
            .iter()
            .filter(|(n, _)| n == "x-forwarded-for")
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>(),
        ["10.0.0.1", "10.0.0.2"],
        "both values, in order"
    );
    assert!(event
        .headers
        .contains(&("x-request-id".into(), "req_1".into())));
    assert!(
        event.headers.iter().all(|(n, v)| !v.contains("secret")
            && !["authorization", "cookie", "proxy-authorization"].contains(&n.as_str())),
        "{:?}",
        event.headers
    );
    let signature = event
        .headers
        .iter()
        .find(|(n, _)| n == "webhook-signature")
        .unwrap();
    assert!(signature.1.starts_with("v1,"), "{signature:?}");
    assert!(
        !format!("{event:?}").contains("v1,"),
        "Debug shows names only"
    );

    // Headers over 8 KiB in all: the one that would go over is left out.
    let big = "x".repeat(9 * 1024);
    deliver_with(
        &inbox,
        "evt_big_headers",
        &[("x-big", &big), ("x-small", "ok")],
    )
    .await;
    let event = stored(&inbox, "evt_big_headers").await;
    assert!(event.headers.iter().all(|(n, _)| n != "x-big"));
    assert!(event.headers.contains(&("x-small".into(), "ok".into())));

    // An event given to `Inbox::accept` has no request: no headers.
    let direct = verifier(Scheme::standard(), &[SECRET]);
    let headers = Scheme::standard()
        .sign([SECRET], "evt_direct", at(NOW), b"{}")
        .unwrap();
    let event = direct.verify(&headers, Bytes::from_static(b"{}")).unwrap();
    inbox.accept(&event).await.unwrap();
    assert_eq!(stored(&inbox, "evt_direct").await.headers, []);
}

/// No header whose name says it carries a credential is stored, in any spelling; the
/// application names more, or stores only what it lists; the scheme's own stay.
async fn credential_headers_are_never_stored_whatever_their_name(inbox: Inbox) {
    let credentials = [
        ("x-amzn-oidc-accesstoken", "secret-1"),
        ("x-forwarded-access-token", "secret-2"),
        ("x-gitlab-token", "secret-3"),
        ("cf-access-jwt-assertion", "secret-4"),
        ("x_api_key", "secret-5"),
        ("x-amz-security-token", "secret-6"),
        ("x-webhook-secret", "secret-7"),
        ("x-tenant-key", "secret-8"),
    ];
    let status = deliver_with(&inbox, "evt_creds", &credentials).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let event = stored(&inbox, "evt_creds").await;
    let names: Vec<&str> = event.headers.iter().map(|(n, _)| n.as_str()).collect();
    // The application's own name, not one that says credential: stored unless named.
    assert!(names.contains(&"x-tenant-key"), "{names:?}");
    for (name, _) in &credentials[..7] {
        assert!(!names.contains(name), "{name} stored: {names:?}");
    }
    assert!(
        event
            .headers
            .iter()
            .all(|(_, v)| !v.starts_with("secret-") || v == "secret-8"),
        "{:?}",
        event.headers
    );
    for kept in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert!(names.contains(&kept), "{kept} in {names:?}");
    }

    let named = inbox.accept_service().with_stored_headers(
        StoredHeaders::all_but_credentials()
            .with_excluded([http::HeaderName::from_static("x-tenant-key")]),
    );
    let status = deliver_to(named, "evt_named", &credentials).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let event = stored(&inbox, "evt_named").await;
    assert!(
        event.headers.iter().all(|(_, v)| !v.starts_with("secret-")),
        "{:?}",
        event.headers
    );

    let only = inbox
        .accept_service()
        .with_stored_headers(StoredHeaders::only([
            http::HeaderName::from_static("x-request-id"),
            http::HeaderName::from_static("x-gitlab-token"),
        ]));
    let extra = [
        ("x-request-id", "req_1"),
        ("x-other", "1"),
        ("x-gitlab-token", "secret-3"),
    ];
    assert_eq!(
        deliver_to(only, "evt_only", &extra).await,
        StatusCode::NO_CONTENT
    );
    let mut names: Vec<String> = stored(&inbox, "evt_only")
        .await
        .headers
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "webhook-id",
            "webhook-signature",
            "webhook-timestamp",
            "x-request-id"
        ]
    );
}

/// Milliseconds since the epoch.
fn epoch_ms(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Moves `id`'s processed time into the minute `minutes_ago` minutes before the current
/// one (by the database's clock), 10 s past its start; returns that minute's start.
async fn processed_minutes_ago(db: &Db, id: &str, minutes_ago: i64) -> SystemTime {
    let start_ms: i64 = match db {
        Db::Sqlite(pool) => {
            let now = epoch_ms(SystemTime::now());
            let start = now - now % 60_000 - minutes_ago * 60_000;
            sqlx::query("UPDATE webhook_routes SET processed_at = ?1 WHERE event_id = ?2")
                .bind(start + 10_000)
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
            start
        }
        Db::Pg(pool) => sqlx::query_scalar(
            "UPDATE webhook_routes
             SET processed_at = date_trunc('minute', now()) - make_interval(mins => $1)
                 + interval '10 seconds'
             WHERE event_id = $2
             RETURNING (extract(epoch FROM date_trunc('minute', processed_at)) * 1000)::int8",
        )
        .bind(i32::try_from(minutes_ago).unwrap())
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap(),
    };
    UNIX_EPOCH + Duration::from_millis(start_ms.unsigned_abs())
}

async fn processed_per_minute_counts_each_of_the_last_minutes((inbox, db): (Inbox, Db)) {
    assert_eq!(inbox.processed_per_minute(0).await.unwrap(), []);
    let quiet = inbox.processed_per_minute(3).await.unwrap();
    assert_eq!(quiet.len(), 3);
    assert!(quiet.iter().all(|&(_, n)| n == 0), "{quiet:?}");

    for i in 0..6 {
        deliver(&inbox, &format!("evt_rate_{i}")).await;
    }
    // Not counted: a row still queued (snoozed).
    deliver(&inbox, "evt_queued_later").await;
    let running = worker(&inbox, |e: Event, _: Attempt| async move {
        match e.id() {
            Some("evt_queued_later") => Err(Later::after(Duration::from_secs(3600)).into()),
            _ => Ok::<_, Box<dyn std::error::Error + Send + Sync>>(()),
        }
    })
    .spawn();
    eventually("6 processed", async || {
        inbox.counts().await.unwrap().processed == 6
    })
    .await;
    running.shutdown().await;
    let two_ago = processed_minutes_ago(&db, "evt_rate_0", 2).await;
    processed_minutes_ago(&db, "evt_rate_1", 2).await;
    processed_minutes_ago(&db, "evt_rate_2", 10).await; // outside the window

    let rate = inbox.processed_per_minute(5).await.unwrap();
    assert_eq!(rate.len(), 5, "{rate:?}");
    for pair in rate.windows(2) {
        assert_eq!(
            pair[1].0.duration_since(pair[0].0).unwrap(),
            Duration::from_secs(60),
            "{rate:?}"
        );
    }
    let (current, _) = rate[4];
    assert_eq!(epoch_ms(current) % 60_000, 0, "whole minutes");
    let now = SystemTime::now();
    assert!(current <= now && now < current + Duration::from_secs(120));
    let at = |minute: SystemTime| rate.iter().find(|(m, _)| *m == minute).map(|&(_, n)| n);
    assert_eq!(at(two_ago), Some(2), "{rate:?}");
    assert_eq!(
        rate.iter().map(|&(_, n)| n).sum::<u64>(),
        5,
        "the three processed now and the two moved: {rate:?}"
    );
    assert_eq!(
        inbox.processed_per_minute(100_000).await.unwrap().len(),
        1440
    );
}

/// How many attempt records the database holds for `id`.
async fn records(db: &Db, id: &str) -> i64 {
    match db {
        Db::Sqlite(pool) => {
            sqlx::query_scalar("SELECT count(*) FROM webhook_attempts WHERE event_id = ?1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap()
        }
        Db::Pg(pool) => {
            sqlx::query_scalar("SELECT count(*) FROM webhook_attempts WHERE event_id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap()
        }
    }
}

async fn prune_removes_an_events_attempts_with_it((inbox, db): (Inbox, Db)) {
    deliver(&inbox, "evt_fine").await;
    deliver(&inbox, "evt_doomed").await;
    let running = worker(&inbox, |e: Event, a: Attempt| async move {
        match (e.id(), a.number()) {
            (Some("evt_doomed"), _) | (_, 1) => Err("not yet"),
            _ => Ok(()),
        }
    })
    .with_max_attempts(2)
    .unwrap()
    .spawn();
    eventually("one processed, one dead", async || {
        let c = inbox.counts().await.unwrap();
        (c.processed, c.dead) == (1, 1)
    })
    .await;
    running.shutdown().await;
    assert_eq!(
        records(&db, "evt_fine").await,
        1,
        "the failed attempt (the processed one is the row's own)"
    );
    assert_eq!(records(&db, "evt_doomed").await, 2);
    assert_eq!(stored(&inbox, "evt_fine").await.attempts.len(), 2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pruned = inbox.prune(Retention::shorter(Duration::from_millis(10)));
    assert_eq!(pruned.await.unwrap(), 1);
    assert_eq!(records(&db, "evt_fine").await, 0, "gone with its row");
    assert_eq!(records(&db, "evt_doomed").await, 2, "the dead row stays");
    assert_eq!(
        inbox.prune_dead(Duration::from_millis(10)).await.unwrap(),
        1
    );
    assert_eq!(records(&db, "evt_doomed").await, 0);
}

/// Adds `n` old records of failed attempts to `id`'s history, as if it had failed that
/// often.
async fn add_old_records(db: &Db, id: &str, n: i64) {
    match db {
        Db::Sqlite(pool) => {
            sqlx::query(
                "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?2)
                 INSERT INTO webhook_attempts
                     (source, event_id, attempt, started_at, finished_at, outcome, error)
                 SELECT 'standard', ?1, 1, i, i, 'snoozed', NULL FROM k",
            )
            .bind(id)
            .bind(n)
            .execute(pool)
            .await
            .unwrap();
        }
        Db::Pg(pool) => {
            sqlx::query(
                "INSERT INTO webhook_attempts
                     (source, event_id, attempt, started_at, finished_at, outcome, error)
                 SELECT 'standard', $1, 1, to_timestamp(i), to_timestamp(i), 'snoozed', NULL
                 FROM generate_series(1, $2) AS i",
            )
            .bind(id)
            .bind(i32::try_from(n).unwrap())
            .execute(pool)
            .await
            .unwrap();
        }
    }
}

async fn a_failing_attempt_keeps_the_history_at_100_records((inbox, db): (Inbox, Db)) {
    deliver(&inbox, "evt_snoozer").await;
    add_old_records(&db, "evt_snoozer", 150).await;
    let running = worker(&inbox, |_: Event, a: Attempt| async move {
        match a.number() {
            1 => Err("once"),
            _ => Ok(()),
        }
    })
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    assert_eq!(
        records(&db, "evt_snoozer").await,
        100,
        "the failure cut it to 100 (the processed attempt is the row's own)"
    );
    let event = stored(&inbox, "evt_snoozer").await;
    assert_eq!(event.attempts.len(), 100, "the newest 100 are read");
    assert_eq!(
        outcomes(&event)[98..],
        [
            (1, AttemptOutcome::Failed, Some("once")),
            (2, AttemptOutcome::Processed, None),
        ]
    );
}

macro_rules! suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn an_event_failing_twice_then_succeeding_has_three_attempts_and_errors() {
                super::an_event_failing_twice_then_succeeding_has_three_attempts_and_errors(
                    $make.0,
                )
                .await;
            }
            #[tokio::test]
            async fn a_dead_events_attempts_end_with_dead() {
                super::a_dead_events_attempts_end_with_dead($make.0).await;
            }
            #[tokio::test]
            async fn a_replay_of_a_processed_event_keeps_its_first_processed_attempt() {
                super::a_replay_of_a_processed_event_keeps_its_first_processed_attempt($make.0)
                    .await;
            }
            #[tokio::test]
            async fn a_snoozed_attempt_is_recorded_as_snoozed() {
                super::a_snoozed_attempt_is_recorded_as_snoozed($make.0).await;
            }
            #[tokio::test]
            async fn a_crashed_attempt_is_recorded_when_its_row_is_claimed_again() {
                super::a_crashed_attempt_is_recorded_when_its_row_is_claimed_again($make.0).await;
            }
            #[tokio::test]
            async fn headers_are_stored_without_credentials() {
                super::headers_are_stored_without_credentials($make.0).await;
            }
            #[tokio::test]
            async fn credential_headers_are_never_stored_whatever_their_name() {
                super::credential_headers_are_never_stored_whatever_their_name($make.0).await;
            }
            #[tokio::test]
            async fn processed_per_minute_counts_each_of_the_last_minutes() {
                super::processed_per_minute_counts_each_of_the_last_minutes($make).await;
            }
            #[tokio::test]
            async fn prune_removes_an_events_attempts_with_it() {
                super::prune_removes_an_events_attempts_with_it($make).await;
            }
            #[tokio::test]
            async fn a_failing_attempt_keeps_the_history_at_100_records() {
                super::a_failing_attempt_keeps_the_history_at_100_records($make).await;
            }
        }
    };
}

suite!(sqlite_history, sqlite().await);
suite!(postgres_history, postgres().await);

/// The transactional worker marks a row processed in the processor's own transaction:
/// its attempt is recorded there too, and a failed one by the worker.
#[tokio::test]
async fn postgres_transactional_attempts_are_recorded_with_the_commit() {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    let inbox = Inbox::postgres(&store);
    deliver(&inbox, "evt_tx").await;
    let running = Worker::transactional(
        &store,
        |_: Event, a: Attempt, _tx: tower_webhook::dedupe::PgTx| async move {
            match a.number() {
                1 => Err("the provider's API timed out"),
                _ => Ok(()),
            }
        },
    )
    .with_backoff(Duration::from_millis(20), Duration::from_millis(40))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    eventually("processed", async || {
        inbox.counts().await.unwrap().processed == 1
    })
    .await;
    running.shutdown().await;
    let event = stored(&inbox, "evt_tx").await;
    assert_eq!(
        outcomes(&event),
        [
            (
                1,
                AttemptOutcome::Failed,
                Some("the provider's API timed out")
            ),
            (2, AttemptOutcome::Processed, None),
        ]
    );
    assert_in_order(&event.attempts);
}

//! Erasure on request (issue 34 step 5, `docs/design/payload-protection.md` §8), on
//! SQLite and PostgreSQL, each on a fresh database, without a key ring:
//!
//! - `Inbox::erase` deletes an event's body and headers and every error text of its
//!   routes and attempts (at rest too), marks it erased (`body_state: "erased"` in the
//!   admin JSON), buries its queued route dead with the crate's reason, never run; its key
//!   stays (a redelivery is a duplicate), a requeue leaves it out (`without_body`);
//!   erasing twice is harmless; an unknown event is `false`, and 404 on
//!   `DELETE /events/{source}/{id}/body`;
//! - a route running while its event is erased finishes, but its failure's error is not
//!   written back (P11), and it then ends dead with the reason, run once.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_webhook::inbox::{Accepted, BodyState, Inbox, Requeue, State, Worker, WorkerHandle};
use tower_webhook::Event;

use common::seed::eventually;
use common::sql_db::{deliver_order, order_event as event, Db};

/// What a failing attempt's error and a stored header quote: gone with the body.
const CANARY: &str = "canary-9e2b";

/// The reason an erased event's routes go dead with.
const REASON: &str = "the body was erased before the event was processed";

/// How many stored values anywhere quote [`CANARY`]: body rows, headers, errors.
async fn canaries(db: &Db) -> i64 {
    let like = format!("'%{CANARY}%'");
    let mut n = 0;
    for sql in [
        format!("SELECT count(*) FROM webhook_bodies WHERE headers LIKE {like}"),
        format!("SELECT count(*) FROM webhook_routes WHERE processing_error LIKE {like}"),
        format!("SELECT count(*) FROM webhook_attempts WHERE error LIKE {like}"),
    ] {
        n += db.number(&sql).await;
    }
    n
}

/// Accepts `id` through the inbox's HTTP service, a stored header quoting [`CANARY`].
async fn deliver(inbox: &Inbox, id: &str) {
    deliver_order(inbox, id, CANARY).await;
}

/// A worker: `evt_flaky` fails its first attempt with an error quoting [`CANARY`],
/// `evt_dead` every one (two attempts); each run counted in `runs` by id.
fn worker(inbox: &Inbox, runs: Arc<std::sync::Mutex<Vec<String>>>) -> WorkerHandle {
    Worker::new(
        inbox,
        move |e: Event, attempt: tower_webhook::inbox::Attempt| {
            let runs = runs.clone();
            async move {
                let id = e.id().unwrap().to_owned();
                runs.lock().unwrap().push(id.clone());
                match (id.as_str(), attempt.number()) {
                    ("evt_flaky", 1) | ("evt_dead", _) => Err(format!("invalid value {CANARY:?}")),
                    _ => Ok(()),
                }
            }
        },
    )
    .with_max_attempts(2)
    .unwrap()
    .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn()
}

/// A request to the operator API: its status and JSON answer.
async fn admin(inbox: &Inbox, method: &str, uri: &str) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tower_webhook::admin::router(inbox.clone())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// Erased events lose body, headers and error texts and keep their key; a queued route
/// goes dead with the reason and never runs; requeue leaves them out.
async fn an_erased_events_body_and_errors_go_and_its_key_stays(db: Db) {
    let inbox = db.inbox();
    for id in ["evt_ok", "evt_flaky", "evt_dead"] {
        deliver(&inbox, id).await;
    }
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let running = worker(&inbox, runs.clone());
    eventually("two processed, one dead", async || {
        let c = inbox.counts().await.unwrap();
        (c.processed, c.dead) == (2, 1)
    })
    .await;
    running.shutdown().await;
    deliver(&inbox, "evt_queued").await;
    // Headers 4, evt_dead's route error 1, attempts: evt_flaky's first, evt_dead's two.
    assert_eq!(canaries(&db).await, 4 + 1 + 3, "the control");

    for id in ["evt_flaky", "evt_dead", "evt_queued"] {
        assert!(inbox.erase("standard", id).await.unwrap(), "{id}");
    }
    for id in ["evt_flaky", "evt_dead", "evt_queued"] {
        let e = inbox.event("standard", id).await.unwrap().unwrap();
        assert_eq!(e.body_state, BodyState::Erased, "{id}");
        assert_eq!((e.body.len(), e.headers.len()), (0, 0), "{id}");
        assert!(e.attempts.iter().all(|a| a.error.is_none()), "{id}: {e:?}");
    }
    let flaky = inbox.event("standard", "evt_flaky").await.unwrap().unwrap();
    assert_eq!(flaky.summary.state, State::Processed, "its state stays");
    assert!(!flaky.attempts.is_empty(), "its outcomes stay");
    assert_eq!(flaky.summary.last_error, None);
    let dead = inbox.event("standard", "evt_dead").await.unwrap().unwrap();
    assert_eq!(dead.summary.state, State::Dead);
    assert_eq!(
        dead.summary.last_error, None,
        "its error quoted the payload"
    );
    let queued = inbox
        .event("standard", "evt_queued")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(queued.summary.state, State::Dead, "buried at once");
    assert_eq!(queued.summary.last_error.as_deref(), Some(REASON));
    let ok = inbox.event("standard", "evt_ok").await.unwrap().unwrap();
    assert_eq!(ok.body_state, BodyState::Stored, "not asked: kept");

    // At rest: the erased events' body rows and every canary but evt_ok's header.
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_bodies WHERE event_id <> 'evt_ok'")
            .await,
        0
    );
    assert_eq!(canaries(&db).await, 1, "evt_ok's stored header only");
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_events WHERE body_state = 'erased'")
            .await,
        3
    );
    let (status, json) = admin(&inbox, "GET", "/events/standard/evt_queued").await;
    assert_eq!(status, 200);
    assert_eq!(json["body_state"], "erased", "{json}");

    // The key stays: a redelivery is a duplicate, not stored, not run.
    assert_eq!(
        inbox.accept(&event("evt_queued")).await.unwrap(),
        Accepted::Duplicate
    );
    // Requeue leaves erased events out and counts them.
    let one = inbox
        .requeue_counted(Requeue::id("standard", "evt_queued"))
        .await
        .unwrap();
    assert_eq!((one.requeued, one.without_body), (0, 1));
    let all = inbox.requeue_counted(Requeue::all()).await.unwrap();
    assert_eq!((all.requeued, all.without_body), (1, 3), "{all:?}");

    // A worker runs what is queued (evt_ok again), never the erased ones.
    runs.lock().unwrap().clear();
    deliver(&inbox, "evt_after").await;
    let running = worker(&inbox, runs.clone());
    eventually("evt_ok and evt_after processed", async || {
        inbox.counts().await.unwrap().processed == 3
    })
    .await;
    running.shutdown().await;
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, ["evt_after", "evt_ok"]);
    let queued = inbox
        .event("standard", "evt_queued")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(queued.summary.state, State::Dead);

    // Twice is harmless; an unknown event is false (404 on the operator API).
    assert!(inbox.erase("standard", "evt_queued").await.unwrap());
    assert_eq!(state(&inbox, "evt_queued").await, BodyState::Erased);
    assert!(!inbox.erase("standard", "evt_nope").await.unwrap());
    assert!(!inbox.erase("other", "evt_ok").await.unwrap());
    let (status, _) = admin(&inbox, "DELETE", "/events/standard/evt_nope/body").await;
    assert_eq!(status, 404);
    let (status, json) = admin(&inbox, "DELETE", "/events/standard/evt_ok/body").await;
    assert_eq!((status, json), (200, serde_json::json!({"erased": true})));
    assert_eq!(state(&inbox, "evt_ok").await, BodyState::Erased);
    assert_eq!(canaries(&db).await, 1, "evt_after's header only");
    let ok = inbox.event("standard", "evt_ok").await.unwrap().unwrap();
    assert_eq!(
        ok.summary.state,
        State::Processed,
        "processed stays processed"
    );
}

async fn state(inbox: &Inbox, id: &str) -> BodyState {
    let event = inbox.event("standard", id).await.unwrap();
    event.unwrap_or_else(|| panic!("{id} shows")).body_state
}

#[tokio::test]
async fn sqlite_an_erased_events_body_and_errors_go_and_its_key_stays() {
    an_erased_events_body_and_errors_go_and_its_key_stays(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_an_erased_events_body_and_errors_go_and_its_key_stays() {
    an_erased_events_body_and_errors_go_and_its_key_stays(Db::postgres().await).await;
}

/// A route running while its event is erased finishes with the body it holds; its
/// failure is recorded without its error (P11), and its next claim buries it with the
/// reason: run once.
async fn a_running_routes_late_failure_writes_no_error_back(db: Db) {
    let inbox = db.inbox();
    deliver(&inbox, "evt_slow").await;
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (s, r, n) = (started.clone(), release.clone(), runs.clone());
    let running = Worker::new(&inbox, move |_: Event, _| {
        let (s, r, n) = (s.clone(), r.clone(), n.clone());
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            s.notify_one();
            r.notified().await;
            Err::<(), _>(format!("invalid value {CANARY:?}"))
        }
    })
    .with_max_attempts(3)
    .unwrap()
    .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    started.notified().await;
    assert!(inbox.erase("standard", "evt_slow").await.unwrap());
    let e = inbox.event("standard", "evt_slow").await.unwrap().unwrap();
    assert_eq!(
        e.summary.state,
        State::Processing,
        "running: left to finish"
    );
    release.notify_one();
    eventually("dead with the reason", async || {
        let e = inbox.event("standard", "evt_slow").await.unwrap().unwrap();
        e.summary.state == State::Dead
    })
    .await;
    running.shutdown().await;
    let e = inbox.event("standard", "evt_slow").await.unwrap().unwrap();
    assert_eq!(e.summary.last_error.as_deref(), Some(REASON), "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
    assert!(!e.attempts.is_empty(), "the failure's outcome is recorded");
    assert!(
        e.attempts
            .iter()
            .all(|a| a.error.as_deref().is_none_or(|t| t == REASON)),
        "{e:?}"
    );
    assert_eq!(canaries(&db).await, 0, "no error text written back");
}

#[tokio::test]
async fn sqlite_a_running_routes_late_failure_writes_no_error_back() {
    a_running_routes_late_failure_writes_no_error_back(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_running_routes_late_failure_writes_no_error_back() {
    a_running_routes_late_failure_writes_no_error_back(Db::postgres().await).await;
}

/// `k1` (32 bytes of 7) and `k2` (of 8): a ring, then the ring rotated to `k2` first.
fn ring(entries: &str) -> tower_webhook::seal::KeyRing {
    tower_webhook::seal::KeyRing::parse(entries).unwrap()
}
const K1: &str = "k1:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const K2: &str = "k2:CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg=";

/// The subject of the events here: the customer the id names (`evt_<customer>_<n>`).
fn customer(e: &Event) -> Option<String> {
    let id = e.id()?;
    id.split('_').nth(1).map(|c| format!("cus_{c}"))
}

/// `erase_subject` erases every event of the subject, sealed under the current key or an
/// older one still in the ring, and nothing else (the subject stored sealed, with its
/// digest), and after a rekey under the new key alone; `POST /erase` does the same;
/// without keys no subject is stored and it refuses.
async fn erase_subject_finds_the_subjects_events_under_every_key(db: Db) {
    let old = db.inbox().with_keys(ring(K1)).with_subject(customer);
    for id in ["evt_ada_1", "evt_bob_1"] {
        deliver(&old, id).await;
    }
    // Rotated: k2 seals now, k1 still opens (and digests).
    let inbox = db
        .inbox()
        .with_keys(ring(&format!("{K2},{K1}")))
        .with_subject(customer);
    for id in ["evt_ada_2", "evt_bob_2", "evt_cyd_1"] {
        deliver(&inbox, id).await;
    }
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_bodies WHERE subject_digest IS NOT NULL")
            .await,
        5
    );
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_bodies WHERE sealed_subject IS NOT NULL")
            .await,
        5
    );

    assert_eq!(inbox.erase_subject("cus_ada").await.unwrap(), 2);
    for id in ["evt_ada_1", "evt_ada_2"] {
        assert_eq!(state(&inbox, id).await, BodyState::Erased, "{id}");
    }
    for id in ["evt_bob_1", "evt_bob_2", "evt_cyd_1"] {
        assert_eq!(state(&inbox, id).await, BodyState::Stored, "{id}");
    }
    let queued = inbox.event("standard", "evt_ada_1").await.unwrap().unwrap();
    assert_eq!(queued.summary.state, State::Dead);
    assert_eq!(queued.summary.last_error.as_deref(), Some(REASON));
    assert_eq!(
        inbox.erase_subject("cus_ada").await.unwrap(),
        0,
        "none left"
    );
    assert_eq!(inbox.erase_subject("cus_nobody").await.unwrap(), 0);

    // The old ring alone does not know k2's digests: bob's second event is not found.
    assert_eq!(old.erase_subject("cus_bob").await.unwrap(), 1);
    assert_eq!(state(&inbox, "evt_bob_2").await, BodyState::Stored);

    // POST /erase: the same, through the operator API.
    let (status, json) = admin_json(&inbox, "/erase", r#"{"subject": "cus_bob"}"#).await;
    assert_eq!((status, json), (200, serde_json::json!({"erased": 1})));
    assert_eq!(state(&inbox, "evt_bob_2").await, BodyState::Erased);
    let (status, _) = admin_json(&inbox, "/erase", r#"{"who": "cus_bob"}"#).await;
    assert_eq!(status, 400);
    assert_eq!(state(&inbox, "evt_cyd_1").await, BodyState::Stored);

    // Rekey reseals a subject and digests it under the new key: k2 alone finds it then.
    deliver(&old, "evt_dan_1").await;
    let k2 = db.inbox().with_keys(ring(K2)).with_subject(customer);
    assert_eq!(k2.erase_subject("cus_dan").await.unwrap(), 0, "under k1");
    assert_eq!(inbox.rekey(100).await.unwrap().unreadable, 0);
    assert_eq!(k2.erase_subject("cus_dan").await.unwrap(), 1);
    assert_eq!(state(&inbox, "evt_dan_1").await, BodyState::Erased);

    // Without keys: no subject stored, and erasing by one refused, nothing erased.
    let keyless = db.inbox().with_subject(customer);
    deliver(&keyless, "evt_eve_1").await;
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_bodies WHERE event_id = 'evt_eve_1' AND subject_digest IS NULL")
            .await,
        1
    );
    let refused = keyless.erase_subject("cus_cyd").await.unwrap_err();
    assert_eq!(
        refused.kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    let (status, _) = admin_json(&keyless, "/erase", r#"{"subject": "cus_cyd"}"#).await;
    assert_eq!(status, 409);
    assert_eq!(state(&inbox, "evt_cyd_1").await, BodyState::Stored);
}

/// A `POST` of `body` (JSON) to the operator API: its status and JSON answer.
async fn admin_json(inbox: &Inbox, uri: &str, body: &'static str) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let request = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = tower_webhook::admin::router(inbox.clone())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

#[tokio::test]
async fn sqlite_erase_subject_finds_the_subjects_events_under_every_key() {
    erase_subject_finds_the_subjects_events_under_every_key(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_erase_subject_finds_the_subjects_events_under_every_key() {
    erase_subject_finds_the_subjects_events_under_every_key(Db::postgres().await).await;
}

//! The SQL inbox's body retention (issue 34 step 4, `docs/design/payload-protection.md`
//! §7), on SQLite and PostgreSQL, each on a fresh database:
//!
//! - a processed event's body, headers and error texts go once the retention passed
//!   (`body_state` expired), its key stays: a redelivery is a duplicate; dead, failing
//!   and queued events keep theirs, and nothing goes before the retention;
//! - a fan-out event with a route still queued keeps its body, and is found again once
//!   that route is processed (the bookmark had passed its first route);
//! - a batch of 1 walks every event, routes processed at one time taken whole, and the
//!   bookmark ends at the newest processed time;
//! - requeue leaves expired events out and counts them (`POST /admin/requeue` too);
//!   backfill makes no route for them;
//! - `prune_dead` records `expired` where it deletes a body, and an event whose dead
//!   route was deleted beside a processed one expires with the retention.

mod common;

use std::time::Duration;

use tower_webhook::inbox::{
    Accepted, Backfill, BodyState, Inbox, ProcessorSpec, Requeue, State, Worker, WorkerHandle,
};
use tower_webhook::Event;

use common::seed::eventually;
use common::sql_db::{deliver_order, order_event as event, Db};

/// What a failing attempt's error quotes: gone with the body.
const CANARY: &str = "canary-4f1d";

/// Accepts `id` through the inbox's HTTP service, a stored header quoting [`CANARY`].
async fn deliver(inbox: &Inbox, id: &str) {
    deliver_order(inbox, id, CANARY).await;
}

/// A worker of `processor` (`None`: the default one): `evt_flaky` fails its first
/// attempt with an error quoting [`CANARY`], `evt_dead` every one (two attempts).
fn worker(inbox: &Inbox, processor: Option<&str>) -> WorkerHandle {
    let run = |e: Event, attempt: tower_webhook::inbox::Attempt| async move {
        match (e.id().unwrap(), attempt.number()) {
            ("evt_flaky", 1) | ("evt_dead", _) => Err(format!("invalid value {CANARY:?}")),
            _ => Ok(()),
        }
    };
    let worker = match processor {
        Some(name) => Worker::processor(inbox, name, run).unwrap(),
        None => Worker::new(inbox, run),
    };
    worker
        .with_max_attempts(2)
        .unwrap()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn()
}

/// `POST /requeue` of the operator API with `body`: its JSON answer.
async fn admin_requeue(inbox: &Inbox, body: &'static str) -> serde_json::Value {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let request = http::Request::post("/requeue")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = tower_webhook::admin::router(inbox.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn state(inbox: &Inbox, id: &str) -> BodyState {
    let event = inbox.event("standard", id).await.unwrap();
    event.unwrap_or_else(|| panic!("{id} shows")).body_state
}

/// Processed events lose body, headers and error texts once the retention passed, and
/// keep their key; dead, failing and queued ones keep everything; nothing goes earlier.
async fn a_processed_events_body_expires_and_its_key_stays(db: Db) {
    let inbox = db.inbox();
    for id in ["evt_ok", "evt_flaky", "evt_dead"] {
        deliver(&inbox, id).await;
    }
    let running = worker(&inbox, None);
    eventually("two processed, one dead", async || {
        let c = inbox.counts().await.unwrap();
        (c.processed, c.dead) == (2, 1)
    })
    .await;
    running.shutdown().await;
    deliver(&inbox, "evt_queued").await;
    let flaky = inbox.event("standard", "evt_flaky").await.unwrap().unwrap();
    assert!(
        flaky.attempts.iter().any(|a| a.error.is_some()),
        "{flaky:?}"
    );

    // Not yet: an hour's retention keeps every body.
    let hour = inbox.clone().with_body_retention(Duration::from_secs(3600));
    assert_eq!(hour.expire_bodies(100).await.unwrap(), 0);
    assert_eq!(
        inbox.expire_bodies(100).await.unwrap(),
        0,
        "no retention: none"
    );
    assert_eq!(db.number("SELECT count(*) FROM webhook_bodies").await, 4);

    tokio::time::sleep(Duration::from_millis(20)).await;
    let expiring = inbox.clone().with_body_retention(Duration::from_millis(5));
    assert_eq!(expiring.expire_bodies(100).await.unwrap(), 2);
    for id in ["evt_ok", "evt_flaky"] {
        let e = inbox.event("standard", id).await.unwrap().unwrap();
        assert_eq!(e.body_state, BodyState::Expired, "{id}");
        assert_eq!((e.body.len(), e.headers.len()), (0, 0), "{id}");
        assert_eq!(e.summary.state, State::Processed, "{id}: its state stays");
        assert!(
            e.attempts.iter().all(|a| a.error.is_none()) && e.summary.last_error.is_none(),
            "{id}: {e:?}"
        );
        assert!(!e.attempts.is_empty(), "{id}: the outcomes stay");
    }
    for id in ["evt_dead", "evt_queued"] {
        let e = inbox.event("standard", id).await.unwrap().unwrap();
        assert_eq!(e.body_state, BodyState::Stored, "{id}");
        assert!(!e.body.is_empty() && !e.headers.is_empty(), "{id}");
    }
    let dead = inbox.event("standard", "evt_dead").await.unwrap().unwrap();
    assert!(dead.summary.last_error.unwrap().contains(CANARY));
    // At rest: the processed events' body rows and error texts are gone.
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_bodies WHERE event_id IN ('evt_ok', 'evt_flaky')")
            .await,
        0
    );
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_attempts WHERE error IS NOT NULL")
            .await,
        2,
        "evt_dead's two attempts only"
    );
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_events WHERE body_state = 'expired'")
            .await,
        2
    );

    // The key stays: a redelivery is a duplicate, not run again.
    assert_eq!(
        inbox.accept(&event("evt_ok")).await.unwrap(),
        Accepted::Duplicate
    );
    assert_eq!(state(&inbox, "evt_ok").await, BodyState::Expired);
    // Again: nothing left to expire, the bookmark past them.
    assert_eq!(expiring.expire_bodies(100).await.unwrap(), 0);

    // Requeue leaves the expired ones out and counts them.
    let one = inbox
        .requeue_counted(Requeue::id("standard", "evt_ok"))
        .await
        .unwrap();
    assert_eq!((one.requeued, one.without_body), (0, 1));
    let answer = admin_requeue(&inbox, r#"{"source": "standard", "id": "evt_flaky"}"#).await;
    assert_eq!(
        answer,
        serde_json::json!({"requeued": 0, "without_body": 1})
    );
    let all = inbox.requeue_counted(Requeue::all()).await.unwrap();
    assert_eq!((all.requeued, all.without_body), (2, 2), "{all:?}");
    assert_eq!(inbox.requeue(Requeue::dead()).await.unwrap(), 0);
    let ok = inbox.event("standard", "evt_ok").await.unwrap().unwrap();
    assert_eq!(ok.summary.state, State::Processed, "not requeued");
    let c = inbox.counts().await.unwrap();
    assert_eq!((c.queued, c.processed, c.dead), (2, 2, 0), "{c:?}");
}

#[tokio::test]
async fn sqlite_a_processed_events_body_expires_and_its_key_stays() {
    a_processed_events_body_expires_and_its_key_stays(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_processed_events_body_expires_and_its_key_stays() {
    a_processed_events_body_expires_and_its_key_stays(Db::postgres().await).await;
}

/// A fan-out event keeps its body while one route is still queued, though the expiry's
/// bookmark passes its processed route; processed later, it is found again.
async fn a_route_processed_later_finds_its_event_again(db: Db) {
    let specs = [
        ProcessorSpec::new("billing").unwrap(),
        ProcessorSpec::new("email").unwrap(),
    ];
    let inbox = db
        .inbox()
        .with_processors(specs)
        .unwrap()
        .with_body_retention(Duration::ZERO);
    deliver(&inbox, "evt_fan").await;
    let billing = worker(&inbox, Some("billing"));
    eventually("billing's route processed", async || {
        let by = inbox.counts_by_processor().await.unwrap();
        by["billing"].processed == 1
    })
    .await;
    billing.shutdown().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        inbox.expire_bodies(10).await.unwrap(),
        0,
        "email's is queued"
    );
    assert_eq!(state(&inbox, "evt_fan").await, BodyState::Stored);
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_body_expiry WHERE processed_until = (SELECT max(processed_at) FROM webhook_routes)")
            .await,
        1,
        "the bookmark passed billing's route"
    );

    let email = worker(&inbox, Some("email"));
    eventually("email's route processed", async || {
        inbox.counts().await.unwrap().processed == 2
    })
    .await;
    email.shutdown().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(inbox.expire_bodies(10).await.unwrap(), 1);
    assert_eq!(state(&inbox, "evt_fan").await, BodyState::Expired);
}

#[tokio::test]
async fn sqlite_a_route_processed_later_finds_its_event_again() {
    a_route_processed_later_finds_its_event_again(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_route_processed_later_finds_its_event_again() {
    a_route_processed_later_finds_its_event_again(Db::postgres().await).await;
}

/// A batch of 1 walks every processed event, one after another; routes processed at the
/// same time are taken whole (a bookmark set to that time must not skip the others); the
/// bookmark ends at the newest processed time.
async fn batches_of_one_walk_every_event_and_ties_whole(db: Db) {
    let inbox = db.inbox().with_body_retention(Duration::ZERO);
    let ids: Vec<String> = (0..6).map(|i| format!("evt_{i}")).collect();
    for id in &ids {
        assert_eq!(inbox.accept(&event(id)).await.unwrap(), Accepted::New);
    }
    let running = worker(&inbox, None);
    eventually("all processed", async || {
        inbox.counts().await.unwrap().processed == 6
    })
    .await;
    running.shutdown().await;
    // Three processed at one time (the oldest), three apart.
    db.run(
        "UPDATE webhook_routes SET processed_at = (SELECT min(processed_at) FROM webhook_routes)
         WHERE event_id IN ('evt_0', 'evt_1', 'evt_2')",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(inbox.expire_bodies(1).await.unwrap(), 6);
    for id in &ids {
        assert_eq!(state(&inbox, id).await, BodyState::Expired, "{id}");
    }
    assert_eq!(db.number("SELECT count(*) FROM webhook_bodies").await, 0);
    assert_eq!(
        db.number("SELECT count(*) FROM webhook_body_expiry WHERE processed_until = (SELECT max(processed_at) FROM webhook_routes)")
            .await,
        1
    );
    // Backfill makes no route for an event without its body.
    let late = db
        .inbox()
        .with_processors([
            ProcessorSpec::new("default").unwrap(),
            ProcessorSpec::new("late").unwrap(),
        ])
        .unwrap();
    assert_eq!(
        inbox.accept(&event("evt_new")).await.unwrap(),
        Accepted::New
    );
    assert_eq!(
        late.backfill("late", Backfill::all()).await.unwrap(),
        1,
        "evt_new only"
    );
}

#[tokio::test]
async fn sqlite_batches_of_one_walk_every_event_and_ties_whole() {
    batches_of_one_walk_every_event_and_ties_whole(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_batches_of_one_walk_every_event_and_ties_whole() {
    batches_of_one_walk_every_event_and_ties_whole(Db::postgres().await).await;
}

/// `prune_dead` deleting an event's last live route deletes its body and records why
/// (`expired`): the event stays its key only. Beside a processed route, the body stays
/// until the retention expires it, found by the tombstone's time.
async fn prune_dead_records_expired(db: Db) {
    let specs = [
        ProcessorSpec::new("default").unwrap(),
        ProcessorSpec::new("other")
            .unwrap()
            .with_types(["none.*"])
            .unwrap(),
    ];
    let inbox = db.inbox().with_processors(specs).unwrap();
    deliver(&inbox, "evt_dead").await;
    let running = worker(&inbox, Some("default"));
    eventually("dead", async || inbox.counts().await.unwrap().dead == 1).await;
    running.shutdown().await;
    assert_eq!(inbox.prune_dead(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(
        db.number(
            "SELECT count(*) FROM webhook_events WHERE event_id = 'evt_dead' AND body_state = 'expired'"
        )
        .await,
        1
    );
    assert_eq!(db.number("SELECT count(*) FROM webhook_bodies").await, 0);
    assert!(
        inbox.event("standard", "evt_dead").await.unwrap().is_none(),
        "the key only: no route left to show"
    );
    assert_eq!(
        inbox.accept(&event("evt_dead")).await.unwrap(),
        Accepted::Duplicate
    );
    let all = inbox.requeue_counted(Requeue::all()).await.unwrap();
    assert_eq!(
        (all.requeued, all.without_body),
        (0, 0),
        "tombstones are no rows"
    );

    // Fan-out: billing processes, email dies; deleting email's dead route keeps the body
    // (billing's route is live), the retention then expires it.
    let specs = [
        ProcessorSpec::new("billing").unwrap(),
        ProcessorSpec::new("email").unwrap(),
    ];
    let fan = db
        .inbox()
        .with_processors(specs)
        .unwrap()
        .with_body_retention(Duration::ZERO);
    deliver(&fan, "evt_ok").await;
    let billing = worker(&fan, Some("billing"));
    eventually("billing processed", async || {
        fan.counts_by_processor().await.unwrap()["billing"].processed == 1
    })
    .await;
    billing.shutdown().await;
    // email's route dead by hand (its worker would run it): as a dead outcome leaves it.
    db.run(
        "UPDATE webhook_routes SET dead_at = received_at, processing_error = 'gone'
         WHERE event_id = 'evt_ok' AND processor = 'email'",
    )
    .await;
    assert_eq!(
        fan.expire_bodies(10).await.unwrap(),
        0,
        "a dead route keeps it"
    );
    assert_eq!(fan.prune_dead(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(
        state(&fan, "evt_ok").await,
        BodyState::Stored,
        "billing's is live"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(fan.expire_bodies(10).await.unwrap(), 1);
    assert_eq!(state(&fan, "evt_ok").await, BodyState::Expired);
}

#[tokio::test]
async fn sqlite_prune_dead_records_expired() {
    prune_dead_records_expired(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_prune_dead_records_expired() {
    prune_dead_records_expired(Db::postgres().await).await;
}

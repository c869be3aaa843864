//! Fan-out's processor operations on the SQL inbox (issue 33, docs/design/fan-out.md §3,
//! §4), on SQLite and PostgreSQL: a processor added later gets older events only through
//! a backfill (by receipt window, its globs and predicate respected, once), which a
//! worker then runs once each in arrival order; the registry; orphaned processors counted
//! apart and dropped with their routes.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::seed::{eventually, standard};
use common::stores;
use tower_webhook::inbox::{Attempt, Backfill, Counts, Inbox, ProcessorSpec, State, Worker};
use tower_webhook::store::{Retention, StoreErrorKind};
use tower_webhook::Event;

fn body(event_type: &str, live: bool) -> String {
    format!(r#"{{"type":"{event_type}","livemode":{live},"data":{{"object":{{"id":"obj_1"}}}}}}"#)
}

fn email() -> ProcessorSpec {
    ProcessorSpec::new("email").unwrap()
}

/// Invoices in live mode only: globs and a predicate.
fn billing() -> ProcessorSpec {
    ProcessorSpec::new("billing")
        .unwrap()
        .with_types(["invoice.*"])
        .unwrap()
        .with_predicate(|e: &Event| e.livemode() == Some(true))
}

async fn ingest(inbox: &Inbox, events: &[(&str, &str, bool)]) {
    let source = standard("shop");
    for (id, ty, live) in events {
        inbox
            .ingest(&source, Some(id), body(ty, *live))
            .await
            .unwrap();
    }
}

/// A gap in receipt time both clocks see (SQLite's store clock is this process's).
async fn gap() -> SystemTime {
    tokio::time::sleep(Duration::from_millis(60)).await;
    let at = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(60)).await;
    at
}

async fn processors_of(inbox: &Inbox, id: &str) -> Vec<String> {
    let event = inbox.event("shop", id).await.unwrap().unwrap();
    event.routes.iter().map(|r| r.processor.clone()).collect()
}

async fn a_processor_added_later_gets_old_events_by_backfill_once(inbox: Inbox) {
    let before = inbox.clone().with_processors([email()]).unwrap();
    ingest(
        &before,
        &[
            ("e0", "invoice.paid", true),
            ("e1", "customer.created", true),
            ("e2", "invoice.paid", false),
            ("e3", "invoice.created", true),
        ],
    )
    .await;
    let t1 = gap().await;
    ingest(
        &before,
        &[
            ("e4", "invoice.paid", true),
            ("e5", "customer.created", true),
            ("e6", "invoice.paid", false),
            ("e7", "invoice.voided", true),
        ],
    )
    .await;
    let t2 = gap().await;
    ingest(
        &before,
        &[
            ("e8", "invoice.paid", true),
            ("e9", "charge.refunded", true),
        ],
    )
    .await;

    // billing added: its routes start with the events accepted from now on.
    let after = inbox.with_processors([email(), billing()]).unwrap();
    ingest(&after, &[("e10", "invoice.paid", true)]).await;
    assert_eq!(processors_of(&after, "e4").await, ["email"]);
    assert_eq!(processors_of(&after, "e10").await, ["billing", "email"]);
    let billing_queued = |inbox: &Inbox| {
        let inbox = inbox.clone();
        async move { inbox.counts_by_processor().await.unwrap()["billing"].queued }
    };
    assert_eq!(billing_queued(&after).await, 1);

    // A processor the inbox lacks is refused, whatever the database holds.
    let e = after.backfill("audit", Backfill::all()).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
    let e = before
        .backfill("billing", Backfill::all())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput);

    // The window t1..t2: live invoices only (e4, e7), once.
    let window = Backfill::received_between(t1, t2);
    assert_eq!(after.backfill("billing", window).await.unwrap(), 2);
    assert_eq!(after.backfill("billing", window).await.unwrap(), 0);
    assert_eq!(processors_of(&after, "e4").await, ["billing", "email"]);
    assert_eq!(processors_of(&after, "e6").await, ["email"], "not live");
    assert_eq!(
        processors_of(&after, "e5").await,
        ["email"],
        "not an invoice"
    );
    assert_eq!(billing_queued(&after).await, 3);
    // Open-ended: before t1 gives e0 and e3, since t2 e8 (e10 has its route already).
    let old = Backfill::received_before(t1);
    assert_eq!(after.backfill("billing", old).await.unwrap(), 2);
    let new = Backfill::received_since(t2);
    assert_eq!(after.backfill("billing", new).await.unwrap(), 1);
    assert_eq!(after.backfill("billing", Backfill::all()).await.unwrap(), 0);
    assert_eq!(billing_queued(&after).await, 6);
    // email had every event: nothing to make.
    assert_eq!(after.backfill("email", Backfill::all()).await.unwrap(), 0);

    // A worker runs each route once, an object's in arrival order: the backfilled routes
    // keep their events' places, before e10's route made at its accept.
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let worker = Worker::processor(&after, "billing", move |event: Event, _: Attempt| {
        let seen = seen.clone();
        async move {
            let id = event.id().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(id);
            Ok::<_, std::io::Error>(())
        }
    })
    .unwrap()
    .with_per_object(1)
    .unwrap()
    .with_poll_interval(Duration::from_millis(50))
    .unwrap()
    .spawn();
    eventually("billing's six routes processed", async || {
        after.counts_by_processor().await.unwrap()["billing"].processed == 6
    })
    .await;
    worker.shutdown().await;
    assert_eq!(
        *runs.lock().unwrap(),
        ["e0", "e3", "e4", "e7", "e8", "e10"],
        "each once, in arrival order"
    );
    assert_eq!(after.backfill("billing", Backfill::all()).await.unwrap(), 0);
}

#[tokio::test]
async fn sqlite_a_processor_added_later_gets_old_events_by_backfill_once() {
    let store = stores::sqlite().await;
    a_processor_added_later_gets_old_events_by_backfill_once(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_a_processor_added_later_gets_old_events_by_backfill_once() {
    let store = stores::postgres().await;
    a_processor_added_later_gets_old_events_by_backfill_once(Inbox::postgres(&store)).await;
}

/// The registry: an inbox's first write registers its set, the filter as configured.
async fn an_inbox_registers_its_processors_with_its_first_write(inbox: Inbox) {
    assert!(inbox.registered_processors().await.unwrap().is_empty());
    let fanned = inbox.clone().with_processors([email(), billing()]).unwrap();
    assert!(
        fanned.registered_processors().await.unwrap().is_empty(),
        "nothing written yet"
    );
    ingest(&fanned, &[("e1", "invoice.paid", true)]).await;
    let registered: BTreeMap<String, (Option<Vec<String>>, bool)> = fanned
        .registered_processors()
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.name, (p.types, p.has_predicate)))
        .collect();
    assert_eq!(
        registered,
        BTreeMap::from([
            (
                "billing".to_owned(),
                (Some(vec!["invoice.*".to_owned()]), true)
            ),
            ("email".to_owned(), (None, false)),
        ])
    );
    // A worker's start registers too (the default inbox's one processor).
    let worker = Worker::new(&inbox, |_: Event, _: Attempt| async {
        Ok::<_, std::io::Error>(())
    })
    .with_poll_interval(Duration::from_millis(50))
    .unwrap()
    .spawn();
    eventually("default registered", async || {
        let names = inbox.registered_processors().await.unwrap();
        names.iter().any(|p| p.name == "default")
    })
    .await;
    worker.shutdown().await;
}

#[tokio::test]
async fn sqlite_an_inbox_registers_its_processors_with_its_first_write() {
    let store = stores::sqlite().await;
    an_inbox_registers_its_processors_with_its_first_write(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_an_inbox_registers_its_processors_with_its_first_write() {
    let store = stores::postgres().await;
    an_inbox_registers_its_processors_with_its_first_write(Inbox::postgres(&store)).await;
}

/// A processor removed from the set keeps its routes, counted apart (not in the sum) until
/// dropped; dropping is refused for a configured processor.
async fn an_orphaned_processor_is_counted_apart_and_dropped_with_its_routes(inbox: Inbox) {
    let old = inbox
        .clone()
        .with_processors([email(), ProcessorSpec::new("legacy").unwrap()])
        .unwrap();
    ingest(
        &old,
        &[
            ("e1", "invoice.paid", true),
            ("e2", "customer.created", true),
        ],
    )
    .await;
    old.pause_processor("legacy", Some("shop"), None)
        .await
        .unwrap();
    let new = inbox.with_processors([email()]).unwrap();
    let by = new.counts_by_processor().await.unwrap();
    assert_eq!(by.keys().collect::<Vec<_>>(), ["email", "legacy"]);
    assert_eq!(by["legacy"].queued, 2, "orphaned, still counted");
    assert_eq!(
        new.counts().await.unwrap().queued,
        2,
        "the sum: email's only"
    );
    let event = new.event("shop", "e1").await.unwrap().unwrap();
    let orphaned: Vec<(&str, bool)> = event
        .routes
        .iter()
        .map(|r| (r.processor.as_str(), r.orphaned))
        .collect();
    assert_eq!(orphaned, [("email", false), ("legacy", true)]);

    let e = new.drop_processor("email").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "configured here");
    assert_eq!(new.drop_processor("legacy").await.unwrap(), 2);
    assert_eq!(new.drop_processor("legacy").await.unwrap(), 0);
    let by = new.counts_by_processor().await.unwrap();
    assert_eq!(by.keys().collect::<Vec<_>>(), ["email"]);
    assert!(new.pauses().await.unwrap().is_empty(), "its pause went too");
    let names: Vec<String> = new
        .registered_processors()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["email"], "its registry row went too");
    assert_eq!(processors_of(&new, "e1").await, ["email"]);
}

#[tokio::test]
async fn sqlite_an_orphaned_processor_is_counted_apart_and_dropped_with_its_routes() {
    let store = stores::sqlite().await;
    an_orphaned_processor_is_counted_apart_and_dropped_with_its_routes(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_an_orphaned_processor_is_counted_apart_and_dropped_with_its_routes() {
    let store = stores::postgres().await;
    an_orphaned_processor_is_counted_apart_and_dropped_with_its_routes(Inbox::postgres(&store))
        .await;
}

/// An event whose only processor is dropped is left with no route: shown unrouted,
/// backfillable, and pruned past the retention as a finished one.
async fn an_event_left_without_a_route_is_unrouted_and_pruned(inbox: Inbox) {
    let old = inbox
        .clone()
        .with_processors([ProcessorSpec::new("legacy").unwrap()])
        .unwrap();
    ingest(&old, &[("e1", "invoice.paid", true)]).await;
    let new = inbox.with_processors([email()]).unwrap();
    assert_eq!(new.drop_processor("legacy").await.unwrap(), 1);
    let event = new.event("shop", "e1").await.unwrap().unwrap();
    assert_eq!(event.summary.state, State::Unrouted);
    assert!(event.routes.is_empty() && !event.body.is_empty());
    assert_eq!(new.counts().await.unwrap(), Counts::default());
    // Backfillable like any event without a route of the processor.
    assert_eq!(new.backfill("email", Backfill::all()).await.unwrap(), 1);
    assert_eq!(processors_of(&new, "e1").await, ["email"]);
    assert_eq!(new.drop_processor("legacy").await.unwrap(), 0);

    // One left with no route at all is pruned past the retention, not inside it.
    ingest(&old, &[("e2", "invoice.paid", true)]).await;
    assert_eq!(new.drop_processor("legacy").await.unwrap(), 1);
    assert_eq!(
        new.prune(Retention::shorter(Duration::from_secs(3600)))
            .await
            .unwrap(),
        0
    );
    assert!(new.event("shop", "e2").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(30)).await;
    let pruned = new
        .prune(Retention::shorter(Duration::from_millis(10)))
        .await
        .unwrap();
    assert_eq!(pruned, 1, "e2; e1's email route is queued");
    assert!(new.event("shop", "e2").await.unwrap().is_none());
    assert!(new.event("shop", "e1").await.unwrap().is_some());
}

#[tokio::test]
async fn sqlite_an_event_left_without_a_route_is_unrouted_and_pruned() {
    let store = stores::sqlite().await;
    an_event_left_without_a_route_is_unrouted_and_pruned(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_an_event_left_without_a_route_is_unrouted_and_pruned() {
    let store = stores::postgres().await;
    an_event_left_without_a_route_is_unrouted_and_pruned(Inbox::postgres(&store)).await;
}

//! Fan-out on the SQL inbox (issue 33), on SQLite and PostgreSQL: an inbox with several
//! processors gives each accepted event a route per processor whose filter takes it, in
//! the accept's transaction; each processor's workers run only its routes, each route
//! once, and one processor failing every attempt holds no other.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::seed::{eventually, standard};
use common::stores;
use tower_webhook::inbox::{Accepted, Attempt, Counts, Inbox, ProcessorSpec, Worker};
use tower_webhook::{ConfigErrorKind, Event};

/// Each (processor, event id) run, with how many times.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<(String, String), u32>>>);

impl Runs {
    /// A worker of `inbox`'s processor `name` that records each run and fails when
    /// `fails`.
    fn worker(&self, inbox: &Inbox, name: &'static str, fails: bool) -> Worker {
        let runs = self.clone();
        let process = move |event: Event, _: Attempt| {
            let runs = runs.clone();
            async move {
                let key = (name.to_owned(), event.id().unwrap_or_default().to_owned());
                *runs.0.lock().unwrap().entry(key).or_default() += 1;
                match fails {
                    true => Err(format!("{name} fails every attempt")),
                    false => Ok(()),
                }
            }
        };
        Worker::processor(inbox, name, process)
            .unwrap()
            .with_max_attempts(2)
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(20))
            .unwrap()
            .with_poll_interval(Duration::from_millis(50))
            .unwrap()
    }

    fn of(&self, name: &str) -> BTreeMap<String, u32> {
        let runs = self.0.lock().unwrap();
        runs.iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, id), times)| (id.clone(), *times))
            .collect()
    }
}

fn processors() -> [ProcessorSpec; 3] {
    [
        ProcessorSpec::new("billing")
            .unwrap()
            .with_types(["invoice.*"])
            .unwrap(),
        ProcessorSpec::new("email").unwrap(),
        ProcessorSpec::new("flaky").unwrap(),
    ]
}

fn body(event_type: &str) -> String {
    format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"obj_1"}}}}}}"#)
}

async fn counts(inbox: &Inbox) -> BTreeMap<String, (u64, u64, u64)> {
    let by = inbox.counts_by_processor().await.unwrap();
    by.into_iter()
        .map(|(name, c)| (name, (c.queued + c.processing, c.processed, c.dead)))
        .collect()
}

async fn each_processor_runs_its_routes_once_and_a_failing_one_holds_no_other(inbox: Inbox) {
    let inbox = inbox.with_processors(processors()).unwrap();
    let source = standard("shop");
    let ids: Vec<(String, &str)> = (0..6)
        .map(|i| {
            let ty = if i % 2 == 0 {
                "invoice.paid"
            } else {
                "customer.created"
            };
            (format!("evt_{i}"), ty)
        })
        .collect();
    for (id, ty) in &ids {
        let accepted = inbox.ingest(&source, Some(id), body(ty)).await.unwrap();
        assert_eq!(accepted, Accepted::New, "{id}");
    }
    // Routes made with the events: billing takes the invoices only.
    let queued = |billing, email, flaky| {
        BTreeMap::from([
            ("billing".to_owned(), (billing, 0, 0)),
            ("email".to_owned(), (email, 0, 0)),
            ("flaky".to_owned(), (flaky, 0, 0)),
        ])
    };
    assert_eq!(counts(&inbox).await, queued(3, 6, 6));
    assert_eq!(inbox.counts().await.unwrap().queued, 15, "the sum");

    let runs = Runs::default();
    let workers = [
        runs.worker(&inbox, "billing", false).spawn(),
        runs.worker(&inbox, "email", false).spawn(),
        runs.worker(&inbox, "flaky", true).spawn(),
    ];
    let done = BTreeMap::from([
        ("billing".to_owned(), (0, 3, 0)),
        ("email".to_owned(), (0, 6, 0)),
        ("flaky".to_owned(), (0, 0, 6)),
    ]);
    eventually("every route processed or dead", async || {
        counts(&inbox).await == done
    })
    .await;
    // A redelivery of each is a duplicate: no route made again, nothing runs again.
    for (id, ty) in &ids {
        let again = inbox.ingest(&source, Some(id), body(ty)).await.unwrap();
        assert_eq!(again, Accepted::Duplicate, "{id}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(counts(&inbox).await, done);
    let once = |filter: &dyn Fn(&str) -> bool, times| -> BTreeMap<String, u32> {
        ids.iter()
            .filter(|(_, ty)| filter(ty))
            .map(|(id, _)| (id.clone(), times))
            .collect()
    };
    assert_eq!(runs.of("billing"), once(&|ty| ty == "invoice.paid", 1));
    assert_eq!(runs.of("email"), once(&|_| true, 1));
    assert_eq!(
        runs.of("flaky"),
        once(&|_| true, 2),
        "both attempts, then dead"
    );
    let total = inbox.counts().await.unwrap();
    assert_eq!((total.processed, total.dead, total.queued), (9, 6, 0));
}

#[tokio::test]
async fn sqlite_each_processor_runs_its_routes_once_and_a_failing_one_holds_no_other() {
    let store = stores::sqlite().await;
    each_processor_runs_its_routes_once_and_a_failing_one_holds_no_other(Inbox::sqlite(&store))
        .await;
}

#[tokio::test]
async fn postgres_each_processor_runs_its_routes_once_and_a_failing_one_holds_no_other() {
    let store = stores::postgres().await;
    each_processor_runs_its_routes_once_and_a_failing_one_holds_no_other(Inbox::postgres(&store))
        .await;
}

/// An event no processor takes is stored with no route: no worker runs it, and its
/// redelivery is a duplicate.
async fn an_event_no_processor_takes_is_kept_as_a_key_and_runs_nowhere(inbox: Inbox) {
    let inbox = inbox
        .with_processors([ProcessorSpec::new("billing")
            .unwrap()
            .with_types(["invoice.*"])
            .unwrap()])
        .unwrap();
    let source = standard("shop");
    let stored = inbox.ingest(&source, Some("evt_x"), body("customer.created"));
    assert_eq!(stored.await.unwrap(), Accepted::New);
    let runs = Runs::default();
    let worker = runs.worker(&inbox, "billing", false).spawn();
    let again = inbox.ingest(&source, Some("evt_x"), body("customer.created"));
    assert_eq!(again.await.unwrap(), Accepted::Duplicate);
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    assert!(runs.of("billing").is_empty());
    assert_eq!(inbox.counts().await.unwrap(), Counts::default());
}

#[tokio::test]
async fn sqlite_an_event_no_processor_takes_is_kept_as_a_key_and_runs_nowhere() {
    let store = stores::sqlite().await;
    an_event_no_processor_takes_is_kept_as_a_key_and_runs_nowhere(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_an_event_no_processor_takes_is_kept_as_a_key_and_runs_nowhere() {
    let store = stores::postgres().await;
    an_event_no_processor_takes_is_kept_as_a_key_and_runs_nowhere(Inbox::postgres(&store)).await;
}

#[tokio::test]
async fn a_worker_for_a_processor_the_inbox_lacks_and_an_empty_set_are_refused() {
    let store = stores::sqlite().await;
    let inbox = Inbox::sqlite(&store);
    let none = inbox.clone().with_processors([]).unwrap_err();
    assert_eq!(none.kind(), ConfigErrorKind::InvalidProcessor);
    let inbox = inbox.with_processors(processors()).unwrap();
    let process = |_: Event, _: Attempt| async { Ok::<_, std::io::Error>(()) };
    let unknown = Worker::processor(&inbox, "shipping", process).unwrap_err();
    assert_eq!(unknown.kind(), ConfigErrorKind::InvalidProcessor);
    assert!(unknown.to_string().contains("shipping"), "{unknown}");
    let names: Vec<&str> = inbox.processors().map(|p| p.name()).collect();
    assert_eq!(names, ["billing", "email", "flaky"]);
}

//! Fan-out on the SQL inbox (issue 33), on SQLite and PostgreSQL: an inbox with several
//! processors gives each accepted event a route per processor whose filter takes it, in
//! the accept's transaction; each processor's workers run only its routes, each route
//! once, and one processor failing every attempt holds no other.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::seed::{eventually, standard};
use common::stores;
use tower_webhook::inbox::{
    Accepted, Attempt, AttemptOutcome, Counts, Inbox, Jitter, LateAnswers, Later, Listing, Pause,
    ProcessorSpec, Requeue, RetryPolicy, State, StoredEvent, Worker,
};
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
    let event = inbox.event("shop", "evt_x").await.unwrap().expect("kept");
    assert_eq!(event.summary.state, State::Unrouted);
    assert!(event.routes.is_empty() && event.attempts.is_empty());
    assert_eq!(
        event.summary.event_type.as_deref(),
        Some("customer.created")
    );
    assert_eq!(event.body, body("customer.created").as_bytes());
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

/// Each route's state, attempts and error, by processor.
fn routes(event: &StoredEvent) -> Vec<(String, State, u32, Option<String>, bool)> {
    let routes = event.routes.iter();
    routes
        .map(|r| {
            let error = r.last_error.clone();
            (r.processor.clone(), r.state, r.attempts, error, r.orphaned)
        })
        .collect()
}

/// Each attempt record's processor and outcome, in the history's order, by processor.
fn history(event: &StoredEvent) -> BTreeMap<String, Vec<AttemptOutcome>> {
    let mut by: BTreeMap<String, Vec<AttemptOutcome>> = BTreeMap::new();
    for a in &event.attempts {
        by.entry(a.processor.clone()).or_default().push(a.outcome);
    }
    by
}

/// Drives `ids` (invoices: every processor takes them) through billing and email, which
/// succeed, and flaky, which fails both its attempts: every route processed or dead.
async fn run_to_the_end(inbox: &Inbox, ids: &[&str], runs: &Runs) {
    run_failing(inbox, ids, runs, &["flaky"]).await;
}

/// [`run_to_the_end`] with the processors `failing` failing every attempt.
async fn run_failing(inbox: &Inbox, ids: &[&str], runs: &Runs, failing: &[&str]) {
    let source = standard("shop");
    for id in ids {
        let accepted = inbox.ingest(&source, Some(id), body("invoice.paid"));
        assert_eq!(accepted.await.unwrap(), Accepted::New);
    }
    let names = ["billing", "email", "flaky"];
    let fails = |name| failing.contains(&name);
    let workers = names.map(|name| runs.worker(inbox, name, fails(name)).spawn());
    let n = ids.len() as u64;
    let done: BTreeMap<String, (u64, u64, u64)> = names
        .iter()
        .map(|&name| match fails(name) {
            true => (name.to_owned(), (0, 0, n)),
            false => (name.to_owned(), (0, n, 0)),
        })
        .collect();
    eventually("every route processed or dead", async || {
        counts(inbox).await == done
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
}

/// `Inbox::event` shows each processor's route with its own state, attempts and error;
/// the event's own state is the most urgent route's (dead), its history each route's,
/// and a route of a processor the answering inbox lacks is orphaned.
async fn the_event_view_shows_each_route_and_the_most_urgent_state(inbox: Inbox) {
    let other = inbox.clone();
    let inbox = inbox.with_processors(processors()).unwrap();
    run_to_the_end(&inbox, &["evt_a"], &Runs::default()).await;

    let event = inbox.event("shop", "evt_a").await.unwrap().expect("stored");
    let error = Some("flaky fails every attempt".to_owned());
    assert_eq!(
        routes(&event),
        [
            ("billing".into(), State::Processed, 1, None, false),
            ("email".into(), State::Processed, 1, None, false),
            ("flaky".into(), State::Dead, 2, error.clone(), false),
        ]
    );
    assert!(event.routes[0].processed_at.is_some() && event.routes[2].dead_at.is_some());
    assert_eq!(event.summary.state, State::Dead, "the most urgent route's");
    assert_eq!(event.summary.processor, "flaky");
    assert_eq!(
        (event.summary.attempts, event.summary.last_error.clone()),
        (2, error)
    );
    assert_eq!(event.processed_at, None);
    use AttemptOutcome::{Dead, Failed, Processed};
    assert_eq!(
        history(&event),
        BTreeMap::from([
            ("billing".to_owned(), vec![Processed]),
            ("email".to_owned(), vec![Processed]),
            ("flaky".to_owned(), vec![Failed, Dead]),
        ])
    );

    // An inbox without flaky: its route is kept and shown orphaned.
    let fewer = other
        .with_processors([
            ProcessorSpec::new("billing").unwrap(),
            ProcessorSpec::new("email").unwrap(),
        ])
        .unwrap();
    let event = fewer.event("shop", "evt_a").await.unwrap().expect("stored");
    let orphaned: Vec<bool> = event.routes.iter().map(|r| r.orphaned).collect();
    assert_eq!(orphaned, [false, false, true]);
}

#[tokio::test]
async fn sqlite_the_event_view_shows_each_route_and_the_most_urgent_state() {
    let store = stores::sqlite().await;
    the_event_view_shows_each_route_and_the_most_urgent_state(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_the_event_view_shows_each_route_and_the_most_urgent_state() {
    let store = stores::postgres().await;
    the_event_view_shows_each_route_and_the_most_urgent_state(Inbox::postgres(&store)).await;
}

/// A requeue of one processor's dead route reruns that processor alone; a requeue of the
/// event without a processor is a replay for every processor.
async fn a_requeue_of_one_processors_route_reruns_it_alone(inbox: Inbox) {
    let inbox = inbox.with_processors(processors()).unwrap();
    let runs = Runs::default();
    run_to_the_end(&inbox, &["evt_a", "evt_b"], &runs).await;

    let one = Requeue::id("shop", "evt_a").with_processor("flaky");
    assert_eq!(inbox.requeue(one).await.unwrap(), 1);
    let none = Requeue::dead().with_processor("email");
    assert_eq!(
        inbox.requeue(none).await.unwrap(),
        0,
        "email has no dead route"
    );
    let workers = [
        runs.worker(&inbox, "billing", false).spawn(),
        runs.worker(&inbox, "email", false).spawn(),
        runs.worker(&inbox, "flaky", false).spawn(), // fixed
    ];
    let fixed = BTreeMap::from([
        ("billing".to_owned(), (0, 2, 0)),
        ("email".to_owned(), (0, 2, 0)),
        ("flaky".to_owned(), (0, 1, 1)),
    ]);
    eventually("flaky's requeued route processed", async || {
        counts(&inbox).await == fixed
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let flaky = BTreeMap::from([("evt_a".to_owned(), 3), ("evt_b".to_owned(), 2)]);
    assert_eq!(runs.of("flaky"), flaky, "evt_a once more, evt_b not");
    let once = BTreeMap::from([("evt_a".to_owned(), 1), ("evt_b".to_owned(), 1)]);
    assert_eq!(runs.of("billing"), once, "the others' routes not run again");
    assert_eq!(runs.of("email"), once);
    let event = inbox.event("shop", "evt_a").await.unwrap().unwrap();
    let states: Vec<State> = event.routes.iter().map(|r| r.state).collect();
    assert_eq!(states, [State::Processed; 3]);

    // Without a processor: every route of the event, a replay for all.
    assert_eq!(
        inbox.requeue(Requeue::id("shop", "evt_a")).await.unwrap(),
        3
    );
    eventually("the replay processed", async || {
        let by = inbox.counts_by_processor().await.unwrap();
        by.values().map(|c| c.processed).sum::<u64>() == 5
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(runs.of("billing")["evt_a"], 2);
    assert_eq!(runs.of("email")["evt_a"], 2);
    assert_eq!(runs.of("flaky")["evt_a"], 4);
}

#[tokio::test]
async fn sqlite_a_requeue_of_one_processors_route_reruns_it_alone() {
    let store = stores::sqlite().await;
    a_requeue_of_one_processors_route_reruns_it_alone(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_a_requeue_of_one_processors_route_reruns_it_alone() {
    let store = stores::postgres().await;
    a_requeue_of_one_processors_route_reruns_it_alone(Inbox::postgres(&store)).await;
}

/// Every (id, processor) `listing` finds, a page of one row at a time.
async fn listed(inbox: &Inbox, listing: Listing) -> Vec<(String, String)> {
    let (mut rows, mut listing) = (Vec::new(), listing.with_limit(1));
    loop {
        let page = inbox.list(&listing).await.unwrap();
        rows.extend(page.events.into_iter().map(|e| (e.id, e.processor)));
        let Some(next) = page.next else { break rows };
        listing = listing.after(next);
    }
}

/// Each dead route is a row of the listing, paged once each (an event's routes tied in
/// time by their processor); a listing of one processor has its routes alone.
async fn a_listing_shows_each_route_and_filters_by_processor(inbox: Inbox) {
    let inbox = inbox.with_processors(processors()).unwrap();
    run_failing(
        &inbox,
        &["evt_a", "evt_b"],
        &Runs::default(),
        &["email", "flaky"],
    )
    .await;

    let mut all = listed(&inbox, Listing::dead()).await;
    let oldest = listed(&inbox, Listing::dead().oldest_first()).await;
    assert_eq!(all.iter().rev().cloned().collect::<Vec<_>>(), oldest);
    all.sort();
    let route = |id: &str, p: &str| (id.to_owned(), p.to_owned());
    assert_eq!(
        all,
        [
            route("evt_a", "email"),
            route("evt_a", "flaky"),
            route("evt_b", "email"),
            route("evt_b", "flaky"),
        ]
    );
    let mut email = listed(&inbox, Listing::dead().with_processor("email")).await;
    email.sort();
    assert_eq!(email, [route("evt_a", "email"), route("evt_b", "email")]);
    let oldest = listed(
        &inbox,
        Listing::dead().with_processor("flaky").oldest_first(),
    )
    .await;
    assert_eq!(oldest.len(), 2);
    assert!(oldest.iter().all(|(_, p)| p == "flaky"), "{oldest:?}");
    assert!(listed(&inbox, Listing::dead().with_processor("billing"))
        .await
        .is_empty());
    assert!(listed(&inbox, Listing::failing().with_processor("email"))
        .await
        .is_empty());
}

#[tokio::test]
async fn sqlite_a_listing_shows_each_route_and_filters_by_processor() {
    let store = stores::sqlite().await;
    a_listing_shows_each_route_and_filters_by_processor(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_a_listing_shows_each_route_and_filters_by_processor() {
    let store = stores::postgres().await;
    a_listing_shows_each_route_and_filters_by_processor(Inbox::postgres(&store)).await;
}

/// Each pause's processor, source and type.
async fn pauses(inbox: &Inbox) -> Vec<(Option<String>, Option<String>, Option<String>)> {
    let pauses = inbox.pauses().await.unwrap();
    let rule = |p: Pause| (p.processor, p.source, p.event_type);
    pauses.into_iter().map(rule).collect()
}

/// A pause of one processor holds its routes alone (counted paused for it only); a pause
/// of every processor holds all, and its resume leaves the processor's own pause.
async fn a_pause_of_one_processor_holds_only_its_routes(inbox: Inbox) {
    let inbox = inbox.with_processors(processors()).unwrap();
    let unknown = inbox
        .pause_processor("shipping", None, None)
        .await
        .unwrap_err();
    assert_eq!(
        unknown.kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    assert!(inbox
        .pause_processor("email", Some("shop"), None)
        .await
        .unwrap());
    assert!(
        !inbox
            .pause_processor("email", Some("shop"), None)
            .await
            .unwrap(),
        "already"
    );
    let shop = Some("shop".to_owned());
    assert_eq!(
        pauses(&inbox).await,
        [(Some("email".into()), shop.clone(), None)]
    );

    let source = standard("shop");
    let accepted = inbox.ingest(&source, Some("evt_p"), body("invoice.paid"));
    assert_eq!(accepted.await.unwrap(), Accepted::New);
    let paused = inbox.counts_by_processor().await.unwrap();
    let held: Vec<u64> = paused.values().map(|c| c.paused).collect();
    assert_eq!(held, [0, 1, 0], "email's route alone counted paused");

    let runs = Runs::default();
    let names = ["billing", "email", "flaky"];
    let workers = names.map(|name| runs.worker(&inbox, name, false).spawn());
    eventually("billing and flaky processed", async || {
        let c = counts(&inbox).await;
        c["billing"].1 == 1 && c["flaky"].1 == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(runs.of("email").is_empty(), "email's route held");

    // Every processor paused too: resuming email's own pause still holds it.
    assert!(inbox.pause(None, None).await.unwrap());
    assert!(inbox
        .resume_processor("email", Some("shop"), None)
        .await
        .unwrap());
    assert_eq!(pauses(&inbox).await, [(None, None, None)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        runs.of("email").is_empty(),
        "held by the pause of every processor"
    );
    assert!(inbox.resume(None, None).await.unwrap());
    eventually("email's route processed once resumed", async || {
        counts(&inbox).await["email"].1 == 1
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    let once = BTreeMap::from([("evt_p".to_owned(), 1)]);
    for name in names {
        assert_eq!(runs.of(name), once, "{name}");
    }
}

#[tokio::test]
async fn sqlite_a_pause_of_one_processor_holds_only_its_routes() {
    let store = stores::sqlite().await;
    a_pause_of_one_processor_holds_only_its_routes(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_a_pause_of_one_processor_holds_only_its_routes() {
    let store = stores::postgres().await;
    a_pause_of_one_processor_holds_only_its_routes(Inbox::postgres(&store)).await;
}

/// A retry wakes only its processor's workers: while `a`'s route waits out its backoff,
/// `b`'s worker (idle, polling once in 10 minutes) sends no claim, not even at `a`'s due
/// time; `a`'s worker runs the route again at that time, not at its poll.
async fn a_retry_wakes_only_its_processors_workers(inbox: Inbox) {
    let inbox = inbox
        .with_processors(["a", "b"].map(|name| ProcessorSpec::new(name).unwrap()))
        .unwrap();
    // Counts each processor's claims (hidden, for tests).
    let late = LateAnswers::new();
    let counted = inbox.with_late_answers(&late);
    let backoff = Duration::from_secs(2);
    let retry = RetryPolicy::default()
        .with_backoff(backoff, backoff)
        .unwrap()
        .with_jitter(Jitter::None);
    let runs = Runs::default();
    let started: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let process = {
        let started = started.clone();
        move |_: Event, attempt: Attempt| {
            started.lock().unwrap().push(Instant::now());
            async move {
                match attempt.number() {
                    1 => Err("a fails its first attempt"),
                    _ => Ok(()),
                }
            }
        }
    };
    let poll = Duration::from_secs(600);
    let a = Worker::processor(&counted, "a", process).unwrap();
    let a = a.with_retry(retry).with_poll_interval(poll).unwrap();
    let b = runs.worker(&counted, "b", false).with_poll_interval(poll);
    let source = standard("shop");
    let accepted = inbox.ingest(&source, Some("evt_1"), body("invoice.paid"));
    assert_eq!(accepted.await.unwrap(), Accepted::New);
    let (a, b) = (a.spawn(), b.unwrap().spawn());

    let state = async |name: &str| {
        let event = inbox.event("shop", "evt_1").await.unwrap().unwrap();
        let route = event.routes.iter().find(|r| r.processor == name).cloned();
        route.unwrap().state
    };
    eventually("b's route processed", async || {
        state("b").await == State::Processed
    })
    .await;
    // b's worker settles: its claim as its processor ended came back empty.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_claims = late.claims("b");
    assert_eq!(
        started.lock().unwrap().len(),
        1,
        "a's retry is still to come (the backoff is longer than this)"
    );
    eventually("a's route processed at its second attempt", async || {
        state("a").await == State::Processed
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        late.claims("b"),
        b_claims,
        "a's retry woke none of b's workers"
    );
    assert!(late.claims("a") >= 2, "a claimed again");
    let started = started.lock().unwrap().clone();
    let waited = started[1] - started[0];
    assert!(
        waited >= backoff && waited < backoff + Duration::from_secs(3),
        "a's worker woke at the due time, not at its poll: {waited:?}"
    );
    assert_eq!(runs.of("b").len(), 1);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn sqlite_a_retry_wakes_only_its_processors_workers() {
    let store = stores::sqlite().await;
    a_retry_wakes_only_its_processors_workers(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_a_retry_wakes_only_its_processors_workers() {
    let store = stores::postgres().await;
    a_retry_wakes_only_its_processors_workers(Inbox::postgres(&store)).await;
}

/// The attempt history's cap holds per route (fan-out's T15): `a` snoozing its route far
/// past the cap (100 records) evicts only its own oldest records, and the event view reads
/// each route's newest 100; `b`'s older history (a failure, then processed) stays whole.
async fn one_processors_snoozes_past_the_cap_leave_anothers_history(inbox: Inbox) {
    let inbox = inbox
        .with_processors(["a", "b"].map(|name| ProcessorSpec::new(name).unwrap()))
        .unwrap();
    let source = standard("shop");
    let accepted = inbox.ingest(&source, Some("evt_1"), body("invoice.paid"));
    assert_eq!(accepted.await.unwrap(), Accepted::New);
    let processed = async |name: &str| {
        let event = inbox.event("shop", "evt_1").await.unwrap().unwrap();
        let route = event.routes.iter().find(|r| r.processor == name).cloned();
        route.unwrap().state == State::Processed
    };
    let retry = RetryPolicy::default()
        .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
        .unwrap()
        .with_jitter(Jitter::None);
    let b = Worker::processor(&inbox, "b", |_: Event, attempt: Attempt| async move {
        match attempt.number() {
            1 => Err("b fails once"),
            _ => Ok(()),
        }
    });
    let b = b.unwrap().with_retry(retry).spawn();
    eventually("b's route processed", async || processed("b").await).await;
    b.shutdown().await;

    const SNOOZES: usize = 110;
    let snoozed = Arc::new(Mutex::new(0));
    let a = Worker::processor(&inbox, "a", move |_: Event, _: Attempt| {
        let snoozed = snoozed.clone();
        async move {
            let mut snoozed = snoozed.lock().unwrap();
            if *snoozed == SNOOZES {
                return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(());
            }
            *snoozed += 1;
            Err(Later::after(Duration::ZERO).into())
        }
    });
    let a = a.unwrap().spawn();
    // Each snooze is a claim and an outcome: longer than `eventually` waits, under load.
    for _ in 0..1500 {
        if processed("a").await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.shutdown().await;

    let event = inbox.event("shop", "evt_1").await.unwrap().unwrap();
    let history = history(&event);
    assert_eq!(
        history["b"],
        [AttemptOutcome::Failed, AttemptOutcome::Processed],
        "b's history intact"
    );
    let mut newest = vec![AttemptOutcome::Snoozed; 99];
    newest.push(AttemptOutcome::Processed);
    assert_eq!(history["a"], newest, "a's newest 100");
}

#[tokio::test]
async fn sqlite_one_processors_snoozes_past_the_cap_leave_anothers_history() {
    let store = stores::sqlite().await;
    one_processors_snoozes_past_the_cap_leave_anothers_history(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_one_processors_snoozes_past_the_cap_leave_anothers_history() {
    let store = stores::postgres().await;
    one_processors_snoozes_past_the_cap_leave_anothers_history(Inbox::postgres(&store)).await;
}

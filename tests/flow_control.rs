//! Flow control into the processor, each rule on every queue the worker runs on — the SQL
//! inbox on SQLite and on PostgreSQL, and NATS JetStream — against the real servers: a
//! rate spaces the starts and counts no attempt for waiting; backpressure refuses
//! deliveries of retrying providers (not GitHub's) while the queue lags; a pause (SQL
//! inbox) holds a type back while others run, and resume starts its events in order; a
//! per-object cap of 1 runs one object's events one at a time, in arrival order.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{at, fresh_pg_url, request, verifier, NOW};
use http::StatusCode;
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{
    Accept, Attempt, Backpressure, Counts, Inbox, Later, Pause, Processor, Rate, Worker,
    WorkerHandle,
};
use tower_webhook::store::{MemoryStore, PgStore, SqliteStore};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Where the events wait: each test runs once on each.
enum Queue {
    Sql(Inbox),
    JetStream(JetStream),
}

impl Queue {
    async fn sqlite() -> Self {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-flow-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = SqliteStore::open(path).await.unwrap();
        Self::Sql(Inbox::sqlite(&store))
    }

    async fn postgres() -> Self {
        let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
        Self::Sql(Inbox::postgres(&store))
    }

    /// A stream of this test's own, in memory.
    async fn jetstream() -> Self {
        let client = async_nats::connect(common::nats_url())
            .await
            .expect("NATS with JetStream must be running (.ci/services starts it)");
        let name = format!("tw_flow_{}", uuid::Uuid::new_v4().simple());
        let jetstream = JetStream::builder(client, &name)
            .with_memory_storage()
            .build()
            .await
            .unwrap();
        Self::JetStream(jetstream)
    }

    fn accept_service(&self) -> Accept {
        match self {
            Self::Sql(inbox) => inbox.accept_service(),
            Self::JetStream(jetstream) => jetstream.accept_service(),
        }
    }

    /// Delivers `id` (signed, verified) for the queue to store; asserts the 204.
    async fn deliver(&self, id: &str) {
        let response = deliver_to(&self.accept_service(), Scheme::standard(), id).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{id}");
    }

    async fn counts(&self) -> Counts {
        match self {
            Self::Sql(inbox) => inbox.counts().await.unwrap(),
            Self::JetStream(jetstream) => jetstream.counts().await.unwrap(),
        }
    }

    /// A worker on this queue: `concurrency` at a time, quick polls, under `rate`.
    fn spawn(&self, processor: impl Processor, concurrency: usize, rate: Rate) -> WorkerHandle {
        self.spawn_with(processor, concurrency, Some(rate), None)
    }

    /// A worker on this queue: `concurrency` at a time, quick polls, under `rate` and
    /// `per_object`, if given.
    fn spawn_with(
        &self,
        processor: impl Processor,
        concurrency: usize,
        rate: Option<Rate>,
        per_object: Option<u32>,
    ) -> WorkerHandle {
        let settings = Settings {
            concurrency,
            rate,
            per_object,
            ..Settings::default()
        };
        self.spawn_set(processor, settings)
    }

    /// A worker on this queue with `settings`, polling quickly.
    fn spawn_set(&self, processor: impl Processor, settings: Settings) -> WorkerHandle {
        let poll = Duration::from_millis(100);
        // The builder methods the two workers share, applied to either.
        macro_rules! configured {
            ($worker:expr) => {{
                let mut worker = $worker
                    .with_concurrency(settings.concurrency)
                    .unwrap()
                    .with_poll_interval(poll)
                    .unwrap();
                if let Some(rate) = settings.rate {
                    worker = worker.with_rate(rate);
                }
                if let Some(n) = settings.per_object {
                    worker = worker.with_per_object(n).unwrap();
                }
                if let Some(n) = settings.max_attempts {
                    worker = worker.with_max_attempts(n).unwrap();
                }
                if let Some(n) = settings.per_source {
                    worker = worker.with_per_source(n).unwrap();
                }
                if let Some(rate) = settings.rate_per_source {
                    worker = worker.with_rate_per_source(rate);
                }
                worker.spawn()
            }};
        }
        match self {
            Self::Sql(inbox) => configured!(Worker::new(inbox, processor)),
            Self::JetStream(jetstream) => {
                let worker = JetStreamWorker::new(jetstream, MemoryStore::new(), processor);
                let lookahead = settings.lookahead;
                configured!(lookahead
                    .into_iter()
                    .fold(worker, |worker, n| worker.with_lookahead(n).unwrap()))
            }
        }
    }

    async fn pause(&self, source: Option<&str>, event_type: Option<&str>) -> bool {
        match self {
            Self::Sql(inbox) => inbox.pause(source, event_type).await.unwrap(),
            Self::JetStream(js) => js.pause(source, event_type).await.unwrap(),
        }
    }

    async fn resume(&self, source: Option<&str>, event_type: Option<&str>) -> bool {
        match self {
            Self::Sql(inbox) => inbox.resume(source, event_type).await.unwrap(),
            Self::JetStream(js) => js.resume(source, event_type).await.unwrap(),
        }
    }

    async fn pauses(&self) -> Vec<Pause> {
        match self {
            Self::Sql(inbox) => inbox.pauses().await.unwrap(),
            Self::JetStream(js) => js.pauses().await.unwrap(),
        }
    }
}

/// A worker's settings beside the quick poll every test worker has.
#[derive(Default)]
struct Settings {
    concurrency: usize,
    rate: Option<Rate>,
    per_object: Option<u32>,
    max_attempts: Option<u32>,
    per_source: Option<u32>,
    rate_per_source: Option<Rate>,
    /// JetStream's only (the SQL claim skips capped sources at any depth).
    lookahead: Option<usize>,
}

/// Delivers `id` signed in `scheme` (whose name is its source) through verification to
/// `accept`.
async fn deliver_to(accept: &Accept, scheme: Scheme, id: &str) -> http::Response<impl Sized> {
    deliver_typed(accept, scheme, id, "order.paid").await
}

/// As [`deliver_to`], of type `event_type`.
async fn deliver_typed(
    accept: &Accept,
    scheme: Scheme,
    id: &str,
    event_type: &str,
) -> http::Response<impl Sized> {
    deliver_about(accept, scheme, id, event_type, &format!("o_{id}")).await
}

/// As [`deliver_typed`], about `object`.
async fn deliver_about(
    accept: &Accept,
    scheme: Scheme,
    id: &str,
    event_type: &str,
    object: &str,
) -> http::Response<impl Sized> {
    let verify = VerifyWebhookLayer::new(verifier(scheme.clone(), &[SECRET]));
    let body = format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"{object}"}}}}}}"#);
    let mut headers = scheme.sign([SECRET], id, at(NOW), body.as_bytes()).unwrap();
    headers.insert("x-github-event", http::HeaderValue::from_static("push"));
    let req: http::Request<Full<Bytes>> = request(headers, body);
    verify.layer(accept.clone()).oneshot(req).await.unwrap()
}

/// When an attempt started, and its number.
type Start = (Instant, u32);

/// Each event id's attempts.
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<HashMap<String, Vec<Start>>>>);

impl Starts {
    fn processor(&self) -> impl Processor {
        let starts = self.clone();
        move |e: Event, a: Attempt| {
            let starts = starts.clone();
            async move {
                starts
                    .0
                    .lock()
                    .unwrap()
                    .entry(e.id().unwrap().to_owned())
                    .or_default()
                    .push((Instant::now(), a.number()));
                Ok::<_, std::io::Error>(())
            }
        }
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Every start, in order.
    fn times(&self) -> Vec<Instant> {
        let mut times: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .values()
            .flatten()
            .map(|(t, _)| *t)
            .collect();
        times.sort();
        times
    }
}

/// One run of the processor: its event, when it began and ended, which attempt.
#[derive(Clone)]
struct Run {
    event: Event,
    start: Instant,
    end: Instant,
    attempt: u32,
}

/// Every run, as it ended.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    /// A processor that works `work` on each event and records the run.
    fn processor(&self, work: Duration) -> impl Processor {
        let runs = self.clone();
        move |event: Event, a: Attempt| {
            let runs = runs.clone();
            async move {
                let start = Instant::now();
                tokio::time::sleep(work).await;
                let (end, attempt) = (Instant::now(), a.number());
                let run = Run {
                    event,
                    start,
                    end,
                    attempt,
                };
                runs.0.lock().unwrap().push(run);
                Ok::<_, std::io::Error>(())
            }
        }
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }
}

async fn eventually(what: &str, within: Duration, check: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 12 events queued before the worker starts, 8 processors free, a rate of 10 a second:
/// the k-th start comes no sooner than k tenths of a second after the worker was
/// spawned, so the 12 take at least 1.1 s where unpaced they would take milliseconds; and
/// each is attempt 1 — waiting for its turn counted nothing. (Measured from the spawn, not
/// between starts: a loaded machine can only delay a start, never bring it forward, while
/// a late claim followed by prompt ones would bunch starts observed in a window.)
async fn a_rate_spaces_starts_and_counts_no_attempt_for_waiting(queue: Queue) {
    let ids: Vec<String> = (0..12).map(|i| format!("evt_rate_{i}")).collect();
    for id in &ids {
        queue.deliver(id).await;
    }
    let starts = Starts::default();
    let spawned = Instant::now();
    let worker = queue.spawn(starts.processor(), 8, Rate::per_second(10).unwrap());
    eventually("12 started", Duration::from_secs(10), || {
        starts.count() >= 12
    })
    .await;
    worker.shutdown().await;
    let times = starts.times();
    assert_eq!(times.len(), 12, "each event started once");
    for (k, start) in times.iter().enumerate() {
        let after = *start - spawned;
        let turn = Duration::from_millis(100) * u32::try_from(k).unwrap();
        assert!(after >= turn, "start {k} came {after:?} after the spawn");
    }
    for (id, attempts) in starts.0.lock().unwrap().iter() {
        let numbers: Vec<u32> = attempts.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers, [1], "{id}: held back, not attempted");
    }
}

/// Backpressure at 1 s: 3 events queued, no worker. Once the oldest has waited past the
/// bound, a delivery from a retrying provider is answered 503 + `Retry-After: 1` and not
/// stored, while GitHub's (which never retries) is still stored; once a worker has
/// drained the queue, deliveries are stored again.
async fn backpressure_refuses_retrying_sources_while_the_queue_lags(queue: Queue) {
    let accept = queue
        .accept_service()
        .with_backpressure(Backpressure::max_lag(Duration::from_secs(1)));
    for i in 0..3 {
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_bp_{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "before any lag");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The lag is read in the background, every 500 ms at most: refused within a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    let refused = loop {
        n += 1;
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_late_{n}")).await;
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            break response;
        }
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused.headers()[http::header::RETRY_AFTER], "1");
    let stored = queue.counts().await.queued;
    let github = deliver_to(&accept, Scheme::github(), "gh-delivery-1").await;
    assert_eq!(
        github.status(),
        StatusCode::NO_CONTENT,
        "GitHub never retries"
    );
    let again = deliver_to(&accept, Scheme::standard(), "evt_refused_again").await;
    assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        queue.counts().await.queued,
        stored + 1,
        "the refused deliveries were not stored, GitHub's was"
    );

    let starts = Starts::default();
    let worker = queue.spawn(starts.processor(), 8, Rate::per_second(1000).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = deliver_to(&accept, Scheme::standard(), "evt_after_drain").await;
        if response.status() == StatusCode::NO_CONTENT {
            break;
        }
        assert!(Instant::now() < deadline, "still refused after the drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;
}

/// Backpressure by depth, 2: three events queued, no worker. Once the depth was read, a
/// retrying provider's delivery is answered 503 + `Retry-After: 60` and not stored (a
/// depth bound alone), GitHub's is stored; drained, deliveries are stored again.
async fn backpressure_by_depth_refuses_beyond_the_bound(queue: Queue) {
    let accept = queue
        .accept_service()
        .with_backpressure(Backpressure::max_depth(2));
    for i in 0..3 {
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_deep_{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "before any read");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let response = deliver_to(&accept, Scheme::standard(), "evt_too_deep").await;
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            break response;
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused.headers()[http::header::RETRY_AFTER], "60");
    let github = deliver_to(&accept, Scheme::github(), "gh-deep-1").await;
    assert_eq!(
        github.status(),
        StatusCode::NO_CONTENT,
        "GitHub never retries"
    );
    let starts = Starts::default();
    let worker = queue.spawn_with(starts.processor(), 8, None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = deliver_to(&accept, Scheme::standard(), "evt_after_depth").await;
        if response.status() == StatusCode::NO_CONTENT {
            break;
        }
        assert!(Instant::now() < deadline, "still refused after the drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;
}

/// A pause of one type, in the whole inbox: another type's event is processed while the
/// paused ones are accepted and wait, none started and none counted; resumed, they start
/// in the order they came (one processor: one at a time), each as attempt 1.
async fn a_pause_holds_a_type_back_and_resume_starts_its_events_in_order(queue: Queue) {
    assert!(queue.pause(None, Some("invoice.paid")).await);
    assert!(
        !queue.pause(None, Some("invoice.paid")).await,
        "paused already"
    );
    let pauses = queue.pauses().await;
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].source.as_deref(), pauses[0].event_type.as_deref()),
        (None, Some("invoice.paid"))
    );
    let accept = queue.accept_service();
    let ids: Vec<String> = (0..4).map(|i| format!("evt_paused_{i}")).collect();
    for id in &ids {
        let response = deliver_typed(&accept, Scheme::standard(), id, "invoice.paid").await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "accepts go on");
        tokio::time::sleep(Duration::from_millis(5)).await; // distinct arrival times
    }
    let starts = Starts::default();
    let worker = queue.spawn_with(starts.processor(), 1, None, None);
    let other = deliver_typed(&accept, Scheme::standard(), "evt_other", "order.paid").await;
    assert_eq!(other.status(), StatusCode::NO_CONTENT);
    eventually("the other type processed", Duration::from_secs(10), || {
        starts.count() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await; // six polls
    assert_eq!(starts.count(), 1, "nothing paused started");
    assert_eq!(queue.counts().await.paused, 4, "the paused wait");

    assert!(
        !queue.resume(Some("standard"), Some("invoice.paid")).await,
        "not that pause"
    );
    assert!(queue.resume(None, Some("invoice.paid")).await);
    assert!(queue.pauses().await.is_empty());
    eventually("the paused ones processed", Duration::from_secs(10), || {
        starts.count() == 5
    })
    .await;
    assert_eq!(queue.counts().await.paused, 0, "none held back now");
    worker.shutdown().await;
    let all = starts.0.lock().unwrap().clone();
    let mut order: Vec<(Instant, String)> =
        ids.iter().map(|id| (all[id][0].0, id.clone())).collect();
    order.sort();
    let order: Vec<String> = order.into_iter().map(|(_, id)| id).collect();
    assert_eq!(order, ids, "in the order they came");
    for (id, attempts) in all {
        let numbers: Vec<u32> = attempts.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers, [1], "{id}: paused, not attempted");
    }
}

/// Per object, 1, with 8 processors: 4 events of object A and 4 of object B, each 150 ms
/// of work. A's events never overlap and start in the order they came, as do B's; but A
/// and B run beside each other (the cap is per object). Each is attempt 1.
async fn a_per_object_cap_of_one_runs_an_objects_events_one_at_a_time_in_order(queue: Queue) {
    let accept = queue.accept_service();
    let mut arrivals: HashMap<&str, Vec<String>> = HashMap::new();
    for i in 0..4 {
        for object in ["o_A", "o_B"] {
            let id = format!("evt_{object}_{i}");
            let response = deliver_about(&accept, Scheme::standard(), &id, "order.paid", object);
            assert_eq!(response.await.status(), StatusCode::NO_CONTENT);
            arrivals.entry(object).or_default().push(id);
            tokio::time::sleep(Duration::from_millis(5)).await; // distinct arrival times
        }
    }
    let runs = Runs::default();
    let processor = runs.processor(Duration::from_millis(150));
    let worker = queue.spawn_with(processor, 8, None, Some(1));
    eventually("8 processed", Duration::from_secs(15), || runs.len() == 8).await;
    worker.shutdown().await;
    let runs: Vec<(String, String, Instant, Instant, u32)> = runs
        .all()
        .into_iter()
        .map(|r| {
            let object = r.event.object_id().unwrap().to_owned();
            (
                object,
                r.event.id().unwrap().to_owned(),
                r.start,
                r.end,
                r.attempt,
            )
        })
        .collect();
    for object in ["o_A", "o_B"] {
        let mut of: Vec<_> = runs.iter().filter(|r| r.0 == object).collect();
        of.sort_by_key(|r| r.2);
        let order: Vec<&str> = of.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(order, arrivals[object], "{object}: in arrival order");
        for pair in of.windows(2) {
            assert!(
                pair[1].2 >= pair[0].3,
                "{object}: {} began before {} ended",
                pair[1].1,
                pair[0].1
            );
        }
    }
    let first = |object: &str| {
        runs.iter()
            .filter(|r| r.0 == object)
            .map(|r| r.2)
            .min()
            .unwrap()
    };
    let last = |object: &str| {
        runs.iter()
            .filter(|r| r.0 == object)
            .map(|r| r.3)
            .max()
            .unwrap()
    };
    assert!(
        first("o_B") < last("o_A") && first("o_A") < last("o_B"),
        "the two objects ran beside each other"
    );
    assert!(
        runs.iter().all(|r| r.4 == 1),
        "no attempt counted for waiting"
    );
}

/// Per object, 1, with 2 processors: 6 events of a hot object queued first, then 4 of
/// other objects, each 150 ms of work. The hot object's events wait for their turns
/// without holding the processors: one processor works them off one at a time while the
/// other takes the other objects' events, which have all finished before the hot
/// object's last starts (were the waiting ones holding both processors, the others
/// would start only after it), and the hot ones run in arrival order.
async fn events_waiting_for_their_objects_turn_leave_the_processors_to_others(queue: Queue) {
    let accept = queue.accept_service();
    let hot: Vec<String> = (0..6).map(|i| format!("evt_hot_{i}")).collect();
    for id in &hot {
        let response = deliver_about(&accept, Scheme::standard(), id, "order.paid", "o_hot");
        assert_eq!(response.await.status(), StatusCode::NO_CONTENT);
        tokio::time::sleep(Duration::from_millis(5)).await; // distinct arrival times
    }
    let others: Vec<String> = (0..4).map(|i| format!("evt_other_{i}")).collect();
    for id in &others {
        queue.deliver(id).await;
    }
    let runs = Runs::default();
    let worker = queue.spawn_with(runs.processor(Duration::from_millis(150)), 2, None, Some(1));
    eventually("10 processed", Duration::from_secs(20), || runs.len() == 10).await;
    worker.shutdown().await;
    let all = runs.all();
    let mut of_hot: Vec<&Run> = all
        .iter()
        .filter(|r| r.event.object_id() == Some("o_hot"))
        .collect();
    of_hot.sort_by_key(|r| r.start);
    let order: Vec<&str> = of_hot.iter().map(|r| r.event.id().unwrap()).collect();
    assert_eq!(order, hot, "the hot object's events in arrival order");
    for pair in of_hot.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "the hot object's events overlapped"
        );
    }
    let others_done = all
        .iter()
        .filter(|r| r.event.object_id() != Some("o_hot"))
        .map(|r| r.end)
        .max()
        .unwrap();
    assert!(
        others_done <= of_hot[5].start,
        "the other objects' events waited behind the hot object's"
    );
    assert!(
        all.iter().all(|r| r.attempt == 1),
        "no attempt counted for waiting"
    );
}

/// A processor that answers "later" (300 ms) to each event's first start, on a worker
/// allowed one attempt: each event runs again after the snooze, as attempt 1 both times,
/// and none goes dead.
async fn later_snoozes_an_event_without_counting_an_attempt(queue: Queue) {
    let ids: Vec<String> = (0..3).map(|i| format!("evt_later_{i}")).collect();
    for id in &ids {
        queue.deliver(id).await;
    }
    let starts = Starts::default();
    let recorded = starts.clone();
    let processor = move |e: Event, a: Attempt| {
        let starts = recorded.clone();
        async move {
            let mut all = starts.0.lock().unwrap();
            let runs = all.entry(e.id().unwrap().to_owned()).or_default();
            runs.push((Instant::now(), a.number()));
            if runs.len() == 1 {
                return Err(Later::after(Duration::from_millis(300)).into());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    };
    let settings = Settings {
        concurrency: 4,
        max_attempts: Some(1),
        ..Settings::default()
    };
    let worker = queue.spawn_set(processor, settings);
    eventually("each started twice", Duration::from_secs(15), || {
        starts.count() == 6
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue.counts().await.processed < 3 {
        assert!(Instant::now() < deadline, "never all processed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A snooze left a redelivery due, which let a pull wait with no expiry (JetStream).
    let shutdown = tokio::time::timeout(Duration::from_secs(10), worker.shutdown());
    shutdown
        .await
        .expect("the shutdown waited for a pull that never ends");
    let counts = queue.counts().await;
    assert_eq!((counts.dead, counts.queued), (0, 0), "{counts:?}");
    for (id, runs) in starts.0.lock().unwrap().iter() {
        let numbers: Vec<u32> = runs.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers, [1, 1], "{id}: the snooze was not an attempt");
        let waited = runs[1].0 - runs[0].0;
        assert!(
            waited >= Duration::from_millis(280),
            "{id}: ran again after {waited:?}"
        );
    }
}

/// A cap of 2 per source, 4 processors: 12 events of one source queued before 2 of
/// another, each 150 ms of work. The big source never has more than 2 running; on the SQL
/// inbox, whose claim leaves a source at its cap where it is, the small source's events
/// start before the first of the big one's has ended — on JetStream too, which delivers
/// in order: the big source's messages over its cap wait in the worker without a
/// processor, and the worker reads on. Each is attempt 1: an event left or handed back
/// for its source's cap counted nothing.
async fn a_per_source_cap_bounds_a_source_and_lets_another_through(queue: Queue) {
    let accept = queue.accept_service();
    for i in 0..12 {
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_big_{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    for i in 0..2 {
        let response = deliver_to(&accept, Scheme::github(), &format!("gh-small-{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    let runs = Runs::default();
    let processor = runs.processor(Duration::from_millis(150));
    let settings = Settings {
        concurrency: 4,
        per_source: Some(2),
        ..Settings::default()
    };
    let worker = queue.spawn_set(processor, settings);
    eventually("14 processed", Duration::from_secs(20), || runs.len() == 14).await;
    worker.shutdown().await;
    let runs: Vec<(String, Instant, Instant, u32)> = runs
        .all()
        .into_iter()
        .map(|r| (r.event.source().to_owned(), r.start, r.end, r.attempt))
        .collect();
    let big: Vec<_> = runs.iter().filter(|r| r.0 == "standard").collect();
    // The most running at once is reached as one starts: count those running then.
    for run in &big {
        let at = run.1;
        let running = big.iter().filter(|o| o.1 <= at && at < o.2).count();
        assert!(running <= 2, "{running} of the big source ran at once");
    }
    let first_end = big.iter().map(|r| r.2).min().unwrap();
    let small = runs.iter().filter(|r| r.0 == "github");
    assert!(
        small.clone().all(|r| r.1 < first_end),
        "the small source waited behind the big one"
    );
    assert!(
        runs.iter().all(|r| r.3 == 1),
        "no attempt counted for a cap"
    );
}

/// A rate of 5 a second per source, 8 processors: 6 events of one source, then 2 of
/// another. One source's starts are spaced by a fifth of a second (its k-th no sooner
/// than k fifths after the spawn: measured from there, as the rate above), and the
/// other's first start does not wait behind them: it comes before the first source's
/// second. Each is attempt 1.
async fn a_rate_per_source_spaces_each_source_on_its_own(queue: Queue) {
    let accept = queue.accept_service();
    for i in 0..6 {
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_paced_{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    for i in 0..2 {
        let response = deliver_to(&accept, Scheme::github(), &format!("gh-paced-{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    let runs = Runs::default();
    let settings = Settings {
        concurrency: 8,
        rate_per_source: Some(Rate::per_second(5).unwrap()),
        ..Settings::default()
    };
    let spawned = Instant::now();
    let worker = queue.spawn_set(runs.processor(Duration::ZERO), settings);
    eventually("8 processed", Duration::from_secs(15), || runs.len() == 8).await;
    worker.shutdown().await;
    let starts = |source: &str| {
        let mut starts: Vec<Instant> = runs
            .all()
            .iter()
            .filter(|r| r.event.source() == source)
            .map(|r| r.start)
            .collect();
        starts.sort();
        starts
    };
    let (paced, other) = (starts("standard"), starts("github"));
    for (k, start) in paced.iter().enumerate() {
        let after = *start - spawned;
        let turn = Duration::from_millis(200) * u32::try_from(k).unwrap();
        assert!(after >= turn, "start {k} came {after:?} after the spawn");
    }
    assert!(
        other[0] < paced[1],
        "the other source waited behind the first"
    );
    assert!(
        runs.all().iter().all(|r| r.attempt == 1),
        "no attempt counted for the rate"
    );
}

/// The fair share: one source's backlog of 900 queued before another's 10, a cap of 2
/// per source, 4 processors, 20 ms of work each (the big source alone needs 9 s). Every
/// event of the small source starts while fewer than half of the big
/// one's have run. On JetStream the worker reads that far ahead (a lookahead of 2 000;
/// the 910 are within the consumer's `max_ack_pending` of 1 000). Then the worker shuts
/// down with the big source's backlog waiting, and a worker without caps runs what is
/// left: every event ran once, each as attempt 1 — waiting in the first worker, and being
/// handed back by its shutdown, counted nothing.
async fn a_small_source_is_not_starved_behind_a_big_backlog(queue: Queue) {
    let accept = queue.accept_service();
    let ids: Vec<(Scheme, String)> = (0..900)
        .map(|i| (Scheme::standard(), format!("evt_backlog_{i}")))
        .chain((0..10).map(|i| (Scheme::github(), format!("gh-few-{i}"))))
        .collect();
    // In order (the stream's order is the test), a few at a time.
    for chunk in ids.chunks(50) {
        let sent = chunk
            .iter()
            .map(|(scheme, id)| deliver_to(&accept, scheme.clone(), id));
        for response in futures_util::future::join_all(sent).await {
            assert_eq!(response.status(), StatusCode::NO_CONTENT);
        }
    }
    let runs = Runs::default();
    let settings = Settings {
        concurrency: 4,
        per_source: Some(2),
        lookahead: Some(2000),
        ..Settings::default()
    };
    let started = Instant::now();
    let worker = queue.spawn_set(runs.processor(Duration::from_millis(20)), settings);
    let small = |runs: &Runs| {
        runs.all()
            .iter()
            .filter(|r| r.event.source() == "github")
            .count()
    };
    eventually("the small source's 10 ran", Duration::from_secs(20), || {
        small(&runs) == 10
    })
    .await;
    let big_done = runs.len() - 10;
    assert!(
        big_done < 450,
        "{big_done} of the big source ran first ({:?})",
        started.elapsed()
    );
    worker.shutdown().await;
    let left = runs.clone();
    let uncapped = Settings {
        concurrency: 16,
        ..Settings::default()
    };
    let worker = queue.spawn_set(runs.processor(Duration::ZERO), uncapped);
    eventually("every event ran", Duration::from_secs(60), || {
        left.len() >= ids.len()
    })
    .await;
    worker.shutdown().await;
    let all = runs.all();
    let mut seen: Vec<&str> = all.iter().map(|r| r.event.id().unwrap()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        (all.len(), seen.len()),
        (ids.len(), ids.len()),
        "each ran once"
    );
    assert!(
        all.iter().all(|r| r.attempt == 1),
        "no attempt counted for waiting"
    );
}

// On a runtime of two threads, as a server's: tasks spawned in order may run out of it.
macro_rules! on_every_queue {
    ($($test:ident),* $(,)?) => {
        mod sqlite { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::sqlite().await).await; })* }
        mod postgres { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::postgres().await).await; })* }
        mod jetstream { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::jetstream().await).await; })* }
    };
}

on_every_queue!(
    a_rate_spaces_starts_and_counts_no_attempt_for_waiting,
    a_pause_holds_a_type_back_and_resume_starts_its_events_in_order,
    later_snoozes_an_event_without_counting_an_attempt,
    a_per_source_cap_bounds_a_source_and_lets_another_through,
    a_small_source_is_not_starved_behind_a_big_backlog,
    a_rate_per_source_spaces_each_source_on_its_own,
    backpressure_refuses_retrying_sources_while_the_queue_lags,
    backpressure_by_depth_refuses_beyond_the_bound,
    a_per_object_cap_of_one_runs_an_objects_events_one_at_a_time_in_order,
    events_waiting_for_their_objects_turn_leave_the_processors_to_others,
);

/// JetStream, workers crashing while they park and publish back: 30 events accepted while
/// everything is paused, three workers each aborted 60 ms after they start, the pause
/// ended during the second; a last worker then runs every event (at least once: a crash
/// mid-run runs it again), none dead, none left parked or queued.
#[tokio::test]
async fn jetstream_crashes_while_parking_and_publishing_back_lose_nothing() {
    let Queue::JetStream(js) = Queue::jetstream().await else {
        unreachable!()
    };
    assert!(js.pause(None, None).await.unwrap());
    let queue = Queue::JetStream(js.clone());
    let ids: Vec<String> = (0..30).map(|i| format!("evt_crash_{i}")).collect();
    for id in &ids {
        queue.deliver(id).await;
    }
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let spawn = || {
        let processor = runs.processor(Duration::from_millis(5));
        JetStreamWorker::from_arc(&js, store.clone(), processor)
            .with_lease(Duration::from_millis(500))
            .unwrap()
            .with_poll_interval(Duration::from_millis(100))
            .unwrap()
            .spawn()
    };
    for round in 0..3 {
        let worker = spawn();
        tokio::time::sleep(Duration::from_millis(60)).await;
        if round == 1 {
            assert!(js.resume(None, None).await.unwrap());
        }
        worker.abort();
    }
    let worker = spawn();
    let ran = |runs: &Runs| {
        let all = runs.all();
        let ran: std::collections::HashSet<String> = all
            .iter()
            .map(|r| r.event.id().unwrap().to_owned())
            .collect();
        ran.len()
    };
    eventually("every event run", Duration::from_secs(30), || {
        ran(&runs) == ids.len()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let counts = queue.counts().await;
        if (counts.queued, counts.processing, counts.paused) == (0, 0, 0) {
            assert_eq!(counts.dead, 0, "{counts:?}");
            break;
        }
        assert!(Instant::now() < deadline, "left over: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;
    js.delete().await.unwrap();
}

/// A small lookahead that fills: 2 processors, a cap of 1 per source and 20 starts a
/// second per source, a lookahead of 1, 60 events of one source before 5 of another, on
/// a multi-threaded runtime. Messages past the lookahead must not wait holding a
/// processor while the event that has the source's turn waits for one (a deadlock that
/// stopped every source): all 65 run, each once, each as attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_a_full_lookahead_never_stops_the_worker() {
    let queue = Queue::jetstream().await;
    let Queue::JetStream(js) = &queue else {
        unreachable!()
    };
    let accept = queue.accept_service();
    for i in 0..60 {
        let response = deliver_to(&accept, Scheme::standard(), &format!("evt_full_{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    for i in 0..5 {
        let response = deliver_to(&accept, Scheme::github(), &format!("gh-full-{i}")).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    let runs = Runs::default();
    let worker = JetStreamWorker::new(
        js,
        MemoryStore::new(),
        runs.processor(Duration::from_millis(5)),
    )
    .with_concurrency(2)
    .unwrap()
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .with_per_source(1)
    .unwrap()
    .with_rate_per_source(Rate::per_second(20).unwrap())
    .with_lookahead(1)
    .unwrap()
    .spawn();
    eventually("all 65 ran", Duration::from_secs(30), || runs.len() >= 65).await;
    worker.shutdown().await;
    let all = runs.all();
    assert_eq!(all.len(), 65, "each ran once");
    assert!(
        all.iter().all(|r| r.attempt == 1),
        "no attempt counted for waiting"
    );
}

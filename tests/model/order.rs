//! Model H: order per object. `with_per_object(1)` promises that one object's events run
//! one at a time, in the order they arrived, whatever happens to them on the way.
//!
//! A case accepts a few events of two objects, interleaved at random, scripts each
//! event's first attempts (fail, say "later", or hang until the worker is killed: a
//! crash), and runs a worker with four processors, restarting it gracefully after some
//! events succeeded and replacing it when a processor hangs (the worker aborted, as a
//! process dies). Every processor call is logged with its start and end, and checked:
//!
//! - no two calls of one object overlap;
//! - no call of an object's event starts before every earlier event of that object has
//!   succeeded (arrival order, across retries, snoozes, crashes and restarts).
//!
//! On SQLite, PostgreSQL and JetStream (its claims in a memory store per case, which the
//! successive workers share as they would a durable one).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use tokio::sync::mpsc;
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Attempt, Inbox, Later, Worker, WorkerHandle};
use tower_webhook::store::{MemoryStore, PgStore, SqliteStore};
use tower_webhook::{Event, Scheme};

use crate::common::{self, at, stores, verifier, NOW};
use crate::run::{block_on, config};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const LEASE: Duration = Duration::from_millis(300);
/// How long a graceful shutdown waits for running processors (a hanging one included).
const GRACE: Duration = Duration::from_millis(500);
/// How long one case may take before the model says the queue is stuck.
const CASE_BOUND: Duration = Duration::from_secs(30);

/// What an event's processor does at one of its first attempts (then it succeeds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behave {
    Fail,
    Later,
    /// Hangs until its worker is aborted.
    Crash,
}

#[derive(Clone, Debug)]
struct Case {
    /// The object (0 or 1) of each event, in the order they are accepted.
    objects: Vec<usize>,
    /// Each event's first attempts.
    scripts: Vec<Vec<Behave>>,
    /// After how many successes the worker is shut down gracefully and replaced.
    restarts: Vec<usize>,
}

/// Cases: with crashes among the behaviours and graceful restarts, or with neither.
fn cases(crashes: bool) -> impl Strategy<Value = Case> {
    let behave = prop_oneof![
        Just(Behave::Fail),
        Just(Behave::Later),
        Just(if crashes { Behave::Crash } else { Behave::Fail })
    ];
    (3usize..=7).prop_flat_map(move |n| {
        (
            proptest::collection::vec(0usize..2, n),
            proptest::collection::vec(proptest::collection::vec(behave.clone(), 0..3), n),
            proptest::collection::vec(1..n, 0..if crashes { 3 } else { 1 }),
        )
            .prop_map(|(objects, scripts, restarts)| Case {
                objects,
                scripts,
                restarts,
            })
    })
}

/// One processor call.
#[derive(Debug)]
struct Call {
    event: usize,
    start: Instant,
    end: Option<Instant>,
    succeeded: bool,
}

#[derive(Debug, Default)]
struct Log {
    scripts: Vec<VecDeque<Behave>>,
    calls: Vec<Call>,
}

/// Ends a call however it ends (an aborted worker drops it where it hangs).
struct Ending(Arc<Mutex<Log>>, usize);

impl Drop for Ending {
    fn drop(&mut self) {
        let mut log = self.0.lock().unwrap();
        log.calls[self.1].end.get_or_insert_with(Instant::now);
    }
}

fn event(case: usize, i: usize, object: usize) -> Event {
    let id = format!("e{i}");
    let body =
        format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"c{case}_o{object}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], &id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, Bytes::from(body))
        .unwrap()
}

/// The processor: logs each call, does what the event's script says.
fn processor(
    log: Arc<Mutex<Log>>,
    crashed: mpsc::UnboundedSender<()>,
) -> impl Fn(Event, Attempt) -> futures_util::future::BoxFuture<'static, Result<(), BoxError>>
       + Send
       + Sync
       + 'static {
    move |event: Event, _: Attempt| {
        let (log, crashed) = (log.clone(), crashed.clone());
        Box::pin(async move {
            let i: usize = event.id().unwrap()[1..].parse().unwrap();
            let (behave, ending) = {
                let mut l = log.lock().unwrap();
                let behave = l.scripts[i].pop_front();
                l.calls.push(Call {
                    event: i,
                    start: Instant::now(),
                    end: None,
                    succeeded: false,
                });
                (behave, Ending(log.clone(), l.calls.len() - 1))
            };
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
            match behave {
                None => {
                    let mut l = log.lock().unwrap();
                    let call = &mut l.calls[ending.1];
                    call.succeeded = true;
                    call.end = Some(Instant::now());
                    Ok(())
                }
                Some(Behave::Fail) => Err("the processor failed (the model asked it to)".into()),
                Some(Behave::Later) => Err(Later::after(Duration::from_millis(5)).into()),
                Some(Behave::Crash) => {
                    let _ = crashed.send(());
                    let _ending = ending;
                    std::future::pending().await
                }
            }
        })
    }
}

/// Where the events go.
enum Queue {
    Sql(Inbox),
    /// The stream, and the store the workers claim events in: one for the case, as a
    /// process's SQLite file or PostgreSQL outlives it (a store of each worker's own would
    /// run an event again whose acknowledgement a killed worker never sent).
    JetStream(JetStream, Arc<MemoryStore>),
}

impl Queue {
    async fn accept(&self, event: &Event) {
        match self {
            Self::Sql(inbox) => inbox.accept(event).await.map(drop),
            Self::JetStream(jetstream, _) => jetstream.accept(event).await.map(drop),
        }
        .expect("accepted");
    }

    fn spawn(&self, log: &Arc<Mutex<Log>>, crashed: &mpsc::UnboundedSender<()>) -> WorkerHandle {
        let processor = processor(log.clone(), crashed.clone());
        match self {
            Self::Sql(inbox) => Worker::new(inbox, processor)
                .with_concurrency(4)
                .unwrap()
                .with_per_object(1)
                .unwrap()
                .with_max_attempts(20)
                .unwrap()
                .with_backoff(Duration::from_millis(1), Duration::from_millis(4))
                .unwrap()
                .with_lease(LEASE)
                .unwrap()
                .with_poll_interval(Duration::from_millis(20))
                .unwrap()
                .with_grace(GRACE)
                .spawn(),
            Self::JetStream(jetstream, store) => {
                JetStreamWorker::from_arc(jetstream, store.clone(), processor)
                    .with_concurrency(4)
                    .unwrap()
                    .with_per_object(1)
                    .unwrap()
                    .with_max_attempts(20)
                    .unwrap()
                    .with_backoff(Duration::from_millis(1), Duration::from_millis(4))
                    .unwrap()
                    .with_lease(LEASE)
                    .unwrap()
                    .with_ack_wait(LEASE) // a killed worker's messages back as soon
                    .unwrap()
                    .with_poll_interval(Duration::from_millis(50))
                    .unwrap()
                    .with_grace(GRACE)
                    .spawn()
            }
        }
    }
}

/// Runs `case` on `queue` until every event succeeded; checks the log.
async fn run(queue: &Queue, case_no: usize, case: &Case) -> Result<usize, String> {
    let log = Arc::new(Mutex::new(Log {
        scripts: case
            .scripts
            .iter()
            .map(|s| s.iter().copied().collect())
            .collect(),
        calls: Vec::new(),
    }));
    for (i, &object) in case.objects.iter().enumerate() {
        bounded("an accept", queue.accept(&event(case_no, i, object))).await?;
    }
    let (crashed, mut crashes) = mpsc::unbounded_channel();
    let mut worker = queue.spawn(&log, &crashed);
    let mut restarts: Vec<usize> = case.restarts.clone();
    restarts.sort_unstable();
    let mut restarts = VecDeque::from(restarts);
    let deadline = tokio::time::Instant::now() + CASE_BOUND;
    loop {
        let succeeded = log
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.succeeded)
            .count();
        if succeeded >= case.objects.len() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            worker.abort();
            return Err(format!(
                "stuck: {succeeded} of {} events succeeded in {CASE_BOUND:?}; calls {:?}",
                case.objects.len(),
                log.lock().unwrap().calls
            ));
        }
        if tokio::time::timeout(Duration::from_millis(10), crashes.recv())
            .await
            .is_ok()
        {
            worker.abort(); // the process died; another takes over after the lease
            worker = queue.spawn(&log, &crashed);
            continue;
        }
        if restarts.front().is_some_and(|&at| succeeded >= at) {
            restarts.pop_front();
            bounded("a graceful shutdown mid-drain", worker.shutdown()).await?;
            worker = queue.spawn(&log, &crashed);
        }
    }
    bounded("the last shutdown", worker.shutdown()).await?;
    let log = log.lock().unwrap();
    check(case, &log.calls)?;
    Ok(log.calls.len())
}

/// `what` within 15 s, or an error naming it.
async fn bounded(what: &str, future: impl std::future::Future<Output = ()>) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(15), future)
        .await
        .map_err(|_| format!("{what} took over 15 s"))
}

/// One at a time per object, in arrival order.
fn check(case: &Case, calls: &[Call]) -> Result<(), String> {
    let done = |i: usize| calls.iter().find(|c| c.event == i && c.succeeded);
    for (n, call) in calls.iter().enumerate() {
        let object = case.objects[call.event];
        for earlier in (0..call.event).filter(|&i| case.objects[i] == object) {
            match done(earlier) {
                Some(d) if d.end.unwrap() <= call.start => {}
                _ => {
                    return Err(format!(
                        "e{} of object {object} started before e{earlier} succeeded: {calls:#?}",
                        call.event
                    ))
                }
            }
        }
        for other in &calls[n + 1..] {
            let overlap = case.objects[other.event] == object
                && other.start < call.end.unwrap_or(other.start + Duration::from_secs(1));
            if overlap {
                return Err(format!(
                    "e{} and e{} of object {object} ran at once: {calls:#?}",
                    call.event, other.event
                ));
            }
        }
    }
    Ok(())
}

/// Runs the model as test `name` on the queues `open` makes, one per case.
fn model<F>(
    name: &str,
    regressions: &'static str,
    (what, crashes): (&str, bool),
    open: impl Fn() -> F,
) where
    F: std::future::Future<Output = (Queue, Box<dyn FnOnce() + Send>)>,
{
    let started = Instant::now();
    let config = config(name, regressions, 6);
    let mut runner = proptest::test_runner::TestRunner::new(config.clone());
    let case_no = std::sync::atomic::AtomicUsize::new(0);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&cases(crashes), |case| {
        let n = case_no.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outcome = block_on(async {
            let (queue, cleanup) = open().await;
            let outcome = run(&queue, n, &case).await;
            if let Queue::JetStream(jetstream, _) = queue {
                let deleted = tokio::time::timeout(Duration::from_secs(15), jetstream.delete());
                deleted
                    .await
                    .expect("deleted in 15 s")
                    .expect("the streams deleted");
            }
            cleanup();
            outcome
        });
        let made = outcome.map_err(TestCaseError::fail)?;
        calls.fetch_add(made, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    eprintln!(
        "MODEL | {what} | cases={} | calls={} | {:.1?}",
        config.cases,
        calls.into_inner(),
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

#[test]
fn sqlite() {
    model(
        "order::sqlite",
        "tests/proptest-regressions/model-order-sqlite.txt",
        ("order per object | SQLite", true),
        || async {
            let path = stores::temp_sqlite_path();
            let store = SqliteStore::open(&path)
                .await
                .unwrap()
                .with_busy_timeout(Duration::from_millis(50)); // a lease floor of 200 ms
            let cleanup = move || {
                let _ = std::fs::remove_file(&path);
            };
            (Queue::Sql(Inbox::sqlite(&store)), Box::new(cleanup) as _)
        },
    );
}

#[test]
fn postgres() {
    model(
        "order::postgres",
        "tests/proptest-regressions/model-order-postgres.txt",
        ("order per object | PostgreSQL", true),
        || async {
            let url = common::fresh_pg_url().await;
            let store = PgStore::connect(&url).await.unwrap();
            (Queue::Sql(Inbox::postgres(&store)), Box::new(|| {}) as _)
        },
    );
}

/// Retries and snoozes in one worker, without restarts or crashes.
#[test]
fn jetstream() {
    model(
        "order::jetstream",
        "tests/proptest-regressions/model-order-jetstream.txt",
        ("order per object | JetStream, one worker", false),
        jetstream_queue,
    );
}

/// Across graceful restarts and killed workers, one at a time on the consumer: the objects'
/// lines in the stream's bucket hold the order. Before them this failed within 25 cases:
/// a stopping worker's last pull ran a handed-back event again and handed it back behind
/// its object's later one, and a killed worker's event waited out its lease while the
/// next worker ran the later ones (both kept in the regression file, and as tests in
/// `tests/jetstream.rs`).
#[test]
fn jetstream_with_restarts_and_crashes() {
    model(
        "order::jetstream_with_restarts_and_crashes",
        "tests/proptest-regressions/model-order-jetstream-restarts.txt",
        ("order per object | JetStream, restarts and crashes", true),
        jetstream_queue,
    );
}

/// A stream of its own for one case.
async fn jetstream_queue() -> (Queue, Box<dyn FnOnce() + Send>) {
    let client = async_nats::connect(common::nats_url())
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)");
    let name = format!("tw_order_{}", uuid::Uuid::new_v4().simple());
    let jetstream = JetStream::builder(client, &name)
        .with_memory_storage()
        .build()
        .await
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    (Queue::JetStream(jetstream, store), Box::new(|| {}))
}

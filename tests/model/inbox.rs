//! Model B: the SQL inbox (accept, the worker's claims and outcomes, attempts, backoff,
//! dead rows, requeue) on SQLite and PostgreSQL, through the public API only.
//!
//! A case is a fresh database and a random sequence of: accepts of three event ids
//! (duplicates included), what the processor does at a key's next attempts (succeed,
//! fail, panic, say "later", or hang until its worker is killed: a crash), a drain (workers run until
//! every row is processed or dead; a worker whose processor hangs is aborted as a crash
//! and another takes over after the lease), an overrun (a worker's processor runs past
//! its max run time, a second worker takes the row over after the lease, and the first
//! one's late failure must be fenced out), requeues by id and of the dead, and timing
//! faults the model injects itself (`Inbox::with_late_answers`, hidden, for tests): the
//! worker's next claim that takes a row, its next renewal or its next outcome answered
//! 210–350 ms late, past two thirds of the 300 ms lease, in the next drain that makes
//! such a call (a drain has one worker) — the statement landed, its answer did not come
//! in time. A late claim's rows are handed back uncounted (the model sees nothing of it:
//! the processor is told the same attempt number); a renewal that landed keeps the row;
//! an outcome that landed stands. These paths ran before only when load made a call that
//! slow.
//!
//! The model is exact: rows with their state and attempts, the processor's calls per key
//! (with the attempt numbers it was told) and its effects (successful calls). After every
//! step the store is compared with it: `counts()`, each row's state and attempts
//! (`Inbox::event`), the calls and the effects.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::sync::mpsc;
use tower_webhook::inbox::{
    Accepted, Attempt, Inbox, LateAnswers, LateCall, Later, Requeue, State, Worker, WorkerHandle,
};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme};

use crate::common::{self, at, stores, verifier, NOW};
use crate::run::{block_on, check};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEYS: usize = 3;
const MAX_ATTEMPTS: u32 = 3;
const LEASE: Duration = Duration::from_millis(300);
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// How long a drain may take before the model says the store is stuck.
const DRAIN_BOUND: Duration = Duration::from_secs(20);

/// What the processor does at one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behave {
    Succeed,
    Fail,
    Panic,
    /// Hangs until its worker is aborted (a crash): no outcome, the attempt counted.
    Crash,
    /// Answers `Later` (a millisecond): snoozed, the attempt not counted, so the next
    /// call is told the same attempt number.
    Later,
    /// Succeeds after 400 ms: past a third of the lease, so its lease is renewed (a renewal
    /// answered up to 290 ms late is heard while it still runs).
    Slow,
}

#[derive(Clone, Debug)]
pub enum Step {
    Accept {
        key: usize,
    },
    /// The processor does `behave` at one of `key`'s next attempts (after those scripted
    /// before it; unscripted attempts succeed).
    Script {
        key: usize,
        behave: Behave,
    },
    /// Workers run until every row is processed or dead.
    Drain,
    /// As a drain, but `key`'s next attempt runs past the max run time, is taken over by
    /// another worker after its lease, and then fails: a late outcome to fence out.
    Overrun {
        key: usize,
    },
    Requeue {
        key: usize,
    },
    RequeueDead,
    /// The worker's next `call` (a claim: the next that takes a row) is answered `ms` late,
    /// in the first drain that makes one — not in an overrun, whose two workers could take
    /// a row whose lease a late answer let run out: a takeover the model does not predict.
    Late {
        call: LateCall,
        ms: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowState {
    Queued,
    Processed,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    state: RowState,
    attempts: u32,
}

/// The model: exact, so it also steers generation.
#[derive(Clone, Debug, Default)]
pub struct Queue {
    rows: [Option<Row>; KEYS],
    scripts: [VecDeque<Behave>; KEYS],
    /// Successful processor calls per key.
    effects: [u32; KEYS],
    /// The attempt numbers the processor was called with, per key.
    calls: [Vec<u32>; KEYS],
}

impl Queue {
    /// Runs every queued row to processed or dead; `slow`'s next attempt is fenced out.
    fn drain(&mut self, slow: Option<usize>) {
        for k in 0..KEYS {
            let Some(row) = &mut self.rows[k] else {
                continue;
            };
            if row.state != RowState::Queued {
                continue;
            }
            let mut slow_pending = slow == Some(k);
            loop {
                if row.attempts >= MAX_ATTEMPTS {
                    row.state = RowState::Dead; // every attempt ended without an outcome
                    break;
                }
                row.attempts += 1;
                self.calls[k].push(row.attempts);
                if slow_pending {
                    slow_pending = false; // taken over; its late failure is fenced out
                    continue;
                }
                match self.scripts[k].pop_front().unwrap_or(Behave::Succeed) {
                    Behave::Later => row.attempts -= 1, // snoozed: not an attempt
                    Behave::Succeed | Behave::Slow => {
                        row.state = RowState::Processed;
                        self.effects[k] += 1;
                        break;
                    }
                    Behave::Fail | Behave::Panic if row.attempts >= MAX_ATTEMPTS => {
                        row.state = RowState::Dead;
                        break;
                    }
                    Behave::Fail | Behave::Panic | Behave::Crash => {}
                }
            }
        }
    }

    fn queued(&self, key: usize) -> bool {
        matches!(
            self.rows[key],
            Some(Row {
                state: RowState::Queued,
                ..
            })
        )
    }
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Queue;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Queue> {
        Just(Queue::default()).boxed()
    }

    fn transitions(_: &Queue) -> BoxedStrategy<Step> {
        let behave = prop_oneof![
            2 => Just(Behave::Fail),
            1 => Just(Behave::Panic),
            1 => Just(Behave::Crash),
            1 => Just(Behave::Later),
            1 => Just(Behave::Succeed),
            1 => Just(Behave::Slow),
        ];
        let call = prop_oneof![
            2 => Just(LateCall::Claim),
            2 => Just(LateCall::Renew),
            1 => Just(LateCall::Finish),
        ];
        prop_oneof![
            5 => (0..KEYS).prop_map(|key| Step::Accept { key }),
            5 => (0..KEYS, behave).prop_map(|(key, behave)| Step::Script { key, behave }),
            4 => Just(Step::Drain),
            1 => (0..KEYS).prop_map(|key| Step::Overrun { key }),
            2 => (0..KEYS).prop_map(|key| Step::Requeue { key }),
            1 => Just(Step::RequeueDead),
            // Past two thirds of the lease (200 ms), some past the whole lease.
            3 => (call, 210..=350u64).prop_map(|(call, ms)| Step::Late { call, ms }),
        ]
        .boxed()
    }

    fn preconditions(state: &Queue, step: &Step) -> bool {
        match step {
            Step::Overrun { key } => state.queued(*key),
            _ => true,
        }
    }

    fn apply(mut state: Queue, step: &Step) -> Queue {
        match *step {
            Step::Accept { key } => {
                if state.rows[key].is_none() {
                    state.rows[key] = Some(Row {
                        state: RowState::Queued,
                        attempts: 0,
                    });
                }
            }
            Step::Script { key, behave } => state.scripts[key].push_back(behave),
            // Nothing the model sees: the rows of a late claim are handed back uncounted,
            // a late renewal and a late outcome landed.
            Step::Late { .. } => {}
            Step::Drain => state.drain(None),
            Step::Overrun { key } => state.drain(Some(key)),
            Step::Requeue { key } => {
                if let Some(row) = &mut state.rows[key] {
                    *row = Row {
                        state: RowState::Queued,
                        attempts: 0,
                    };
                }
            }
            Step::RequeueDead => {
                for row in state.rows.iter_mut().flatten() {
                    if row.state == RowState::Dead {
                        *row = Row {
                            state: RowState::Queued,
                            attempts: 0,
                        };
                    }
                }
            }
        }
        state
    }
}

/// What the processor does, shared with it.
#[derive(Default)]
struct Script {
    next: [VecDeque<Behave>; KEYS],
    /// The next attempt of this key runs past the max run time, then fails.
    slow: Option<usize>,
    effects: [u32; KEYS],
    calls: [Vec<u32>; KEYS],
}

enum Signal {
    /// A processor hangs: abort its worker.
    Crashed,
    /// The slow attempt started.
    SlowStarted,
    /// The slow attempt ended (its outcome goes to the store now).
    SlowEnded,
}

/// The inbox on a fresh database, the processor's script, and what the model expects.
pub struct Sut {
    inbox: Inbox,
    /// The answers to give late in the next drains, until met.
    late: Vec<(LateCall, Duration)>,
    db: Db,
    script: Arc<Mutex<Script>>,
    signals: mpsc::UnboundedReceiver<Signal>,
    signal: mpsc::UnboundedSender<Signal>,
    /// Which ids this case accepted before.
    accepted: [bool; KEYS],
    /// Dead rows before the step.
    dead: u64,
    postgres: bool,
}

enum Db {
    Sqlite(std::path::PathBuf),
    Postgres(PgStore, String),
}

fn event(key: usize) -> Event {
    let id = format!("k{key}");
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"o{key}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], &id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, Bytes::from(body))
        .unwrap()
}

impl Sut {
    fn processor(
        &self,
    ) -> impl Fn(Event, Attempt) -> futures_util::future::BoxFuture<'static, Result<(), BoxError>>
           + Send
           + Sync
           + 'static {
        let (script, signal) = (self.script.clone(), self.signal.clone());
        move |event: Event, attempt: Attempt| {
            let (script, signal) = (script.clone(), signal.clone());
            Box::pin(async move {
                let key: usize = event.id().unwrap()[1..].parse().unwrap();
                let (behave, slow) = {
                    let mut s = script.lock().unwrap();
                    s.calls[key].push(attempt.number());
                    if s.slow == Some(key) {
                        s.slow = None;
                        (Behave::Fail, true)
                    } else {
                        let b = s.next[key].pop_front().unwrap_or(Behave::Succeed);
                        if matches!(b, Behave::Succeed | Behave::Slow) {
                            s.effects[key] += 1;
                        }
                        (b, false)
                    }
                };
                if slow {
                    let _ = signal.send(Signal::SlowStarted);
                    // Past the max run time (1 s) and the lease after it.
                    tokio::time::sleep(Duration::from_millis(1800)).await;
                    let _ = signal.send(Signal::SlowEnded);
                    return Err("the overrun attempt failed late".into());
                }
                match behave {
                    Behave::Succeed => Ok(()),
                    Behave::Slow => {
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        Ok(())
                    }
                    Behave::Later => Err(Later::after(Duration::from_millis(1)).into()),
                    Behave::Fail => Err("the processor failed".into()),
                    Behave::Panic => panic!("the processor panicked (the model asked it to)"),
                    Behave::Crash => {
                        let _ = signal.send(Signal::Crashed);
                        std::future::pending().await
                    }
                }
            })
        }
    }

    fn worker(&self, inbox: &Inbox) -> Worker {
        Worker::new(inbox, self.processor())
            .with_concurrency(1)
            .unwrap()
            .with_max_attempts(MAX_ATTEMPTS)
            .unwrap()
            .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
            .unwrap()
            .with_lease(LEASE)
            .unwrap()
            .with_poll_interval(Duration::from_millis(20))
            .unwrap()
    }

    /// Whether the store shows what the model expects (rows, counts).
    async fn matches(&self, model: &Queue) -> Result<(), String> {
        let counts = self
            .inbox
            .counts()
            .await
            .map_err(|e| format!("counts: {e:?}"))?;
        let count =
            |s: RowState| model.rows.iter().flatten().filter(|r| r.state == s).count() as u64;
        let want = (
            count(RowState::Queued),
            0,
            count(RowState::Processed),
            count(RowState::Dead),
        );
        let got = (
            counts.queued,
            counts.processing,
            counts.processed,
            counts.dead,
        );
        if got != want {
            return Err(format!(
                "counts (queued, processing, processed, dead): {got:?}, the model {want:?}"
            ));
        }
        for (k, row) in model.rows.iter().enumerate() {
            let stored = self
                .inbox
                .event("standard", &format!("k{k}"))
                .await
                .map_err(|e| format!("event k{k}: {e:?}"))?;
            let got = stored.map(|e| (e.summary.state, e.summary.attempts));
            let want = row.map(|r| {
                let state = match r.state {
                    RowState::Queued => State::Queued,
                    RowState::Processed => State::Processed,
                    RowState::Dead => State::Dead,
                };
                (state, r.attempts)
            });
            if got != want {
                return Err(format!(
                    "k{k} (state, attempts): {got:?}, the model {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// Whether the processor's calls so far, with the attempt numbers it was told, are the
    /// first of those the model expects of the drain.
    fn calls_so_far(&self, model: &Queue) -> Result<(), String> {
        let s = self.script.lock().unwrap();
        for (k, calls) in s.calls.iter().enumerate() {
            if !model.calls[k].starts_with(calls) {
                return Err(format!(
                    "k{k}: the processor was told attempts {calls:?}, the model expects {:?}",
                    model.calls[k]
                ));
            }
        }
        Ok(())
    }

    /// Runs workers until the store matches the model, aborting a worker whose processor
    /// hangs (a crash) and, for an overrun, starting a second worker beside the stuck one.
    async fn drain(&mut self, model: &Queue, slow: Option<usize>) {
        self.script.lock().unwrap().slow = slow;
        let deadline = tokio::time::Instant::now() + DRAIN_BOUND;
        let overrun = |w: Worker| w.with_max_run(Duration::from_secs(1)).unwrap();
        // The late answers planned, in a drain of one worker.
        let late = LateAnswers::new();
        let inbox = match slow {
            Some(_) => self.inbox.clone(),
            None => {
                for (call, after) in &self.late {
                    late.next(*call, *after);
                }
                self.inbox.with_late_answers(&late)
            }
        };
        let mut workers = Workers(vec![match slow {
            Some(_) => overrun(self.worker(&inbox)).spawn(),
            None => self.worker(&inbox).spawn(),
        }]);
        let mut slow_running = slow.is_some();
        loop {
            // A call the model does not expect fails at once, not at the bound (quicker to
            // find and to shrink).
            if let Err(why) = self.calls_so_far(model) {
                panic!("drain: {why}");
            }
            // A slow attempt still running may yet write: only judge once it ended.
            if !slow_running && self.matches(model).await.is_ok() {
                break;
            }
            let wait = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    s = self.signals.recv() => s,
                    () = tokio::time::sleep(Duration::from_millis(25)) => None,
                }
            });
            match wait.await {
                Err(_) => {
                    let why = self.matches(model).await.unwrap_err_or("stuck");
                    panic!(
                        "drain: the store did not reach the model within {DRAIN_BOUND:?}: {why}"
                    );
                }
                Ok(Some(Signal::Crashed)) => {
                    STEPS[usize::from(self.postgres)][4].fetch_add(1, Ordering::Relaxed);
                    // The worker running the hung processor dies; a new one takes over.
                    let crashed = workers.0.pop().expect("a worker");
                    crashed.abort();
                    workers.0.push(self.worker(&inbox).spawn());
                }
                Ok(Some(Signal::SlowStarted)) => workers.0.push(self.worker(&inbox).spawn()),
                Ok(Some(Signal::SlowEnded)) => {
                    // Let its fenced outcome land before judging.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    slow_running = false;
                }
                Ok(None) => {}
            }
        }
        for w in std::mem::take(&mut workers.0) {
            w.shutdown().await;
        }
        // Those met are spent; the rest wait for a drain that makes such a call (a claim
        // that takes a row, a processor slow enough to be renewed).
        let calls = [LateCall::Claim, LateCall::Renew, LateCall::Finish];
        for (i, call) in calls.into_iter().enumerate() {
            let mut met = late.met(call);
            STEPS[usize::from(self.postgres)][6 + i].fetch_add(met, Ordering::Relaxed);
            self.late.retain(|(c, _)| {
                *c != call || met == 0 || {
                    met -= 1;
                    false
                }
            });
        }
    }
}

/// A drain's workers: aborted if the drain panics (a handle dropped leaves its worker
/// running, and its pool open, through the rest of the run and its shrinking).
struct Workers(Vec<WorkerHandle>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in self.0.drain(..) {
            w.abort();
        }
    }
}

trait UnwrapErrOr {
    fn unwrap_err_or(self, or: &str) -> String;
}

impl UnwrapErrOr for Result<(), String> {
    fn unwrap_err_or(self, or: &str) -> String {
        self.err().unwrap_or_else(|| or.to_owned())
    }
}

/// Which database a test runs on.
pub trait On: 'static {
    const POSTGRES: bool;
}

pub struct InboxTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for InboxTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &Queue) -> Sut {
        let (inbox, db) = block_on(async {
            if K::POSTGRES {
                let url = common::fresh_pg_url().await;
                let store = PgStore::connect(&url).await.unwrap();
                (Inbox::postgres(&store), Db::Postgres(store, url))
            } else {
                let path = stores::temp_sqlite_path();
                let store = SqliteStore::open(&path)
                    .await
                    .unwrap()
                    .with_busy_timeout(Duration::from_millis(50)); // a lease floor of 200 ms
                (Inbox::sqlite(&store), Db::Sqlite(path))
            }
        });
        let (signal, signals) = mpsc::unbounded_channel();
        Sut {
            inbox,
            late: Vec::new(),
            db,
            script: Arc::default(),
            signals,
            signal,
            accepted: [false; KEYS],
            dead: 0,
            postgres: K::POSTGRES,
        }
    }

    fn apply(mut sut: Sut, model: &Queue, step: Step) -> Sut {
        // `model` is the state after `step`.
        let i = match step {
            Step::Accept { .. } | Step::Script { .. } => 0,
            Step::Drain => 1,
            Step::Overrun { .. } => 2,
            Step::Requeue { .. } | Step::RequeueDead => 3,
            Step::Late { .. } => 5,
        };
        STEPS[usize::from(K::POSTGRES)][i].fetch_add(1, Ordering::Relaxed);
        block_on(async {
            match step {
                Step::Accept { key } => {
                    let accepted = sut.inbox.accept(&event(key)).await.unwrap();
                    // New exactly the first time this case accepts the id.
                    let want = match sut.accepted[key] {
                        false => Accepted::New,
                        true => Accepted::Duplicate,
                    };
                    assert_eq!(accepted, want, "accept k{key}");
                    sut.accepted[key] = true;
                }
                Step::Script { key, behave } => {
                    sut.script.lock().unwrap().next[key].push_back(behave);
                }
                Step::Drain => sut.drain(model, None).await,
                Step::Overrun { key } => sut.drain(model, Some(key)).await,
                Step::Requeue { key } => {
                    let n = sut
                        .inbox
                        .requeue(Requeue::id("standard", &format!("k{key}")))
                        .await
                        .unwrap();
                    let want = u64::from(model.rows[key].is_some());
                    assert_eq!(n, want, "requeue k{key}: rows requeued");
                }
                Step::RequeueDead => {
                    let n = sut.inbox.requeue(Requeue::dead()).await.unwrap();
                    assert_eq!(n, sut.dead, "requeue of the dead: rows requeued");
                }
                Step::Late { call, ms } => sut.late.push((call, Duration::from_millis(ms))),
            }
            if let Err(why) = sut.matches(model).await {
                panic!("after {step:?}: {why}");
            }
            let s = sut.script.lock().unwrap();
            assert_eq!(s.effects, model.effects, "after {step:?}: effects per key");
            assert_eq!(
                s.calls, model.calls,
                "after {step:?}: attempt numbers per key"
            );
            drop(s);
            sut.dead = model
                .rows
                .iter()
                .flatten()
                .filter(|r| r.state == RowState::Dead)
                .count() as u64;
        });
        sut
    }

    fn teardown(sut: Sut, _: Queue) {
        let Sut { inbox, db, .. } = sut;
        drop(inbox);
        block_on(async {
            match db {
                Db::Sqlite(path) => {
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                    }
                }
                Db::Postgres(store, url) => {
                    store.pool().close().await;
                    let name = url.rsplit('/').next().unwrap().to_owned();
                    let admin = sqlx::PgPool::connect(&common::database_url())
                        .await
                        .unwrap();
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&admin)
                    .await;
                    admin.close().await;
                }
            }
        });
    }
}

/// Steps run: accepts and scripts, drains, overruns, requeues; crashes; late answers
/// planned; and late answers met: claims, renewals, outcomes.
static STEPS: [[AtomicUsize; 9]; 2] = [const { [const { AtomicUsize::new(0) }; 9] }; 2];

macro_rules! on {
    ($marker:ident, $pg:expr, $test:ident, $file:literal) => {
        pub struct $marker;
        impl On for $marker {
            const POSTGRES: bool = $pg;
        }

        #[test]
        fn $test() {
            let n = |i: usize| STEPS[usize::from($pg)][i].load(Ordering::Relaxed);
            check::<InboxTest<$marker>>(
                concat!("inbox::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (24, 1..24),
                &format!("inbox | {}", stringify!($test)),
                || {
                    format!(
                        "accepts+scripts={} drains={} overruns={} requeues={} crashes={} \
                         late planned={} met: claims={} renewals={} outcomes={}",
                        n(0),
                        n(1),
                        n(2),
                        n(3),
                        n(4),
                        n(5),
                        n(6),
                        n(7),
                        n(8)
                    )
                },
            );
        }
    };
}

on!(OnSqlite, false, sqlite, "model-inbox-sqlite.txt");
on!(OnPostgres, true, postgres, "model-inbox-postgres.txt");

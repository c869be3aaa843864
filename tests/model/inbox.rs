//! Model B: the SQL inbox (accept, the worker's claims and outcomes, attempts, backoff,
//! dead rows, requeue) on SQLite and PostgreSQL, through the public API only, with one
//! processor (no `with_processors`: `sqlite`, `postgres`) or three (fan-out:
//! `fan_out_sqlite`, `fan_out_postgres`): `a` takes every event, `b` the type glob
//! `order.*`, `c` a predicate over the event (not object `o1`). Of the three event ids,
//! two are `order.paid` and one `customer.created`, so `a` routes all three, `b` k0 and
//! k1, `c` k0 and k2.
//!
//! A case is a fresh database and a random sequence of: accepts of the three event ids
//! (duplicates included), what the processor does at a route's next attempts (succeed,
//! fail, panic, say "later", or hang until its worker is killed: a crash), a drain (a
//! worker per processor, all at once, until every route is processed or dead; a worker
//! whose processor hangs is aborted as a crash and another of its processor takes over
//! after the lease), an overrun (a worker's processor runs past its max run time, a second
//! worker of that processor takes the route over after the lease, and the first one's
//! late failure must be fenced out), requeues of an event (every route of it, or one
//! processor's) and of the dead (every processor's, or one's), backfills (`Inbox::backfill`
//! of a processor: `c` joins the inbox at its first, a processor added later, and gets its
//! routes of the events accepted before; of any other, none), and timing faults the
//! model injects itself (`Inbox::with_late_answers`, hidden, for tests): the worker's
//! next claim that takes a row, its next renewal or its next outcome answered 210–350 ms
//! late, past two thirds of the 300 ms lease, in the next drain that makes such a call
//! (not an overrun: a processor has one worker then) — the statement landed, its answer
//! did not come in time. A late claim's rows are handed back uncounted (the model sees
//! nothing of it: the processor is told the same attempt number); a renewal that landed
//! keeps the row; an outcome that landed stands. These paths ran before only when load
//! made a call that slow.
//!
//! The model is exact: a route per admitted (event, processor) with its state and
//! attempts, the processor's calls per route (with the attempt numbers it was told) and
//! its effects (successful calls). After every step the store is compared with it:
//! `counts()` and `counts_by_processor()`, each event's routes — processor, state,
//! attempts, no error left on a queued or processed route, none for a processor whose
//! filter excludes the event — and its summary (the most urgent route's), the calls and
//! the effects per route. A crash aborts the one worker whose processor hung: the route it
//! was running — and no other, of its processor or another's — is the one run again.
//!
//! With the feature `seal`, two more tests run the same model with a key ring on the inbox
//! (`sealed_sqlite`, one processor; `sealed_fan_out_postgres`, three): bodies, headers and
//! errors sealed at rest, every state, count, call and effect the same, and each event's
//! body read back whole as `stored` under the ring's key (without a ring: in clear, no
//! key) — fewer cases than the others.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::sync::mpsc;
use tower_webhook::inbox::{
    Accepted, Attempt, Backfill, BodyState, Inbox, LateAnswers, LateCall, Later, ProcessorSpec,
    Requeue, State, Worker, WorkerHandle, DEFAULT_PROCESSOR,
};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme};

use crate::common::{self, at, stores, verifier, NOW};
use crate::run::{block_on, check};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEYS: usize = 3;
/// The most processors a case has (fan-out's `a`, `b`, `c`).
const PROCS: usize = 3;
const MAX_ATTEMPTS: u32 = 3;
const LEASE: Duration = Duration::from_millis(300);
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// How long a drain may take before the model says the store is stuck.
const DRAIN_BOUND: Duration = Duration::from_secs(20);

/// A route: an event's key and a processor's index.
type Route = (usize, usize);

/// One processor as before fan-out, or three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Single,
    FanOut,
}

impl Layout {
    fn processors(self) -> usize {
        match self {
            Layout::Single => 1,
            Layout::FanOut => PROCS,
        }
    }

    fn name(self, p: usize) -> &'static str {
        match self {
            Layout::Single => DEFAULT_PROCESSOR,
            Layout::FanOut => ["a", "b", "c"][p],
        }
    }

    /// Whether processor `p` takes event `key` (the model's own reading of the filters
    /// [`specs`] configures).
    fn takes(self, p: usize, key: usize) -> bool {
        match (self, p) {
            (Layout::Single, _) | (Layout::FanOut, 0) => true,
            (Layout::FanOut, 1) => event_type(key).starts_with("order."),
            _ => key != 1,
        }
    }

    /// Every route an accept of each key makes.
    fn routes(self) -> Vec<Route> {
        (0..KEYS)
            .flat_map(|k| (0..self.processors()).map(move |p| (k, p)))
            .filter(|&(k, p)| self.takes(p, k))
            .collect()
    }
}

/// Fan-out's processors.
fn specs() -> [ProcessorSpec; PROCS] {
    [
        ProcessorSpec::new("a").unwrap(),
        ProcessorSpec::new("b")
            .unwrap()
            .with_types(["order.*"])
            .unwrap(),
        ProcessorSpec::new("c")
            .unwrap()
            .with_predicate(|e: &Event| e.object_id() != Some("o1")),
    ]
}

fn event_type(key: usize) -> &'static str {
    match key {
        2 => "customer.created",
        _ => "order.paid",
    }
}

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
    /// Processor `processor` does `behave` at `key`'s next attempts, one each (after those
    /// scripted before it; unscripted attempts succeed).
    Script {
        key: usize,
        processor: usize,
        behave: Vec<Behave>,
    },
    /// A worker per processor runs until every route is processed or dead.
    Drain,
    /// As a drain, but the next attempt of `key`'s route of `processor` runs past the max
    /// run time, is taken over by another worker of its processor after its lease, and
    /// then fails: a late outcome to fence out.
    Overrun {
        key: usize,
        processor: usize,
    },
    /// Requeues `key`: every route of it, or `processor`'s.
    Requeue {
        key: usize,
        processor: Option<usize>,
    },
    /// Requeues the dead routes: every processor's, or `processor`'s.
    RequeueDead {
        processor: Option<usize>,
    },
    /// The worker's next `call` (a claim: the next that takes a row) is answered `ms` late,
    /// in the first drain that makes one — not in an overrun, whose two workers of a
    /// processor could take a route whose lease a late answer let run out: a takeover the
    /// model does not predict.
    Late {
        call: LateCall,
        ms: u64,
    },
    /// `Inbox::backfill` of `processor` (fan-out): `c`'s first configures it (the inbox
    /// has `a` and `b` until then: a processor added later), and creates its routes of the
    /// events accepted before; any other creates none (every route was made with its
    /// event).
    Backfill {
        processor: usize,
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

const QUEUED: Row = Row {
    state: RowState::Queued,
    attempts: 0,
};

type PerRoute<T> = [[T; PROCS]; KEYS];

/// The model: exact, so it also steers generation.
#[derive(Clone, Debug)]
pub struct Queue {
    layout: Layout,
    /// Whether fan-out's `c` is configured yet (its first backfill adds it).
    joined: bool,
    routes: PerRoute<Option<Row>>,
    scripts: PerRoute<VecDeque<Behave>>,
    /// Successful processor calls per route.
    effects: PerRoute<u32>,
    /// The attempt numbers the processor was called with, per route.
    calls: PerRoute<Vec<u32>>,
}

impl Queue {
    fn new(layout: Layout) -> Self {
        Self {
            layout,
            joined: false,
            routes: Default::default(),
            scripts: Default::default(),
            effects: Default::default(),
            calls: Default::default(),
        }
    }

    /// Runs every queued route to processed or dead; `slow`'s next attempt is fenced out.
    fn drain(&mut self, slow: Option<Route>) {
        for k in 0..KEYS {
            for p in 0..PROCS {
                self.drain_route((k, p), slow == Some((k, p)));
            }
        }
    }

    fn drain_route(&mut self, (k, p): Route, mut slow_pending: bool) {
        let Some(row) = &mut self.routes[k][p] else {
            return;
        };
        if row.state != RowState::Queued {
            return;
        }
        loop {
            if row.attempts >= MAX_ATTEMPTS {
                row.state = RowState::Dead; // every attempt ended without an outcome
                break;
            }
            row.attempts += 1;
            self.calls[k][p].push(row.attempts);
            if slow_pending {
                slow_pending = false; // taken over; its late failure is fenced out
                continue;
            }
            match self.scripts[k][p].pop_front().unwrap_or(Behave::Succeed) {
                Behave::Later => row.attempts -= 1, // snoozed: not an attempt
                Behave::Succeed | Behave::Slow => {
                    row.state = RowState::Processed;
                    self.effects[k][p] += 1;
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

    /// The processors the inbox has now.
    fn configured(&self) -> Vec<usize> {
        match self.layout {
            Layout::Single => vec![0],
            Layout::FanOut if self.joined => vec![0, 1, 2],
            Layout::FanOut => vec![0, 1],
        }
    }

    /// The routes `Inbox::backfill` of `p` creates: of each event accepted (each has a
    /// route of `a`, which takes every event) that `p` takes and has no route of.
    fn missing(&self, p: usize) -> Vec<usize> {
        (0..KEYS)
            .filter(|&k| {
                self.routes[k][0].is_some()
                    && self.layout.takes(p, k)
                    && self.routes[k][p].is_none()
            })
            .collect()
    }

    fn queued(&self, (k, p): Route) -> bool {
        matches!(
            self.routes[k][p],
            Some(Row {
                state: RowState::Queued,
                ..
            })
        )
    }

    /// Routes of processor `p` (every processor's: `None`) in `state`.
    fn count(&self, p: Option<usize>, state: RowState) -> u64 {
        let mut n = 0;
        for k in 0..KEYS {
            for q in 0..PROCS {
                let row = self.routes[k][q];
                n += u64::from(p.is_none_or(|p| p == q) && row.is_some_and(|r| r.state == state));
            }
        }
        n
    }
}

pub struct Reference<K>(PhantomData<K>);

impl<K: On> ReferenceStateMachine for Reference<K> {
    type State = Queue;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Queue> {
        Just(Queue::new(K::LAYOUT)).boxed()
    }

    fn transitions(state: &Queue) -> BoxedStrategy<Step> {
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
        // Past two thirds of the lease (200 ms), some past the whole lease.
        let late = (call, 210..=350u64).prop_map(|(call, ms)| Step::Late { call, ms });
        match state.layout {
            // The strategy of the model before fan-out, draw for draw: the seeds saved in
            // its regression files replay the same cases.
            Layout::Single => prop_oneof![
                5 => (0..KEYS).prop_map(|key| Step::Accept { key }),
                5 => (0..KEYS, behave).prop_map(|(key, behave)| Step::Script {
                    key,
                    processor: 0,
                    behave: vec![behave],
                }),
                4 => Just(Step::Drain),
                1 => (0..KEYS).prop_map(|key| Step::Overrun { key, processor: 0 }),
                2 => (0..KEYS).prop_map(|key| Step::Requeue {
                    key,
                    processor: None
                }),
                1 => Just(Step::RequeueDead { processor: None }),
                3 => late,
            ]
            .boxed(),
            Layout::FanOut => {
                let route = prop::sample::select(state.layout.routes());
                let processor = prop_oneof![Just(None), (0..PROCS).prop_map(Some)];
                prop_oneof![
                    5 => (0..KEYS).prop_map(|key| Step::Accept { key }),
                    // Runs of attempts, so that more routes go dead or crash at their last.
                    7 => (route.clone(), prop::collection::vec(behave, 1..=3)).prop_map(
                        |((key, processor), behave)| {
                        Step::Script {
                            key,
                            processor,
                            behave,
                        }
                    }),
                    4 => Just(Step::Drain),
                    1 => route.prop_map(|(key, processor)| Step::Overrun { key, processor }),
                    3 => (0..KEYS, processor.clone())
                        .prop_map(|(key, processor)| Step::Requeue { key, processor }),
                    2 => processor.prop_map(|processor| Step::RequeueDead { processor }),
                    3 => late,
                    2 => (0..PROCS).prop_map(|processor| Step::Backfill { processor }),
                ]
                .boxed()
            }
        }
    }

    fn preconditions(state: &Queue, step: &Step) -> bool {
        match *step {
            Step::Overrun { key, processor } => state.queued((key, processor)),
            _ => true,
        }
    }

    fn apply(mut state: Queue, step: &Step) -> Queue {
        match *step {
            Step::Accept { key } => {
                for p in state.configured() {
                    // One route per processor whose filter takes the event, made with it.
                    if state.layout.takes(p, key) && state.routes[key][p].is_none() {
                        state.routes[key][p] = Some(QUEUED);
                    }
                }
            }
            Step::Script {
                key,
                processor,
                ref behave,
            } => state.scripts[key][processor].extend(behave.iter().copied()),
            // Nothing the model sees: the rows of a late claim are handed back uncounted,
            // a late renewal and a late outcome landed.
            Step::Late { .. } => {}
            Step::Backfill { processor } => {
                state.joined |= processor == 2;
                for k in state.missing(processor) {
                    state.routes[k][processor] = Some(QUEUED);
                }
            }
            Step::Drain => state.drain(None),
            Step::Overrun { key, processor } => state.drain(Some((key, processor))),
            Step::Requeue { key, processor } => {
                for (p, row) in state.routes[key].iter_mut().enumerate() {
                    if processor.is_none_or(|q| q == p) && row.is_some() {
                        *row = Some(QUEUED);
                    }
                }
            }
            Step::RequeueDead { processor } => {
                for routes in &mut state.routes {
                    for (p, row) in routes.iter_mut().enumerate() {
                        let dead = row.is_some_and(|r| r.state == RowState::Dead);
                        if dead && processor.is_none_or(|q| q == p) {
                            *row = Some(QUEUED);
                        }
                    }
                }
            }
        }
        state
    }
}

/// What the processors do, shared with them.
#[derive(Default)]
struct Script {
    next: PerRoute<VecDeque<Behave>>,
    /// The next attempt of this route runs past the max run time, then fails.
    slow: Option<Route>,
    effects: PerRoute<u32>,
    calls: PerRoute<Vec<u32>>,
    /// Runs that ended without an outcome (dropped mid-run: their worker was aborted).
    aborted: Vec<Route>,
    /// Runs of a route whose processor's filter does not take the event.
    strays: Vec<Route>,
}

enum Signal {
    /// A processor hangs on `route`: abort its worker (by number).
    Crashed { worker: usize, route: Route },
    /// The slow attempt started.
    SlowStarted,
    /// The slow attempt ended (its outcome goes to the store now).
    SlowEnded,
}

/// A run going on; one dropped before it finished (an aborted worker drops it where it
/// hangs) is recorded as aborted.
struct Running {
    script: Arc<Mutex<Script>>,
    route: Route,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = self.script.lock().unwrap_or_else(|e| e.into_inner());
        if !self.finished {
            s.aborted.push(self.route);
        }
    }
}

/// The inbox on a fresh database, the processors' script, and what the model expects.
pub struct Sut {
    inbox: Inbox,
    layout: Layout,
    /// Whether the inbox has a key ring.
    sealed: bool,
    /// The answers to give late in the next drains, until met.
    late: Vec<(LateCall, Duration)>,
    db: Db,
    script: Arc<Mutex<Script>>,
    signals: mpsc::UnboundedReceiver<Signal>,
    signal: mpsc::UnboundedSender<Signal>,
    /// Workers started in this case: the next one's number.
    workers: usize,
    /// Which ids this case accepted before.
    accepted: [bool; KEYS],
    /// The model's routes before the step.
    before: PerRoute<Option<Row>>,
    /// Which test's figures this case adds to.
    figures: usize,
}

enum Db {
    Sqlite(std::path::PathBuf),
    Postgres(PgStore, String),
}

fn event(key: usize) -> Event {
    let id = format!("k{key}");
    let body = format!(
        r#"{{"type":"{}","data":{{"object":{{"id":"o{key}"}}}}}}"#,
        event_type(key)
    );
    let headers = Scheme::standard()
        .sign([SECRET], &id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, Bytes::from(body))
        .unwrap()
}

/// How an operator reads a route's state in [`RouteState`](tower_webhook::inbox::RouteState).
fn state_of(row: Row) -> State {
    match row.state {
        RowState::Queued => State::Queued,
        RowState::Processed => State::Processed,
        RowState::Dead => State::Dead,
    }
}

impl Sut {
    /// Processor `p`'s function, for the worker numbered `worker`.
    fn processor(
        &self,
        p: usize,
        worker: usize,
    ) -> impl Fn(Event, Attempt) -> futures_util::future::BoxFuture<'static, Result<(), BoxError>>
           + Send
           + Sync
           + 'static {
        let (script, signal, layout) = (self.script.clone(), self.signal.clone(), self.layout);
        move |event: Event, attempt: Attempt| {
            let (script, signal) = (script.clone(), signal.clone());
            Box::pin(async move {
                let key: usize = event.id().unwrap()[1..].parse().unwrap();
                let route = (key, p);
                let (behave, slow, mut running) = {
                    let mut s = script.lock().unwrap();
                    if !layout.takes(p, key) {
                        s.strays.push(route);
                        return Ok(());
                    }
                    s.calls[key][p].push(attempt.number());
                    let running = Running {
                        script: script.clone(),
                        route,
                        finished: false,
                    };
                    if s.slow == Some(route) {
                        s.slow = None;
                        (Behave::Fail, true, running)
                    } else {
                        let b = s.next[key][p].pop_front().unwrap_or(Behave::Succeed);
                        if matches!(b, Behave::Succeed | Behave::Slow) {
                            s.effects[key][p] += 1;
                        }
                        (b, false, running)
                    }
                };
                if slow {
                    let _ = signal.send(Signal::SlowStarted);
                    // Past the max run time (1 s) and the lease after it.
                    tokio::time::sleep(Duration::from_millis(1800)).await;
                    running.finished = true;
                    let _ = signal.send(Signal::SlowEnded);
                    return Err("the overrun attempt failed late".into());
                }
                match behave {
                    Behave::Succeed => {}
                    Behave::Slow => tokio::time::sleep(Duration::from_millis(400)).await,
                    Behave::Crash => {
                        let _ = signal.send(Signal::Crashed { worker, route });
                        std::future::pending::<()>().await;
                    }
                    Behave::Later | Behave::Fail | Behave::Panic => {}
                }
                running.finished = true;
                drop(running);
                match behave {
                    Behave::Later => Err(Later::after(Duration::from_millis(1)).into()),
                    Behave::Fail => Err("the processor failed".into()),
                    Behave::Panic => panic!("the processor panicked (the model asked it to)"),
                    _ => Ok(()),
                }
            })
        }
    }

    /// A worker of processor `p` on `inbox`, and its number.
    fn worker(&mut self, inbox: &Inbox, p: usize) -> (usize, Worker) {
        let n = self.workers;
        self.workers += 1;
        let f = self.processor(p, n);
        let worker = match self.layout {
            Layout::Single => Worker::new(inbox, f),
            Layout::FanOut => Worker::processor(inbox, self.layout.name(p), f).unwrap(),
        };
        let worker = worker
            .with_concurrency(1)
            .unwrap()
            .with_max_attempts(MAX_ATTEMPTS)
            .unwrap()
            .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
            .unwrap()
            .with_lease(LEASE)
            .unwrap()
            .with_poll_interval(Duration::from_millis(20))
            .unwrap();
        (n, worker)
    }

    /// Whether the store shows what the model expects (counts, routes).
    async fn matches(&self, model: &Queue) -> Result<(), String> {
        let want = |p: Option<usize>| {
            (
                model.count(p, RowState::Queued),
                0,
                model.count(p, RowState::Processed),
                model.count(p, RowState::Dead),
            )
        };
        let got = |c: tower_webhook::inbox::Counts| (c.queued, c.processing, c.processed, c.dead);
        let counts = self
            .inbox
            .counts()
            .await
            .map_err(|e| format!("counts: {e:?}"))?;
        if got(counts) != want(None) {
            return Err(format!(
                "counts (queued, processing, processed, dead): {:?}, the model {:?}",
                got(counts),
                want(None)
            ));
        }
        let by = self
            .inbox
            .counts_by_processor()
            .await
            .map_err(|e| format!("counts_by_processor: {e:?}"))?;
        let mut names: Vec<&str> = (model.configured().into_iter())
            .map(|p| self.layout.name(p))
            .collect();
        names.sort_unstable();
        if !by.keys().map(String::as_str).eq(names.iter().copied()) {
            return Err(format!("counts_by_processor's processors: {:?}", by.keys()));
        }
        for p in model.configured() {
            let c = by[self.layout.name(p)];
            if got(c) != want(Some(p)) {
                return Err(format!(
                    "{}'s counts (queued, processing, processed, dead): {:?}, the model {:?}",
                    self.layout.name(p),
                    got(c),
                    want(Some(p))
                ));
            }
        }
        for k in 0..KEYS {
            self.matches_event(model, k).await?;
        }
        Ok(())
    }

    /// Whether event `key`'s routes and summary are the model's.
    async fn matches_event(&self, model: &Queue, k: usize) -> Result<(), String> {
        let stored = self
            .inbox
            .event("standard", &format!("k{k}"))
            .await
            .map_err(|e| format!("event k{k}: {e:?}"))?;
        // By processor name, as `routes` lists them.
        let mut want: Vec<(&str, State, u32)> = (0..PROCS)
            .filter_map(|p| {
                model.routes[k][p].map(|r| (model.layout.name(p), state_of(r), r.attempts))
            })
            .collect();
        want.sort_unstable_by_key(|r| r.0);
        let Some(stored) = stored else {
            return match want.is_empty() {
                true => Ok(()),
                false => Err(format!("k{k}: no event, the model's routes {want:?}")),
            };
        };
        let got: Vec<(&str, State, u32)> = stored
            .routes
            .iter()
            .map(|r| (r.processor.as_str(), r.state, r.attempts))
            .collect();
        if got != want {
            return Err(format!(
                "k{k}'s routes (processor, state, attempts): {got:?}, the model {want:?}"
            ));
        }
        // The body kept (sealed under the ring's key, or in clear) and read back whole.
        let key_id = self.sealed.then_some(KEY_ID);
        if (stored.body_state, stored.key_id.as_deref()) != (BodyState::Stored, key_id)
            || stored.body != *event(k).body()
        {
            return Err(format!(
                "k{k}'s body: {:?} under {:?}, {} bytes; expected stored under {key_id:?}",
                stored.body_state,
                stored.key_id,
                stored.body.len()
            ));
        }
        for r in &stored.routes {
            let settled = matches!(r.state, State::Queued | State::Processed);
            if r.orphaned || (settled && r.last_error.is_some()) {
                return Err(format!("k{k}: {r:?}, no error or orphan expected"));
            }
        }
        // The most urgent route: dead, else queued, else processed (no route is failing
        // or running between steps), ties by name.
        let rank = |s: State| match s {
            State::Dead => 0,
            State::Queued => 1,
            _ => 2,
        };
        let summary = want
            .iter()
            .min_by_key(|r| (rank(r.1), r.0))
            .map(|r| (r.1, r.2));
        let got = Some((stored.summary.state, stored.summary.attempts));
        if got != summary {
            return Err(format!(
                "k{k}'s summary (state, attempts): {got:?}, the model {summary:?}"
            ));
        }
        Ok(())
    }

    /// Whether the processors' calls so far, with the attempt numbers they were told, are
    /// the first of those the model expects of the drain, and none ran an excluded route.
    fn calls_so_far(&self, model: &Queue) -> Result<(), String> {
        let s = self.script.lock().unwrap();
        if !s.strays.is_empty() {
            return Err(format!(
                "routes run whose processor's filter excludes the event: {:?}",
                s.strays
            ));
        }
        for k in 0..KEYS {
            for p in 0..PROCS {
                let (calls, want) = (&s.calls[k][p], &model.calls[k][p]);
                if !want.starts_with(calls) {
                    return Err(format!(
                        "k{k} of {}: the processor was told attempts {calls:?}, the model \
                         expects {want:?}",
                        model.layout.name(p)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Runs a worker per processor until the store matches the model, aborting a worker
    /// whose processor hangs (a crash) and starting another of its processor, and, for an
    /// overrun, starting a second worker of its processor beside the stuck one.
    async fn drain(&mut self, model: &Queue, slow: Option<Route>) {
        self.script.lock().unwrap().slow = slow;
        let deadline = tokio::time::Instant::now() + DRAIN_BOUND;
        // The late answers planned, in a drain of one worker per processor.
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
        let mut workers = Workers(HashMap::new());
        for p in model.configured() {
            let (n, worker) = self.worker(&inbox, p);
            let worker = match slow {
                Some((_, q)) if q == p => worker.with_max_run(Duration::from_secs(1)).unwrap(),
                _ => worker,
            };
            workers.0.insert(n, (p, worker.spawn()));
        }
        let mut slow_running = slow.is_some();
        let aborted_before = self.script.lock().unwrap().aborted.len();
        let mut hung = Vec::new();
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
                Ok(Some(Signal::Crashed { worker, route })) => {
                    STEPS[self.figures][4].fetch_add(1, Ordering::Relaxed);
                    // The worker running the hung processor dies, with whatever it runs;
                    // a new one of its processor takes over.
                    hung.push(route);
                    let (p, crashed) = workers.0.remove(&worker).expect("a live worker");
                    crashed.abort();
                    let (n, worker) = self.worker(&inbox, p);
                    workers.0.insert(n, (p, worker.spawn()));
                }
                Ok(Some(Signal::SlowStarted)) => {
                    let p = slow.expect("an overrun").1;
                    let (n, worker) = self.worker(&inbox, p);
                    workers.0.insert(n, (p, worker.spawn()));
                }
                Ok(Some(Signal::SlowEnded)) => {
                    // Let its fenced outcome land before judging.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    slow_running = false;
                }
                Ok(None) => {}
            }
        }
        for (_, (_, w)) in std::mem::take(&mut workers.0) {
            w.shutdown().await;
        }
        // A crash ended the runs of the worker aborted, and those alone: the hung routes,
        // each run again (the calls, checked against the model, say how often).
        let mut aborted = self.script.lock().unwrap().aborted[aborted_before..].to_vec();
        aborted.sort_unstable();
        hung.sort_unstable();
        assert_eq!(
            aborted, hung,
            "drain: the runs a crash ended, against the routes whose processor hung"
        );
        // Those met are spent; the rest wait for a drain that makes such a call (a claim
        // that takes a row, a processor slow enough to be renewed).
        let calls = [LateCall::Claim, LateCall::Renew, LateCall::Finish];
        for (i, call) in calls.into_iter().enumerate() {
            let mut met = late.met(call);
            STEPS[self.figures][6 + i].fetch_add(met, Ordering::Relaxed);
            self.late.retain(|(c, _)| {
                *c != call || met == 0 || {
                    met -= 1;
                    false
                }
            });
        }
    }
}

/// A drain's workers by number, with their processor: aborted if the drain panics (a
/// handle dropped leaves its worker running, and its pool open, through the rest of the
/// run and its shrinking).
struct Workers(HashMap<usize, (usize, WorkerHandle)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, (_, w)) in self.0.drain() {
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

/// Which database and processors a test runs on, and whether its inbox seals.
pub trait On: 'static {
    const POSTGRES: bool;
    const LAYOUT: Layout;
    /// A key ring on the inbox (feature `seal`): bodies, headers and errors sealed at
    /// rest, every state the model checks the same, and each event's body read back
    /// opened, under the ring's key.
    const SEALED: bool;
}

/// The sealed tests' key id.
const KEY_ID: &str = "k1";

pub struct InboxTest<K>(PhantomData<K>);

impl<K: On> StateMachineTest for InboxTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference<K>;

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
        #[cfg(feature = "seal")]
        let inbox = match K::SEALED {
            true => {
                use tower_webhook::seal::{Key, KeyRing};
                inbox.with_keys(KeyRing::new([Key::new(KEY_ID, [7; 32]).unwrap()]).unwrap())
            }
            false => inbox,
        };
        let inbox = match K::LAYOUT {
            Layout::Single => inbox,
            // `c` joins at its first backfill.
            Layout::FanOut => inbox.with_processors(specs().into_iter().take(2)).unwrap(),
        };
        let (signal, signals) = mpsc::unbounded_channel();
        Sut {
            inbox,
            layout: K::LAYOUT,
            sealed: K::SEALED,
            late: Vec::new(),
            db,
            script: Arc::default(),
            signals,
            signal,
            workers: 0,
            accepted: [false; KEYS],
            before: Default::default(),
            figures: figures::<K>(),
        }
    }

    fn apply(mut sut: Sut, model: &Queue, step: Step) -> Sut {
        // `model` is the state after `step`.
        let i = match step {
            Step::Accept { .. } | Step::Script { .. } => 0,
            Step::Drain => 1,
            Step::Overrun { .. } => 2,
            Step::Requeue { .. } | Step::RequeueDead { .. } => 3,
            Step::Late { .. } => 5,
            Step::Backfill { .. } => 9,
        };
        STEPS[sut.figures][i].fetch_add(1, Ordering::Relaxed);
        let layout = sut.layout;
        let name = move |p: usize| layout.name(p);
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
                Step::Script {
                    key,
                    processor,
                    ref behave,
                } => {
                    let mut s = sut.script.lock().unwrap();
                    s.next[key][processor].extend(behave.iter().copied());
                }
                Step::Drain => sut.drain(model, None).await,
                Step::Overrun { key, processor } => {
                    sut.drain(model, Some((key, processor))).await;
                }
                Step::Requeue { key, processor } => {
                    let which = Requeue::id("standard", &format!("k{key}"));
                    let which = match processor {
                        Some(p) => which.with_processor(name(p)),
                        None => which,
                    };
                    let n = sut.inbox.requeue(which).await.unwrap();
                    let routes = sut.before[key].iter().enumerate();
                    let want = routes
                        .filter(|(p, r)| r.is_some() && processor.is_none_or(|q| q == *p))
                        .count() as u64;
                    assert_eq!(n, want, "requeue k{key}: routes requeued");
                }
                Step::RequeueDead { processor } => {
                    let which = match processor {
                        Some(p) => Requeue::dead().with_processor(name(p)),
                        None => Requeue::dead(),
                    };
                    let n = sut.inbox.requeue(which).await.unwrap();
                    let before = sut.before.iter().flatten().enumerate();
                    let want = before
                        .filter(|(i, r)| {
                            r.is_some_and(|r| r.state == RowState::Dead)
                                && processor.is_none_or(|q| q == i % PROCS)
                        })
                        .count() as u64;
                    assert_eq!(n, want, "requeue of the dead: routes requeued");
                }
                Step::Late { call, ms } => sut.late.push((call, Duration::from_millis(ms))),
                Step::Backfill { processor } => {
                    if processor == 2 && sut.inbox.processors().count() < PROCS {
                        sut.inbox = sut.inbox.clone().with_processors(specs()).unwrap();
                    }
                    let n = sut
                        .inbox
                        .backfill(name(processor), Backfill::all())
                        .await
                        .unwrap();
                    let want = (0..KEYS)
                        .filter(|&k| sut.before[k][processor].is_none())
                        .filter(|&k| model.routes[k][processor].is_some())
                        .count() as u64;
                    assert_eq!(n, want, "backfill of {}: routes created", name(processor));
                }
            }
            if let Err(why) = sut.matches(model).await {
                panic!("after {step:?}: {why}");
            }
            let s = sut.script.lock().unwrap();
            assert_eq!(
                s.effects, model.effects,
                "after {step:?}: effects per route"
            );
            assert_eq!(
                s.calls, model.calls,
                "after {step:?}: attempt numbers per route"
            );
            drop(s);
            sut.before = model.routes;
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

/// Steps run, per test (`figures`): accepts and scripts, drains, overruns, requeues;
/// crashes; late answers planned; late answers met: claims, renewals, outcomes; and
/// backfills.
static STEPS: [[AtomicUsize; 10]; 8] = [const { [const { AtomicUsize::new(0) }; 10] }; 8];

/// Test `K`'s row of [`STEPS`].
fn figures<K: On>() -> usize {
    usize::from(K::POSTGRES)
        + 2 * usize::from(K::LAYOUT == Layout::FanOut)
        + 4 * usize::from(K::SEALED)
}

macro_rules! on {
    ($marker:ident, $pg:expr, $layout:expr, $test:ident, $file:literal, $ci:expr) => {
        on!($marker, $pg, $layout, false, $test, $file, $ci);
    };
    ($marker:ident, $pg:expr, $layout:expr, $sealed:expr, $test:ident, $file:literal, $ci:expr) => {
        pub struct $marker;
        impl On for $marker {
            const POSTGRES: bool = $pg;
            const LAYOUT: Layout = $layout;
            const SEALED: bool = $sealed;
        }

        #[test]
        fn $test() {
            let n = |i: usize| STEPS[figures::<$marker>()][i].load(Ordering::Relaxed);
            check::<InboxTest<$marker>>(
                concat!("inbox::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                ($ci, 1..24),
                &format!("inbox | {}", stringify!($test)),
                || {
                    format!(
                        "accepts+scripts={} drains={} overruns={} requeues={} crashes={} \
                         late planned={} met: claims={} renewals={} outcomes={} backfills={}",
                        n(0),
                        n(1),
                        n(2),
                        n(3),
                        n(4),
                        n(5),
                        n(6),
                        n(7),
                        n(8),
                        n(9)
                    )
                },
            );
        }
    };
}

// The CI budget: about the time of the 24 cases per database the one-processor model ran
// alone, split between the two layouts (fan-out's drains run three workers at once and
// take about as long as one's); the regression files replay on top.
on!(
    OnSqlite,
    false,
    Layout::Single,
    sqlite,
    "model-inbox-sqlite.txt",
    12
);
on!(
    OnPostgres,
    true,
    Layout::Single,
    postgres,
    "model-inbox-postgres.txt",
    12
);
on!(
    OnSqliteFanOut,
    false,
    Layout::FanOut,
    fan_out_sqlite,
    "model-inbox-fan-out-sqlite.txt",
    16
);
on!(
    OnPostgresFanOut,
    true,
    Layout::FanOut,
    fan_out_postgres,
    "model-inbox-fan-out-postgres.txt",
    16
);
// With a key ring: fewer cases (the model is the same; what a ring changes is the bytes at
// rest and the read path, which every step's comparison goes through), one layout per
// database.
#[cfg(feature = "seal")]
on!(
    OnSqliteSealed,
    false,
    Layout::Single,
    true,
    sealed_sqlite,
    "model-inbox-sealed-sqlite.txt",
    8
);
#[cfg(feature = "seal")]
on!(
    OnPostgresFanOutSealed,
    true,
    Layout::FanOut,
    true,
    sealed_fan_out_postgres,
    "model-inbox-sealed-fan-out-postgres.txt",
    4
);

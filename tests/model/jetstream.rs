//! Model D: `JetStreamWorker` on the real NATS server (`NATS_URL`), its consumer-side
//! claim on every store (memory, SQLite, PostgreSQL, Redis) behind [`FaultStore`], with
//! one processor (no `with_processors`: today's layout) or three (fan-out: `default` and
//! `email` take every type, `orders` only `order.*`), a worker each.
//!
//! A case is a stream of its own (a uuid name, memory storage, a 400 ms duplicate
//! window; deleted at the end) and a random sequence of: accepts of one of three events
//! (two `order.paid`, one `customer.created`) — the first with a script per processor of
//! what each attempt of its route does (succeed, fail, panic or snooze, after 0–150 ms or
//! 400–900 ms: past the claim's 300 ms lease and the consumer's 200 ms `ack_wait`,
//! living on renewals; a message delivered again while its claim holds goes back until
//! the claim ends), the later ones the same id again (inside the duplicate window
//! JetStream drops it; after a sleep past it, a second message of the same event); store
//! faults scripted on the next calls of one operation of the claim store (fail, lose the
//! acknowledgement, answer late: up to two thirds of the lease, or past them — a claim so
//! late is given back and asked again, as `PendingClaim` does); healing; time passing;
//! pauses and resumes, of every processor or of one (its worker parks what it pulls, and
//! publishes it back when the pause ends); and a crash of one processor's worker — aborted
//! wherever it is, its processor with it, a new worker started on the same stream,
//! consumer and store.
//!
//! The model holds a route per admitted (event, processor): each to end processed
//! successfully exactly once, the runs of its script up to the first success no crash
//! aborted, no more. Checked after every step, per route: no second success, no two runs
//! at once, no more runs than the model allows (a crash re-runs only the routes it
//! aborted mid-run), no run at all of a route the processor's filter does not take; and
//! `counts_by_processor`: the processors configured, none dead, nothing parked for a
//! processor never paused, no more processed than the messages its filter takes. At the
//! end (faults healed, pauses ended) every route succeeded exactly once after exactly the
//! runs the model expects, its key done in the store, and each processor's counts are
//! exact: nothing queued, running, dead or parked, `processed` the messages it takes (a
//! crash of its worker may add one each: an acknowledgement it gave whose count it never
//! wrote). Exempt, checked only "at least once": a route whose renewals or "done" the
//! wrapper failed or answered late (the claim may have lapsed: the Guarantees table's
//! "else `ClaimLost`"), and one a crash hit after its processor succeeded and before its
//! key was done (a crash between the effect and its record re-runs it: what
//! `IdempotencyKey` is for).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Accepted, Attempt, Later, ProcessorSpec, WorkerHandle};
use tower_webhook::store::{Claim, DedupeStore, Delivery, Token};
use tower_webhook::{Event, Scheme};

use crate::common::fault_store::{Fault, FaultStore, Op};
use crate::common::stores::Kind;
use crate::run::{block_on, check, shared_store};

const KEYS: usize = 3;
const LEASE: Duration = Duration::from_millis(300);
const ACK_WAIT: Duration = Duration::from_millis(200);
const WINDOW: Duration = Duration::from_millis(400);
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The processors of a fan-out case: name and type glob (`None`: every type).
const PROCESSORS: [(&str, Option<&str>); 3] = [
    ("default", None),
    ("orders", Some("order.*")),
    ("email", None),
];

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
            Layout::FanOut => PROCESSORS.len(),
        }
    }
}

/// A route: an event's key and a processor's index.
type Route = (String, usize);

fn event_type(key: &str) -> &'static str {
    match key {
        "evt_2" => "customer.created",
        _ => "order.paid",
    }
}

/// Whether processor `p` takes event `key` (its route is admitted).
fn takes(p: usize, key: &str) -> bool {
    match PROCESSORS[p].1 {
        None => true,
        Some(glob) => event_type(key).starts_with(glob.trim_end_matches('*')),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behave {
    Succeed,
    Fail,
    Panic,
    /// `Later` (10 ms): snoozed, not an attempt.
    Later,
}

#[derive(Clone, Copy, Debug)]
pub enum StoreFault {
    Fail,
    LoseAck,
    AnswerAfter(u64),
}

#[derive(Clone, Debug)]
pub enum Step {
    /// Accepts event `key`; its first accept sets what the attempts of each processor's
    /// route do (`scripts[p]`, then success), each after `work` ms. With `late`, the claim
    /// store's next call of that operation — most likely this event's — is answered that
    /// many ms late.
    Accept {
        key: usize,
        scripts: Vec<Vec<Behave>>,
        work: u64,
        late: Option<(Op, u64)>,
    },
    /// The next `n` calls of `op` on the claim store meet `fault`.
    Fault {
        op: Op,
        fault: StoreFault,
        n: usize,
    },
    Heal,
    /// Processor `processor`'s worker aborted (its process died), a new one started.
    Crash {
        processor: usize,
    },
    /// Pauses every event for `processor` (`None`: for every processor).
    Pause {
        processor: Option<usize>,
    },
    /// Ends that pause.
    Resume {
        processor: Option<usize>,
    },
    Sleep {
        ms: u64,
    },
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Layout;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Layout> {
        prop_oneof![1 => Just(Layout::Single), 2 => Just(Layout::FanOut)].boxed()
    }

    fn transitions(layout: &Layout) -> BoxedStrategy<Step> {
        let processors = layout.processors();
        let behave = prop_oneof![
            2 => Just(Behave::Fail),
            1 => Just(Behave::Panic),
            1 => Just(Behave::Later),
        ];
        let op = prop_oneof![
            Just(Op::Claim),
            Just(Op::Renew),
            Just(Op::Complete),
            Just(Op::Release)
        ];
        // Past two thirds of the lease, some past all of it: a claim answered so late is
        // given back and asked again; a renewal or "done" so late exempts its event.
        let late = prop_oneof![Just(None), (op.clone(), 210..400u64).prop_map(Some)];
        let script = prop::collection::vec(behave, 0..3);
        let accept = (
            0..KEYS,
            prop::collection::vec(script, PROCESSORS.len()),
            prop_oneof![3 => Just(0u64), 2 => 0..150u64, 1 => 400..900u64],
            late,
        )
            .prop_map(|(key, scripts, work, late)| Step::Accept {
                key,
                scripts,
                work,
                late,
            });
        let fault = prop_oneof![
            Just(StoreFault::Fail),
            Just(StoreFault::LoseAck),
            (10..200u64).prop_map(StoreFault::AnswerAfter),
        ];
        let which = prop_oneof![Just(None), (0..processors).prop_map(Some)];

        prop_oneof![
            6 => accept,
            3 => (op, fault, 1..=3usize).prop_map(|(op, fault, n)| Step::Fault { op, fault, n }),
            1 => Just(Step::Heal),
            2 => (0..processors).prop_map(|processor| Step::Crash { processor }),
            2 => prop_oneof![Just(50u64), Just(200), Just(WINDOW.as_millis() as u64 + 200)]
                .prop_map(|ms| Step::Sleep { ms }),
            2 => which.clone().prop_map(|processor| Step::Pause { processor }),
            2 => which.prop_map(|processor| Step::Resume { processor }),
        ]
        .boxed()
    }

    fn apply(layout: Layout, _: &Step) -> Layout {
        layout
    }
}

/// What the processors did, per route.
#[derive(Default, Debug)]
pub struct Seen {
    /// Each event's scripts (per processor) and work, set by its first accept.
    scripts: HashMap<String, (Vec<Vec<Behave>>, u64)>,
    /// Runs started, successful runs, runs going on now and the most at once, per route.
    runs: HashMap<Route, usize>,
    effects: HashMap<Route, u32>,
    running: HashMap<Route, u32>,
    overlap: HashMap<Route, u32>,
    /// The runs (numbered from 1) that ended without an outcome: aborted by a crash.
    aborted: HashMap<Route, BTreeSet<usize>>,
    /// Routes a crash hit between their success and their key done.
    crashed_between: HashSet<Route>,
    /// Runs of a route the processor's filter does not take.
    strays: Vec<Route>,
    accepts: usize,
    crashes: usize,
    pauses: usize,
}

impl Seen {
    /// How many runs route `route` has when it is done: up to the first run its script
    /// makes a success and no crash aborted.
    fn expected_runs(&self, route: &Route) -> usize {
        let script = &self.scripts[&route.0].0[route.1];
        let aborted = self.aborted.get(route);
        (1..)
            .find(|r| {
                script.get(r - 1).is_none_or(|b| *b == Behave::Succeed)
                    && !aborted.is_some_and(|a| a.contains(r))
            })
            .expect("a run succeeds")
    }
}

/// Counts a run as ended however it ends; one dropped before it finished (an aborted
/// worker drops it mid-sleep) is recorded as aborted.
struct Running {
    seen: Arc<Mutex<Seen>>,
    route: Route,
    run: usize,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = self.seen.lock().unwrap();
        *s.running.get_mut(&self.route).unwrap() -= 1;
        if !self.finished {
            let aborted = s.aborted.entry(self.route.clone()).or_default();
            aborted.insert(self.run);
        }
    }
}

pub struct Sut {
    kind: Kind,
    layout: Layout,
    store: FaultStore<dyn DedupeStore>,
    jetstream: JetStream,
    workers: Vec<Option<WorkerHandle>>,
    seen: Arc<Mutex<Seen>>,
    /// The pauses in force (`None`: of every processor), and the processors ever paused.
    pauses: HashSet<Option<usize>>,
    paused_ever: HashSet<usize>,
    /// Messages stored per event (accepts JetStream did not drop), and crashes per
    /// processor.
    messages: HashMap<String, u64>,
    crashes: HashMap<usize, u64>,
}

fn event(id: &str) -> Event {
    let body = format!(
        r#"{{"type":"{}","data":{{"object":{{"id":"pi_{id}"}}}}}}"#,
        event_type(id)
    );
    let headers = Scheme::standard()
        .sign(
            [SECRET],
            id,
            crate::common::at(crate::common::NOW),
            body.as_bytes(),
        )
        .unwrap();
    crate::common::verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

fn worker(
    jetstream: &JetStream,
    layout: Layout,
    p: usize,
    store: &FaultStore<dyn DedupeStore>,
    seen: &Arc<Mutex<Seen>>,
) -> WorkerHandle {
    let seen = seen.clone();
    let processor = move |e: Event, _: Attempt| {
        let seen = seen.clone();
        async move {
            let route = (e.id().unwrap().to_owned(), p);
            let (behave, work, mut guard) = {
                let mut s = seen.lock().unwrap();
                if !takes(p, &route.0) {
                    s.strays.push(route);
                    return Ok(());
                }
                let run = *s
                    .runs
                    .entry(route.clone())
                    .and_modify(|n| *n += 1)
                    .or_insert(1);
                let (scripts, work) = s.scripts[&route.0].clone();
                let behave = scripts[p].get(run - 1).copied().unwrap_or(Behave::Succeed);
                let n = s.running.entry(route.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.overlap.entry(route.clone()).or_default();
                *most = (*most).max(n);
                let guard = Running {
                    seen: seen.clone(),
                    route: route.clone(),
                    run,
                    finished: false,
                };
                (behave, work, guard)
            };
            tokio::time::sleep(Duration::from_millis(work)).await;
            guard.finished = true;
            drop(guard);
            match behave {
                Behave::Succeed => {
                    *seen.lock().unwrap().effects.entry(route).or_default() += 1;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                }
                Behave::Fail => Err("the processor failed (the model asked it to)".into()),
                Behave::Later => Err(Later::after(Duration::from_millis(10)).into()),
                Behave::Panic => panic!("the processor panicked (the model asked it to)"),
            }
        }
    };
    let store = store.clone();
    let worker = match layout {
        Layout::Single => JetStreamWorker::from_arc(jetstream, Arc::new(store), processor),
        Layout::FanOut => {
            JetStreamWorker::processor(jetstream, PROCESSORS[p].0, store, processor).unwrap()
        }
    };
    worker
        .with_lease(LEASE)
        .unwrap()
        .with_ack_wait(ACK_WAIT)
        .unwrap()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap()
        .with_backoff(Duration::from_millis(20), Duration::from_millis(80))
        .unwrap()
        // Crashes count attempts too: never dead within a case (at most 2 scripted
        // failures and a dozen crashes).
        .with_max_attempts(30)
        .unwrap()
        // Flow control must not break the guarantee: of the three events, the third to
        // come waits for its source's turn in the lookahead (renewed, no processor).
        .with_per_source(2)
        .unwrap()
        .spawn()
}

/// The consumer of processor `p`: `tower-webhook`, or `tower-webhook-<name>`.
fn consumer(p: usize) -> String {
    match PROCESSORS[p].0 {
        "default" => "tower-webhook".to_owned(),
        name => format!("tower-webhook-{name}"),
    }
}

impl Sut {
    /// The worker's claim key of route `(key, p)` (`jetstream/<stream>/<consumer>/
    /// <source>`: the settle checks it is the one, by finding every processed key done).
    fn claim_key(&self, (key, p): &Route) -> Delivery {
        Delivery::new(
            format!(
                "jetstream/{}/{}/{}",
                self.jetstream.stream(),
                consumer(*p),
                event(key).source()
            ),
            key.as_str(),
        )
    }

    /// The routes admitted so far.
    fn routes(&self) -> Vec<Route> {
        let s = self.seen.lock().unwrap();
        let mut routes: Vec<Route> = s
            .scripts
            .keys()
            .flat_map(|k| (0..self.layout.processors()).map(move |p| (k.clone(), p)))
            .filter(|(k, p)| takes(*p, k))
            .collect();
        routes.sort();
        routes
    }

    /// Whether `route` is done in the store underneath (a claim granted to look is
    /// released).
    async fn done(&self, route: &Route) -> bool {
        let delivery = self.claim_key(route);
        let token = Token::new();
        match self
            .store
            .inner()
            .claim(delivery.clone(), token, LEASE)
            .await
        {
            Ok(Claim::Done) => true,
            Ok(Claim::New(token)) => {
                let _ = self.store.inner().release(delivery, token).await;
                false
            }
            _ => false,
        }
    }

    /// Routes whose renewals or "done" the wrapper failed or answered late, and those a
    /// crash hit between their success and their record.
    fn exempt(&self) -> HashSet<Route> {
        let mut exempt: HashSet<Route> = self
            .store
            .met()
            .into_iter()
            .filter(|m| {
                matches!(m.op, Op::Renew | Op::Complete)
                    && matches!(m.fault, Fault::Fail | Fault::AnswerAfter(_))
            })
            .filter_map(|m| {
                let consumer_of = m.source.split('/').nth(2)?.to_owned();
                let p = (0..PROCESSORS.len()).find(|p| consumer(*p) == consumer_of)?;
                Some((m.id, p))
            })
            .collect();
        exempt.extend(self.seen.lock().unwrap().crashed_between.iter().cloned());
        exempt
    }

    /// The messages of the stream processor `p` takes.
    fn messages_of(&self, p: usize) -> u64 {
        let messages = self.messages.iter();
        messages.filter(|(k, _)| takes(p, k)).map(|(_, n)| n).sum()
    }

    fn check_routes(&self, when: &str) {
        let exempt = self.exempt();
        let s = self.seen.lock().unwrap();
        assert!(
            s.strays.is_empty(),
            "{when}: routes run that the filter does not take: {:?}",
            s.strays
        );
        for (route, n) in &s.effects {
            if !exempt.contains(route) {
                assert!(
                    *n <= 1,
                    "{when}: {route:?} processed successfully {n} times"
                );
            }
        }
        for (route, n) in &s.overlap {
            if !exempt.contains(route) {
                assert!(*n <= 1, "{when}: {n} runs of {route:?} at once");
            }
        }
        for (route, n) in &s.runs {
            let expected = s.expected_runs(route);
            if !exempt.contains(route) {
                assert!(
                    *n <= expected,
                    "{when}: {route:?} ran {n} times, where its script and the crashes \
                     that aborted it (runs {:?}) allow {expected}",
                    s.aborted.get(route)
                );
            }
        }
    }

    /// Each processor's counts, as far as they hold at any moment.
    async fn check_counts(&self, when: &str) {
        // An error until a worker has created its consumer (as `counts` documents).
        let Ok(by) = self.jetstream.counts_by_processor().await else {
            return;
        };
        let names: Vec<&str> = by.keys().map(String::as_str).collect();
        let mut configured: Vec<&str> = PROCESSORS[..self.layout.processors()]
            .iter()
            .map(|p| p.0)
            .collect();
        configured.sort_unstable();
        assert_eq!(
            names, configured,
            "{when}: counts_by_processor's processors"
        );
        for (p, (name, _)) in PROCESSORS[..self.layout.processors()].iter().enumerate() {
            let counts = by[*name];
            assert_eq!(
                counts.dead, 0,
                "{when}: {name}: a route went dead: {counts:?}"
            );
            if !self.paused_ever.contains(&p) {
                assert_eq!(counts.paused, 0, "{when}: {name} never paused: {counts:?}");
            }
            let most = self.messages_of(p) + self.crashes.get(&p).copied().unwrap_or(0);
            assert!(
                counts.processed <= most,
                "{when}: {name} processed {} of the {most} messages it takes: {counts:?}",
                counts.processed
            );
        }
    }

    async fn step(&mut self, step: &Step) {
        match step {
            Step::Accept {
                key,
                scripts,
                work,
                late,
            } => {
                let met_before = self.store.met().len();
                if let Some((op, ms)) = late {
                    let late = Fault::AnswerAfter(Duration::from_millis(*ms));
                    self.store.script(*op, [late]);
                }
                let key = format!("evt_{key}");
                {
                    let mut s = self.seen.lock().unwrap();
                    s.accepts += 1;
                    s.scripts
                        .entry(key.clone())
                        .or_insert((scripts.clone(), *work));
                }
                let accepted = self
                    .jetstream
                    .accept(&event(&key))
                    .await
                    .unwrap_or_else(|e| panic!("{key}: accept failed with NATS up: {e}"));
                if accepted == Accepted::New {
                    *self.messages.entry(key).or_default() += 1;
                }
                // Give the late answer a moment to be met before a later step heals it
                // (the call is logged as it is made, not when it answers).
                let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
                while late.is_some()
                    && self.store.met().len() == met_before
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Step::Fault { op, fault, n } => {
                let fault = match fault {
                    StoreFault::Fail => Fault::Fail,
                    StoreFault::LoseAck => Fault::LoseAck,
                    StoreFault::AnswerAfter(ms) => Fault::AnswerAfter(Duration::from_millis(*ms)),
                };
                self.store.script(*op, std::iter::repeat_n(fault, *n));
            }
            Step::Heal => self.store.heal_all(),
            Step::Crash { processor: p } => {
                self.workers[*p].take().expect("a worker").abort();
                // The aborted tasks end at their next poll; a statement already sent may
                // still land.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let succeeded: Vec<Route> = {
                    let s = self.seen.lock().unwrap();
                    s.effects.keys().filter(|r| r.1 == *p).cloned().collect()
                };
                for route in succeeded {
                    if !self.done(&route).await {
                        self.seen.lock().unwrap().crashed_between.insert(route);
                    }
                }
                self.seen.lock().unwrap().crashes += 1;
                *self.crashes.entry(*p).or_default() += 1;
                let layout = self.layout;
                self.workers[*p] =
                    Some(worker(&self.jetstream, layout, *p, &self.store, &self.seen));
            }
            Step::Pause { processor } => {
                let paused = self.hold(*processor, true).await;
                let expected = self.pauses.insert(*processor);
                assert_eq!(paused, expected, "{step:?}: paused anew");
                match processor {
                    Some(p) => drop(self.paused_ever.insert(*p)),
                    None => self.paused_ever.extend(0..self.layout.processors()),
                }
                self.seen.lock().unwrap().pauses += 1;
            }
            Step::Resume { processor } => {
                let resumed = self.hold(*processor, false).await;
                let expected = self.pauses.remove(processor);
                assert_eq!(resumed, expected, "{step:?}: a pause ended");
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }

    /// Pauses (or resumes) every event for processor `p` (`None`: every processor).
    async fn hold(&self, p: Option<usize>, pause: bool) -> bool {
        let js = &self.jetstream;
        let done = match (p.map(|p| PROCESSORS[p].0), pause) {
            (None, true) => js.pause(None, None).await,
            (None, false) => js.resume(None, None).await,
            (Some(name), true) => js.pause_processor(name, None, None).await,
            (Some(name), false) => js.resume_processor(name, None, None).await,
        };
        done.expect("NATS answers")
    }

    /// No fault or pause left: every route processed and acknowledged within 30 s, once
    /// (at least once where exempt), after the runs the model expects, none dead, each
    /// key done in the store, each processor's counts exact.
    async fn settle(&mut self) {
        self.store.heal_all();
        for pause in std::mem::take(&mut self.pauses) {
            assert!(self.hold(pause, false).await, "{pause:?}: a pause ended");
        }
        let routes = self.routes();
        let n = self.layout.processors();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let all_ran = {
                let s = self.seen.lock().unwrap();
                routes
                    .iter()
                    .all(|r| s.effects.get(r).copied().unwrap_or(0) >= 1)
                    && s.running.values().all(|n| *n == 0)
            };
            let by = self.jetstream.counts_by_processor().await;
            let exact = by.as_ref().is_ok_and(|by| {
                PROCESSORS[..n].iter().enumerate().all(|(p, (name, _))| {
                    let c = by[*name];
                    let crashes = self.crashes.get(&p).copied().unwrap_or(0);
                    let taken = self.messages_of(p);
                    c.queued == 0
                        && c.processing == 0
                        && c.dead == 0
                        && c.paused == 0
                        && (taken..=taken + crashes).contains(&c.processed)
                })
            });
            if all_ran && exact {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every route processed and acknowledged, or counts not exact, within \
                 30 s: {by:?} (messages {:?}, crashes {:?}), {:?}",
                self.messages,
                self.crashes,
                self.seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for worker in &mut self.workers {
            worker.take().expect("a worker").shutdown().await;
        }
        let exempt = self.exempt();
        for route in &routes {
            let (n, runs, expected) = {
                let s = self.seen.lock().unwrap();
                (s.effects[route], s.runs[route], s.expected_runs(route))
            };
            // An exempt route may be acknowledged with its "done" never landed: the worker
            // retries "done" until the lease it read when the processor ended, then logs
            // and acknowledges (a republish after the window would run it again).
            if !exempt.contains(route) {
                assert_eq!(n, 1, "{route:?}: processed successfully {n} times");
                assert_eq!(runs, expected, "{route:?}: runs");
                assert!(
                    self.done(route).await,
                    "{route:?}: processed, but not done in the store"
                );
            }
        }
        self.check_routes("settled");
    }
}

pub static TOTALS: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];
static STORES: [OnceLock<Arc<dyn DedupeStore>>; 4] = [const { OnceLock::new() }; 4];

pub trait On: 'static {
    const KIND: Kind;
}

pub struct JetStreamTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for JetStreamTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(layout: &Layout) -> Sut {
        let store = FaultStore::from_arc(shared_store(&STORES, K::KIND));
        let layout = *layout;
        block_on(async {
            let client = async_nats::connect(crate::common::nats_url())
                .await
                .expect("NATS with JetStream must be running (.ci/services starts it)");
            let name = format!("tw_model_{}", uuid::Uuid::new_v4().simple());
            let builder = JetStream::builder(client, &name)
                .with_memory_storage()
                .with_duplicate_window(WINDOW);
            let builder = match layout {
                Layout::Single => builder,
                Layout::FanOut => builder
                    .with_processors(PROCESSORS.map(|(name, glob)| {
                        let spec = ProcessorSpec::new(name).unwrap();
                        match glob {
                            Some(glob) => spec.with_types([glob]).unwrap(),
                            None => spec,
                        }
                    }))
                    .unwrap(),
            };
            let jetstream = builder.build().await.unwrap();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let workers = (0..layout.processors())
                .map(|p| Some(worker(&jetstream, layout, p, &store, &seen)))
                .collect();
            Sut {
                kind: K::KIND,
                layout,
                store,
                jetstream,
                workers,
                seen,
                pauses: HashSet::new(),
                paused_ever: HashSet::new(),
                messages: HashMap::new(),
                crashes: HashMap::new(),
            }
        })
    }

    fn apply(mut sut: Sut, _: &Layout, step: Step) -> Sut {
        let when = format!("after {step:?}");
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
            sut.check_counts(&when).await;
        });
        sut.check_routes(&when);
        sut
    }

    fn teardown(mut sut: Sut, _: Layout) {
        block_on(async {
            sut.settle().await;
            sut.jetstream
                .clone()
                .delete()
                .await
                .expect("the streams deleted");
        });
        let i = Kind::ALL.iter().position(|k| *k == sut.kind).unwrap();
        let s = sut.seen.lock().unwrap();
        TOTALS[i].fetch_add(s.accepts, std::sync::atomic::Ordering::Relaxed);
        let late = sut
            .store
            .met()
            .into_iter()
            .filter(|m| matches!(m.fault, Fault::AnswerAfter(after) if after >= LEASE * 2 / 3));
        LATE[i].fetch_add(late.count(), std::sync::atomic::Ordering::Relaxed);
        CRASHES[i].fetch_add(s.crashes, std::sync::atomic::Ordering::Relaxed);
        PAUSES[i].fetch_add(s.pauses, std::sync::atomic::Ordering::Relaxed);
        if sut.layout == Layout::FanOut {
            FAN_OUT[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

static CRASHES: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];
static PAUSES: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];
/// Cases with three processors.
static FAN_OUT: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];
/// Store calls answered past two thirds of the lease.
static LATE: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

macro_rules! on {
    ($marker:ident, $kind:expr, $test:ident, $file:literal) => {
        pub struct $marker;
        impl On for $marker {
            const KIND: Kind = $kind;
        }

        #[test]
        fn $test() {
            let i = Kind::ALL.iter().position(|k| *k == $kind).unwrap();
            check::<JetStreamTest<$marker>>(
                concat!("jetstream::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (6, 1..12),
                &format!("jetstream worker | {:?}", $kind),
                || {
                    let n = |a: &[std::sync::atomic::AtomicUsize; 4]| {
                        a[i].load(std::sync::atomic::Ordering::Relaxed)
                    };
                    format!(
                        "fan-out cases={} | accepts={} | crashes={} | pauses={} | answered \
                         past 2/3 of the lease={}",
                        n(&FAN_OUT),
                        n(&TOTALS),
                        n(&CRASHES),
                        n(&PAUSES),
                        n(&LATE)
                    )
                },
            );
        }
    };
}

on!(OnMemory, Kind::Memory, memory, "model-jetstream-memory.txt");
on!(OnSqlite, Kind::Sqlite, sqlite, "model-jetstream-sqlite.txt");
on!(
    OnPostgres,
    Kind::Postgres,
    postgres,
    "model-jetstream-postgres.txt"
);
on!(OnRedis, Kind::Redis, redis, "model-jetstream-redis.txt");

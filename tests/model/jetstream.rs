//! Model D: `JetStreamWorker` on the real NATS server (`NATS_URL`), its consumer-side
//! claim on every store (memory, SQLite, PostgreSQL, Redis) behind [`FaultStore`].
//!
//! A case is a stream of its own (a uuid name, memory storage, a 400 ms duplicate
//! window; deleted at the end) and a random sequence of: accepts of one of three events —
//! the first with a script of what each attempt of its processor does (succeed, fail or
//! panic, after 0–150 ms or 400–900 ms: past the claim's 300 ms lease and the consumer's
//! 200 ms `ack_wait`, living on renewals; a message delivered again while its claim holds
//! goes back until the claim ends), the
//! later ones the same id again (inside the duplicate window JetStream drops it; after a
//! sleep past it, a second message of the same event); store faults scripted on the next
//! calls of one operation of the claim store (fail, lose the acknowledgement, answer
//! late: up to two thirds of the lease, or past them — a claim so late is given back and
//! asked again, as `PendingClaim` does); healing; time passing; and a crash — the worker aborted wherever it is, its
//! processor with it, and a new worker started on the same stream, consumer and store.
//!
//! The model is the set of accepted events, each to end processed successfully exactly
//! once. Checked after every step: no event's processor succeeded twice, no two runs of
//! one event at once. At the end (faults healed) every accepted event succeeded exactly
//! once, none went dead, every message was acknowledged, and each event's key is done in
//! the store. Exempt, checked only "at least once": an event whose renewals or "done"
//! the wrapper failed or answered late (the claim may have lapsed: the Guarantees table's
//! "else `ClaimLost`"), and one a crash hit after its processor succeeded and before its
//! key was done (a crash between the effect and its record re-runs it: what
//! `IdempotencyKey` is for).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Attempt, Later, WorkerHandle};
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
    /// Accepts event `key`; its first accept sets what its attempts do (`script`, then
    /// success), each after `work` ms. With `late`, the claim store's next call of that
    /// operation — most likely this event's — is answered that many ms late.
    Accept {
        key: usize,
        script: Vec<Behave>,
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
    /// The worker aborted (its process died), a new one started.
    Crash,
    Sleep {
        ms: u64,
    },
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = ();
    type Transition = Step;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Step> {
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
        let accept = (
            0..KEYS,
            prop::collection::vec(behave, 0..3),
            prop_oneof![3 => Just(0u64), 2 => 0..150u64, 1 => 400..900u64],
            late,
        )
            .prop_map(|(key, script, work, late)| Step::Accept {
                key,
                script,
                work,
                late,
            });
        let fault = prop_oneof![
            Just(StoreFault::Fail),
            Just(StoreFault::LoseAck),
            (10..200u64).prop_map(StoreFault::AnswerAfter),
        ];

        prop_oneof![
            6 => accept,
            3 => (op, fault, 1..=3usize).prop_map(|(op, fault, n)| Step::Fault { op, fault, n }),
            1 => Just(Step::Heal),
            2 => Just(Step::Crash),
            2 => prop_oneof![Just(50u64), Just(200), Just(WINDOW.as_millis() as u64 + 200)]
                .prop_map(|ms| Step::Sleep { ms }),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

/// What the processors did.
#[derive(Default, Debug)]
pub struct Seen {
    /// Each event's script and work, set by its first accept.
    scripts: HashMap<String, (Vec<Behave>, u64)>,
    /// Runs started, successful runs, runs going on now and the most at once, per event.
    runs: HashMap<String, usize>,
    effects: HashMap<String, u32>,
    running: HashMap<String, u32>,
    overlap: HashMap<String, u32>,
    /// Events a crash hit between their success and their key done.
    crashed_between: HashSet<String>,
    accepts: usize,
    crashes: usize,
}

/// Counts a run as ended however it ends (an aborted worker drops it mid-sleep).
struct Running(Arc<Mutex<Seen>>, String);

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap();
        *s.running.get_mut(&self.1).unwrap() -= 1;
    }
}

pub struct Sut {
    kind: Kind,
    store: FaultStore<dyn DedupeStore>,
    jetstream: JetStream,
    worker: Option<WorkerHandle>,
    seen: Arc<Mutex<Seen>>,
}

fn event(id: &str) -> Event {
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"pi_{id}"}}}}}}"#);
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
    store: &FaultStore<dyn DedupeStore>,
    seen: &Arc<Mutex<Seen>>,
) -> WorkerHandle {
    let seen = seen.clone();
    let processor = move |e: Event, _: Attempt| {
        let seen = seen.clone();
        async move {
            let key = e.id().unwrap().to_owned();
            let (behave, work, guard) = {
                let mut s = seen.lock().unwrap();
                let run = *s
                    .runs
                    .entry(key.clone())
                    .and_modify(|n| *n += 1)
                    .or_insert(1);
                let (script, work) = s.scripts[&key].clone();
                let behave = script.get(run - 1).copied().unwrap_or(Behave::Succeed);
                let n = s.running.entry(key.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.overlap.entry(key.clone()).or_default();
                *most = (*most).max(n);
                (behave, work, Running(seen.clone(), key.clone()))
            };
            tokio::time::sleep(Duration::from_millis(work)).await;
            drop(guard);
            match behave {
                Behave::Succeed => {
                    *seen.lock().unwrap().effects.entry(key).or_default() += 1;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                }
                Behave::Fail => Err("the processor failed (the model asked it to)".into()),
                Behave::Later => Err(Later::after(Duration::from_millis(10)).into()),
                Behave::Panic => panic!("the processor panicked (the model asked it to)"),
            }
        }
    };
    JetStreamWorker::from_arc(jetstream, Arc::new(store.clone()), processor)
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

impl Sut {
    /// The worker's claim key of event `key` (`jetstream/<stream>/<consumer>/<source>`:
    /// the settle checks it is the one, by finding every processed key done).
    fn claim_key(&self, key: &str) -> Delivery {
        Delivery::new(
            format!(
                "jetstream/{}/tower-webhook/{}",
                self.jetstream.stream(),
                event(key).source()
            ),
            key,
        )
    }

    /// Whether `key` is done in the store underneath (a claim granted to look is released).
    async fn done(&self, key: &str) -> bool {
        let delivery = self.claim_key(key);
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

    /// Events whose renewals or "done" the wrapper failed or answered late, and those a
    /// crash hit between their success and their record.
    fn exempt(&self) -> HashSet<String> {
        let mut exempt: HashSet<String> = self
            .store
            .met()
            .into_iter()
            .filter(|m| {
                matches!(m.op, Op::Renew | Op::Complete)
                    && matches!(m.fault, Fault::Fail | Fault::AnswerAfter(_))
            })
            .map(|m| m.id)
            .collect();
        exempt.extend(self.seen.lock().unwrap().crashed_between.iter().cloned());
        exempt
    }

    fn check_once(&self, when: &str) {
        let exempt = self.exempt();
        let s = self.seen.lock().unwrap();
        for (key, n) in &s.effects {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {key} processed successfully {n} times");
            }
        }
        for (key, n) in &s.overlap {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {n} runs of {key} at once");
            }
        }
    }

    async fn step(&mut self, step: &Step) {
        match step {
            Step::Accept {
                key,
                script,
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
                        .or_insert((script.clone(), *work));
                }
                self.jetstream
                    .accept(&event(&key))
                    .await
                    .unwrap_or_else(|e| panic!("{key}: accept failed with NATS up: {e}"));
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
            Step::Crash => {
                self.worker.take().expect("a worker").abort();
                // The aborted tasks end at their next poll; a statement already sent may
                // still land.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let succeeded: Vec<String> = {
                    let s = self.seen.lock().unwrap();
                    s.effects.keys().cloned().collect()
                };
                for key in succeeded {
                    if !self.done(&key).await {
                        self.seen.lock().unwrap().crashed_between.insert(key);
                    }
                }
                self.seen.lock().unwrap().crashes += 1;
                self.worker = Some(worker(&self.jetstream, &self.store, &self.seen));
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }

    /// No fault left: every accepted event processed and acknowledged within 30 s, once
    /// (at least once where exempt), none dead, each key done in the store.
    async fn settle(&mut self) {
        self.store.heal_all();
        let accepted: Vec<String> = self.seen.lock().unwrap().scripts.keys().cloned().collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let all_ran = {
                let s = self.seen.lock().unwrap();
                accepted
                    .iter()
                    .all(|k| s.effects.get(k).copied().unwrap_or(0) >= 1)
                    && s.running.values().all(|n| *n == 0)
            };
            // An error until the worker has created its consumer (as `counts` documents).
            let counts = self.jetstream.counts().await;
            if let (true, Ok(counts)) = (all_ran, &counts) {
                if counts.queued == 0 && counts.processing == 0 {
                    assert_eq!(counts.dead, 0, "an event went dead: {counts:?}");
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every accepted event processed and acknowledged within 30 s: {counts:?}, \
                 {:?}",
                self.seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.worker.take().expect("a worker").shutdown().await;
        let exempt = self.exempt();
        for key in &accepted {
            let n = self.seen.lock().unwrap().effects[key];
            // An exempt event may be acknowledged with its "done" never landed: the worker
            // retries "done" until the lease it read when the processor ended, then logs
            // and acknowledges (a republish after the window would run it again).
            if !exempt.contains(key) {
                assert_eq!(n, 1, "{key}: processed successfully {n} times");
                assert!(
                    self.done(key).await,
                    "{key}: processed, but not done in the store"
                );
            }
        }
        self.check_once("settled");
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

    fn init_test(_: &()) -> Sut {
        let store = FaultStore::from_arc(shared_store(&STORES, K::KIND));
        block_on(async {
            let client = async_nats::connect(crate::common::nats_url())
                .await
                .expect("NATS with JetStream must be running (.ci/services starts it)");
            let name = format!("tw_model_{}", uuid::Uuid::new_v4().simple());
            let jetstream = JetStream::builder(client, &name)
                .with_memory_storage()
                .with_duplicate_window(WINDOW)
                .build()
                .await
                .unwrap();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let worker = Some(worker(&jetstream, &store, &seen));
            Sut {
                kind: K::KIND,
                store,
                jetstream,
                worker,
                seen,
            }
        })
    }

    fn apply(mut sut: Sut, _: &(), step: Step) -> Sut {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
        });
        sut.check_once(&format!("after {step:?}"));
        sut
    }

    fn teardown(mut sut: Sut, _: ()) {
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
    }
}

static CRASHES: [std::sync::atomic::AtomicUsize; 4] =
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
                    format!(
                        "accepts={} | crashes={} | answered past 2/3 of the lease={}",
                        TOTALS[i].load(std::sync::atomic::Ordering::Relaxed),
                        CRASHES[i].load(std::sync::atomic::Ordering::Relaxed),
                        LATE[i].load(std::sync::atomic::Ordering::Relaxed)
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

//! Model E: `Once::run` on every store (memory, SQLite, PostgreSQL, Redis) behind
//! [`FaultStore`].
//!
//! A case is a namespace of its own and a random sequence of: one to three callers at
//! once running one of three keys, whose action succeeds, fails or panics after 0–150 ms
//! or 400–900 ms (the lease is 300 ms: slow actions live on renewals), each caller
//! dropped after a random time or not (a request whose client hung up); store faults on
//! the next calls of one operation (fail, lose the acknowledgement, answer late);
//! healing; time passing. At the end, with no fault left, each key is run again until it
//! answers `Now` or `Already`.
//!
//! The model is each key's state: never run, run successfully (its effect happened).
//! Checked, for every key whose renewals or "done" no fault touched: its effect happens
//! at most once at every step and exactly once at the end; no two actions of it run at
//! once; `Already` only after its effect happened; `Lost` never (only where a fault on
//! "done" or renewals allows it); a failed or panicking action is released, so a later
//! run goes; a caller dropped mid-run never causes a second run of an action that had
//! started (it runs to its end and its outcome is recorded); a store error only where a
//! claim met a fault.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::FutureExt;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::once::{Once, OnceErrorKind, Ran};
use tower_webhook::store::DedupeStore;

use crate::common::fault_store::{Fault, FaultStore, Op};
use crate::common::stores::Kind;
use crate::run::{block_on, check, shared_store};

const KEYS: usize = 3;
const LEASE: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behave {
    Succeed,
    Fail,
    Panic,
}

#[derive(Clone, Copy, Debug)]
pub enum StoreFault {
    Fail,
    LoseAck,
    AnswerAfter(u64),
}

#[derive(Clone, Debug)]
pub enum Step {
    /// `callers` runs of `key` at once, each dropped after `hang_up` ms if set; the
    /// action does `behave` after `work` ms.
    Run {
        key: usize,
        callers: usize,
        behave: Behave,
        work: u64,
        hang_up: Option<u64>,
    },
    Fault {
        op: Op,
        fault: StoreFault,
        n: usize,
    },
    Heal,
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
            5 => Just(Behave::Succeed),
            2 => Just(Behave::Fail),
            1 => Just(Behave::Panic),
        ];
        let run = (
            0..KEYS,
            1..=3usize,
            behave,
            prop_oneof![Just(0u64), 0..150u64, 400..900u64],
            prop::option::weighted(0.3, 0..500u64),
        )
            .prop_map(|(key, callers, behave, work, hang_up)| Step::Run {
                key,
                callers,
                behave,
                work,
                hang_up,
            });
        let op = prop_oneof![
            Just(Op::Claim),
            Just(Op::Renew),
            Just(Op::Complete),
            Just(Op::Release)
        ];
        let fault = prop_oneof![
            Just(StoreFault::Fail),
            Just(StoreFault::LoseAck),
            (10..200u64).prop_map(StoreFault::AnswerAfter),
        ];
        prop_oneof![
            8 => run,
            3 => (op, fault, 1..=3usize).prop_map(|(op, fault, n)| Step::Fault { op, fault, n }),
            1 => Just(Step::Heal),
            1 => prop_oneof![Just(100u64), Just(400)].prop_map(|ms| Step::Sleep { ms }),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

#[derive(Default, Debug)]
pub struct Seen {
    /// Successful actions, actions running now and the most at once, per key.
    effects: HashMap<String, u32>,
    running: HashMap<String, u32>,
    overlap: HashMap<String, u32>,
    runs: usize,
}

/// Counts an action as ended however it ends (a panic unwinds through it).
struct Running(Arc<Mutex<Seen>>, String);

impl Drop for Running {
    fn drop(&mut self) {
        *self.0.lock().unwrap().running.get_mut(&self.1).unwrap() -= 1;
    }
}

/// What one caller got: `None` when it hung up first.
#[derive(Debug)]
enum Answer {
    Now,
    Already,
    InProgress,
    Lost,
    ActionFailed,
    StoreFailed,
    Panicked,
}

pub struct Sut {
    kind: Kind,
    store: FaultStore<dyn DedupeStore>,
    once: Once,
    seen: Arc<Mutex<Seen>>,
}

async fn run(
    once: Once,
    seen: Arc<Mutex<Seen>>,
    key: String,
    behave: Behave,
    work: u64,
    hang_up: Option<u64>,
) -> Option<Answer> {
    let action_key = key.clone();
    let call = async move {
        let ran = std::panic::AssertUnwindSafe(once.run(&key, move |_idempotency_key| {
            let guard = {
                let mut s = seen.lock().unwrap();
                let n = s.running.entry(action_key.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.overlap.entry(action_key.clone()).or_default();
                *most = (*most).max(n);
                Running(seen.clone(), action_key.clone())
            };
            async move {
                tokio::time::sleep(Duration::from_millis(work)).await;
                let seen = guard.0.clone();
                drop(guard);
                match behave {
                    Behave::Succeed => {
                        *seen.lock().unwrap().effects.entry(action_key).or_default() += 1;
                        Ok::<_, String>(())
                    }
                    Behave::Fail => Err("the action failed (the model asked it to)".to_owned()),
                    Behave::Panic => panic!("the action panicked (the model asked it to)"),
                }
            }
        }))
        .catch_unwind()
        .await;
        match ran {
            Err(_) => Answer::Panicked,
            Ok(Ok(Ran::Now(()))) => Answer::Now,
            Ok(Ok(Ran::Already)) => Answer::Already,
            Ok(Ok(Ran::InProgress { .. })) => Answer::InProgress,
            Ok(Ok(Ran::Lost(()))) => Answer::Lost,
            Ok(Ok(other)) => panic!("{other:?}: not a known answer"),
            Ok(Err(e)) => match e.kind() {
                OnceErrorKind::Action => Answer::ActionFailed,
                OnceErrorKind::Store => Answer::StoreFailed,
                other => panic!("{other:?}: no drain was stopped"),
            },
        }
    };
    match hang_up {
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), call)
            .await
            .ok(),
        None => Some(call.await),
    }
}

impl Sut {
    /// Keys whose renewals or "done" the wrapper failed or answered late: the lease may
    /// have run out under their action, so it may run again (`Ran::Lost`).
    fn exempt(&self) -> HashSet<String> {
        self.store
            .met()
            .into_iter()
            .filter(|m| {
                matches!(m.op, Op::Renew | Op::Complete)
                    && matches!(m.fault, Fault::Fail | Fault::AnswerAfter(_))
            })
            .map(|m| m.id)
            .collect()
    }

    fn met(&self, op: Op, key: &str) -> bool {
        self.store
            .met()
            .iter()
            .any(|m| m.op == op && m.id.ends_with(key))
    }

    fn record(&self, key: &str, behave: Behave, answer: Option<Answer>) {
        let Some(answer) = answer else { return };
        let effects = self
            .seen
            .lock()
            .unwrap()
            .effects
            .get(key)
            .copied()
            .unwrap_or(0);
        match answer {
            Answer::Now => {
                assert!(
                    behave == Behave::Succeed && effects >= 1,
                    "{key}: Now, {behave:?}"
                )
            }
            Answer::Already => {
                assert!(
                    effects >= 1,
                    "{key}: Already, but its action never succeeded"
                )
            }
            Answer::InProgress => {}
            Answer::Lost => assert!(
                self.exempt().contains(key) || self.met(Op::Complete, key),
                "{key}: Lost, but no store fault allows it"
            ),
            Answer::ActionFailed => assert_eq!(behave, Behave::Fail, "{key}: action failed"),
            Answer::Panicked => assert_eq!(behave, Behave::Panic, "{key}: panicked"),
            Answer::StoreFailed => assert!(
                self.met(Op::Claim, key),
                "{key}: a store error without a fault on its claim"
            ),
        }
    }

    fn check_once(&self, when: &str) {
        let exempt = self.exempt();
        let s = self.seen.lock().unwrap();
        for (key, n) in &s.effects {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {key}'s effect happened {n} times");
            }
        }
        for (key, n) in &s.overlap {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {n} actions of {key} at once");
            }
        }
    }

    async fn step(&self, step: &Step) {
        match *step {
            Step::Run {
                key,
                callers,
                behave,
                work,
                hang_up,
            } => {
                let key = format!("order-{key}");
                self.seen.lock().unwrap().runs += callers;
                let calls = (0..callers).map(|_| {
                    run(
                        self.once.clone(),
                        self.seen.clone(),
                        key.clone(),
                        behave,
                        work,
                        hang_up,
                    )
                });
                for answer in futures_util::future::join_all(calls).await {
                    self.record(&key, behave, answer);
                }
            }
            Step::Fault { op, fault, n } => {
                let fault = match fault {
                    StoreFault::Fail => Fault::Fail,
                    StoreFault::LoseAck => Fault::LoseAck,
                    StoreFault::AnswerAfter(ms) => Fault::AnswerAfter(Duration::from_millis(ms)),
                };
                self.store.script(op, std::iter::repeat_n(fault, n));
            }
            Step::Heal => self.store.heal_all(),
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// No fault left, every action ended: each key run until `Now` or `Already`; its
    /// effect happened exactly once (at least once where exempt). A key whose effect had
    /// happened answers `Already` at once.
    async fn settle(&self) {
        self.store.heal_all();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.seen.lock().unwrap().running.values().any(|n| *n > 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "actions still running after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // "Done" or the release lands right after the action; a release that failed leaves
        // the key to its lease.
        tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
        let exempt = self.exempt();
        for k in 0..KEYS {
            let key = format!("order-{k}");
            let happened = self.seen.lock().unwrap().effects.contains_key(&key);
            let mut first = true;
            loop {
                let answer = run(
                    self.once.clone(),
                    self.seen.clone(),
                    key.clone(),
                    Behave::Succeed,
                    0,
                    None,
                )
                .await
                .expect("no hang-up");
                if first && happened && !exempt.contains(&key) {
                    assert!(
                        matches!(answer, Answer::Already),
                        "{key}: its effect happened, yet a later run answered {answer:?}"
                    );
                }
                first = false;
                let again = matches!(answer, Answer::InProgress);
                self.record(&key, Behave::Succeed, Some(answer));
                if !again {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline + Duration::from_secs(5),
                    "{key}: in progress for good"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let n = self
                .seen
                .lock()
                .unwrap()
                .effects
                .get(&key)
                .copied()
                .unwrap_or(0);
            assert!(n >= 1, "{key}: its effect never happened");
            if !exempt.contains(&key) {
                assert_eq!(n, 1, "{key}: its effect happened {n} times");
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

pub struct OnceTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for OnceTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        let store = FaultStore::from_arc(shared_store(&STORES, K::KIND));
        let namespace = format!("model-{}", uuid::Uuid::new_v4().simple());
        let once = Once::from_arc(Arc::new(store.clone()), &namespace)
            .with_lease(LEASE)
            .unwrap();
        Sut {
            kind: K::KIND,
            store,
            once,
            seen: Arc::default(),
        }
    }

    fn apply(sut: Sut, _: &(), step: Step) -> Sut {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
        });
        sut.check_once(&format!("after {step:?}"));
        sut
    }

    fn teardown(sut: Sut, _: ()) {
        block_on(sut.settle());
        let i = Kind::ALL.iter().position(|k| *k == sut.kind).unwrap();
        let runs = sut.seen.lock().unwrap().runs;
        TOTALS[i].fetch_add(runs, std::sync::atomic::Ordering::Relaxed);
    }
}

macro_rules! on {
    ($marker:ident, $kind:expr, $test:ident, $file:literal) => {
        pub struct $marker;
        impl On for $marker {
            const KIND: Kind = $kind;
        }

        #[test]
        fn $test() {
            let i = Kind::ALL.iter().position(|k| *k == $kind).unwrap();
            check::<OnceTest<$marker>>(
                concat!("once::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (8, 1..15),
                &format!("once | {:?}", $kind),
                || {
                    format!(
                        "runs={}",
                        TOTALS[i].load(std::sync::atomic::Ordering::Relaxed)
                    )
                },
            );
        }
    };
}

on!(OnMemory, Kind::Memory, memory, "model-once-memory.txt");
on!(OnSqlite, Kind::Sqlite, sqlite, "model-once-sqlite.txt");
on!(
    OnPostgres,
    Kind::Postgres,
    postgres,
    "model-once-postgres.txt"
);
on!(OnRedis, Kind::Redis, redis, "model-once-redis.txt");

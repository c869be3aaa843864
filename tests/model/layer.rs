//! Model C: `DedupeLayer` end to end on every store, behind the generic fault wrapper
//! ([`FaultStore`] over the real store), checked against README's Guarantees table.
//!
//! A case is a source of its own and a random sequence of: bursts of concurrent
//! duplicate deliveries of one of three keys, through one of two replicas (two layers on
//! one store), whose handler succeeds, fails (500) or panics after 0–600 ms (the lease is
//! 300 ms: slow handlers live on renewals), whose clients hang up (the response future
//! dropped) at a random point or not; store faults scripted on the next calls of one
//! operation (fail, lose the acknowledgement, answer late); healing; time passing. At the
//! end the provider redelivers every key until it gets a 2xx, with no fault left.
//!
//! The rows of the Guarantees table checked, for `DedupeLayer`:
//!
//! - *client hangs up mid-handler*: the handler runs to its end and its outcome is
//!   recorded — the redelivery after it gets 204, the handler does not run again;
//! - *handler fails or panics*: released, the retry runs (every key ends with exactly one
//!   successful run);
//! - *slow handler (longer than the lease)*: once — no two runs of a key overlap, and no
//!   key succeeds twice;
//! - *store outage*: 503 before the handler (only claims meet faults before it), and
//!   during it "done" and renewals are retried while the lease lasts; a key whose
//!   renewals or completions the wrapper failed may run again (the table's "else
//!   `ClaimLost`"), so for those keys only "at least once" is checked;
//! - *lost commit acknowledgement*: once — a completion whose answer was lost or late is
//!   not a re-run;
//! - *two replicas*: once per key.
//!
//! And throughout: a 204 only for a key whose handler succeeded (nothing deduplicated
//! that never ran); statuses only 200, 204, 409, 500 (the handler's own failure or a
//! panic) and 503 (a claim the store failed). Crashes and the max run time are not in
//! this model (the chaos tests kill processes).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::ClaimLost;
use tower_webhook::store::{DedupeStore, Delivery};
use tower_webhook::DedupeLayer;

use crate::common::fault_store::{Fault, FaultStore, Op};
use crate::common::stores::Kind;
use crate::run::{block_on, check, shared_store, spawn};

const KEYS: usize = 3;
const LEASE: Duration = Duration::from_millis(300);
/// The storm's lease: short beside its handlers (0.3 to 2.5 s), so they live on renewals.
const STORM_LEASE: Duration = Duration::from_secs(1);

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
    /// `copies` deliveries of `key` at once through `replica`, each client hanging up
    /// after `hang_up` ms if set; the handler does `behave` after `work` ms.
    Deliver {
        key: usize,
        copies: usize,
        replica: usize,
        behave: Behave,
        work: u64,
        hang_up: Option<u64>,
    },
    /// The next `n` calls of `op` meet `fault`.
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
            6 => Just(Behave::Succeed),
            2 => Just(Behave::Fail),
            1 => Just(Behave::Panic),
        ];
        let deliver = (
            0..KEYS,
            1..=4usize,
            0..2usize,
            behave,
            prop_oneof![Just(0u64), 0..150u64, 150..600u64],
            prop::option::weighted(0.3, 0..500u64),
        )
            .prop_map(
                |(key, copies, replica, behave, work, hang_up)| Step::Deliver {
                    key,
                    copies,
                    replica,
                    behave,
                    work,
                    hang_up,
                },
            );
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
            8 => deliver,
            3 => (op, fault, 1..=3usize).prop_map(|(op, fault, n)| Step::Fault { op, fault, n }),
            1 => Just(Step::Heal),
            1 => prop_oneof![Just(100u64), Just(400)].prop_map(|ms| Step::Sleep { ms }),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, std::convert::Infallible>;

/// What the handler and the clients saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// Successful runs per key.
    effects: HashMap<String, u32>,
    /// Runs going on now, and the most at once, per key.
    running: HashMap<String, u32>,
    overlap: HashMap<String, u32>,
    /// Keys a response said `ClaimLost` for.
    lost: HashSet<String>,
    /// Keys that got a 200 without `ClaimLost`: recorded done.
    acknowledged: HashSet<String>,
    /// Statuses seen, and deliveries made.
    statuses: HashMap<u16, usize>,
    deliveries: usize,
    /// What broke a guarantee (the storm collects them rather than panic mid-storm).
    violations: Vec<String>,
}

/// Two replicas' layers on one faulty store, and a handler that records what it does.
pub struct Sut {
    kind: Kind,
    store: FaultStore<dyn DedupeStore>,
    replicas: [Svc; 2],
    seen: Arc<Mutex<Seen>>,
}

/// Builds one replica: `DedupeLayer` keyed on `x-key`, on `store`, over the handler.
pub fn replica(
    store: &FaultStore<dyn DedupeStore>,
    source: &str,
    lease: Duration,
    seen: &Arc<Mutex<Seen>>,
) -> Svc {
    let source = source.to_owned();
    let seen = seen.clone();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let seen = seen.clone();
        async move {
            let key = req.headers()["x-key"].to_str().unwrap().to_owned();
            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
            let work: u64 = req.headers()["x-work"].to_str().unwrap().parse().unwrap();
            {
                let mut s = seen.lock().unwrap();
                let n = s.running.entry(key.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.overlap.entry(key.clone()).or_default();
                *most = (*most).max(n);
            }
            tokio::time::sleep(Duration::from_millis(work)).await;
            let mut s = seen.lock().unwrap();
            *s.running.get_mut(&key).unwrap() -= 1;
            match behave.as_str() {
                "Succeed" => {
                    *s.effects.entry(key).or_default() += 1;
                    Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
                }
                "Fail" => Ok(Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(Full::new(Bytes::new()))
                    .unwrap()),
                _ => {
                    drop(s);
                    panic!("the handler panicked (the model asked it to)")
                }
            }
        }
    });
    let layer = DedupeLayer::from_arc(Arc::new(store.clone()))
        .with_lease(lease)
        .unwrap()
        .with_key(move |parts| {
            let key = parts.headers.get("x-key")?.to_str().ok()?;
            Some(Delivery::new(source.clone(), key))
        });
    let svc = ServiceBuilder::new().layer(layer).service(handler);
    BoxCloneSyncService::new(svc.map_response(|r| {
        let (parts, body) = r.into_parts();
        // The bodies are small and in memory; the model reads only status and extensions.
        drop(body);
        Response::from_parts(parts, Bytes::new())
    }))
}

/// One delivery of `key`; `None` when the client hung up first. A handler's panic goes on
/// to the caller (as the layer documents): here it is the 500 a server's panic catcher
/// answers.
pub async fn deliver(
    svc: Svc,
    key: &str,
    behave: Behave,
    work: u64,
    hang_up: Option<u64>,
) -> Option<(StatusCode, Option<ClaimLost>)> {
    let req = Request::post("/")
        .header("x-key", key)
        .header("x-behave", format!("{behave:?}"))
        .header("x-work", work.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let call = async move {
        match std::panic::AssertUnwindSafe(svc.oneshot(req))
            .catch_unwind()
            .await
        {
            Ok(response) => response,
            Err(_) => Ok(Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(Bytes::new())
                .unwrap()),
        }
    };
    let response = match hang_up {
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), call)
            .await
            .ok()?,
        None => call.await,
    }
    .expect("infallible");
    Some((
        response.status(),
        response.extensions().get::<ClaimLost>().copied(),
    ))
}

impl Sut {
    /// Records a response; checks what can be checked at once.
    fn record(&self, key: &str, answer: Option<(StatusCode, Option<ClaimLost>)>) {
        let mut s = self.seen.lock().unwrap();
        s.deliveries += 1;
        let Some((status, lost)) = answer else { return };
        *s.statuses.entry(status.as_u16()).or_default() += 1;
        match status.as_u16() {
            200 if lost.is_none() => {
                s.acknowledged.insert(key.to_owned());
            }
            200 => {
                // The table: "done" and renewals are retried while the lease lasts, else
                // `ClaimLost`. Not heard (`Unrecorded`): only when completions met faults
                // (a lost acknowledgement included: it landed, and the key stays done).
                // Taken over: only when the lease could run out — renewals or completions
                // failed or answered late.
                drop(s);
                let allowed = match lost {
                    Some(ClaimLost::Unrecorded) => {
                        self.exempt().contains(key)
                            || self
                                .store
                                .met()
                                .iter()
                                .any(|m| m.op == Op::Complete && m.id == key)
                    }
                    _ => self.exempt().contains(key),
                };
                assert!(
                    allowed,
                    "{key}: 200 with {lost:?}, but no store fault allows it"
                );
                self.seen.lock().unwrap().lost.insert(key.to_owned());
            }
            204 => assert!(
                s.effects.get(key).copied().unwrap_or(0) >= 1,
                "{key}: 204 (a duplicate), but its handler never succeeded"
            ),
            409 | 500 => {}
            503 => assert!(
                self.store
                    .met()
                    .iter()
                    .any(|m| m.op == Op::Claim && m.id == key),
                "{key}: 503 without a store fault on its claim"
            ),
            other => panic!("{key}: status {other}"),
        }
    }

    /// Keys whose renewals or completions the wrapper failed or answered late: the lease
    /// may have run out under them (a store outage), so they may run again.
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

    /// Once per key (no two runs at once, no second success) for every key not exempt.
    fn check_once(&self, when: &str) {
        let exempt = self.exempt();
        let s = self.seen.lock().unwrap();
        for (key, n) in &s.effects {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {key} succeeded {n} times");
            }
        }
        for (key, n) in &s.overlap {
            if !exempt.contains(key) {
                assert!(*n <= 1, "{when}: {n} runs of {key} at once");
            }
        }
    }

    async fn step(&self, step: &Step) {
        match *step {
            Step::Deliver {
                key,
                copies,
                replica,
                behave,
                work,
                hang_up,
            } => {
                let key = format!("k{key}");
                let calls = (0..copies)
                    .map(|_| deliver(self.replicas[replica].clone(), &key, behave, work, hang_up));
                for answer in futures_util::future::join_all(calls).await {
                    self.record(&key, answer);
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

    /// No fault left, every detached handler ended and its outcome landed; then the
    /// provider redelivers each key until it gets a 2xx. Every key ran successfully
    /// exactly once (at least once where exempt); a key acknowledged before gets 204 at
    /// once.
    async fn settle(&self) {
        self.store.heal_all();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.seen.lock().unwrap().running.values().any(|n| *n > 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "handlers still running after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // "Done" or the release lands right after the handler; a release that failed
        // leaves the key to its lease.
        tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
        let exempt = self.exempt();
        for k in 0..KEYS {
            let key = format!("k{k}");
            let acknowledged = self.seen.lock().unwrap().acknowledged.contains(&key);
            let mut first = true;
            loop {
                let answer =
                    deliver(self.replicas[k % 2].clone(), &key, Behave::Succeed, 0, None).await;
                let (status, lost) = answer.expect("no hang-up");
                if first && acknowledged && !exempt.contains(&key) {
                    assert_eq!(
                        status,
                        StatusCode::NO_CONTENT,
                        "{key}: acknowledged with a 200 before, so recorded done; its \
                         redelivery got {status}"
                    );
                }
                first = false;
                self.record(&key, Some((status, lost)));
                match status.as_u16() {
                    200 | 204 => break,
                    409 => tokio::time::sleep(Duration::from_millis(50)).await,
                    other => panic!("{key}: {other} with no fault left"),
                }
                assert!(
                    tokio::time::Instant::now() < deadline + Duration::from_secs(10),
                    "{key}: no 2xx"
                );
            }
            let n = self
                .seen
                .lock()
                .unwrap()
                .effects
                .get(&key)
                .copied()
                .unwrap_or(0);
            assert!(n >= 1, "{key}: never ran successfully, yet answered 2xx");
            if !exempt.contains(&key) {
                assert_eq!(n, 1, "{key}: succeeded {n} times");
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

pub struct LayerTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for LayerTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        let store = FaultStore::from_arc(shared_store(&STORES, K::KIND));
        let source = format!("layer-{}", uuid::Uuid::new_v4().simple());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let replicas = [
            replica(&store, &source, LEASE, &seen),
            replica(&store, &source, LEASE, &seen),
        ];
        Sut {
            kind: K::KIND,
            store,
            replicas,
            seen,
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
        let deliveries = sut.seen.lock().unwrap().deliveries;
        TOTALS[i].fetch_add(deliveries, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A storm on one store: `keys` events, each delivered `copies` times at once through two
/// replicas, a handler slower than the lease, a fifth of the clients hanging up; every
/// delivery retried by its provider until it gets a 2xx. Each event's handler succeeds
/// exactly once and never runs beside itself; statuses are 200, 204 or 409 only.
pub async fn storm(
    kind: Kind,
    seed: u64,
    keys: usize,
    copies: usize,
    work: (u64, u64),
    hang_ups: u8,
) -> usize {
    let store = FaultStore::from_arc(crate::common::stores::open(kind).await);
    let source = format!("storm-{}", uuid::Uuid::new_v4().simple());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let lease = STORM_LEASE;
    let replicas = [
        replica(&store, &source, lease, &seen),
        replica(&store, &source, lease, &seen),
    ];
    // Every random choice drawn here, from the seed: a seed replays the same storm.
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tasks = Vec::new();
    for k in 0..keys {
        for c in 0..copies {
            let svc = replicas[(k + c) % 2].clone();
            let seen = seen.clone();
            let work = rng.u64(work.0..=work.1);
            let hang_up = (rng.u8(..100) < hang_ups).then(|| rng.u64(0..work.max(1)));
            let start = rng.u64(0..100);
            tasks.push(spawn(async move {
                let key = format!("k{k}");
                tokio::time::sleep(Duration::from_millis(start)).await;
                let mut hang_up = hang_up;
                loop {
                    let answer =
                        deliver(svc.clone(), &key, Behave::Succeed, work, hang_up.take()).await;
                    let done = {
                        let mut s = seen.lock().unwrap();
                        s.deliveries += 1;
                        match answer {
                            // The provider saw no answer: it retries.
                            None => false,
                            Some((status, lost)) => {
                                *s.statuses.entry(status.as_u16()).or_default() += 1;
                                if let Some(lost) = lost {
                                    s.violations.push(format!(
                                        "{key}: {status} with {lost:?}, no fault injected"
                                    ));
                                }
                                match status.as_u16() {
                                    200 | 204 => true,
                                    409 => false,
                                    other => {
                                        s.violations
                                            .push(format!("{key}: {other} with no fault injected"));
                                        true
                                    }
                                }
                            }
                        }
                    };
                    if done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("the storm ends within 120 s")
            .expect("no delivery panicked");
    }
    let mut s = seen.lock().unwrap();
    for k in 0..keys {
        let key = format!("k{k}");
        let (runs, at_once) = (s.effects.get(&key).copied(), s.overlap.get(&key).copied());
        if (runs, at_once) != (Some(1), Some(1)) {
            s.violations.push(format!(
                "{key}: {runs:?} successful runs, {at_once:?} at once"
            ));
        }
    }
    assert!(
        s.violations.is_empty(),
        "storm on {kind:?} (seed {seed}): {} violations; statuses {:?}:\n{}",
        s.violations.len(),
        s.statuses,
        s.violations.join("\n")
    );
    s.deliveries
}

macro_rules! on {
    ($marker:ident, $kind:expr, $test:ident, $storm:ident, $file:literal) => {
        pub struct $marker;
        impl On for $marker {
            const KIND: Kind = $kind;
        }

        #[test]
        fn $test() {
            let i = Kind::ALL.iter().position(|k| *k == $kind).unwrap();
            check::<LayerTest::<$marker>>(
                concat!("layer::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (16, 1..20),
                &format!("dedupe layer | {:?}", $kind),
                || format!("deliveries={}", TOTALS[i].load(std::sync::atomic::Ordering::Relaxed)),
            );
        }

        #[test]
        fn $storm() {
            let started = std::time::Instant::now();
            let rounds = crate::run::cases(1);
            let mut deliveries = 0;
            for round in 0..rounds {
                let seed = crate::run::seed(concat!("layer::", stringify!($storm)), round);
                deliveries += block_on(storm($kind, seed, 40, 4, (300, 2500), 20));
            }
            eprintln!(
                "MODEL | storm | {:?} | rounds={rounds} | events={} | deliveries={deliveries} | {:.1?}",
                $kind,
                40 * rounds,
                started.elapsed()
            );
        }
    };
}

on!(
    OnMemory,
    Kind::Memory,
    memory,
    memory_storm,
    "model-layer-memory.txt"
);
on!(
    OnSqlite,
    Kind::Sqlite,
    sqlite,
    sqlite_storm,
    "model-layer-sqlite.txt"
);
on!(
    OnPostgres,
    Kind::Postgres,
    postgres,
    postgres_storm,
    "model-layer-postgres.txt"
);
on!(
    OnRedis,
    Kind::Redis,
    redis,
    redis_storm,
    "model-layer-redis.txt"
);

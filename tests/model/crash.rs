//! Model C′: `DedupeLayer` across process crashes, on every store.
//!
//! A "process" is a Tokio runtime of its own holding a `DedupeLayer` on the shared store
//! (its pools live on the binary's runtime, as a database outlives the process). A case
//! is a source of its own and a random sequence of: deliveries of one of three keys
//! (one to three copies at once, the handler succeeding or failing after 0–150 ms or
//! 400–900 ms — the lease is 300 ms), either awaited or left in flight; crashes — the
//! process's runtime shut down in the background, every request future and every
//! handler task it spawned dropped wherever they are, nothing released on purpose — and
//! a new process started on the same store; time passing. At the end the provider
//! redelivers each key through the last process until it gets a 2xx.
//!
//! Checked: once the lease of a crashed attempt ends, the redelivery runs the handler,
//! and only once: every key ends with exactly one successful run, no two runs of a key
//! at once, a 204 only for a key whose handler succeeded, and no 503 (no store fault is
//! injected here: a crash must not leave the store refusing). Exempt, checked only "at
//! least once": a key a crash hit after its handler succeeded and before "done" landed
//! (the crash-between-effect-and-record window the Guarantees table leaves to
//! `IdempotencyKey`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::store::{
    Claim, DedupeStore, Delivery, MemoryStore, PgStore, RedisStore, SqliteStore, Token,
};
use tower_webhook::DedupeLayer;

use crate::common::stores::Kind;
use crate::run::{block_on, check};

const KEYS: usize = 3;
const LEASE: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
pub enum Step {
    /// `copies` deliveries of `key` at once; the handler succeeds (or fails) after
    /// `work` ms; awaited, or left in flight.
    Deliver {
        key: usize,
        copies: usize,
        succeed: bool,
        work: u64,
        wait: bool,
    },
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
        let deliver = (
            0..KEYS,
            1..=3usize,
            prop::bool::weighted(0.8),
            prop_oneof![0..150u64, 400..900u64],
            prop::bool::weighted(0.4),
        )
            .prop_map(|(key, copies, succeed, work, wait)| Step::Deliver {
                key,
                copies,
                succeed,
                work,
                wait,
            });
        prop_oneof![
            5 => deliver,
            2 => Just(Step::Crash),
            1 => prop_oneof![Just(50u64), Just(200), Just(400)].prop_map(|ms| Step::Sleep { ms }),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

#[derive(Default, Debug)]
pub struct Seen {
    effects: HashMap<String, u32>,
    running: HashMap<String, u32>,
    overlap: HashMap<String, u32>,
    statuses: HashMap<u16, usize>,
    deliveries: usize,
    crashes: usize,
}

struct Running(Arc<Mutex<Seen>>, String);

impl Drop for Running {
    fn drop(&mut self) {
        *self.0.lock().unwrap().running.get_mut(&self.1).unwrap() -= 1;
    }
}

/// What outlives a process: the database (a file, a server's database or key prefix);
/// each process opens its own pool on it, on its own runtime. (A pool shared across the
/// processes' runtimes keeps connections bound to a runtime that ended: 503s that are
/// the harness's, not the crate's.) The memory store cannot outlive its process: shared,
/// it models the crash of the request tasks alone.
#[derive(Clone)]
enum Backing {
    Memory(Arc<MemoryStore>),
    Sqlite(std::path::PathBuf),
    Postgres(String),
    Redis(String),
}

impl Backing {
    async fn create(kind: Kind) -> Self {
        match kind {
            Kind::Memory => Backing::Memory(Arc::new(MemoryStore::new())),
            Kind::Sqlite => Backing::Sqlite(crate::common::stores::temp_sqlite_path()),
            Kind::Postgres => Backing::Postgres(crate::common::fresh_pg_url().await),
            Kind::Redis => Backing::Redis(format!(
                "tower-webhook-test:{}:",
                uuid::Uuid::new_v4().simple()
            )),
        }
    }

    async fn open(self) -> Arc<dyn DedupeStore> {
        match self {
            Backing::Memory(m) => m,
            Backing::Sqlite(path) => Arc::new(
                SqliteStore::open(path)
                    .await
                    .unwrap()
                    .with_busy_timeout(Duration::from_millis(50)),
            ),
            Backing::Postgres(url) => Arc::new(PgStore::connect(&url).await.unwrap()),
            Backing::Redis(prefix) => Arc::new(
                RedisStore::connect(&crate::common::redis_url())
                    .await
                    .unwrap()
                    .with_prefix(&prefix),
            ),
        }
    }
}

/// Per kind: the backing, and a handle on it for the model's own looks (the binary's
/// runtime).
static BACKINGS: [OnceLock<(Backing, Arc<dyn DedupeStore>)>; 4] = [const { OnceLock::new() }; 4];

type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, std::convert::Infallible>;

/// One process: its runtime and its layer.
struct Process {
    runtime: tokio::runtime::Runtime,
    svc: Svc,
}

/// A process: a runtime, a store handle opened on it, a layer. Called from async code.
async fn process(backing: &Backing, source: &str, seen: &Arc<Mutex<Seen>>) -> Process {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let store = runtime
        .spawn(backing.clone().open())
        .await
        .expect("the store opens");
    let seen = seen.clone();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let seen = seen.clone();
        async move {
            let key = req.headers()["x-key"].to_str().unwrap().to_owned();
            let succeed = req.headers().contains_key("x-succeed");
            let work: u64 = req.headers()["x-work"].to_str().unwrap().parse().unwrap();
            let guard = {
                let mut s = seen.lock().unwrap();
                let n = s.running.entry(key.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.overlap.entry(key.clone()).or_default();
                *most = (*most).max(n);
                Running(seen.clone(), key.clone())
            };
            tokio::time::sleep(Duration::from_millis(work)).await;
            drop(guard);
            if succeed {
                *seen.lock().unwrap().effects.entry(key).or_default() += 1;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
            } else {
                Ok(Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(Full::new(Bytes::new()))
                    .unwrap())
            }
        }
    });
    let source = source.to_owned();
    let layer = DedupeLayer::from_arc(store)
        .with_lease(LEASE)
        .unwrap()
        .with_key(move |parts| {
            let key = parts.headers.get("x-key")?.to_str().ok()?;
            Some(Delivery::new(source.clone(), key))
        });
    let svc = ServiceBuilder::new().layer(layer).service(handler);
    let svc = BoxCloneSyncService::new(svc.map_response(|r| {
        let (parts, _) = r.into_parts();
        Response::from_parts(parts, Bytes::new())
    }));
    Process { runtime, svc }
}

pub struct Sut {
    kind: Kind,
    backing: Backing,
    /// The model's own handle (for looks), on the binary's runtime.
    store: Arc<dyn DedupeStore>,
    source: String,
    process: Option<Process>,
    seen: Arc<Mutex<Seen>>,
    /// Keys a crash hit between their success and "done".
    crashed_between: HashSet<String>,
}

impl Sut {
    /// Sends one delivery of `key` on the process's runtime; its status, or `None` when
    /// the process died first.
    fn send(&self, key: &str, succeed: bool, work: u64) -> tokio::task::JoinHandle<StatusCode> {
        let mut req = Request::post("/")
            .header("x-key", key)
            .header("x-work", work.to_string());
        if succeed {
            req = req.header("x-succeed", "1");
        }
        let req = req.body(Full::new(Bytes::new())).unwrap();
        let process = self.process.as_ref().expect("a process");
        let svc = process.svc.clone();
        process
            .runtime
            .spawn(async move { svc.oneshot(req).await.expect("infallible").status() })
    }

    fn record(&self, key: &str, status: StatusCode) {
        let mut s = self.seen.lock().unwrap();
        *s.statuses.entry(status.as_u16()).or_default() += 1;
        match status.as_u16() {
            200 | 409 | 500 => {}
            204 => assert!(
                s.effects.get(key).copied().unwrap_or(0) >= 1,
                "{key}: 204, but its handler never succeeded"
            ),
            other => panic!("{key}: {other} (no store fault injected; crashes only)"),
        }
    }

    /// Whether `key` is done in the store (a claim granted to look is released).
    async fn done(&self, key: &str) -> bool {
        let delivery = Delivery::new(self.source.clone(), key);
        match self
            .store
            .claim(delivery.clone(), Token::new(), LEASE)
            .await
        {
            Ok(Claim::Done) => true,
            Ok(Claim::New(token)) => {
                let _ = self.store.release(delivery, token).await;
                false
            }
            _ => false,
        }
    }

    fn check_once(&self, when: &str) {
        let s = self.seen.lock().unwrap();
        for (key, n) in &s.effects {
            if !self.crashed_between.contains(key) {
                assert!(*n <= 1, "{when}: {key} succeeded {n} times");
            }
        }
        for (key, n) in &s.overlap {
            assert!(*n <= 1, "{when}: {n} runs of {key} at once");
        }
    }

    async fn step(&mut self, step: &Step) {
        match *step {
            Step::Deliver {
                key,
                copies,
                succeed,
                work,
                wait,
            } => {
                let key = format!("k{key}");
                self.seen.lock().unwrap().deliveries += copies;
                let calls: Vec<_> = (0..copies)
                    .map(|_| self.send(&key, succeed, work))
                    .collect();
                if wait {
                    for status in futures_util::future::join_all(calls).await {
                        self.record(&key, status.expect("the process lives"));
                    }
                }
            }
            Step::Crash => {
                self.process
                    .take()
                    .expect("a process")
                    .runtime
                    .shutdown_background();
                // The dropped tasks end on the runtime's threads; a statement already sent
                // may still land.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let succeeded: Vec<String> =
                    self.seen.lock().unwrap().effects.keys().cloned().collect();
                for key in succeeded {
                    if !self.done(&key).await {
                        self.crashed_between.insert(key);
                    }
                }
                self.seen.lock().unwrap().crashes += 1;
                self.process = Some(process(&self.backing, &self.source, &self.seen).await);
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// Every handler ended (or died); after the lease, each key redelivered until a 2xx:
    /// it ran successfully exactly once (at least once where a crash hit it between).
    async fn settle(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.seen.lock().unwrap().running.values().any(|n| *n > 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "handlers still running after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
        for k in 0..KEYS {
            let key = format!("k{k}");
            loop {
                let status = self.send(&key, true, 0).await.expect("the process lives");
                self.record(&key, status);
                match status.as_u16() {
                    200 | 204 => break,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
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
            assert!(n >= 1, "{key}: answered 2xx, never ran successfully");
            if !self.crashed_between.contains(&key) {
                assert_eq!(n, 1, "{key}: succeeded {n} times");
            }
        }
        self.check_once("settled");
    }
}

pub static TOTALS: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];
static CRASHES: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

pub trait On: 'static {
    const KIND: Kind;
}

pub struct CrashTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for CrashTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        let i = Kind::ALL.iter().position(|k| *k == K::KIND).unwrap();
        let (backing, store) = BACKINGS[i]
            .get_or_init(|| {
                block_on(async {
                    let backing = Backing::create(K::KIND).await;
                    (backing.clone(), backing.open().await)
                })
            })
            .clone();
        let source = format!("crash-{}", uuid::Uuid::new_v4().simple());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let process = Some(block_on(process(&backing, &source, &seen)));
        Sut {
            kind: K::KIND,
            backing,
            store,
            source,
            process,
            seen,
            crashed_between: HashSet::new(),
        }
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
        block_on(sut.settle());
        if let Some(p) = sut.process.take() {
            p.runtime.shutdown_background();
        }
        let i = Kind::ALL.iter().position(|k| *k == sut.kind).unwrap();
        let s = sut.seen.lock().unwrap();
        TOTALS[i].fetch_add(s.deliveries, std::sync::atomic::Ordering::Relaxed);
        CRASHES[i].fetch_add(s.crashes, std::sync::atomic::Ordering::Relaxed);
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
            check::<CrashTest<$marker>>(
                concat!("crash::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (6, 1..12),
                &format!("dedupe layer crashes | {:?}", $kind),
                || {
                    format!(
                        "deliveries={} | crashes={}",
                        TOTALS[i].load(std::sync::atomic::Ordering::Relaxed),
                        CRASHES[i].load(std::sync::atomic::Ordering::Relaxed)
                    )
                },
            );
        }
    };
}

on!(OnMemory, Kind::Memory, memory, "model-crash-memory.txt");
on!(OnSqlite, Kind::Sqlite, sqlite, "model-crash-sqlite.txt");
on!(
    OnPostgres,
    Kind::Postgres,
    postgres,
    "model-crash-postgres.txt"
);
on!(OnRedis, Kind::Redis, redis, "model-crash-redis.txt");

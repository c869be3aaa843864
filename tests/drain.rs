//! Drain on shutdown, on every store: a handler (a `Once` action) whose caller hung up
//! runs on a task nobody else awaits; `Drain::wait` after the server stops lets it finish
//! and records it, and past its bound stops it and releases its claim.
//!
//! Each test runs two "processes" on one store: each a Tokio runtime of its own, shut
//! down at its end as a process exit would (the tasks still running on it stop there),
//! each opening the store anew (SQLite and PostgreSQL by their file and URL, Redis by its
//! prefix; memory is handed over, as a store that outlives the process).

mod common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{at, fresh_pg_url, redis_url, request, verifier, NOW};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::TxDedupeLayer;
use tower_webhook::once::{Once, OnceErrorKind, Ran};
use tower_webhook::store::{DedupeStore, MemoryStore, PgStore, RedisStore, SqliteStore};
use tower_webhook::{DedupeLayer, Drain, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Short enough that, without a drain, the key left by the exit frees itself within the
/// test (and the redelivery would run again); long beside the handler.
const LEASE: Duration = Duration::from_secs(2);
/// A lease no test outlives: only a release frees the key.
const LONG_LEASE: Duration = Duration::from_secs(60);

/// Where the processes of a test keep their claims.
#[derive(Clone)]
enum Backend {
    Memory(MemoryStore),
    Sqlite(PathBuf),
    Postgres(String),
    Redis(String),
}

impl Backend {
    async fn memory() -> Self {
        Backend::Memory(MemoryStore::new())
    }

    async fn sqlite() -> Self {
        let name = format!("tower-webhook-drain-{}.db", uuid::Uuid::new_v4().simple());
        Backend::Sqlite(std::env::temp_dir().join(name))
    }

    async fn postgres() -> Self {
        Backend::Postgres(fresh_pg_url().await)
    }

    async fn redis() -> Self {
        let _ = redis_url(); // probed: a clear panic when it is down
        Backend::Redis(format!(
            "tower-webhook-test:{}:",
            uuid::Uuid::new_v4().simple()
        ))
    }

    /// The store, as a freshly started process opens it.
    async fn open(&self) -> Arc<dyn DedupeStore> {
        match self {
            Backend::Memory(store) => Arc::new(store.clone()),
            // No other process shares the file: a short busy timeout lowers the store's
            // lease floor (four of them) below these tests' 2 s lease.
            Backend::Sqlite(path) => Arc::new(
                SqliteStore::open(path)
                    .await
                    .unwrap()
                    .with_busy_timeout(Duration::from_millis(100)),
            ),
            Backend::Postgres(url) => Arc::new(PgStore::connect(url).await.unwrap()),
            Backend::Redis(prefix) => Arc::new(
                RedisStore::connect(&redis_url())
                    .await
                    .unwrap()
                    .with_prefix(prefix),
            ),
        }
    }
}

/// Runs `main` as one process: on a runtime of its own, shut down when `main` returns.
fn process<T>(main: impl Future<Output = T>) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let output = runtime.block_on(main);
    runtime.shutdown_timeout(Duration::from_secs(1));
    output
}

/// How often the handler (action) started and how often it ran to its end.
#[derive(Clone, Default)]
struct Runs {
    started: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
}

impl Runs {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    fn ended(&self) -> usize {
        self.ended.load(Ordering::SeqCst)
    }

    /// Counts a run that takes `ms`.
    async fn run(&self, ms: u64) {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.ended.fetch_add(1, Ordering::SeqCst);
    }
}

type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, std::io::Error>;
type Body =
    tower_webhook::response::ResponseBody<tower_webhook::response::ResponseBody<Full<Bytes>>>;

/// A handler that runs for `x-run-ms`.
fn handler(
    runs: &Runs,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + Sync
       + 'static {
    let runs = runs.clone();
    service_fn(move |req: Request<Full<Bytes>>| {
        let runs = runs.clone();
        async move {
            let ms = req.headers()["x-run-ms"].to_str().unwrap().parse().unwrap();
            runs.run(ms).await;
            Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::from_static(b"handled"))))
        }
    })
}

/// `svc` with its bodies collected.
fn boxed<S>(svc: S) -> Svc
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<Body>, Error = std::io::Error>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(ServiceExt::<Request<Full<Bytes>>>::then(
        svc,
        |result: Result<Response<Body>, std::io::Error>| async move {
            let (parts, body) = result?.into_parts();
            let bytes = body.collect().await.expect("a whole body").to_bytes();
            Ok(Response::from_parts(parts, bytes))
        },
    ))
}

fn verify() -> VerifyWebhookLayer {
    VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]))
}

/// Verify + dedupe on `store` + a handler that runs for `x-run-ms`; and the layer's drain.
fn stack(store: Arc<dyn DedupeStore>, lease: Duration, runs: &Runs) -> (Svc, Drain) {
    let dedupe = DedupeLayer::from_arc(store).with_lease(lease).unwrap();
    let drain = dedupe.drain();
    let svc = ServiceBuilder::new()
        .layer(verify())
        .layer(dedupe)
        .service(handler(runs));
    (boxed(svc), drain)
}

/// Verify + `TxDedupeLayer` on the database at `url` + the same handler; its drain.
async fn tx_stack(url: &str, runs: &Runs) -> (Svc, Drain) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let dedupe = TxDedupeLayer::new(pool).await.unwrap();
    let drain = dedupe.drain();
    let svc = ServiceBuilder::new()
        .layer(verify())
        .layer(dedupe)
        .service(handler(runs));
    (boxed(svc), drain)
}

async fn send(svc: &Svc, id: &str, run_ms: u64) -> Response<Bytes> {
    let body = format!(r#"{{"type":"order.paid","data":{{"id":"{id}"}}}}"#);
    let mut headers: HeaderMap = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    headers.insert("x-run-ms", HeaderValue::from(run_ms));
    svc.clone().oneshot(request(headers, body)).await.unwrap()
}

/// Polls `caller` until the handler (action) has started a run more, then drops it: the
/// client hung up, or the caller was dropped, mid-run.
async fn drop_once_started<F: Future>(caller: F, runs: &Runs) {
    let before = runs.started();
    let started = async {
        while runs.started() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let dropped = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            biased;
            () = started => {}
            _ = caller => panic!("finished before it was dropped"),
        }
    });
    dropped.await.expect("the run started within 5 s");
}

/// A delivery whose client hangs up once the handler (of `run_ms`) has started.
async fn hang_up(svc: &Svc, id: &str, run_ms: u64, runs: &Runs) {
    drop_once_started(send(svc, id, run_ms), runs).await;
}

/// Redelivers until the key is no longer held (409), for at most a lease and 3 s.
async fn redeliver(svc: &Svc, id: &str) -> Response<Bytes> {
    let until = tokio::time::Instant::now() + LEASE + Duration::from_secs(3);
    loop {
        let response = send(svc, id, 0).await;
        if response.status() != StatusCode::CONFLICT || tokio::time::Instant::now() > until {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn dedupe_a_handler_whose_client_hung_up_is_awaited_and_its_key_is_done(backend: Backend) {
    let runs = Runs::default();
    process(async {
        let (svc, drain) = stack(backend.open().await, LEASE, &runs);
        hang_up(&svc, "evt_drain", 600, &runs).await;
        // `serve` has returned: the handler is still running, on a task nobody awaits.
        let drained = drain.wait(Duration::from_secs(10)).await;
        assert_eq!((drained.finished(), drained.released()), (1, 0));
        assert_eq!(drained.unreleased(), 0);
    });
    process(async {
        let (svc, _) = stack(backend.open().await, LEASE, &runs);
        // Without the drain the exit stopped the handler midway, and after the lease
        // this redelivery ran it again.
        let again = redeliver(&svc, "evt_drain").await;
        assert_eq!(again.status(), StatusCode::NO_CONTENT, "recorded as done");
    });
    assert_eq!(runs.started(), 1, "the handler ran once");
    assert_eq!(runs.ended(), 1, "to its end, before the exit");
}

fn dedupe_past_the_bound_the_handler_is_stopped_and_released_so_the_retry_runs_at_once(
    backend: Backend,
) {
    let runs = Runs::default();
    process(async {
        let (svc, drain) = stack(backend.open().await, LONG_LEASE, &runs);
        hang_up(&svc, "evt_bound", 30_000, &runs).await;
        let started = tokio::time::Instant::now();
        let drained = drain.wait(Duration::from_millis(300)).await;
        assert!(started.elapsed() < Duration::from_secs(2), "bounded");
        assert_eq!((drained.finished(), drained.released()), (0, 1));
        // The drain is over: a later delivery runs nothing.
        let late = send(&svc, "evt_late", 0).await;
        assert_eq!(late.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(late.headers().contains_key("retry-after"));
    });
    assert_eq!((runs.started(), runs.ended()), (1, 0), "stopped midway");
    process(async {
        let (svc, _) = stack(backend.open().await, LONG_LEASE, &runs);
        // Released: the retry runs at once, not after the 60 s lease.
        let again = send(&svc, "evt_bound", 0).await;
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.body(), "handled");
    });
    assert_eq!(runs.started(), 2);
}

/// `once.run` of `key` with an action of `ms`, its caller dropped once it has started.
async fn once_hang_up(once: &Once, key: &str, runs: &Runs, ms: u64) {
    let action = runs.clone();
    let run = once.run(key, move |_| async move {
        action.run(ms).await;
        Ok::<_, std::io::Error>(())
    });
    drop_once_started(run, runs).await;
}

async fn once_run(once: &Once, key: &str, runs: &Runs) -> Ran<()> {
    let runs = runs.clone();
    let run = once.run(key, move |_| async move {
        runs.run(0).await;
        Ok::<_, std::io::Error>(())
    });
    run.await.unwrap()
}

fn once_an_action_whose_caller_was_dropped_is_awaited_and_its_key_is_done(backend: Backend) {
    let runs = Runs::default();
    process(async {
        let once = Once::from_arc(backend.open().await, "fulfil")
            .with_lease(LEASE)
            .unwrap();
        once_hang_up(&once, "order-7", &runs, 600).await;
        let drained = once.drain().wait(Duration::from_secs(10)).await;
        assert_eq!((drained.finished(), drained.released()), (1, 0));
    });
    process(async {
        let once = Once::from_arc(backend.open().await, "fulfil")
            .with_lease(LEASE)
            .unwrap();
        let until = tokio::time::Instant::now() + LEASE + Duration::from_secs(3);
        let ran = loop {
            match once_run(&once, "order-7", &runs).await {
                Ran::InProgress { .. } if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                ran => break ran,
            }
        };
        assert_eq!(ran, Ran::Already);
    });
    assert_eq!(runs.started(), 1, "the action ran once");
    assert_eq!(runs.ended(), 1, "to its end, before the exit");
}

fn once_past_the_bound_the_action_is_stopped_and_released_so_the_next_run_runs_at_once(
    backend: Backend,
) {
    let runs = Runs::default();
    process(async {
        let once = Once::from_arc(backend.open().await, "fulfil")
            .with_lease(LONG_LEASE)
            .unwrap();
        once_hang_up(&once, "order-8", &runs, 30_000).await;
        let drained = once.drain().wait(Duration::from_millis(300)).await;
        assert_eq!((drained.finished(), drained.released()), (0, 1));
        let late = once.run("order-9", |_| async { Ok::<_, std::io::Error>(()) });
        assert_eq!(late.await.unwrap_err().kind(), OnceErrorKind::Stopped);
    });
    assert_eq!((runs.started(), runs.ended()), (1, 0), "stopped midway");
    process(async {
        let once = Once::from_arc(backend.open().await, "fulfil")
            .with_lease(LONG_LEASE)
            .unwrap();
        assert_eq!(once_run(&once, "order-8", &runs).await, Ran::Now(()));
    });
    assert_eq!(runs.started(), 2);
}

macro_rules! suite {
    ($store:ident) => {
        mod $store {
            use super::*;

            fn backend() -> Backend {
                process(Backend::$store())
            }

            #[test]
            fn dedupe_a_handler_whose_client_hung_up_is_awaited_and_its_key_is_done() {
                super::dedupe_a_handler_whose_client_hung_up_is_awaited_and_its_key_is_done(
                    backend(),
                );
            }
            #[test]
            fn dedupe_past_the_bound_the_handler_is_stopped_and_released_so_the_retry_runs_at_once(
            ) {
                super::dedupe_past_the_bound_the_handler_is_stopped_and_released_so_the_retry_runs_at_once(backend());
            }
            #[test]
            fn once_an_action_whose_caller_was_dropped_is_awaited_and_its_key_is_done() {
                super::once_an_action_whose_caller_was_dropped_is_awaited_and_its_key_is_done(
                    backend(),
                );
            }
            #[test]
            fn once_past_the_bound_the_action_is_stopped_and_released_so_the_next_run_runs_at_once(
            ) {
                super::once_past_the_bound_the_action_is_stopped_and_released_so_the_next_run_runs_at_once(backend());
            }
        }
    };
}

suite!(memory);
suite!(sqlite);
suite!(postgres);
suite!(redis);

/// `TxDedupeLayer`: a handler whose client hung up is awaited and committed; past the
/// bound it is stopped, its transaction (the event's row with it) rolled back, and the
/// redelivery runs it.
#[test]
fn tx_dedupe_a_hung_up_handler_is_awaited_and_committed_and_past_the_bound_rolled_back() {
    let url = process(fresh_pg_url());
    let runs = Runs::default();
    process(async {
        let (svc, drain) = tx_stack(&url, &runs).await;
        hang_up(&svc, "evt_tx_done", 600, &runs).await;
        let drained = drain.wait(Duration::from_secs(10)).await;
        assert_eq!((drained.finished(), drained.released()), (1, 0));
    });
    process(async {
        let (svc, drain) = tx_stack(&url, &runs).await;
        let again = send(&svc, "evt_tx_done", 0).await;
        assert_eq!(again.status(), StatusCode::NO_CONTENT, "committed");
        hang_up(&svc, "evt_tx_cut", 30_000, &runs).await;
        let drained = drain.wait(Duration::from_millis(300)).await;
        assert_eq!((drained.finished(), drained.released()), (0, 1));
    });
    assert_eq!((runs.started(), runs.ended()), (2, 1));
    process(async {
        let (svc, _) = tx_stack(&url, &runs).await;
        let again = send(&svc, "evt_tx_cut", 0).await;
        assert_eq!(again.status(), StatusCode::OK, "rolled back: runs again");
    });
    assert_eq!(runs.started(), 3);
}

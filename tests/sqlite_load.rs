//! SQLite under load keeps its leases: while a storm of accepts and claims runs, a
//! `DedupeLayer` claim with a short lease is renewed in time (its slow handler runs once),
//! and the inbox's worker with a 1 s lease processes each event exactly once and drains.
//! Bounded: a few thousand events, each test under a minute.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::ClaimLost;
use tower_webhook::inbox::{Attempt, Inbox, Worker};
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, Renewed, Retention, SqliteStore, StoreFuture, Token,
};
use tower_webhook::{DedupeLayer, Event};

fn temp_path() -> PathBuf {
    std::env::temp_dir().join(format!(
        "tower-webhook-load-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}

/// A store as `SqliteStore::open` makes it, with a busy timeout of `busy` (the shortest
/// lease the layers take is four of it).
async fn store(path: &std::path::Path, busy: Duration) -> SqliteStore {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(busy);
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    SqliteStore::from_pool(pool).await.unwrap()
}

fn remove(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Accepts `storm-{first}`… into `inbox` from `tasks` concurrent senders until `stop` is
/// set or `count` are stored; returns how many were stored (a 503 is retried, as a
/// provider would).
async fn accept_storm(inbox: Inbox, tasks: usize, count: usize, stop: Arc<AtomicBool>) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..tasks)
        .map(|_| {
            let (inbox, next, stop) = (inbox.clone(), next.clone(), stop.clone());
            let storm = tower_webhook::Verifier::new(
                tower_webhook::Scheme::standard(),
                ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            )
            .expect("a valid secret")
            .with_source("storm");
            tokio::spawn(async move {
                let mut stored = 0;
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let id = format!("storm-{i}");
                    while inbox.ingest(&storm, Some(&id), "{}").await.is_err() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    stored += 1;
                }
                stored
            })
        })
        .collect();
    let mut stored = 0;
    for sender in senders {
        stored += sender.await.unwrap();
    }
    stored
}

/// A store that times its renewals: the slowest, and how many failed.
#[derive(Clone)]
struct TimedRenewals {
    inner: SqliteStore,
    slowest: Arc<Mutex<Duration>>,
    failed: Arc<AtomicUsize>,
}

impl DedupeStore for TimedRenewals {
    fn claim(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        self.inner.claim(d, token, lease)
    }
    fn renew(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let (renewal, this) = (self.inner.renew(d, token, lease), self.clone());
        Box::pin(async move {
            let sent = Instant::now();
            let renewed = renewal.await;
            let took = sent.elapsed();
            let mut slowest = this.slowest.lock().unwrap();
            *slowest = (*slowest).max(took);
            if let Err(e) = &renewed {
                eprintln!(
                    "renewal failed after {took:?}: {e}: {:?}",
                    std::error::Error::source(e)
                );
                this.failed.fetch_add(1, Ordering::SeqCst);
            }
            renewed
        })
    }
    fn complete(&self, d: Delivery, token: Token) -> StoreFuture<Completed> {
        self.inner.complete(d, token)
    }
    fn release(&self, d: Delivery, token: Token) -> StoreFuture<()> {
        self.inner.release(d, token)
    }
    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        self.inner.prune(older_than)
    }
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        self.inner.prune_once(namespace, older_than)
    }
}

/// A 1.2 s lease (the floor of a 300 ms busy timeout) on a slow (8 s) handler, renewed
/// while a storm of accepts and claims holds the writer busy: every renewal lands within a
/// third of the lease (before, they waited on SQLite's lock behind the writer, and some
/// failed after the busy timeout), a duplicate sent
/// every 300 ms meanwhile gets 409 each time, the handler runs once, and its response
/// carries no `ClaimLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_is_renewed_in_time_through_a_storm() {
    let path = temp_path();
    let store = store(&path, Duration::from_millis(300)).await;
    let inbox = Inbox::sqlite(&store);
    let timed = TimedRenewals {
        inner: store.clone(),
        slowest: Arc::default(),
        failed: Arc::default(),
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let runs = runs.clone();
            async move {
                if req.uri().path() == "/slow" {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(8)).await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(
            DedupeLayer::new(timed.clone())
                .with_lease(Duration::from_millis(1200))
                .unwrap()
                .with_key(|parts| {
                    let id = parts.uri.path().trim_start_matches('/').to_owned();
                    Some(Delivery::new("load", id))
                }),
        )
        .service(handler);
    let call = |path: &str| {
        let svc = svc.clone();
        let req = Request::builder()
            .uri(path)
            .body(Full::new(Bytes::new()))
            .unwrap();
        async move { svc.oneshot(req).await.unwrap() }
    };

    let stop = Arc::new(AtomicBool::new(false));
    let storm = tokio::spawn(accept_storm(inbox.clone(), 64, 1_000_000, stop.clone()));
    // Claims too: new keys through the same layer, each answered at once.
    let claims = {
        let (svc, stop) = (svc.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = (0..16)
                    .map(|_| {
                        i += 1;
                        let req = Request::builder()
                            .uri(format!("/fast-{i}"))
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        svc.clone().oneshot(req)
                    })
                    .collect();
                futures_util::future::join_all(batch).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the storm is on
    let slow = tokio::spawn(call("/slow"));
    let started = Instant::now();
    let mut conflicts = 0;
    while started.elapsed() < Duration::from_millis(7_500) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let duplicate = call("/slow").await;
        assert_eq!(
            duplicate.status(),
            StatusCode::CONFLICT,
            "the lease was lost {:?} into the run",
            started.elapsed()
        );
        conflicts += 1;
    }
    let response = slow.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let stored = storm.await.unwrap();
    claims.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.extensions().get::<ClaimLost>().is_none());
    let slowest = *timed.slowest.lock().unwrap();
    eprintln!(
        "{stored} accepts and {conflicts} duplicates during the 8 s run; slowest renewal \
         {slowest:?}, {} failed",
        timed.failed.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the slow handler ran once");
    assert_eq!(timed.failed.load(Ordering::SeqCst), 0, "no renewal failed");
    assert!(
        slowest < Duration::from_secs(1),
        "renewed within a third of the lease"
    );
    assert!(stored > 1_000, "a storm: {stored} accepts");
    drop((svc, inbox, store));
    remove(&path);
}

/// The worker with a 1 s lease and a 50 ms processor, during a storm of accepts: each
/// event processed exactly once, the queue drained; the rates are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_keeps_a_1s_lease_and_drains_during_an_accept_storm() {
    const EVENTS: usize = 4_000;
    let path = temp_path();
    let store = store(&path, Duration::from_millis(200)).await;
    let inbox = Inbox::sqlite(&store);
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let processor = {
        let seen = seen.clone();
        move |event: Event, _: Attempt| {
            let seen = seen.clone();
            async move {
                *seen
                    .lock()
                    .unwrap()
                    .entry(event.id().unwrap().to_owned())
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Infallible>(())
            }
        }
    };
    let worker = Worker::new(&inbox, processor)
        .with_concurrency(32)
        .unwrap()
        .with_lease(Duration::from_secs(1))
        .unwrap()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap()
        .spawn();
    let started = Instant::now();
    let stored = accept_storm(inbox.clone(), 64, EVENTS, Arc::default()).await;
    let accepted_in = started.elapsed();
    let processed_then = seen.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(45);
    while seen.lock().unwrap().len() < EVENTS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained_in = started.elapsed();
    worker.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    eprintln!(
        "accepted {stored} in {accepted_in:?} ({:.0}/s); processed {processed_then} meanwhile, \
         all {} in {drained_in:?} ({:.0}/s)",
        stored as f64 / accepted_in.as_secs_f64(),
        seen.len(),
        seen.len() as f64 / drained_in.as_secs_f64(),
    );
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "processed more than once: {twice:?}");
    assert_eq!(seen.len(), EVENTS, "drained within 45 s");
    let counts = inbox.counts().await.unwrap();
    assert_eq!(counts.processed, EVENTS as u64);
    assert_eq!((counts.queued, counts.processing, counts.dead), (0, 0, 0));
    drop((inbox, store));
    remove(&path);
}

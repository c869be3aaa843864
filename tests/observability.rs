//! Metrics and spans against known traffic.
//!
//! Each test records into a `DebuggingRecorder` of its own, set as the default of the
//! test's thread (the Tokio test runtime runs every task there), so tests never see each
//! other's values. A known mix of deliveries goes through `VerifyWebhookLayer` and
//! `DedupeLayer` — genuine, forged, stale, without headers, duplicates, one retry while
//! the first attempt runs (409), one while the store is down (503), a handler that fails
//! and one that panics — and every counter, histogram and label is checked against what
//! was sent; likewise `TxDedupeLayer`'s duplicates, handler outcomes and 503, and the
//! inbox worker's attempts (processed, retry, dead, abandoned) and gauges (depth, dead
//! rows, lag), and the routes ended dead unrun because their body cannot be opened or is
//! gone (SQLite and JetStream, with the feature `seal`; expired and erased on SQLite and
//! PostgreSQL). A subscriber of the test's own reads the spans: the
//! handler's and the processor's logs carry the event's source, id and type.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::sql_db::Db;
use common::{at, request, verifier, NOW};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use tokio::sync::Notify;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{Attempt, Inbox, ProcessorSpec, Worker};
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, MemoryStore, Renewed, Retention, SqliteStore,
    StoreError, StoreFuture, Token,
};
use tower_webhook::verify::{TenantFrom, Tenants};
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const FORGER: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

// ---- reading the recorder ----

/// What the recorder saw, added up over snapshots (a snapshot of the debugging recorder
/// hands over the counts since the last one).
struct Recorded {
    snapshotter: Snapshotter,
    counters: HashMap<(String, Labels), u64>,
    histograms: HashMap<(String, Labels), Vec<f64>>,
    /// Gauges as the last snapshot saw them.
    gauges: HashMap<(String, Labels), f64>,
    /// Every metric's unit and help text, as described to the recorder.
    described: HashMap<String, (Option<metrics::Unit>, Option<String>)>,
}

type Labels = BTreeMap<String, String>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Recorded {
    fn new(recorder: &DebuggingRecorder) -> Self {
        Self {
            snapshotter: recorder.snapshotter(),
            counters: HashMap::new(),
            histograms: HashMap::new(),
            gauges: HashMap::new(),
            described: HashMap::new(),
        }
    }

    /// Takes a snapshot and adds it up.
    fn take(&mut self) -> &mut Self {
        self.gauges.clear();
        for (key, unit, help, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let name = key.name().to_owned();
            let labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            self.described
                .insert(name.clone(), (unit, help.map(|h| h.to_string())));
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.counters.entry((name, labels)).or_default() += n
                }
                (MetricKind::Histogram, DebugValue::Histogram(values)) => self
                    .histograms
                    .entry((name, labels))
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                    self.gauges.insert((name, labels), v.into_inner());
                }
                other => panic!("{other:?}"),
            }
        }
        self
    }

    fn counter(&self, name: &str, pairs: &[(&str, &str)]) -> u64 {
        let key = (name.to_owned(), labels(pairs));
        self.counters.get(&key).copied().unwrap_or(0)
    }

    /// The sum of a counter over every label set it was recorded with.
    fn counter_total(&self, name: &str) -> u64 {
        let of_name = self.counters.iter().filter(|((n, _), _)| n == name);
        of_name.map(|(_, v)| v).sum()
    }

    /// The label sets a counter was recorded with.
    fn label_sets(&self, name: &str) -> Vec<Labels> {
        let mut sets: Vec<Labels> = (self.counters.keys().chain(self.histograms.keys()))
            .filter(|(n, _)| n == name)
            .map(|(_, l)| l.clone())
            .collect();
        sets.sort();
        sets
    }

    fn samples(&self, name: &str, pairs: &[(&str, &str)]) -> &[f64] {
        let key = (name.to_owned(), labels(pairs));
        self.histograms.get(&key).map_or(&[], Vec::as_slice)
    }

    fn gauge(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        self.gauges.get(&(name.to_owned(), labels(pairs))).copied()
    }
}

/// Takes snapshots until `done` holds (at most 5 s: background releases, the worker).
async fn until(recorded: &mut Recorded, what: &str, done: impl Fn(&Recorded) -> bool) {
    for _ in 0..250 {
        if done(recorded.take()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "timed out waiting for {what}: {:?} {:?}",
        recorded.counters, recorded.gauges
    );
}

// ---- verify + dedupe ----

/// A memory store whose claims can be made to fail (the store unreachable).
#[derive(Clone, Default)]
struct Flaky {
    inner: MemoryStore,
    down: Arc<AtomicBool>,
}

impl DedupeStore for Flaky {
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(StoreError::message("the store is down")) });
        }
        self.inner.claim(delivery, token, lease)
    }
    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        self.inner.renew(delivery, token, lease)
    }
    fn complete(&self, delivery: Delivery, token: Token) -> StoreFuture<Completed> {
        self.inner.complete(delivery, token)
    }
    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()> {
        self.inner.release(delivery, token)
    }
    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        self.inner.prune(older_than)
    }
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        self.inner.prune_once(namespace, older_than)
    }
}

type Svc = tower::util::BoxCloneSyncService<Request<Full<Bytes>>, StatusCode, Infallible>;

/// Verify (Standard Webhooks, clock at `NOW`) + dedupe on `store` + a handler that obeys
/// `x-behave`: `ok`, `wait` (says it started, then waits for `go`), `fail` (500), `panic`.
fn webhooks(store: Flaky, started: Arc<Notify>, go: Arc<Notify>) -> Svc {
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let (started, go) = (started.clone(), go.clone());
        async move {
            tracing::info!(target: "handler", "handling");
            match req.headers()["x-behave"].to_str().unwrap() {
                "wait" => {
                    started.notify_one();
                    go.notified().await;
                }
                "fail" => {
                    let mut response = Response::new(Full::new(Bytes::new()));
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    return Ok::<_, Infallible>(response);
                }
                "panic" => panic!("the handler panicked"),
                _ => {}
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"handled"))))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(DedupeLayer::new(store))
        .service(handler);
    let svc = ServiceExt::<Request<Full<Bytes>>>::map_response(svc, |r| r.status());
    tower::util::BoxCloneSyncService::new(svc)
}

/// A delivery of `id` signed with `secret` at `signed_at`, telling the handler `behave`.
fn delivery(id: &str, secret: &str, signed_at: u64, behave: &'static str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"type":"invoice.paid","data":{{"object":{{"id":"in_{id}"}}}}}}"#);
    let mut headers: HeaderMap = Scheme::standard()
        .sign([secret], id, at(signed_at), body.as_bytes())
        .unwrap();
    headers.insert("x-behave", HeaderValue::from_static(behave));
    request(headers, body)
}

async fn send(svc: &Svc, request: Request<Full<Bytes>>) -> StatusCode {
    svc.clone().oneshot(request).await.unwrap()
}

const VERIFIED: &str = "tower_webhook_deliveries_verified_total";
const REJECTED: &str = "tower_webhook_deliveries_rejected_total";
const VERIFICATION: &str = "tower_webhook_verification_duration_seconds";
const DUPLICATES: &str = "tower_webhook_duplicates_total";
const IN_FLIGHT: &str = "tower_webhook_in_flight_conflicts_total";
const UNAVAILABLE: &str = "tower_webhook_store_unavailable_total";
const HANDLER: &str = "tower_webhook_handler_outcomes_total";
const STORE: &str = "tower_webhook_store_operation_duration_seconds";
const ATTEMPTS: &str = "tower_webhook_inbox_attempts_total";
const DEPTH: &str = "tower_webhook_inbox_depth";
const DEAD: &str = "tower_webhook_inbox_dead_rows";
const LAG: &str = "tower_webhook_inbox_lag_seconds";
const UNREADABLE: &str = "tower_webhook_inbox_unreadable_total";

#[tokio::test]
async fn verify_and_dedupe_count_every_delivery_by_what_became_of_it() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let store = Flaky::default();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let svc = webhooks(store.clone(), started.clone(), go.clone());

    // 5 genuine events, then 3 of them again.
    for i in 0..5 {
        let status = send(&svc, delivery(&format!("msg_{i}"), SECRET, NOW, "ok")).await;
        assert_eq!(status, StatusCode::OK);
    }
    for i in 0..3 {
        let status = send(&svc, delivery(&format!("msg_{i}"), SECRET, NOW, "ok")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    // 2 forged, 2 stale (an hour old: refused on the headers), 1 without headers.
    for i in 0..2 {
        let status = send(&svc, delivery(&format!("forged_{i}"), FORGER, NOW, "ok")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let status = send(
            &svc,
            delivery(&format!("stale_{i}"), SECRET, NOW - 3600, "ok"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    assert_eq!(
        send(&svc, request(HeaderMap::new(), "{}")).await,
        StatusCode::BAD_REQUEST
    );
    // A retry while the first attempt runs: 409; the first then succeeds.
    let first = tokio::spawn(send_owned(
        svc.clone(),
        delivery("msg_slow", SECRET, NOW, "wait"),
    ));
    started.notified().await;
    let retry = send(&svc, delivery("msg_slow", SECRET, NOW, "ok")).await;
    assert_eq!(retry, StatusCode::CONFLICT);
    go.notify_one();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    // The store down: 503, and the handler does not run.
    store.down.store(true, Ordering::SeqCst);
    let down = send(&svc, delivery("msg_down", SECRET, NOW, "ok")).await;
    assert_eq!(down, StatusCode::SERVICE_UNAVAILABLE);
    store.down.store(false, Ordering::SeqCst);
    // A handler that fails, and one that panics (the panic goes on to the caller).
    let failed = send(&svc, delivery("msg_fail", SECRET, NOW, "fail")).await;
    assert_eq!(failed, StatusCode::INTERNAL_SERVER_ERROR);
    let panicked = tokio::spawn(send_owned(
        svc.clone(),
        delivery("msg_panic", SECRET, NOW, "panic"),
    ));
    assert!(panicked.await.unwrap_err().is_panic());

    // Every release is done: the failure's, the panic's, and the failed claim's (which
    // may have landed) in the background.
    let source = [("source", "standard")];
    until(&mut recorded, "three releases", |r| {
        r.samples(STORE, &[("operation", "release")]).len() == 3
    })
    .await;
    let r = &recorded;
    // 5 + 3 + 2 (msg_slow twice) + down + fail + panic verified.
    assert_eq!(r.counter(VERIFIED, &source), 13);
    assert_eq!(r.counter_total(VERIFIED), 13, "one source");
    let reason = |reason| r.counter(REJECTED, &[("source", "standard"), ("reason", reason)]);
    assert_eq!(reason("invalid_signature"), 2);
    assert_eq!(reason("timestamp_too_old"), 2);
    assert_eq!(reason("missing_header"), 1);
    assert_eq!(r.counter_total(REJECTED), 5, "no other reason");
    // Timed for each body that was checked: the verified and the forged, not the ones
    // refused on their headers.
    let checked = r.samples(VERIFICATION, &source);
    assert_eq!(checked.len(), 15);
    assert!(
        checked.iter().all(|s| (0.0..1.0).contains(s)),
        "{checked:?}"
    );
    assert_eq!(r.counter(DUPLICATES, &source), 3);
    assert_eq!(r.counter(IN_FLIGHT, &source), 1);
    assert_eq!(r.counter(UNAVAILABLE, &source), 1);
    let outcome = |o| r.counter(HANDLER, &[("source", "standard"), ("outcome", o)]);
    assert_eq!(
        (outcome("success"), outcome("failure"), outcome("panic")),
        (6, 1, 1)
    );
    // Store round trips: a claim per delivery that reached dedupe (the failed one too), a
    // completion per success, a release per failure, panic and failed claim.
    let operation = |op| r.samples(STORE, &[("operation", op)]).len();
    assert_eq!(
        (
            operation("claim"),
            operation("complete"),
            operation("release")
        ),
        (13, 6, 3)
    );
    assert_eq!(
        operation("renew"),
        0,
        "no run came near a third of the lease"
    );
    // Labels stay few: never an event id.
    for name in [VERIFIED, REJECTED, DUPLICATES, HANDLER, STORE] {
        for set in r.label_sets(name) {
            assert!(
                set.values().all(|v| !v.starts_with("msg_")),
                "{name} {set:?}"
            );
        }
    }
    // Each metric came with its unit and help text.
    for (name, unit) in [
        (VERIFIED, metrics::Unit::Count),
        (VERIFICATION, metrics::Unit::Seconds),
        (STORE, metrics::Unit::Seconds),
        (HANDLER, metrics::Unit::Count),
    ] {
        let (got, help) = &r.described[name];
        assert_eq!(*got, Some(unit), "{name}");
        assert!(
            help.as_ref().is_some_and(|h| h.len() > 20),
            "{name}: {help:?}"
        );
    }
}

async fn send_owned(svc: Svc, request: Request<Full<Bytes>>) -> StatusCode {
    svc.oneshot(request).await.unwrap()
}

#[tokio::test]
async fn per_tenant_deliveries_are_labelled_with_the_layers_source_not_each_tenants() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let secrets: HashMap<&str, &str> = HashMap::from([
        ("acme", "whsec_acme_secret_000001"),
        ("globex", "whsec_globex_secret_0001"),
    ]);
    let table = secrets.clone();
    let tenants = Tenants::new(
        Scheme::stripe(),
        TenantFrom::path_segment(1),
        move |tenant: String| {
            let found = table.get(tenant.as_str()).map(|s| vec![s.to_string()]);
            async move { Ok::<_, Infallible>(found) }
        },
    )
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::per_tenant(tenants))
        .layer(DedupeLayer::new(MemoryStore::new()))
        .service(service_fn(move |req: Request<Full<Bytes>>| {
            let event = req.extensions().get::<tower_webhook::Event>().cloned();
            s.lock().unwrap().push(event.unwrap().source().to_owned());
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    for (tenant, secret) in [("acme", secrets["acme"]), ("globex", secrets["globex"])] {
        let body = common::event_body(&format!("evt_{tenant}"), "charge.succeeded", "ch_1");
        let headers = common::signed_headers(&Scheme::stripe(), secret, "", &body);
        let mut req = request(headers, body);
        *req.uri_mut() = format!("/webhooks/{tenant}").parse().unwrap();
        let response = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // A tenant nobody knows.
    let body = common::event_body("evt_nobody", "charge.succeeded", "ch_1");
    let headers = common::signed_headers(&Scheme::stripe(), secrets["acme"], "", &body);
    let mut req = request(headers, body);
    *req.uri_mut() = "/webhooks/nobody".parse().unwrap();
    assert_eq!(
        svc.clone().oneshot(req).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );

    assert_eq!(*seen.lock().unwrap(), ["stripe/acme", "stripe/globex"]);
    let r = recorded.take();
    assert_eq!(r.label_sets(VERIFIED), [labels(&[("source", "stripe")])]);
    assert_eq!(r.counter(VERIFIED, &[("source", "stripe")]), 2);
    let unknown = [("source", "stripe"), ("reason", "unknown_tenant")];
    assert_eq!(r.counter(REJECTED, &unknown), 1);
    let success = [("source", "stripe"), ("outcome", "success")];
    assert_eq!(r.counter(HANDLER, &success), 2);
    assert_eq!(r.label_sets(HANDLER), [labels(&success)]);
}

#[tokio::test]
async fn tx_dedupe_counts_duplicates_handler_outcomes_and_an_unreachable_database() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let pool = sqlx::PgPool::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    let layer = tower_webhook::dedupe::TxDedupeLayer::new(pool.clone())
        .await
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(layer)
        .service(service_fn(|req: Request<Full<Bytes>>| async move {
            let mut response = Response::new(Full::new(Bytes::new()));
            match req.headers()["x-behave"].to_str().unwrap() {
                "fail" => *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
                "panic" => panic!("the handler panicked"),
                _ => *response.status_mut() = StatusCode::NO_CONTENT,
            }
            Ok::<_, Infallible>(response)
        }));
    let svc = ServiceExt::<Request<Full<Bytes>>>::map_response(svc, |r| r.status());
    let svc: Svc = tower::util::BoxCloneSyncService::new(svc);

    assert_eq!(
        send(&svc, delivery("msg_tx", SECRET, NOW, "ok")).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        send(&svc, delivery("msg_tx", SECRET, NOW, "ok")).await,
        StatusCode::NO_CONTENT
    );
    let failed = send(&svc, delivery("msg_tx_fail", SECRET, NOW, "fail")).await;
    assert_eq!(failed, StatusCode::INTERNAL_SERVER_ERROR);
    let panicked = tokio::spawn(send_owned(
        svc.clone(),
        delivery("msg_tx_panic", SECRET, NOW, "panic"),
    ));
    assert!(panicked.await.unwrap_err().is_panic());
    pool.close().await; // the database out of reach: no transaction begins
    let down = send(&svc, delivery("msg_tx_down", SECRET, NOW, "ok")).await;
    assert_eq!(down, StatusCode::SERVICE_UNAVAILABLE);

    let r = recorded.take();
    let source = [("source", "standard")];
    assert_eq!(r.counter(VERIFIED, &source), 5);
    assert_eq!(r.counter(DUPLICATES, &source), 1);
    assert_eq!(r.counter(UNAVAILABLE, &source), 1);
    assert_eq!(r.counter(IN_FLIGHT, &source), 0);
    let outcome = |o| r.counter(HANDLER, &[("source", "standard"), ("outcome", o)]);
    assert_eq!(
        (outcome("success"), outcome("failure"), outcome("panic")),
        (1, 1, 1)
    );
}

// ---- the inbox ----

fn sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "tower-webhook-observability-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}

/// Verify (clock at `NOW`) + the inbox's accept; the status of a delivery of `id`.
async fn accept(inbox: &Inbox, id: &str) -> StatusCode {
    accept_into(inbox.accept_service(), id).await
}

/// Verify + an accept service (the SQL inbox's or JetStream's).
async fn accept_into(accept: tower_webhook::inbox::Accept, id: &str) -> StatusCode {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(accept);
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"pi_{id}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    svc.oneshot(request(headers, body)).await.unwrap().status()
}

/// The JetStream worker counts its attempts as the SQL one does, and `counts` sets the
/// same gauges (against a real NATS server, a stream of the test's own).
#[tokio::test]
async fn the_jetstream_inbox_counts_accepts_and_attempts_by_outcome_and_sets_the_gauges() {
    use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let url = common::nats_url();
    let name = format!("tw_test_{}", uuid::Uuid::new_v4().simple());
    let client = async_nats::connect(&url).await.expect("NATS is running");
    let jetstream = JetStream::builder(client, &name)
        .with_memory_storage()
        .build()
        .await
        .unwrap();
    for id in ["evt_ok", "evt_flaky", "evt_broken", "evt_ok"] {
        assert_eq!(
            accept_into(jetstream.accept_service(), id).await,
            StatusCode::NO_CONTENT
        );
    }
    let store = tower_webhook::store::MemoryStore::new();
    let worker = JetStreamWorker::new(&jetstream, store, move |e: Event, a: Attempt| async move {
        match (e.id().unwrap(), a.number()) {
            ("evt_flaky", 1) | ("evt_broken", _) => Err("the provider's API said 500"),
            _ => Ok(()),
        }
    })
    .with_max_attempts(2)
    .unwrap()
    .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
    .unwrap()
    .spawn();
    until(&mut recorded, "five attempts recorded", |r| {
        r.counter_total(ATTEMPTS) == 5
    })
    .await;
    worker.shutdown().await;
    let counts = jetstream.counts().await.unwrap();
    let r = recorded.take();
    let outcome = |o| r.counter(ATTEMPTS, &[("processor", "default"), ("outcome", o)]);
    assert_eq!(
        (outcome("processed"), outcome("retry"), outcome("dead")),
        (2, 2, 1)
    );
    assert_eq!(r.counter(DUPLICATES, &[("source", "standard")]), 1);
    assert_eq!(r.counter(VERIFIED, &[("source", "standard")]), 4);
    let operation = |op| r.samples(STORE, &[("operation", op)]).len();
    assert_eq!(operation("accept"), 4, "each delivery published once");
    assert_eq!(
        operation("inbox_finish"),
        5,
        "each outcome recorded once: 2 acks, 2 naks, the dead one's ack"
    );
    assert_eq!(operation("complete"), 2, "each success done in the store");
    assert!(operation("inbox_claim") >= 1);
    assert_eq!((counts.processed, counts.dead), (2, 1), "{counts:?}");
    assert_eq!(r.gauge(DEAD, &[("processor", "default")]), Some(1.0));
    assert_eq!(
        r.gauge(DEPTH, &[("processor", "default"), ("state", "queued")]),
        Some(0.0)
    );
    jetstream.delete().await.unwrap();
}

#[cfg(feature = "seal")]
fn ring(keys: &[(&str, u8)]) -> tower_webhook::seal::KeyRing {
    use tower_webhook::seal::{Key, KeyRing};
    KeyRing::new(keys.iter().map(|(id, b)| Key::new(*id, [*b; 32]).unwrap())).unwrap()
}

/// Routes refused at their claim are counted by reason: one sealed under a key the inbox
/// lacks (`unknown_key`), one whose ciphertext was moved from another row (`tampered`),
/// one whose body row was deleted by SQL (`missing`); the one that opens is not.
#[cfg(feature = "seal")]
#[tokio::test]
async fn the_inbox_counts_routes_dead_unrun_by_why_their_body_could_not_be_given() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let path = sqlite_path();
    let store = SqliteStore::open(&path).await.unwrap();
    let k1 = Inbox::sqlite(&store).with_keys(ring(&[("k1", 1)]));
    assert_eq!(accept(&k1, "evt_k1").await, StatusCode::NO_CONTENT);
    let inbox = Inbox::sqlite(&store).with_keys(ring(&[("k2", 2)]));
    for id in ["evt_ok", "evt_moved", "evt_gone"] {
        assert_eq!(accept(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    for sql in [
        "UPDATE webhook_bodies SET
             body = (SELECT body FROM webhook_bodies WHERE event_id = 'evt_ok'),
             body_nonce = (SELECT body_nonce FROM webhook_bodies WHERE event_id = 'evt_ok')
         WHERE event_id = 'evt_moved'",
        "DELETE FROM webhook_bodies WHERE event_id = 'evt_gone'",
    ] {
        let done = sqlx::query(sql).execute(store.pool()).await.unwrap();
        assert_eq!(done.rows_affected(), 1, "{sql}");
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let worker = Worker::new(&inbox, move |e: Event, _| {
        seen.lock().unwrap().push(e.id().unwrap().to_owned());
        async { Ok::<_, Infallible>(()) }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    until(&mut recorded, "three routes refused", |r| {
        r.counter_total(UNREADABLE) == 3
    })
    .await;
    worker.shutdown().await;
    let r = recorded.take();
    let reason = |why| r.counter(UNREADABLE, &[("source", "standard"), ("reason", why)]);
    assert_eq!(
        (reason("unknown_key"), reason("tampered"), reason("missing")),
        (1, 1, 1)
    );
    assert_eq!(r.counter_total(UNREADABLE), 3);
    assert_eq!(*ran.lock().unwrap(), ["evt_ok"]);
    assert_eq!(inbox.counts().await.unwrap().dead, 3);
    let (unit, help) = &r.described[UNREADABLE];
    assert_eq!(*unit, Some(metrics::Unit::Count));
    assert!(help.as_deref().unwrap().contains("by reason"), "{help:?}");
    drop(store);
    let _ = std::fs::remove_file(&path);
}

/// A JetStream message sealed under a key the worker's stream lacks is buried unrun and
/// counted as `unknown_key`; one that opens is processed and not counted.
#[cfg(feature = "seal")]
#[tokio::test]
async fn the_jetstream_worker_counts_a_message_it_cannot_open() {
    use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let url = common::nats_url();
    let name = format!("tw_test_{}", uuid::Uuid::new_v4().simple());
    let stream = async |keys| {
        let client = async_nats::connect(&url).await.expect("NATS is running");
        JetStream::builder(client, &name)
            .with_memory_storage()
            .with_keys(keys)
            .build()
            .await
            .unwrap()
    };
    let k1 = stream(ring(&[("k1", 1)])).await;
    let accepted = accept_into(k1.accept_service(), "evt_k1").await;
    assert_eq!(accepted, StatusCode::NO_CONTENT);
    let jetstream = stream(ring(&[("k2", 2)])).await;
    let accepted = accept_into(jetstream.accept_service(), "evt_ok").await;
    assert_eq!(accepted, StatusCode::NO_CONTENT);
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let store = tower_webhook::store::MemoryStore::new();
    let worker = JetStreamWorker::new(&jetstream, store, move |e: Event, _| {
        seen.lock().unwrap().push(e.id().unwrap().to_owned());
        async { Ok::<_, Infallible>(()) }
    })
    .spawn();
    until(&mut recorded, "one processed, one buried", |r| {
        r.counter_total(UNREADABLE) == 1
            && r.counter(
                ATTEMPTS,
                &[("processor", "default"), ("outcome", "processed")],
            ) == 1
    })
    .await;
    worker.shutdown().await;
    let r = recorded.take();
    let reason = |why| r.counter(UNREADABLE, &[("source", "standard"), ("reason", why)]);
    assert_eq!((reason("unknown_key"), reason("tampered")), (1, 0));
    assert_eq!(*ran.lock().unwrap(), ["evt_ok"]);
    jetstream.delete().await.unwrap();
}

/// A worker whose processor counts its runs in `runs`; at its first attempt it says so on
/// `started` and fails once `release` is notified (a route failing with attempts left);
/// other attempts succeed.
fn counting_worker(
    inbox: &Inbox,
    runs: &Arc<AtomicUsize>,
    started: &Arc<Notify>,
    release: &Arc<Notify>,
) -> tower_webhook::inbox::WorkerHandle {
    let (n, s, r) = (runs.clone(), started.clone(), release.clone());
    Worker::new(inbox, move |_: Event, attempt: Attempt| {
        let (n, s, r) = (n.clone(), s.clone(), r.clone());
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            if attempt.number() > 1 {
                return Ok(());
            }
            s.notify_one();
            r.notified().await;
            Err("failed at its first attempt".to_owned())
        }
    })
    .with_max_attempts(3)
    .unwrap()
    .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn()
}

/// How many routes the recorder counted unreadable for each reason (`unknown_key`,
/// `tampered`, `expired`, `erased`, `missing`).
fn unreadable_by_reason(r: &Recorded) -> [u64; 5] {
    ["unknown_key", "tampered", "expired", "erased", "missing"]
        .map(|why| r.counter(UNREADABLE, &[("source", "standard"), ("reason", why)]))
}

/// An event erased while its route's first attempt runs: the attempt fails with attempts
/// left, and the route's next claim finds the body erased: dead without running, counted
/// once as `erased` and under no other reason.
async fn a_route_claimed_after_its_body_was_erased_is_counted_erased(db: Db) {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let inbox = db.inbox();
    assert_eq!(accept(&inbox, "evt_erased").await, StatusCode::NO_CONTENT);
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = counting_worker(&inbox, &runs, &started, &release);
    started.notified().await;
    assert!(inbox.erase("standard", "evt_erased").await.unwrap());
    assert_eq!(
        unreadable_by_reason(recorded.take()),
        [0; 5],
        "not while it runs"
    );
    release.notify_one();
    until(&mut recorded, "the route refused", |r| {
        r.counter_total(UNREADABLE) == 1
    })
    .await;
    worker.shutdown().await;
    assert_eq!(unreadable_by_reason(recorded.take()), [0, 0, 0, 1, 0]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
    assert_eq!(inbox.counts().await.unwrap().dead, 1);
}

#[tokio::test]
async fn sqlite_a_route_claimed_after_its_body_was_erased_is_counted_erased() {
    a_route_claimed_after_its_body_was_erased_is_counted_erased(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_route_claimed_after_its_body_was_erased_is_counted_erased() {
    a_route_claimed_after_its_body_was_erased_is_counted_erased(Db::postgres().await).await;
}

/// A processed event whose body the retention expired, its route then put back in the
/// queue by SQL (the crate's requeue leaves such a route out; a hand-written UPDATE or a
/// restored table does not): its claim finds the body expired, ends it dead without
/// running, counted once as `expired` and under no other reason.
async fn a_route_claimed_after_its_body_expired_is_counted_expired(db: Db) {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let inbox = db.inbox();
    assert_eq!(accept(&inbox, "evt_expired").await, StatusCode::NO_CONTENT);
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = counting_worker(&inbox, &runs, &started, &release);
    started.notified().await;
    release.notify_one(); // its first attempt fails, its second is processed
    let processed = [("processor", "default"), ("outcome", "processed")];
    until(&mut recorded, "the event processed", |r| {
        r.counter(ATTEMPTS, &processed) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expiring = inbox.clone().with_body_retention(Duration::from_millis(5));
    assert_eq!(expiring.expire_bodies(10).await.unwrap(), 1);
    let due_again = match &db {
        Db::Sqlite(..) => "UPDATE webhook_routes SET processed_at = NULL, next_attempt_at = 0",
        Db::Pg(..) => "UPDATE webhook_routes SET processed_at = NULL, next_attempt_at = now()",
    };
    db.run(&format!("{due_again} WHERE event_id = 'evt_expired'"))
        .await;
    until(&mut recorded, "the route refused", |r| {
        r.counter_total(UNREADABLE) == 1
    })
    .await;
    worker.shutdown().await;
    assert_eq!(unreadable_by_reason(recorded.take()), [0, 0, 1, 0, 0]);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "not run a third time");
    assert_eq!(inbox.counts().await.unwrap().dead, 1);
}

#[tokio::test]
async fn sqlite_a_route_claimed_after_its_body_expired_is_counted_expired() {
    a_route_claimed_after_its_body_expired_is_counted_expired(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_route_claimed_after_its_body_expired_is_counted_expired() {
    a_route_claimed_after_its_body_expired_is_counted_expired(Db::postgres().await).await;
}

#[tokio::test]
async fn the_inbox_counts_accepts_attempts_by_outcome_and_its_worker_sets_the_gauges() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let path = sqlite_path();
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap());
    for id in ["evt_ok", "evt_flaky", "evt_broken", "evt_ok"] {
        assert_eq!(accept(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    // evt_flaky fails its first attempt; evt_broken both of its two.
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let worker = Worker::new(&inbox, move |e: Event, a: Attempt| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            match (e.id().unwrap(), a.number()) {
                ("evt_flaky", 1) | ("evt_broken", _) => Err("the provider's API said 500"),
                _ => Ok(()),
            }
        }
    })
    .with_max_attempts(2)
    .unwrap()
    .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    // Waited for on the counters alone: `counts` is not called here, so the gauges below
    // were set by the worker's own refresh.
    until(&mut recorded, "five attempts recorded", |r| {
        r.counter_total(ATTEMPTS) == 5
    })
    .await;
    until(&mut recorded, "the worker to refresh the gauges", |r| {
        r.gauge(DEAD, &[("processor", "default")]) == Some(1.0)
    })
    .await;
    worker.shutdown().await;
    let r = recorded.take();
    assert_eq!(attempts.load(Ordering::SeqCst), 5);
    let outcome = |o| r.counter(ATTEMPTS, &[("processor", "default"), ("outcome", o)]);
    assert_eq!(
        (outcome("processed"), outcome("retry"), outcome("dead")),
        (2, 2, 1)
    );
    assert_eq!(r.counter(DUPLICATES, &[("source", "standard")]), 1);
    assert_eq!(r.counter(VERIFIED, &[("source", "standard")]), 4);
    let operation = |op| r.samples(STORE, &[("operation", op)]).len();
    assert_eq!(
        operation("accept"),
        4,
        "each delivery stored once (or found)"
    );
    assert_eq!(
        operation("inbox_finish"),
        5,
        "each attempt's outcome recorded once"
    );
    assert!(
        operation("inbox_claim") >= 2,
        "the first claim and the retries'"
    );
    assert!(operation("inbox_counts") >= 1, "the worker's refresh");

    // A processor that hangs, stopped past a grace period: abandoned, back in the queue.
    assert_eq!(accept(&inbox, "evt_stuck").await, StatusCode::NO_CONTENT);
    let started = Arc::new(Notify::new());
    let s = started.clone();
    let stuck = Worker::new(&inbox, move |_: Event, _: Attempt| {
        s.notify_one();
        std::future::pending::<Result<(), String>>()
    })
    .with_grace(Duration::from_millis(50))
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    started.notified().await;
    stuck.shutdown().await;
    assert_eq!(
        recorded.take().counter(
            ATTEMPTS,
            &[("processor", "default"), ("outcome", "abandoned")]
        ),
        1
    );
    assert_eq!(recorded.counter_total(ATTEMPTS), 6);

    // The gauges are what `counts` read: one queued, none processing, one dead, and the
    // lag of the queued row.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let counts = inbox.counts().await.unwrap();
    let lag = counts.oldest_due.expect("evt_stuck is due").as_secs_f64();
    assert!(lag >= 0.1, "{lag}");
    let r = recorded.take();
    assert_eq!(
        r.gauge(DEPTH, &[("processor", "default"), ("state", "queued")]),
        Some(1.0)
    );
    assert_eq!(
        r.gauge(DEPTH, &[("processor", "default"), ("state", "processing")]),
        Some(0.0)
    );
    assert_eq!(r.gauge(DEAD, &[("processor", "default")]), Some(1.0));
    assert_eq!(r.gauge(LAG, &[("processor", "default")]), Some(lag));
    let _ = std::fs::remove_file(path);
}

/// With fan-out, each processor's attempts and gauges carry its name (`processor`): one
/// failing every attempt leaves the other's series clean.
#[tokio::test]
async fn each_processors_attempts_and_gauges_are_labelled_with_its_name() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let path = sqlite_path();
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap())
        .with_processors([
            ProcessorSpec::new("ledger").unwrap(),
            ProcessorSpec::new("email").unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(accept(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    let worker = |name, fails: bool| {
        Worker::processor(&inbox, name, move |_: Event, _: Attempt| async move {
            match fails {
                true => Err("the mail server said 500"),
                false => Ok(()),
            }
        })
        .unwrap()
        .with_max_attempts(1)
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn()
    };
    let (ledger, email) = (worker("ledger", false), worker("email", true));
    until(&mut recorded, "four attempts recorded", |r| {
        r.counter_total(ATTEMPTS) == 4
    })
    .await;
    ledger.shutdown().await;
    email.shutdown().await;
    let by = inbox.counts_by_processor().await.unwrap();
    assert_eq!((by["ledger"].processed, by["email"].dead), (2, 2));
    let r = recorded.take();
    let attempts = |p, o| r.counter(ATTEMPTS, &[("processor", p), ("outcome", o)]);
    assert_eq!(
        [attempts("ledger", "processed"), attempts("ledger", "dead")],
        [2, 0]
    );
    assert_eq!(
        [attempts("email", "processed"), attempts("email", "dead")],
        [0, 2]
    );
    assert_eq!(r.gauge(DEAD, &[("processor", "ledger")]), Some(0.0));
    assert_eq!(r.gauge(DEAD, &[("processor", "email")]), Some(2.0));
    let _ = std::fs::remove_file(path);
}

/// The flow-control rules in the metrics: a paused row in the `paused` depth, events a
/// per-source cap handed back in `held_back_total{rule="per_source"}`, and a processor's
/// `Later` as the attempt outcome `snoozed`.
#[tokio::test]
async fn the_flow_control_rules_are_counted() {
    const HELD_BACK: &str = "tower_webhook_inbox_held_back_total";
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut recorded = Recorded::new(&recorder);
    let path = sqlite_path();
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap());
    inbox.pause(Some("standard"), None).await.unwrap();
    for id in ["evt_a", "evt_b", "evt_c"] {
        assert_eq!(accept(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    inbox.counts().await.unwrap();
    assert_eq!(
        recorded
            .take()
            .gauge(DEPTH, &[("processor", "default"), ("state", "paused")]),
        Some(3.0)
    );
    inbox.resume(Some("standard"), None).await.unwrap();
    // One at a time per source, three processors: a claim of three hands two back.
    let snoozed = Arc::new(AtomicBool::new(false));
    let worker = Worker::new(&inbox, move |_: Event, _: Attempt| {
        let first = !snoozed.swap(true, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            match first {
                true => Err(tower_webhook::inbox::Later::after(Duration::from_millis(10)).into()),
                false => Ok::<_, Box<dyn std::error::Error + Send + Sync>>(()),
            }
        }
    })
    .with_concurrency(3)
    .unwrap()
    .with_per_source(1)
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    until(&mut recorded, "three processed", |r| {
        r.counter(
            ATTEMPTS,
            &[("processor", "default"), ("outcome", "processed")],
        ) == 3
    })
    .await;
    worker.shutdown().await;
    let r = recorded.take();
    assert_eq!(
        r.counter(
            ATTEMPTS,
            &[("processor", "default"), ("outcome", "snoozed")]
        ),
        1
    );
    assert!(
        r.counter(
            HELD_BACK,
            &[("processor", "default"), ("rule", "per_source")]
        ) >= 2
    );
    inbox.counts().await.unwrap();
    assert_eq!(
        recorded
            .take()
            .gauge(DEPTH, &[("processor", "default"), ("state", "paused")]),
        Some(0.0)
    );
    let _ = std::fs::remove_file(path);
}

// ---- spans ----

/// Every log event with the fields of the spans it was logged in, innermost first:
/// `span{field=value ...}: ... message`.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<SpansInner>>);

#[derive(Default)]
struct SpansInner {
    next: u64,
    spans: HashMap<u64, (&'static tracing::Metadata<'static>, Vec<String>)>,
    lines: Vec<String>,
}

thread_local! {
    /// The spans entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Field visitor writing `name=value`.
struct Fields<'a>(&'a mut Vec<String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push(format!("{}={value}", field.name()));
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut inner = self.0.lock().unwrap();
        inner.next += 1;
        let id = inner.next;
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        inner.spans.insert(id, (attrs.metadata(), fields));
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut inner = self.0.lock().unwrap();
        if let Some((_, fields)) = inner.spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut inner = self.0.lock().unwrap();
        let mut line = String::new();
        for id in ENTERED.with(|e| e.borrow().clone()).iter().rev() {
            let (meta, fields) = &inner.spans[id];
            line += &format!("{}{{{}}}: ", meta.name(), fields.join(" "));
        }
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        line += &fields.join(" ");
        inner.lines.push(line);
    }
    fn enter(&self, span: &tracing::span::Id) {
        ENTERED.with(|e| e.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, span: &tracing::span::Id) {
        ENTERED.with(|e| {
            let mut entered = e.borrow_mut();
            if let Some(at) = entered.iter().rposition(|id| *id == span.into_u64()) {
                entered.remove(at);
            }
        });
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let inner = self.0.lock().unwrap();
        match ENTERED.with(|e| e.borrow().last().copied()) {
            Some(id) => tracing_core::span::Current::new(
                tracing::span::Id::from_u64(id),
                inner.spans[&id].0,
            ),
            None => tracing_core::span::Current::none(),
        }
    }
}

impl Spans {
    /// The lines whose message is `message`.
    fn lines_of(&self, message: &str) -> Vec<String> {
        let needle = format!("message={message}");
        let inner = self.0.lock().unwrap();
        inner
            .lines
            .iter()
            .filter(|l| l.contains(&needle))
            .cloned()
            .collect()
    }
}

#[tokio::test]
async fn a_handlers_logs_carry_the_deliverys_source_event_id_and_type() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    // Callsites another test's thread registered meanwhile learn of this subscriber too.
    tracing::callsite::rebuild_interest_cache();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let svc = webhooks(Flaky::default(), started, go);
    assert_eq!(
        send(&svc, delivery("msg_traced", SECRET, NOW, "ok")).await,
        StatusCode::OK
    );
    // The handler runs on a task of dedupe's own: the span goes with it.
    assert_eq!(
        spans.lines_of("handling"),
        ["webhook.delivery{source=standard event_id=msg_traced event_type=invoice.paid}: message=handling"]
    );
    // A forged delivery is logged as rejected inside its span, which never got an id.
    assert_eq!(
        send(&svc, delivery("msg_forged", FORGER, NOW, "ok")).await,
        StatusCode::BAD_REQUEST
    );
    let rejected = spans.lines_of("webhook rejected: no signature matches any secret");
    assert!(
        rejected[0].contains("kind=InvalidSignature"),
        "{rejected:?}"
    );
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].starts_with("webhook.delivery{source=standard}: "),
        "{rejected:?}"
    );
    // No secret, no body.
    let inner = spans.0.lock().unwrap();
    for line in &inner.lines {
        assert!(
            !line.contains("whsec_") && !line.contains("in_msg"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_processors_logs_carry_the_rows_source_event_id_type_and_attempt() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    // Callsites another test's thread registered meanwhile learn of this subscriber too.
    tracing::callsite::rebuild_interest_cache();
    let path = sqlite_path();
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap());
    assert_eq!(accept(&inbox, "evt_traced").await, StatusCode::NO_CONTENT);
    let worker = Worker::new(&inbox, |_: Event, a: Attempt| async move {
        tracing::info!(target: "processor", "processing");
        match a.number() {
            1 => Err("not yet"),
            _ => Ok(()),
        }
    })
    .with_backoff(Duration::from_millis(10), Duration::from_millis(10))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    for _ in 0..250 {
        if spans.lines_of("processing").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.shutdown().await;
    let span = "webhook.process{source=standard event_id=evt_traced event_type=order.paid";
    // The feature `otel` (on for the tests) adds the processor and the messaging fields.
    let otel = " processor=default otel.kind=consumer messaging.operation.type=process \
        messaging.message.id=evt_traced";
    assert_eq!(
        spans.lines_of("processing"),
        [
            format!("{span} attempt=1{otel}}}: message=processing"),
            format!("{span} attempt=2{otel}}}: message=processing"),
        ]
    );
    let _ = std::fs::remove_file(path);
}

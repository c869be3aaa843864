//! Alerts end to end: `JsonPost` against a local HTTP server (the JSON it sends, its retry
//! after a 5xx, a server that never answers costing the callers nothing), a burst of
//! forged deliveries through `VerifyWebhookLayer` raising one `Rejections` alert, and a
//! SQLite inbox with an old due event raising one `Lagging` alert.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use common::{call, request, serve, signed_headers, verifier, Serving};
use http::StatusCode;
use tokio::sync::mpsc;
use tower_webhook::alerts::{Alert, AlertKind, Alerts, JsonPost};
use tower_webhook::inbox::Accepted;
use tower_webhook::store::SqliteStore;
use tower_webhook::{Inbox, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const FORGED: &str = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// What the alert endpoint saw: each POST's path, content type and JSON body.
#[derive(Clone, Default)]
struct Seen {
    posts: Arc<Mutex<Vec<(String, String, serde_json::Value)>>>,
    /// The statuses to answer, in order; 200 once they run out.
    statuses: Arc<Mutex<Vec<StatusCode>>>,
}

impl Seen {
    fn posts(&self) -> Vec<(String, String, serde_json::Value)> {
        self.posts.lock().unwrap().clone()
    }

    /// Waits up to 10 s for `n` POSTs.
    async fn wait_for(&self, n: usize) -> Vec<(String, String, serde_json::Value)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.posts.lock().unwrap().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.posts()
    }
}

/// An alert endpoint on 127.0.0.1 answering `statuses` then 200; its URL has a secret path.
async fn endpoint(statuses: &[StatusCode]) -> (String, Seen, Serving) {
    let seen = Seen::default();
    seen.statuses.lock().unwrap().extend(statuses.iter().rev());
    let app = Router::new()
        .route(
            "/services/T0/B0/{secret}",
            post(
                |State(seen): State<Seen>,
                 uri: axum::http::Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                    let content_type = headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.posts
                        .lock()
                        .unwrap()
                        .push((uri.path().to_owned(), content_type, json));
                    seen.statuses
                        .lock()
                        .unwrap()
                        .pop()
                        .unwrap_or(StatusCode::OK)
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/services/T0/B0/sEcReT",
        listener.local_addr().unwrap()
    );
    (url, seen, serve(listener, app))
}

/// Alerts whose alerter records what it is handed.
fn recording() -> (Alerts, mpsc::UnboundedReceiver<Alert>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let alerts = Alerts::new(move |alert: Alert| {
        let _ = tx.send(alert);
        std::future::ready(())
    });
    (alerts, rx)
}

/// Every alert received within `within`.
async fn received(rx: &mut mpsc::UnboundedReceiver<Alert>, within: Duration) -> Vec<Alert> {
    let deadline = tokio::time::Instant::now() + within;
    let mut alerts = Vec::new();
    while let Ok(Some(alert)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        alerts.push(alert);
    }
    alerts
}

#[tokio::test]
async fn json_post_sends_the_alert_as_slack_compatible_json() {
    let (url, seen, server) = endpoint(&[]).await;
    let alerts = Alerts::new(JsonPost::new(&url).unwrap());
    alerts.dead(
        "stripe",
        "evt_1",
        Some("invoice.paid"),
        "crm: <!here> 502\nbad gateway",
    );

    let posts = seen.wait_for(1).await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    let (path, content_type, json) = &posts[0];
    assert_eq!(path, "/services/T0/B0/sEcReT");
    assert_eq!(content_type, "application/json");
    assert_eq!(json["text"], "stripe: event evt_1 (invoice.paid) is dead");
    assert_eq!(json["kind"], "dead");
    assert_eq!(json["source"], "stripe");
    assert_eq!(json["event_id"], "evt_1");
    assert_eq!(json["event_type"], "invoice.paid");
    assert_eq!(json["details"], "crm: <!here> 502 bad gateway");
    assert_eq!(json["suppressed"], 0);
    assert!(json["at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn a_5xx_is_retried_and_the_alert_arrives_once_answered() {
    let (url, seen, server) = endpoint(&[StatusCode::INTERNAL_SERVER_ERROR]).await;
    let alerts = Alerts::new(JsonPost::new(&url).unwrap());
    alerts.lagging(Duration::from_secs(3600));

    let posts = seen.wait_for(2).await;
    assert_eq!(posts.len(), 2, "the 500, then the retry");
    assert_eq!(posts[0].2, posts[1].2, "the same alert");
    assert_eq!(posts[1].2["kind"], "lagging");
    assert_eq!(posts[1].2["lag_ms"], 3_600_000);
    // Answered 200: no third try.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(seen.posts().len(), 2);
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn a_4xx_is_not_retried() {
    let (url, seen, server) = endpoint(&[StatusCode::NOT_FOUND]).await;
    Alerts::new(JsonPost::new(&url).unwrap()).dead("stripe", "evt_1", None, "boom");
    assert_eq!(seen.wait_for(1).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(seen.posts().len(), 1, "a 404 will not get better");
    server.shut_down().await.unwrap();
}

#[tokio::test]
async fn an_endpoint_that_never_answers_does_not_slow_the_callers() {
    // Accepts connections and never reads from them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let post = JsonPost::new(&url)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .unwrap();
    let alerts = Alerts::new(post);

    let started = Instant::now();
    for i in 0..200 {
        let source = format!("source-{i}");
        alerts.failed(&source, "evt_1", None, 1, "boom");
        alerts.dead(&source, "evt_1", None, "boom");
        alerts.succeeded(&source);
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(500), "600 calls took {took:?}");
    held.abort();
}

#[tokio::test]
async fn a_burst_of_forged_deliveries_raises_one_rejections_alert() {
    let (alerts, mut rx) = recording();
    let alerts = alerts.with_rejections(5, Duration::from_secs(60)).unwrap();
    let verifier = Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .with_source("billing");
    let layer = VerifyWebhookLayer::new(verifier).with_alerts(alerts);

    let body = common::event_body("evt_1", "invoice.paid", "in_1");
    for i in 0..30 {
        let headers = signed_headers(&Scheme::standard(), FORGED, &format!("msg_{i}"), &body);
        let out = call(&layer, request(headers, body.clone())).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST, "forged");
        assert!(out.handled.is_empty());
    }
    // A genuine delivery still goes through, and raises nothing.
    let genuine = signed_headers(&Scheme::standard(), SECRET, "msg_ok", &body);
    assert_eq!(
        call(&layer, request(genuine, body.clone()))
            .await
            .handled
            .len(),
        1
    );

    let alerts = received(&mut rx, Duration::from_millis(500)).await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    let alert = &alerts[0];
    assert_eq!(alert.kind(), AlertKind::Rejections);
    assert_eq!(alert.source(), Some("billing"));
    assert_eq!(alert.count(), 5);
    assert_eq!(alert.details(), Some("InvalidSignature: 5"));
    assert_eq!(alert.summary(), "billing: 5 deliveries rejected within 60s");
}

#[tokio::test]
async fn health_checks_answered_405_raise_no_rejections_alert() {
    let (alerts, mut rx) = recording();
    let alerts = alerts.with_rejections(5, Duration::from_secs(60)).unwrap();
    let layer =
        VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET])).with_alerts(alerts);
    for _ in 0..30 {
        let get = http::Request::get("/webhooks")
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        let out = call(&layer, get).await;
        assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    }
    assert!(received(&mut rx, Duration::from_millis(300))
        .await
        .is_empty());
}

#[tokio::test]
async fn a_layer_without_alerts_raises_nothing_and_a_rejection_below_the_threshold_neither() {
    let (alerts, mut rx) = recording();
    let plain = VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]));
    let watched =
        VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET])).with_alerts(alerts);
    for layer in [&plain, &plain, &watched] {
        let out = call(layer, request(http::HeaderMap::new(), "{}")).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST);
    }
    assert!(received(&mut rx, Duration::from_millis(200))
        .await
        .is_empty());
}

#[tokio::test]
async fn an_old_due_event_in_a_sqlite_inbox_raises_one_lagging_alert() {
    let dir = std::env::temp_dir().join(format!(
        "tower-webhook-alerts-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("inbox.db")).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    let body = common::event_body("evt_1", "invoice.paid", "in_1");
    let headers = signed_headers(&Scheme::standard(), SECRET, "evt_1", &body);
    let event = Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .verify(&headers, body.into())
        .unwrap();
    assert_eq!(inbox.accept(&event).await.unwrap(), Accepted::New);

    let (alerts, mut rx) = recording();
    let alerts = alerts.with_max_lag(Duration::from_secs(1)).unwrap();
    alerts.watch_lag(&inbox);

    // Read every 500 ms: past 1 s of lag, within a few seconds; then held back for the
    // interval (5 minutes), however many reads see it.
    let alerts_seen = received(&mut rx, Duration::from_secs(5)).await;
    assert_eq!(alerts_seen.len(), 1, "{alerts_seen:?}");
    assert_eq!(alerts_seen[0].kind(), AlertKind::Lagging);
    assert_eq!(alerts_seen[0].source(), None);
    assert!(alerts_seen[0].lag().unwrap() > Duration::from_secs(1));

    drop((alerts, inbox, store));
    let _ = std::fs::remove_dir_all(dir);
}

/// A verified event of `event_type`, signed by the standard scheme.
fn event(id: &str, event_type: &str) -> tower_webhook::Event {
    let body = common::event_body(id, event_type, "in_1");
    let headers = signed_headers(&Scheme::standard(), SECRET, id, &body);
    Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .verify(&headers, body.into())
        .unwrap()
}

/// A processor failing every event of type `bad`.
async fn fail_bad(
    e: tower_webhook::Event,
    _: tower_webhook::inbox::Attempt,
) -> Result<(), &'static str> {
    match e.event_type() {
        Some("bad") => Err("the CRM answered 500"),
        _ => Ok(()),
    }
}

/// A worker with alerts, 2 attempts: an event that always fails raises `Failing` on its
/// first attempt and `Dead` on its second; the next success raises `Recovered`.
async fn a_worker_tells_alerts_of_failing_dead_and_recovered(queue: Queue) {
    let (alerts, mut rx) = recording();
    let worker = queue.spawn(alerts);
    queue.accept(&event("evt_bad", "bad")).await;
    let mut first = received(&mut rx, Duration::from_secs(3)).await;
    // Each is sent on a task of its own: in either order.
    first.sort_by_key(|alert| alert.kind() != AlertKind::Failing);
    let kinds: Vec<AlertKind> = first.iter().map(Alert::kind).collect();
    assert_eq!(kinds, [AlertKind::Failing, AlertKind::Dead], "{first:?}");
    assert_eq!(first[1].event_id(), Some("evt_bad"));
    assert!(first[1]
        .details()
        .is_some_and(|d| d.contains("the CRM answered 500")));
    queue.accept(&event("evt_good", "good")).await;
    let then = received(&mut rx, Duration::from_secs(3)).await;
    let kinds: Vec<AlertKind> = then.iter().map(Alert::kind).collect();
    assert_eq!(kinds, [AlertKind::Recovered], "{then:?}");
    worker.shutdown().await;
}

enum Queue {
    Sql(Inbox),
    JetStream(tower_webhook::inbox::jetstream::JetStream),
}

impl Queue {
    async fn accept(&self, event: &tower_webhook::Event) {
        let accepted = match self {
            Self::Sql(inbox) => inbox.accept(event).await,
            Self::JetStream(js) => js.accept(event).await,
        };
        assert_eq!(accepted.unwrap(), Accepted::New);
    }

    fn spawn(&self, alerts: Alerts) -> tower_webhook::inbox::WorkerHandle {
        let backoff = (Duration::from_millis(10), Duration::from_millis(20));
        macro_rules! configured {
            ($worker:expr) => {
                $worker
                    .with_max_attempts(2)
                    .unwrap()
                    .with_backoff(backoff.0, backoff.1)
                    .unwrap()
                    .with_poll_interval(Duration::from_millis(50))
                    .unwrap()
                    .with_alerts(alerts)
                    .spawn()
            };
        }
        match self {
            Self::Sql(inbox) => configured!(tower_webhook::Worker::new(inbox, fail_bad)),
            Self::JetStream(js) => {
                configured!(tower_webhook::inbox::jetstream::JetStreamWorker::new(
                    js,
                    tower_webhook::store::MemoryStore::new(),
                    fail_bad
                ))
            }
        }
    }
}

#[tokio::test]
async fn sqlite_a_worker_tells_alerts_of_failing_dead_and_recovered() {
    let path = std::env::temp_dir().join(format!(
        "tower-webhook-alerts-worker-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let store = SqliteStore::open(&path).await.unwrap();
    a_worker_tells_alerts_of_failing_dead_and_recovered(Queue::Sql(Inbox::sqlite(&store))).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn jetstream_a_worker_tells_alerts_of_failing_dead_and_recovered() {
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let name = format!("tw_alerts_{}", uuid::Uuid::new_v4().simple());
    let js = tower_webhook::inbox::jetstream::JetStream::builder(client, &name)
        .with_memory_storage()
        .build()
        .await
        .unwrap();
    a_worker_tells_alerts_of_failing_dead_and_recovered(Queue::JetStream(js.clone())).await;
    js.delete().await.unwrap();
}

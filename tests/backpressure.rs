//! Backpressure's reading and whom it spares, on every queue the accept service stores
//! into — the SQL inbox on SQLite and on PostgreSQL, and NATS JetStream — against the real
//! servers: a reading taken during a storm does not refuse the first delivery after a
//! quiet drain, and GitHub's deliveries are spared whatever their source (a tenant's
//! `github/<tenant>`, or one the application named).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{at, fresh_pg_url, request, verifier, NOW};
use http::StatusCode;
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Accept, Attempt, Backpressure, Inbox, Worker, WorkerHandle};
use tower_webhook::store::{MemoryStore, PgStore, SqliteStore};
use tower_webhook::verify::{TenantFrom, Tenants};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Where the events wait: each test runs once on each.
enum Queue {
    Sql(Inbox),
    JetStream(JetStream),
}

impl Queue {
    async fn sqlite() -> Self {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-backpressure-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        Self::Sql(Inbox::sqlite(&SqliteStore::open(path).await.unwrap()))
    }

    async fn postgres() -> Self {
        let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
        Self::Sql(Inbox::postgres(&store))
    }

    /// A stream of this test's own, in memory.
    async fn jetstream() -> Self {
        let client = async_nats::connect(common::nats_url())
            .await
            .expect("NATS with JetStream must be running (.ci/services starts it)");
        let name = format!("tw_bp_{}", uuid::Uuid::new_v4().simple());
        let jetstream = JetStream::builder(client, &name)
            .with_memory_storage()
            .build()
            .await
            .unwrap();
        Self::JetStream(jetstream)
    }

    fn accept_service(&self) -> Accept {
        match self {
            Self::Sql(inbox) => inbox.accept_service(),
            Self::JetStream(jetstream) => jetstream.accept_service(),
        }
    }

    async fn queued(&self) -> u64 {
        match self {
            Self::Sql(inbox) => inbox.counts().await.unwrap().queued,
            Self::JetStream(jetstream) => jetstream.counts().await.unwrap().queued,
        }
    }

    /// A worker that counts the events it handled, polling quickly.
    fn spawn(&self, handled: Arc<AtomicUsize>) -> WorkerHandle {
        let processor = move |_: Event, _: Attempt| {
            let handled = handled.clone();
            async move {
                handled.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            }
        };
        let poll = Duration::from_millis(50);
        match self {
            Self::Sql(inbox) => Worker::new(inbox, processor)
                .with_poll_interval(poll)
                .unwrap()
                .spawn(),
            Self::JetStream(js) => JetStreamWorker::new(js, MemoryStore::new(), processor)
                .with_poll_interval(poll)
                .unwrap()
                .spawn(),
        }
    }
}

/// Delivers `id` signed in `scheme`, verified by `verify`, to `accept`; at `path`.
async fn deliver_through(
    verify: VerifyWebhookLayer,
    accept: &Accept,
    scheme: &Scheme,
    id: &str,
    path: &str,
) -> StatusCode {
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"o_{id}"}}}}}}"#);
    let mut headers = scheme.sign([SECRET], id, at(NOW), body.as_bytes()).unwrap();
    headers.insert("x-github-event", http::HeaderValue::from_static("push"));
    let mut req: http::Request<Full<Bytes>> = request(headers, body);
    *req.uri_mut() = path.parse().unwrap();
    let response = verify.layer(accept.clone()).oneshot(req).await.unwrap();
    response.status()
}

/// Delivers `id` signed in `scheme` (its source the scheme's name) to `accept`.
async fn deliver(accept: &Accept, scheme: Scheme, id: &str) -> StatusCode {
    let verify = VerifyWebhookLayer::new(verifier(scheme.clone(), &[SECRET]));
    deliver_through(verify, accept, &scheme, id, "/webhooks").await
}

/// Backpressure at 1 s over 3 events queued and no worker, until a retrying provider's
/// delivery is refused; returns the accept service, refusing.
/// `round` names this call's events apart from another's.
async fn lagging(queue: &Queue, backpressure: Backpressure, round: &str) -> Accept {
    let accept = queue.accept_service().with_backpressure(backpressure);
    for i in 0..3 {
        let status = deliver(&accept, Scheme::standard(), &format!("evt_{round}_{i}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "before any lag");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    for n in 0.. {
        let id = format!("evt_{round}_late_{n}");
        let status = deliver(&accept, Scheme::standard(), &id).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return accept;
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

/// Refused during the storm; then the workers drain the queue while nothing arrives, and
/// the reading the storm left behind ages past the refresh interval (500 ms): the first
/// delivery after it is stored, not answered 503 from that reading.
async fn the_first_delivery_after_a_quiet_drain_is_not_refused_by_a_stale_reading(queue: Queue) {
    let accept = lagging(&queue, Backpressure::max_lag(Duration::from_secs(1)), "a").await;
    let handled = Arc::new(AtomicUsize::new(0));
    let worker = queue.spawn(handled.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue.queued().await > 0 {
        assert!(Instant::now() < deadline, "never drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let status = deliver(&accept, Scheme::standard(), "evt_after_quiet").await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "the first delivery after the drain was refused from the storm's reading"
    );
    // And a fresh reading of a lagging queue still refuses: the gate is not off.
    worker.shutdown().await;
    let accept = lagging(&queue, Backpressure::max_lag(Duration::from_secs(1)), "b").await;
    let status = deliver(&accept, Scheme::standard(), "evt_refused").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// While the queue lags, GitHub's deliveries are spared whatever their source: a tenant's
/// (`github/acme`, verified with `Tenants`) and one named by the application; `refuse`
/// of the provider refuses them all, and `spare` of a source still spares it.
async fn github_tenants_and_renamed_sources_are_spared_by_provider(queue: Queue) {
    let accept = lagging(&queue, Backpressure::max_lag(Duration::from_secs(1)), "a").await;
    let github = Scheme::github();
    let tenants = Tenants::new(
        Scheme::github(),
        TenantFrom::path_segment(1),
        |tenant: String| async move {
            Ok::<_, std::io::Error>((tenant == "acme").then(|| vec![SECRET.to_owned()]))
        },
    )
    .unwrap();
    let per_tenant = VerifyWebhookLayer::per_tenant(tenants.clone());
    let before = queue.queued().await;
    let status = deliver_through(per_tenant, &accept, &github, "gh-1", "/webhooks/acme").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "a GitHub tenant is spared");
    let renamed = VerifyWebhookLayer::new(verifier(Scheme::github(), &[SECRET]).with_source("gh"));
    let status = deliver_through(renamed, &accept, &github, "gh-2", "/webhooks").await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "GitHub under another source"
    );
    let status = deliver(&accept, Scheme::standard(), "evt_still_refused").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a retrying provider"
    );
    assert_eq!(
        queue.queued().await,
        before + 2,
        "both GitHub events stored"
    );

    // `refuse("github")` refuses its tenants too; a source spared by name is spared.
    let rule = Backpressure::max_lag(Duration::from_secs(1))
        .refuse("github")
        .spare("standard");
    let accept = lagging_with_github(&queue, rule).await;
    let per_tenant = VerifyWebhookLayer::per_tenant(tenants);
    let status = deliver_through(per_tenant, &accept, &github, "gh-3", "/webhooks/acme").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "refused by provider"
    );
    let status = deliver(&accept, Scheme::standard(), "evt_spared_by_name").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "spared by its source");
}

/// As [`lagging`], for a rule that spares `standard` and refuses GitHub: the refusal
/// waited for is GitHub's.
async fn lagging_with_github(queue: &Queue, backpressure: Backpressure) -> Accept {
    let accept = queue.accept_service().with_backpressure(backpressure);
    let deadline = Instant::now() + Duration::from_secs(5);
    for n in 0.. {
        let status = deliver(&accept, Scheme::github(), &format!("gh-late-{n}")).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return accept;
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

// On a runtime of two threads, as a server's.
macro_rules! on_every_queue {
    ($($test:ident),* $(,)?) => {
        mod sqlite { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::sqlite().await).await; })* }
        mod postgres { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::postgres().await).await; })* }
        mod jetstream { use super::*; $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$test(Queue::jetstream().await).await; })* }
    };
}

on_every_queue!(
    the_first_delivery_after_a_quiet_drain_is_not_refused_by_a_stale_reading,
    github_tenants_and_renamed_sources_are_spared_by_provider,
);

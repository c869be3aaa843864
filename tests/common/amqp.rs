//! What the RabbitMQ tests share (feature `amqp`): names of a test's own, a raw channel of
//! the test's own (not the crate's), and a signed delivery through the layers into the
//! accept service.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::amqp::Amqp;
use tower_webhook::store::MemoryStore;
use tower_webhook::{DedupeLayer, Scheme, VerifyWebhookLayer};

use super::{at, request, verifier, NOW, TEST_SECRET};

/// A name of a test's own: `tw_test_<uuid>`, for its exchange and queue.
pub fn name() -> String {
    format!("tw_test_{}", uuid::Uuid::new_v4().simple())
}

/// The exchange and queue `name` (declared when missing) on the broker at `url`, its
/// accepts waiting up to 2 s for a confirm.
pub async fn named(url: &str, name: &str) -> Amqp {
    Amqp::builder(url)
        .with_exchange(name)
        .unwrap()
        .with_queue(name)
        .unwrap()
        .with_confirm_timeout(std::time::Duration::from_secs(2))
        .unwrap()
        .build()
        .await
        .unwrap()
}

/// A raw channel on a connection of the test's own: reads the broker as it is.
pub async fn raw_channel() -> lapin::Channel {
    let url = super::amqp_url();
    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    connection.create_channel().await.unwrap()
}

/// One signed delivery of `id` through `VerifyWebhookLayer` and `DedupeLayer` on `store`
/// into `amqp`'s accept service: its status, and whether it said `Retry-After`.
pub async fn deliver(amqp: &Amqp, store: &MemoryStore, id: &str) -> (StatusCode, bool) {
    let verify = VerifyWebhookLayer::new(verifier(Scheme::standard(), &[TEST_SECRET]));
    let body = r#"{"type":"order.paid","data":{"object":{"id":"o"}}}"#;
    let headers = Scheme::standard()
        .sign([TEST_SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    let req: http::Request<Full<Bytes>> = request(headers, body);
    let svc = ServiceBuilder::new()
        .layer(verify)
        .layer(DedupeLayer::new(store.clone()))
        .service(amqp.accept_service());
    let response = svc.oneshot(req).await.unwrap();
    let retry_after = response.headers().contains_key("retry-after");
    (response.status(), retry_after)
}

/// Runs `rabbitmqctl` on the local broker, within a minute or the test fails.
pub fn rabbitmqctl(args: &[&str]) {
    // Within a minute, or the test fails (a broker that no longer answers hangs it).
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl (of the broker at AMQP_URL) must be installed for this test");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the broker's application again however the test ends, and waits (up to a
/// minute) until it is up.
pub struct Restart;

impl Drop for Restart {
    fn drop(&mut self) {
        for args in [
            ["60", "rabbitmqctl", "start_app"],
            ["60", "rabbitmqctl", "await_startup"],
        ] {
            let _ = std::process::Command::new("timeout").args(args).output();
        }
    }
}

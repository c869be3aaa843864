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

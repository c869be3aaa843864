//! An inbox holding a row in every state an operator looks at, made the way production
//! makes them: signed deliveries through `VerifyWebhookLayer`, and workers whose
//! processor fails.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{Attempt, Inbox, Worker};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use super::{at, request, verifier, NOW};

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The error the dead rows' processor gave.
/// A verifier of Standard Webhooks deliveries under `source`, to ingest fetched events as
/// its deliveries are keyed.
pub fn standard(source: &str) -> tower_webhook::Verifier {
    tower_webhook::Verifier::new(tower_webhook::Scheme::standard(), [SECRET])
        .unwrap()
        .with_source(source)
}

pub const DEAD_ERROR: &str = "order not found";
/// The error the failing row's processor gave.
pub const FAILING_ERROR: &str = "provider API timed out";

/// The body `deliver` sends for `id`.
pub fn body(id: &str) -> String {
    format!(r#"{{"type":"order.paid","livemode":true,"data":{{"object":{{"id":"pi_{id}"}}}}}}"#)
}

/// Posts a signed Standard Webhooks delivery of `id` to verify + accept.
pub async fn deliver(inbox: &Inbox, id: &str) -> StatusCode {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(inbox.accept_service());
    let body = body(id);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    let req: http::Request<Full<Bytes>> = request(headers, body);
    svc.oneshot(req).await.unwrap().status()
}

/// Polls `check` until it holds (at most 6 s).
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Fills `inbox` (source `standard`) with:
/// - `evt_dead_1` … `evt_dead_{dead}`: dead after 2 attempts failed with [`DEAD_ERROR`];
/// - `evt_done`: processed at its first attempt;
/// - `evt_failing`: queued again, due in 30 to 60 minutes, after one attempt failed with
///   [`FAILING_ERROR`];
/// - `evt_queued`: queued, never attempted.
pub async fn seed(inbox: &Inbox, dead: usize) {
    assert_eq!(deliver(inbox, "evt_done").await, StatusCode::NO_CONTENT);
    for i in 1..=dead {
        assert_eq!(
            deliver(inbox, &format!("evt_dead_{i}")).await,
            StatusCode::NO_CONTENT
        );
    }
    let dying = Worker::new(inbox, |e: Event, _: Attempt| async move {
        match e.id().unwrap().starts_with("evt_dead_") {
            true => Err(DEAD_ERROR),
            false => Ok(()),
        }
    })
    .with_max_attempts(2)
    .unwrap()
    .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    eventually("the dead rows dead, evt_done processed", async || {
        let c = inbox.counts().await.unwrap();
        (c.dead, c.processed) == (dead as u64, 1)
    })
    .await;
    dying.shutdown().await;

    assert_eq!(deliver(inbox, "evt_failing").await, StatusCode::NO_CONTENT);
    let failing = Worker::new(inbox, |_: Event, _: Attempt| async { Err(FAILING_ERROR) })
        .with_backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn();
    eventually("evt_failing failed once", async || {
        let e = inbox.event("standard", "evt_failing").await.unwrap();
        e.is_some_and(|e| e.summary.last_error.is_some())
    })
    .await;
    failing.shutdown().await;

    assert_eq!(deliver(inbox, "evt_queued").await, StatusCode::NO_CONTENT);
    let c = inbox.counts().await.unwrap();
    assert_eq!(
        (c.queued, c.processing, c.processed, c.dead),
        (2, 0, 1, dead as u64),
        "{c:?}"
    );
}

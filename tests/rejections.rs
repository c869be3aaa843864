//! Every layer's own answers: a typed `Rejection` in the extensions, a missing-layer text
//! that names the layer it came from, and a response each layer lets you replace.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use common::{at, fresh_pg_url, request, verifier, NOW};
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::{PgTx, TxDedupeLayer};
use tower_webhook::filter::EventFilterLayer;
use tower_webhook::inbox::Inbox;
use tower_webhook::response::{Rejection, RejectionKind};
use tower_webhook::store::{MemoryStore, SqliteStore};
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A signed Standard Webhooks delivery of `id`.
fn delivery(id: &str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"type":"invoice.paid","id":"{id}"}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    request(headers, body)
}

fn verify() -> VerifyWebhookLayer {
    VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]))
}

/// A handler that counts its runs and answers 200.
fn handler(runs: Arc<AtomicUsize>) -> Handler {
    Handler::new(service_fn(move |_req: Request<Full<Bytes>>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    }))
}

type Handler = BoxCloneSyncService<Request<Full<Bytes>>, Response<Full<Bytes>>, Infallible>;

/// A JSON body for any rejection, with a status of its own to tell it from the default.
fn json(rejection: &Rejection) -> Response<Bytes> {
    let body = format!(r#"{{"error":"{:?}"}}"#, rejection.kind());
    Response::builder()
        .status(StatusCode::IM_A_TEAPOT)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body))
        .unwrap()
}

/// Status, body, content type and the rejection's kind of `response`.
async fn parts<B>(response: Response<B>) -> (StatusCode, String, Option<RejectionKind>)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let status = response.status();
    let kind = response
        .extensions()
        .get::<Rejection>()
        .map(Rejection::kind);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap(), kind)
}

#[tokio::test]
async fn each_layer_without_the_verify_layer_names_itself_in_its_500() {
    let runs = Arc::new(AtomicUsize::new(0));
    let unverified = || delivery("evt_unverified");

    let dedupe = DedupeLayer::new(MemoryStore::new()).layer(handler(runs.clone()));
    let (status, text, kind) = parts(dedupe.oneshot(unverified()).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingEvent)
        )
    );
    assert!(text.contains("in front of DedupeLayer"), "{text}");

    let filter = EventFilterLayer::new().layer(handler(runs.clone()));
    let (status, text, kind) = parts(filter.oneshot(unverified()).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingEvent)
        )
    );
    assert!(text.contains("in front of EventFilterLayer"), "{text}");

    // The transactional layer answers before it touches its pool.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let tx = TxDedupeLayer::from_migrated_pool(pool).layer(handler(runs.clone()));
    let (status, text, kind) = parts(tx.oneshot(unverified()).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingEvent)
        )
    );
    assert!(text.contains("in front of TxDedupeLayer"), "{text}");

    let path = std::env::temp_dir().join(format!("rejections-{}.db", std::process::id()));
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap());
    let response = inbox.accept_service().oneshot(unverified()).await.unwrap();
    let (status, text, kind) = parts(response).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingEvent)
        )
    );
    assert!(
        text.contains("in front of the inbox's accept service"),
        "{text}"
    );
    let _ = std::fs::remove_file(&path);

    // The extractors: the event's and the transaction's.
    let app = Router::new()
        .route("/event", post(|_: Event| async { "ran" }))
        .route("/tx", post(|_: PgTx| async { "ran" }));
    let to = |uri: &str| Request::post(uri).body(axum::body::Body::empty()).unwrap();
    let (status, text, kind) = parts(app.clone().oneshot(to("/event")).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingEvent)
        )
    );
    assert!(text.contains("in front of this route"), "{text}");
    let (status, text, kind) = parts(app.oneshot(to("/tx")).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(RejectionKind::MissingTransaction)
        )
    );
    assert!(
        text.contains("TxDedupeLayer in front of this route"),
        "{text}"
    );

    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");
}

#[tokio::test]
async fn dedupe_replaces_its_own_answers_and_keeps_the_reason() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(verify())
        .layer(DedupeLayer::new(MemoryStore::new()).with_rejection(json))
        .service(handler(runs.clone()));
    let (status, body, kind) = parts(svc.clone().oneshot(delivery("evt_1")).await.unwrap()).await;
    assert_eq!(
        (status, body.as_str(), kind),
        (StatusCode::OK, "ok", None),
        "the handler's own"
    );
    let (status, body, kind) = parts(svc.oneshot(delivery("evt_1")).await.unwrap()).await;
    assert_eq!(status, StatusCode::IM_A_TEAPOT);
    assert_eq!(body, r#"{"error":"Duplicate"}"#);
    assert_eq!(kind, Some(RejectionKind::Duplicate));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn no_key_is_a_400_rejection() {
    let svc = DedupeLayer::new(MemoryStore::new())
        .with_key(|_| None)
        .layer(handler(Arc::default()));
    let (status, _, kind) = parts(svc.oneshot(delivery("evt_k")).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (StatusCode::BAD_REQUEST, Some(RejectionKind::NoKey))
    );
}

#[tokio::test]
async fn the_filter_replaces_its_skip_and_keeps_the_reason() {
    let svc = ServiceBuilder::new()
        .layer(verify())
        .layer(
            EventFilterLayer::new()
                .add_type("charge.*")
                .with_rejection(json),
        )
        .service(handler(Arc::default()));
    let (status, body, kind) = parts(svc.oneshot(delivery("evt_f")).await.unwrap()).await;
    assert_eq!(status, StatusCode::IM_A_TEAPOT);
    assert_eq!(body, r#"{"error":"SkippedType"}"#);
    assert_eq!(kind, Some(RejectionKind::SkippedType));
}

#[tokio::test]
async fn the_inbox_accept_replaces_a_duplicate_and_a_503_but_not_a_new_events_204() {
    let path = std::env::temp_dir().join(format!("rejections-accept-{}.db", std::process::id()));
    let store = SqliteStore::open(&path).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    let svc = verify().layer(inbox.accept_service().with_rejection(json));
    let (status, body, kind) = parts(svc.clone().oneshot(delivery("evt_a")).await.unwrap()).await;
    assert_eq!(
        (status, body.as_str(), kind),
        (StatusCode::NO_CONTENT, "", None)
    );
    let (status, _, kind) = parts(svc.clone().oneshot(delivery("evt_a")).await.unwrap()).await;
    assert_eq!(
        (status, kind),
        (StatusCode::IM_A_TEAPOT, Some(RejectionKind::Duplicate))
    );

    // The database goes away: a 503, replaced, with the reason's Retry-After.
    store.pool().close().await;
    let response = svc.oneshot(delivery("evt_b")).await.unwrap();
    assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    let (status, _, kind) = parts(response).await;
    assert_eq!(
        (status, kind),
        (
            StatusCode::IM_A_TEAPOT,
            Some(RejectionKind::StoreUnavailable)
        )
    );
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn the_transactional_layer_replaces_a_duplicate_and_keeps_the_reason() {
    let pool = sqlx::PgPool::connect(&fresh_pg_url().await).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(verify())
        .layer(TxDedupeLayer::new(pool).await.unwrap().with_rejection(json))
        .service(handler(runs.clone()));
    let (status, _, kind) = parts(svc.clone().oneshot(delivery("evt_t")).await.unwrap()).await;
    assert_eq!((status, kind), (StatusCode::OK, None));
    let (status, body, kind) = parts(svc.oneshot(delivery("evt_t")).await.unwrap()).await;
    assert_eq!(status, StatusCode::IM_A_TEAPOT);
    assert_eq!(body, r#"{"error":"Duplicate"}"#);
    assert_eq!(kind, Some(RejectionKind::Duplicate));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

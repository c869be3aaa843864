//! Let each event through once: [`DedupeLayer`] claims `(source, event id)` atomically in
//! a [store](crate::store) before the handler runs.
//!
//! | the store says | response | handler called? |
//! |---|---|---|
//! | new (or released, or its lease ran out) | the handler's own | yes |
//! | done | 204 | no |
//! | claimed by a live attempt | 409 + `Retry-After` | no |
//! | store unreachable or failing | 503 + `Retry-After` | no |
//!
//! After the handler: a 2xx marks the key done (fenced on the claim's token, so a slow
//! attempt whose lease ran out cannot overwrite a newer one); anything else — a non-2xx,
//! an error, a panic, a dropped request — releases the claim so the provider's retry runs.
//! A crashed process's claim frees itself when its lease runs out.
//!
//! Put it behind `VerifyWebhookLayer`: the key comes from the verified
//! [`Event`](crate::Event) (a missing one is a 500 that names the fix; one without an id
//! is a 400), or from [`DedupeLayer::with_key`].
//!
//! The outcome rides in the response's extensions as [`Deduped`] when the middleware
//! answered by itself.
//!
//! # Example
//!
//! ```
//! use std::time::SystemTime;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_webhook::store::MemoryStore;
//! use tower_webhook::{DedupeLayer, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let service = ServiceBuilder::new()
//!     .layer(VerifyWebhookLayer::new(Verifier::new(Scheme::standard(), [secret])?))
//!     .layer(DedupeLayer::new(MemoryStore::new()))
//!     .service(service_fn(|_req: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("handled"))))
//!     }));
//!
//! let body = b"{}";
//! let headers = Scheme::standard().sign([secret], "msg_1", SystemTime::now(), body)?;
//! let delivery = || {
//!     let mut request = Request::post("/").body(Full::new(Bytes::from_static(body))).unwrap();
//!     *request.headers_mut() = headers.clone();
//!     request
//! };
//! assert_eq!(service.clone().oneshot(delivery()).await?.status(), StatusCode::OK);
//! // The provider delivers it again: acknowledged, the handler does not run.
//! assert_eq!(service.oneshot(delivery()).await?.status(), StatusCode::NO_CONTENT);
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;
mod service;

pub(crate) use self::service::MISSING_EVENT;

pub use self::future::ResponseFuture;
pub use self::layer::DedupeLayer;
pub use self::service::Dedupe;
pub use crate::body::ResponseBody;

impl Deduped {
    /// The middleware's own answer for this outcome, with `Retry-After` where given and
    /// the outcome in the extensions. Shared by `Dedupe` and `PgTxDedupe`.
    pub(crate) fn response<T>(self, retry_after: Option<u64>) -> http::Response<ResponseBody<T>> {
        let (status, text) = match self {
            Deduped::Done => (http::StatusCode::NO_CONTENT, ""),
            Deduped::InFlight => (http::StatusCode::CONFLICT, "webhook delivery in progress"),
            Deduped::StoreUnavailable => (
                http::StatusCode::SERVICE_UNAVAILABLE,
                "webhook store unavailable",
            ),
        };
        let mut response = ResponseBody::text(status, text);
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        response.extensions_mut().insert(self);
        response
    }
}

/// Why `Dedupe` answered without calling the handler; in the response's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deduped {
    /// The event was already handled (204).
    Done,
    /// Another attempt is handling it now (409).
    InFlight,
    /// The store could not answer (503).
    StoreUnavailable,
}

//! Let each event through once: [`DedupeLayer`] claims `(source, event id)` atomically in
//! a [store](crate::store) before the handler runs.
//!
//! | the store says | response | handler called? |
//! |---|---|---|
//! | new (or released, or its lease ran out) | the handler's own | yes |
//! | done | 204 | no |
//! | claimed by a live attempt | 409 + `Retry-After` | no |
//! | store unreachable or failing | 503 + `Retry-After` | no |
//! | store refuses the key as invalid input | 500 | no |
//!
//! Once claimed, the handler runs on a task of its own, to its end: a client that hangs
//! up (or a `TimeoutLayer` that fires) drops the response, not the work, so an effect
//! that has started is never repeated by the provider's retry. While it runs, the claim
//! is renewed every third of the lease (fenced on its token), for up to the max run time
//! ([`DedupeLayer::with_max_run`]). After the handler:
//!
//! - a 2xx marks the key done — before the 2xx goes out, retried while the lease lasts,
//!   fenced on the claim's token so a slow attempt whose lease ran out cannot overwrite a
//!   newer one;
//! - a non-2xx, an error or a panic releases the claim so the provider's retry runs;
//! - a crashed process's claim frees itself when its lease runs out: the only way a
//!   handler runs twice here is a crash (or a store outage longer than the lease) in the
//!   middle of it. Effects in PostgreSQL can close that gap with
//!   [`PgTxDedupeLayer`](crate::pg_tx::PgTxDedupeLayer).
//!
//! When a handler's claim could not be kept (taken over after its lease ran out, or "done"
//! not heard by the store), its response carries [`ClaimLost`].
//!
//! The handler's future must be `Send + 'static` (it is spawned on the Tokio runtime, as
//! axum's, hyper's and tonic's are).
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
            Deduped::StoreRefused => (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "webhook store refused the event",
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

/// In the extensions of a handler's response when its claim could not be kept: the
/// handler's work is done, but the key is not (yet) recorded as done under this attempt,
/// so another attempt may run the handler too. Logged at `warn` (feature `tracing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimLost {
    /// The lease ran out while the handler ran — the store was out of reach for longer
    /// than the lease, or the handler ran past the max run time — and another attempt
    /// took the key over.
    TakenOver,
    /// The store could not hear "done" before the lease would end: the key frees itself
    /// when the lease runs out, and a later redelivery runs again.
    Unrecorded,
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
    /// The store refused the event's key as invalid input
    /// ([`StoreErrorKind::InvalidInput`](crate::store::StoreErrorKind::InvalidInput)):
    /// trying again would not help (500).
    StoreRefused,
}

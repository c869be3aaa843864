//! [`Accept`]: the Tower service that stores verified deliveries in the inbox (SQL, or
//! JetStream).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower_service::Service;

use super::backpressure::{Backpressure, Gate};
use super::{Accepted, Counts};
use crate::response::{self, Needs, RejectFn, Rejection};
use crate::store::{StoreError, StoreErrorKind};
use crate::{metrics, Event};

/// A [`Destination`]'s answer, borrowing it (and the event) while it runs.
pub(crate) type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Where [`Accept`] stores a delivery: an [`Inbox`](super::Inbox), or JetStream.
pub(crate) trait Destination: Send + Sync + 'static {
    fn accept<'a>(&'a self, event: &'a Event) -> Answer<'a, Accepted>;
    /// Whether [`accept_with`](Self::accept_with) stores the request's headers (the SQL
    /// inbox does), so `Accept` prepares them only for a destination that keeps them.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    fn keeps_headers(&self) -> bool {
        false
    }
    /// [`accept`](Self::accept), with the delivery's request headers as the SQL inbox
    /// stores them (`None` where the destination does not keep them), and the sender's
    /// trace context (`traceparent`: feature `otel`).
    fn accept_with<'a>(
        &'a self,
        event: &'a Event,
        headers: Option<String>,
        sent: crate::span::TraceContext,
    ) -> Answer<'a, Accepted> {
        let _ = (headers, sent);
        self.accept(event)
    }
    /// The queue's counts (its lag: `oldest_due`).
    fn counts(&self) -> Answer<'_, Counts>;
}

/// Stores each verified delivery and answers at once: 204 when stored (duplicates too),
/// 503 + `Retry-After` when it could not be stored (the provider retries), 500 when the
/// store refused it as invalid input or without `VerifyWebhookLayer` in front. Serve it with axum's `post_service`.
///
/// With [`with_backpressure`](Self::with_backpressure), it also answers 503 +
/// `Retry-After` without storing while the queue lags too far behind.
///
/// The SQL inbox's `Accept` stores the delivery's request headers with the event, for
/// operators ([`StoredEvent::headers`]), **never its
/// credentials**: no header whose name says it carries one (`Authorization`, `Cookie`,
/// `X-Gitlab-Token`, `Cf-Access-Jwt-Assertion`, …), none the application names, and no
/// value marked [sensitive](http::HeaderValue::set_sensitive) before it; at most 8 KiB.
/// The scheme's own signature, id and timestamp headers are kept. What exactly:
/// [`StoredHeaders`], set with `with_stored_headers`. JetStream's
/// keeps none.
///
/// A duplicate's 204, the 503 and the 500 carry a [`Rejection`] in their extensions;
/// [`with_rejection`](Self::with_rejection) replaces them (see [`crate::response`]).
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "
[`StoredEvent::headers`]: super::StoredEvent::headers
[`StoredHeaders`]: super::StoredHeaders"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "
[`StoredEvent::headers`]: crate#features
[`StoredHeaders`]: crate#features"
)]
#[derive(Clone)]
pub struct Accept {
    into: Arc<dyn Destination>,
    rejection: Option<Arc<RejectFn<Rejection>>>,
    backpressure: Option<Arc<Gate>>,
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    stored_headers: Arc<super::StoredHeaders>,
}

/// Response future of [`Accept`]: boxed, as it is one database round trip.
pub type AcceptFuture =
    Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

impl Accept {
    pub(super) fn new(into: Arc<dyn Destination>) -> Self {
        Self {
            into,
            rejection: None,
            backpressure: None,
            #[cfg(any(feature = "sqlite", feature = "postgres"))]
            stored_headers: Arc::default(),
        }
    }

    /// Replaces which request headers the SQL inbox stores with an event (default:
    /// [`StoredHeaders::all_but_credentials`](super::StoredHeaders::all_but_credentials));
    /// JetStream's stores none.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[must_use]
    pub fn with_stored_headers(mut self, headers: super::StoredHeaders) -> Self {
        self.stored_headers = Arc::new(headers);
        self
    }

    /// Refuses deliveries (503 + `Retry-After`, not stored) of the sources whose providers
    /// retry while the queue's oldest due event has waited longer than the bound: see
    /// [`Backpressure`].
    #[must_use]
    pub fn with_backpressure(mut self, backpressure: Backpressure) -> Self {
        self.backpressure = Some(Arc::new(Gate::new(backpressure)));
        self
    }

    /// Replaces the service's responses for a duplicate (204), a store that could not
    /// store (503) and a missing event (500); the [`Rejection`] is still added to the
    /// response's extensions. A new event's 204 is not replaced.
    #[must_use]
    pub fn with_rejection(
        mut self,
        rejection: impl Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.rejection = Some(Arc::new(rejection));
        self
    }
}

impl std::fmt::Debug for Accept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accept")
            .field("custom_rejection", &self.rejection.is_some())
            .field(
                "backpressure",
                &self.backpressure.as_ref().map(|gate| gate.rule()),
            )
            .finish_non_exhaustive()
    }
}

/// What `Retry-After` says when the event could not be stored.
const RETRY_AFTER_SECS: u64 = 5;

impl<B> Service<Request<B>> for Accept {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = AcceptFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (into, custom) = (self.into.clone(), self.rejection.clone());
        let event = req.extensions().get::<Event>().cloned();
        // Only what the destination keeps, and only for a verified delivery.
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        let headers = event
            .as_ref()
            .filter(|_| self.into.keeps_headers())
            .map(|event| self.stored_headers.stored(req.headers(), event.scheme()));
        #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
        let headers = None;
        // Read only for a verified delivery (and only with the feature `otel`).
        let sent = match &event {
            Some(_) => crate::span::TraceContext::sent(req.headers()),
            None => crate::span::TraceContext::default(),
        };
        let gate = self.backpressure.clone();
        Box::pin(async move {
            let reject = |r| Ok(response::respond(r, custom.as_ref()).map(Full::new));
            let Some(event) = event else {
                return reject(Rejection::missing_event(Needs::Accept));
            };
            if let Some(gate) = gate.filter(|gate| gate.refuses(&event, &into)) {
                metrics::backlogged(event.metrics());
                return reject(Rejection::backlogged(gate.rule().retry_after_secs()));
            }
            match into.accept_with(&event, headers, sent).await {
                Ok(Accepted::New) => {
                    let mut stored = Response::new(Full::new(Bytes::new()));
                    *stored.status_mut() = StatusCode::NO_CONTENT;
                    Ok(stored)
                }
                Ok(Accepted::Duplicate) => {
                    metrics::duplicate(event.metrics());
                    reject(Rejection::duplicate())
                }
                Err(error) => {
                    metrics::store_unavailable(event.metrics());
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", "inbox could not store an event: {error}");
                    // Invalid input would be refused again: no retry later.
                    match error.kind() {
                        StoreErrorKind::InvalidInput => reject(Rejection::store_refused()),
                        _ => reject(Rejection::store_unavailable(RETRY_AFTER_SECS)),
                    }
                }
            }
        })
    }
}

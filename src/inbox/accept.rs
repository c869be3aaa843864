//! [`Accept`]: the Tower service that stores verified deliveries in the inbox (SQL, or
//! JetStream).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tower_service::Service;

use super::Accepted;
use crate::store::{StoreError, StoreErrorKind};
use crate::{metrics, Event};

/// Where [`Accept`] stores a delivery: an [`Inbox`](super::Inbox), or JetStream.
pub(crate) trait Destination: Send + Sync + 'static {
    fn accept<'a>(
        &'a self,
        event: &'a Event,
    ) -> Pin<Box<dyn Future<Output = Result<Accepted, StoreError>> + Send + 'a>>;
}

/// Stores each verified delivery and answers at once: 204 when stored (duplicates too),
/// 503 + `Retry-After` when it could not be stored (the provider retries), 500 when the
/// store refused it as invalid input or without `VerifyWebhookLayer` in front. Serve it with axum's `post_service`.
#[derive(Clone)]
pub struct Accept {
    into: Arc<dyn Destination>,
}

/// Response future of [`Accept`]: boxed, as it is one database round trip.
pub type AcceptFuture =
    Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

impl Accept {
    pub(super) fn new(into: Arc<dyn Destination>) -> Self {
        Self { into }
    }
}

impl std::fmt::Debug for Accept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accept").finish_non_exhaustive()
    }
}

fn text(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    response
}

impl<B> Service<Request<B>> for Accept {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = AcceptFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let into = self.into.clone();
        let event = req.extensions().get::<Event>().cloned();
        Box::pin(async move {
            let Some(event) = event else {
                return Ok(text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    crate::dedupe::MISSING_EVENT,
                ));
            };
            Ok(match into.accept(&event).await {
                Ok(Accepted::New) => text(StatusCode::NO_CONTENT, ""),
                Ok(Accepted::Duplicate) => {
                    metrics::duplicate(event.metrics());
                    text(StatusCode::NO_CONTENT, "")
                }
                Err(error) => {
                    metrics::store_unavailable(event.metrics());
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", "inbox could not store an event: {error}");
                    if error.kind() == StoreErrorKind::InvalidInput {
                        // The same event would be refused again: no retry later.
                        text(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "webhook store refused the event",
                        )
                    } else {
                        text(StatusCode::SERVICE_UNAVAILABLE, "webhook store unavailable")
                    }
                }
            })
        })
    }
}

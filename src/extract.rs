//! The axum extractor for [`Event`] (feature `axum`).

use std::convert::Infallible;
use std::fmt;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;

use crate::Event;

/// Rejection of the [`Event`] extractor: the request did not pass through
/// [`VerifyWebhookLayer`](crate::VerifyWebhookLayer). A server bug, hence 500, with a
/// text that names the fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MissingEvent;

impl MissingEvent {
    const MESSAGE: &'static str = "no verified webhook Event in the request: add \
        tower_webhook::VerifyWebhookLayer in front of this route";
}

impl fmt::Display for MissingEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::MESSAGE)
    }
}

impl std::error::Error for MissingEvent {}

impl IntoResponse for MissingEvent {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, Self::MESSAGE).into_response()
    }
}

/// Extracts the verified event.
///
/// ```
/// use axum::{routing::post, Router};
/// use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};
///
/// async fn webhook(event: Event) -> &'static str {
///     println!("handled {}", event.id().unwrap_or("?"));
///     "ok"
/// }
///
/// # fn main() -> Result<(), tower_webhook::ConfigError> {
/// let verifier = Verifier::new(Scheme::github(), ["It's a Secret to Everybody"])?;
/// let app: Router = Router::new().route(
///     "/webhooks",
///     post(webhook).layer(VerifyWebhookLayer::new(verifier)),
/// );
/// # Ok(())
/// # }
/// ```
impl<S: Send + Sync> FromRequestParts<S> for Event {
    type Rejection = MissingEvent;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Event>().cloned().ok_or(MissingEvent)
    }
}

/// `Option<Event>`: `None` without the layer, for routes that take unverified requests too.
impl<S: Send + Sync> OptionalFromRequestParts<S> for Event {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Event>().cloned())
    }
}

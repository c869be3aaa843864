//! The axum extractor for [`Event`] (feature `axum`).

use std::convert::Infallible;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use http::request::Parts;

use crate::response::{Needs, Rejection};
use crate::Event;

/// Extracts the verified event; without [`VerifyWebhookLayer`](crate::VerifyWebhookLayer)
/// in front, a [`Rejection`] of kind `MissingEvent` (500, with a text that names the fix).
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
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let missing = Rejection::missing_event(Needs::Extractor);
        parts.extensions.get::<Event>().cloned().ok_or(missing)
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

//! What the layers answer on their own, instead of (or before) the handler: one
//! mechanism for all of them.
//!
//! Every answer a layer gives itself carries its reason in the response's extensions —
//! [`VerifyError`](crate::VerifyError) from `VerifyWebhookLayer`, a [`Rejection`] from
//! every other layer, the inbox's accept service and the extractors — so a layer outside
//! (logging, metrics, a JSON error body) can tell why. Each reason has a
//! [`status`](Rejection::status) and a short fixed [`body_text`](Rejection::body_text),
//! and each layer's `with_rejection` replaces the default response with your own:
//!
//! ```
//! use bytes::Bytes;
//! use http::{header, Response};
//! use tower_webhook::response::Rejection;
//! use tower_webhook::store::MemoryStore;
//! use tower_webhook::DedupeLayer;
//!
//! let json = |rejection: &Rejection| {
//!     let body = format!(r#"{{"error":"{}"}}"#, rejection.body_text());
//!     Response::builder()
//!         .status(rejection.status())
//!         .header(header::CONTENT_TYPE, "application/json")
//!         .body(Bytes::from(body))
//!         .unwrap()
//! };
//! let layer = DedupeLayer::new(MemoryStore::new()).with_rejection(json);
//! # let _ = layer;
//! ```
//!
//! A `Retry-After` the reason calls for (an in-flight 409, a store's 503), and the `Allow`
//! of a 405, are added to a replaced response too, unless it sets one itself.

mod body;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

pub use self::body::ResponseBody;

/// Why a layer answered a delivery itself; in the response's extensions. See the
/// [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    kind: RejectionKind,
    text: &'static str,
    retry_after: Option<u64>,
}

/// What kind of [`Rejection`] it is. Its status is fixed by the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The event was already handled or stored (204): a duplicate delivery.
    Duplicate,
    /// Another attempt is handling the event now (409 + `Retry-After`).
    InFlight,
    /// The store could not answer or could not record the event (503 + `Retry-After`):
    /// the provider retries.
    StoreUnavailable,
    /// The inbox's oldest due event has waited longer than its
    /// [`Backpressure`] allows (503 + `Retry-After`): the
    /// delivery was not stored, and the provider retries later.
    ///
    #[cfg_attr(
        any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        ),
        doc = "[`Backpressure`]: crate::inbox::Backpressure"
    )]
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )),
        doc = "[`Backpressure`]: crate#features"
    )]
    Backlogged,
    /// The store refused the event's key as invalid input
    /// ([`StoreErrorKind::InvalidInput`]):
    /// the same delivery would be refused again (500, no `Retry-After`).
    ///
    #[cfg_attr(
        feature = "dedupe",
        doc = "[`StoreErrorKind::InvalidInput`]: crate::store::StoreErrorKind::InvalidInput"
    )]
    #[cfg_attr(
        not(feature = "dedupe"),
        doc = "[`StoreErrorKind::InvalidInput`]: crate#features"
    )]
    StoreRefused,
    /// `EventFilterLayer` skipped the event: its type is not allowed (204).
    SkippedType,
    /// `EventFilterLayer` skipped the event: its livemode does not match the policy (204).
    SkippedLivemode,
    /// `EventFilterLayer` has type rules but the type comes from a header the signature
    /// does not cover (500: a configuration to fix, see its text).
    UnsignedType,
    /// `DedupeLayer::with_key` found no key in the request (400).
    NoKey,
    /// No verified [`Event`](crate::Event) in the request: `VerifyWebhookLayer` is
    /// missing in front of the layer, service or extractor that answered (500: a server
    /// bug; the text names the fix).
    MissingEvent,
    /// No transaction in the request: the transactional dedupe layer is missing in front
    /// of the `PgTx` extractor (500).
    MissingTransaction,
    /// The handler answered 2xx but kept the transaction (a task of its own still holds
    /// it): it is rolled back, never committed behind work that may still run (500).
    TransactionKept,
    /// The handler answered 2xx, but one of its statements had failed the transaction:
    /// it is rolled back (500; the provider retries).
    TransactionFailed,
}

/// What a layer is, in a missing-event text: which layer to put `VerifyWebhookLayer`
/// in front of.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // which layers exist, and so which variants are built, depends on the features
pub(crate) enum Needs {
    Dedupe,
    TxDedupe,
    Filter,
    Accept,
    Extractor,
}

impl Rejection {
    pub(crate) const fn new(kind: RejectionKind, text: &'static str) -> Self {
        Self {
            kind,
            text,
            retry_after: None,
        }
    }

    /// A duplicate's 204.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) const fn duplicate() -> Self {
        Self::new(RejectionKind::Duplicate, "")
    }

    /// Another attempt runs: 409, retry after `secs`.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) const fn in_flight(secs: u64) -> Self {
        Self::new(RejectionKind::InFlight, "webhook delivery in progress").retrying_after(secs)
    }

    /// The store could not answer: 503, retry after `secs`.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) const fn store_unavailable(secs: u64) -> Self {
        Self::new(RejectionKind::StoreUnavailable, "webhook store unavailable").retrying_after(secs)
    }

    /// The inbox lags too far behind to take more: 503, retry after `secs`.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )),
        allow(dead_code)
    )]
    pub(crate) const fn backlogged(secs: u64) -> Self {
        Self::new(RejectionKind::Backlogged, "webhook inbox backlogged").retrying_after(secs)
    }

    /// The store refused the event as invalid input: 500.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) const fn store_refused() -> Self {
        Self::new(
            RejectionKind::StoreRefused,
            "webhook store refused the event",
        )
    }

    /// No verified event in the request, in front of `layer`.
    pub(crate) const fn missing_event(layer: Needs) -> Self {
        // One text per layer, each naming where the verify layer goes.
        let text = match layer {
            Needs::Dedupe => {
                "no verified webhook Event in the request: add \
                tower_webhook::VerifyWebhookLayer in front of DedupeLayer, or give \
                DedupeLayer::with_key"
            }
            Needs::TxDedupe => {
                "no verified webhook Event in the request: add \
                tower_webhook::VerifyWebhookLayer in front of TxDedupeLayer"
            }
            Needs::Filter => {
                "no verified webhook Event in the request: add \
                tower_webhook::VerifyWebhookLayer in front of EventFilterLayer"
            }
            Needs::Accept => {
                "no verified webhook Event in the request: add \
                tower_webhook::VerifyWebhookLayer in front of the inbox's accept service"
            }
            Needs::Extractor => {
                "no verified webhook Event in the request: add \
                tower_webhook::VerifyWebhookLayer in front of this route"
            }
        };
        Self::new(RejectionKind::MissingEvent, text)
    }

    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    const fn retrying_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// What kind of rejection this is.
    #[must_use]
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The status of the default response: 204 for a duplicate or a skipped event, 409
    /// in flight, 503 for the store, 400 for no key, 500 for a server bug or a
    /// transaction that must not commit.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self.kind {
            RejectionKind::Duplicate
            | RejectionKind::SkippedType
            | RejectionKind::SkippedLivemode => StatusCode::NO_CONTENT,
            RejectionKind::InFlight => StatusCode::CONFLICT,
            RejectionKind::StoreUnavailable | RejectionKind::Backlogged => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RejectionKind::NoKey => StatusCode::BAD_REQUEST,
            RejectionKind::StoreRefused
            | RejectionKind::UnsignedType
            | RejectionKind::MissingEvent
            | RejectionKind::MissingTransaction
            | RejectionKind::TransactionKept
            | RejectionKind::TransactionFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short, fixed text of the default body (empty for a 204).
    #[must_use]
    pub fn body_text(&self) -> &'static str {
        self.text
    }

    /// When the provider should retry, for a 409 or a 503: sent as `Retry-After`.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after.map(Duration::from_secs)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RejectionKind::Duplicate => f.write_str("webhook event already handled"),
            RejectionKind::SkippedType => f.write_str("webhook event type not handled here"),
            RejectionKind::SkippedLivemode => {
                f.write_str("webhook event livemode not handled here")
            }
            _ => f.write_str(self.text),
        }
    }
}

impl std::error::Error for Rejection {}

/// The axum form of a rejection: the default response, the rejection in its extensions.
#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for Rejection {
    fn into_response(self) -> axum_core::response::Response {
        respond(self, None).map(axum_core::body::Body::from)
    }
}

/// A reason a layer answers with: [`Rejection`], or the verify layer's `VerifyError`.
pub(crate) trait Reason: Clone + Send + Sync + 'static {
    fn status(&self) -> StatusCode;
    fn body_text(&self) -> &'static str;
    fn retry_after_secs(&self) -> Option<u64>;
    /// The methods a 405 names in `Allow`.
    fn allow(&self) -> Option<&'static str> {
        None
    }
}

impl Reason for Rejection {
    fn status(&self) -> StatusCode {
        Rejection::status(self)
    }
    fn body_text(&self) -> &'static str {
        self.text
    }
    fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
    }
}

impl Reason for crate::VerifyError {
    fn status(&self) -> StatusCode {
        crate::VerifyError::status(self)
    }
    fn body_text(&self) -> &'static str {
        crate::VerifyError::body_text(self)
    }
    fn retry_after_secs(&self) -> Option<u64> {
        None
    }
    fn allow(&self) -> Option<&'static str> {
        crate::VerifyError::allow(self)
    }
}

/// A user's replacement for the default response of a reason `R`.
pub(crate) type RejectFn<R> = dyn Fn(&R) -> Response<Bytes> + Send + Sync;

/// The response for `reason`: the user's, or the status with the short fixed text; a
/// `Retry-After` (or a 405's `Allow`) where the reason has one and the response sets none;
/// the reason in the extensions. Every layer's own answer is built here.
pub(crate) fn respond<R: Reason>(reason: R, custom: Option<&Arc<RejectFn<R>>>) -> Response<Bytes> {
    let mut response = match custom {
        Some(f) => f(&reason),
        None => {
            let text = reason.body_text();
            let mut response = Response::new(Bytes::from_static(text.as_bytes()));
            *response.status_mut() = reason.status();
            if !text.is_empty() {
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
            }
            response
        }
    };
    if let Some(secs) = reason.retry_after_secs() {
        let headers = response.headers_mut();
        if !headers.contains_key(header::RETRY_AFTER) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }
    if let Some(methods) = reason.allow() {
        let headers = response.headers_mut();
        if !headers.contains_key(header::ALLOW) {
            headers.insert(header::ALLOW, HeaderValue::from_static(methods));
        }
    }
    response.extensions_mut().insert(reason);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_response_carries_status_text_retry_after_and_the_reason() {
        let response = respond(Rejection::in_flight(7), None);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.body().as_ref(), b"webhook delivery in progress");
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        assert_eq!(
            response
                .extensions()
                .get::<Rejection>()
                .map(Rejection::kind),
            Some(RejectionKind::InFlight)
        );
        // A 204 has no body, hence no content type.
        let response = respond(Rejection::duplicate(), None);
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        assert!(response.body().is_empty());
        assert!(response.headers().get(header::CONTENT_TYPE).is_none());
    }

    #[test]
    fn a_replaced_response_keeps_the_reason_and_its_retry_after_unless_it_sets_one() {
        let custom: Arc<RejectFn<Rejection>> = Arc::new(|r: &Rejection| {
            let mut response =
                Response::new(Bytes::from(format!("{{\"e\":\"{}\"}}", r.body_text())));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response
        });
        let response = respond(Rejection::store_unavailable(5), Some(&custom));
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        assert!(response.extensions().get::<Rejection>().is_some());

        let sets_its_own: Arc<RejectFn<Rejection>> = Arc::new(|_: &Rejection| {
            let mut response = Response::new(Bytes::new());
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            response
        });
        let response = respond(Rejection::store_unavailable(5), Some(&sets_its_own));
        assert_eq!(response.headers()[header::RETRY_AFTER], "60");
    }

    #[test]
    fn each_layer_names_itself_in_its_missing_event_text() {
        let texts = [
            (Needs::Dedupe, "in front of DedupeLayer"),
            (Needs::TxDedupe, "in front of TxDedupeLayer"),
            (Needs::Filter, "in front of EventFilterLayer"),
            (Needs::Accept, "in front of the inbox's accept service"),
            (Needs::Extractor, "in front of this route"),
        ];
        for (layer, names) in texts {
            let rejection = Rejection::missing_event(layer);
            assert_eq!(rejection.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert!(
                rejection.body_text().contains(names),
                "{layer:?}: {}",
                rejection.body_text()
            );
        }
    }
}

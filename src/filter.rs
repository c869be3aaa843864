//! [`EventFilterLayer`]: acknowledge events the handler should not see — types it does
//! not handle, and test-mode events on a live endpoint — with 204, without calling it.
//!
//! Providers add event types in minor versions; an unknown type must get a 2xx, or the
//! provider retries it for days. And goods must never be handed over for a test-mode
//! event (`livemode: false`). Put the filter after `VerifyWebhookLayer` and before
//! `DedupeLayer`, so skipped events take no dedupe key:
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_webhook::filter::{EventFilterLayer, Livemode};
//! use tower_webhook::store::MemoryStore;
//! use tower_webhook::{DedupeLayer, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # fn main() -> Result<(), tower_webhook::ConfigError> {
//! let verifier = Verifier::new(Scheme::stripe(), ["whsec_from_the_dashboard_0123"])?;
//! let layers = ServiceBuilder::new()
//!     .layer(VerifyWebhookLayer::new(verifier))
//!     .layer(
//!         EventFilterLayer::new()
//!             .add_type("payment_intent.*")
//!             .add_type("charge.refunded")
//!             .with_livemode(Livemode::LiveOnly),
//!     )
//!     .layer(DedupeLayer::new(MemoryStore::new()));
//! # let _ = layers;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::Event;

/// Which events may reach the handler by their `livemode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Livemode {
    /// Every event (the default).
    #[default]
    Any,
    /// Only events whose body says `"livemode": true`; test-mode events, and events that
    /// do not say, are acknowledged and skipped. For live endpoints that hand over goods.
    LiveOnly,
    /// Only events whose body says `"livemode": false`: for a staging endpoint.
    TestOnly,
}

/// Why the filter answered without calling the handler; in the response's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skipped {
    /// The event's type is not allowed.
    Type,
    /// The event's livemode does not match the policy.
    Livemode,
}

#[derive(Debug, Default, Clone)]
struct Rules {
    /// Exact types, or prefixes (a pattern ending in `*`); empty allows every type.
    types: Vec<Box<str>>,
    livemode: Livemode,
    /// Filter on a type header the signature does not cover.
    trust_unsigned_type: bool,
}

/// What the filter says of an event.
enum Verdict {
    Pass,
    Skip(Skipped),
    /// Type rules, but the type is a header the signature does not cover.
    UnsignedType,
}

/// The 500's text when type rules meet an unsigned type header.
const UNSIGNED_TYPE: &str = "the webhook's type header is not signed, so a replayed body may \
    carry any type: filter on it with EventFilterLayer::trust_unsigned_type(), or read the \
    type from the body in the handler";

impl Rules {
    fn verdict(&self, event: &Event) -> Verdict {
        if !self.types.is_empty() && !event.type_is_signed() && !self.trust_unsigned_type {
            return Verdict::UnsignedType;
        }
        match self.skip(event) {
            Err(skipped) => Verdict::Skip(skipped),
            Ok(()) => Verdict::Pass,
        }
    }

    fn skip(&self, event: &Event) -> Result<(), Skipped> {
        if !self.types.is_empty() {
            let ty = event.event_type().unwrap_or_default();
            let allowed = self.types.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => ty.starts_with(prefix),
                None => ty == p.as_ref(),
            });
            if !allowed {
                return Err(Skipped::Type);
            }
        }
        match (self.livemode, event.livemode()) {
            (Livemode::Any, _)
            | (Livemode::LiveOnly, Some(true))
            | (Livemode::TestOnly, Some(false)) => Ok(()),
            _ => Err(Skipped::Livemode),
        }
    }
}

/// Applies [`EventFilter`]. See the [module docs](self).
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct EventFilterLayer {
    rules: Arc<Rules>,
}

impl EventFilterLayer {
    /// A filter that lets every event through; add rules with the methods below.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a type to let through: an exact type, or a prefix ending in `*`
    /// (`payment_intent.*`). Once any type is allowed, all others are skipped.
    pub fn add_type(mut self, pattern: impl Into<Box<str>>) -> Self {
        Arc::make_mut(&mut self.rules).types.push(pattern.into());
        self
    }

    /// Filters on the event's type even where it comes from a header the signature does
    /// not cover (GitHub's `X-GitHub-Event`, Shopify's `X-Shopify-Topic`; see
    /// [`Event::type_is_signed`]). Without it, type rules meet such an event with a 500
    /// that says so: whoever captured a delivery could re-send its body under another
    /// type. Deduplicating on the signed content (the default key for these schemes)
    /// already makes such a replay a duplicate when `DedupeLayer` comes after the filter.
    pub fn trust_unsigned_type(mut self) -> Self {
        Arc::make_mut(&mut self.rules).trust_unsigned_type = true;
        self
    }

    /// Replaces the livemode policy (default [`Livemode::Any`]).
    pub fn with_livemode(mut self, policy: Livemode) -> Self {
        Arc::make_mut(&mut self.rules).livemode = policy;
        self
    }
}

impl<S> Layer<S> for EventFilterLayer {
    type Service = EventFilter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EventFilter {
            inner,
            rules: self.rules.clone(),
        }
    }
}

/// Middleware that skips events by type and livemode. See the [module docs](self).
#[derive(Clone, Debug)]
#[must_use]
pub struct EventFilter<S> {
    inner: S,
    rules: Arc<Rules>,
}

impl<S> EventFilter<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for EventFilter<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let verdict = match req.extensions().get::<Event>() {
            Some(event) => self.rules.verdict(event),
            // Without a verified event there is nothing to filter on: a server bug.
            None => {
                return ResponseFuture {
                    state: State::Own {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        text: crate::event::MISSING_EVENT,
                        skipped: None,
                    },
                }
            }
        };
        match verdict {
            Verdict::Pass => ResponseFuture {
                state: State::Inner {
                    future: self.inner.call(req),
                },
            },
            Verdict::Skip(skipped) => ResponseFuture {
                state: State::Own {
                    status: StatusCode::NO_CONTENT,
                    text: "",
                    skipped: Some(skipped),
                },
            },
            Verdict::UnsignedType => ResponseFuture {
                state: State::Own {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    text: UNSIGNED_TYPE,
                    skipped: None,
                },
            },
        }
    }
}

pin_project! {
    /// Response future of [`EventFilter`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner { #[pin] future: F },
        Own { status: StatusCode, text: &'static str, skipped: Option<Skipped> },
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx).map_ok(|r| r.map(ResponseBody::inner)),
            StateProj::Own {
                status,
                text,
                skipped,
            } => {
                let mut response = ResponseBody::text(*status, text);
                if let Some(skipped) = skipped {
                    response.extensions_mut().insert(*skipped);
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

//! The `tracing` spans (feature `tracing`): one per delivery and one per inbox attempt,
//! so the handler's and the processor's own logs carry the event they are about. Spans
//! are at `info`: cheap when no subscriber wants them (the event's fields are then never
//! read). Without the feature, everything here is a zero-sized no-op.
//!
//! | span | fields | around |
//! |---|---|---|
//! | `webhook.delivery` | `source`, then once verified `event_id` and `event_type` | a delivery in `VerifyWebhookLayer`, from its body's first byte to the response, the inner service included (a dedupe layer's handler task too) |
//! | `webhook.process` | `source`, `event_id`, `event_type`, `attempt` | an inbox worker's attempt at one row, the processor included |
//!
//! No body, header or secret is ever a field.

use std::future::Future;

use crate::Event;

#[cfg(feature = "tracing")]
pub(crate) use tracing::Span;

/// No span: the feature is off.
#[cfg(not(feature = "tracing"))]
#[derive(Clone, Debug)]
pub(crate) struct Span;

/// No span: for answers given at once (a rejection on the headers, a handshake), which
/// are logged with their own fields.
#[inline]
pub(crate) fn none() -> Span {
    #[cfg(feature = "tracing")]
    {
        Span::none()
    }
    #[cfg(not(feature = "tracing"))]
    {
        Span
    }
}

/// The span of a delivery to `source`, before it is verified.
#[inline]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn delivery(source: &str) -> Span {
    #[cfg(feature = "tracing")]
    {
        tracing::info_span!(
            target: "tower_webhook",
            "webhook.delivery",
            source,
            event_id = tracing::field::Empty,
            event_type = tracing::field::Empty,
        )
    }
    #[cfg(not(feature = "tracing"))]
    {
        Span
    }
}

/// Records the verified event's id and type on its delivery's span.
#[inline]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn verified(span: &Span, event: &Event) {
    // Reading them may parse the body's envelope: only for a subscriber that listens.
    #[cfg(feature = "tracing")]
    if !span.is_disabled() {
        span.record("event_id", event.id());
        span.record("event_type", event.event_type());
    }
}

/// The span of an inbox worker's attempt at one row.
#[inline]
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "nats"))]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn attempt(event: &Event, attempt: crate::inbox::Attempt) -> Span {
    #[cfg(feature = "tracing")]
    {
        tracing::info_span!(
            target: "tower_webhook",
            "webhook.process",
            source = event.source(),
            event_id = event.id(),
            event_type = event.event_type(),
            attempt = attempt.number(),
        )
    }
    #[cfg(not(feature = "tracing"))]
    {
        Span
    }
}

/// The span the caller is in: for work it hands to a task of its own.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn current() -> Span {
    #[cfg(feature = "tracing")]
    {
        Span::current()
    }
    #[cfg(not(feature = "tracing"))]
    {
        Span
    }
}

/// Enters `span` until the guard drops: around a `poll`.
#[inline]
#[must_use]
pub(crate) fn enter(span: &Span) -> impl Sized + '_ {
    #[cfg(feature = "tracing")]
    {
        span.enter()
    }
    #[cfg(not(feature = "tracing"))]
    {
        span
    }
}

/// `future`, in `span` each time it is polled.
#[inline]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn instrument<F: Future>(span: Span, future: F) -> impl Future<Output = F::Output> {
    #[cfg(feature = "tracing")]
    {
        tracing::Instrument::instrument(future, span)
    }
    #[cfg(not(feature = "tracing"))]
    {
        future
    }
}

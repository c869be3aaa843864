//! The `tracing` spans (feature `tracing`): one per delivery and one per inbox attempt,
//! so the handler's and the processor's own logs carry the event they are about. Spans
//! are at `info`: cheap when no subscriber wants them (the event's fields are then never
//! read). Without the feature, everything here is a zero-sized no-op.
//!
//! | span | fields | around |
//! |---|---|---|
//! | `webhook.delivery` | `source`, then once verified `event_id` and `event_type` | a delivery in `VerifyWebhookLayer`, from its body's first byte to the response, the inner service included (a dedupe layer's handler task too) |
//! | `webhook.accept` (feature `otel`) | the messaging attributes below (`messaging.message.id` is the event id), and `source` and `event_type` unless its parent is the delivery's span, which has them | an accept's write to the inbox, JetStream or RabbitMQ, after verification; open around it, never entered |
//! | `webhook.process` | `source`, `event_id`, `event_type`, `attempt`, and with `otel` `processor` and the messaging attributes | an inbox worker's attempt at one row, the processor included |
//!
//! With the feature `otel`, `webhook.accept` is a PRODUCER span (`otel.kind`,
//! `messaging.operation.type` `send`, `messaging.message.id` the event id) whose W3C
//! context is stored with the event (`otel.rs`), and `webhook.process` a CONSUMER span
//! (`process`): a child of the accept on the route's first run, else a new trace linked
//! to it. No body, header (but a sender's `traceparent`, as a link or a trusted parent)
//! or secret is ever a field.

use std::future::Future;

use crate::Event;

// The W3C context stored at accept, and the parents and links it gives: for the inbox and
// JetStream (with neither, `otel` only keeps a detached handler in its request's trace).
#[cfg(feature = "otel")]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code, unused_imports)
)]
mod otel;

#[cfg(feature = "otel")]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(unused_imports)
)]
pub(crate) use otel::TraceContext;
#[cfg(feature = "tracing")]
pub(crate) use tracing::Span;

/// No trace context: the feature `otel` is off (nothing is read, stored or allocated).
#[cfg(not(feature = "otel"))]
// A field, not a unit struct: `TraceContext::default()` is written once for both builds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TraceContext(());

#[cfg(not(feature = "otel"))]
#[allow(dead_code, clippy::unused_self)] // the same calls as with the feature
impl TraceContext {
    #[inline]
    pub(crate) fn stored(_: Option<String>, _: Option<String>) -> Self {
        Self(())
    }

    #[inline]
    pub(crate) fn sent(_: &http::HeaderMap) -> Self {
        Self(())
    }

    #[inline]
    pub(crate) fn traceparent(&self) -> Option<&str> {
        None
    }

    #[inline]
    pub(crate) fn tracestate(&self) -> Option<&str> {
        None
    }
}

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

/// The span of an accept's write (feature `otel`; without it, none), and its context to
/// store with the event: `sent`, the sender's `traceparent`, is its parent when
/// `trusted`, else a link. Held open by the caller around the write only ([`held`]).
#[inline]
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub(crate) fn accept(event: &Event, sent: &TraceContext, trusted: bool) -> (Span, TraceContext) {
    #[cfg(feature = "otel")]
    {
        let span = tracing::info_span!(
            target: "tower_webhook",
            "webhook.accept",
            source = tracing::field::Empty,
            event_type = tracing::field::Empty,
            otel.kind = "producer",
            messaging.operation.type = "send",
            messaging.message.id = message_id(event),
        );
        // `source` and `event_type` only where its parent is not the delivery's span.
        let stored = otel::accepted(&span, event, sent, trusted);
        (span, stored)
    }
    #[cfg(not(feature = "otel"))]
    {
        (none(), TraceContext::default())
    }
}

/// The id an OpenTelemetry message is known by: the event's id, else its key.
#[cfg(all(
    feature = "otel",
    any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )
))]
fn message_id(event: &Event) -> &str {
    event.id().unwrap_or(event.dedupe_id())
}

/// The span of an inbox worker's attempt at one row of `processor`. With `otel`, the
/// accept's `stored` context is its parent when `parent` (the route's first run since the
/// accept), else it starts a new trace linked to it.
#[inline]
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
#[cfg_attr(
    not(all(feature = "tracing", feature = "otel")),
    allow(unused_variables)
)]
pub(crate) fn attempt(
    event: &Event,
    attempt: crate::inbox::Attempt,
    processor: &str,
    (stored, parent): (&TraceContext, bool),
) -> Span {
    // `webhook.process` with its fields, and `$extra` after them.
    #[cfg(feature = "tracing")]
    macro_rules! process_span {
        ($($extra:tt)*) => {
            tracing::info_span!(
                target: "tower_webhook",
                "webhook.process",
                source = event.source(),
                event_id = event.id(),
                event_type = event.event_type(),
                attempt = attempt.number(),
                $($extra)*
            )
        };
    }
    #[cfg(feature = "otel")]
    {
        let span = process_span!(
            processor,
            otel.kind = "consumer",
            messaging.operation.type = "process",
            messaging.message.id = message_id(event),
        );
        otel::attempted(&span, stored, parent);
        span
    }
    #[cfg(all(feature = "tracing", not(feature = "otel")))]
    {
        process_span!()
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

/// `future`, with `span` open until it completes (or is dropped) but never entered: for a
/// span whose context was taken when it was made. Entering costs an OpenTelemetry layer a
/// context switch at every poll (callgrind); what logs inside `future` (the crate does not,
/// a dependency such as sqlx may) is in the caller's span instead.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) async fn held<F: Future>(span: Span, future: F) -> F::Output {
    let output = future.await;
    drop(span); // its end: the write's
    output
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

//! OpenTelemetry across the queue (feature `otel`): the accept's span context as it is
//! stored beside the event (W3C `traceparent`, `tracestate`), a sender's `traceparent`
//! read from its request, and the parent or links given to the spans of `super` before
//! their OpenTelemetry half is built (tracing-opentelemetry builds it at the first enter,
//! or when its context is first asked for: a parent set later is refused).

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::Event;

use super::Span;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// A W3C trace context: `traceparent`, and `tracestate` when it says anything. Empty
/// when there was none: no OpenTelemetry layer, the span disabled, or a sender that sent
/// none. One pointer wide (it rides in every `Delivery` and claimed event).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TraceContext(Option<Box<Parts>>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Parts {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// As stored beside an event (or in a message's headers); a `tracestate` without a
    /// `traceparent` means nothing.
    pub(crate) fn stored(traceparent: Option<String>, tracestate: Option<String>) -> Self {
        Self(traceparent.map(|traceparent| {
            Box::new(Parts {
                traceparent,
                tracestate: tracestate.filter(|s| !s.is_empty()),
            })
        }))
    }

    /// The sender's, from its request headers (untrusted: a link unless trusted).
    pub(crate) fn sent(headers: &http::HeaderMap) -> Self {
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        Self::stored(
            text(TRACEPARENT).map(str::to_owned),
            text(TRACESTATE).map(str::to_owned),
        )
    }

    pub(crate) fn traceparent(&self) -> Option<&str> {
        self.0.as_ref().map(|p| p.traceparent.as_str())
    }

    pub(crate) fn tracestate(&self) -> Option<&str> {
        self.0.as_ref().and_then(|p| p.tracestate.as_deref())
    }

    /// The span's context, as the W3C propagator would write it.
    fn of(span: &Span) -> Self {
        Self::written(span.context().span().span_context())
    }

    /// `context` as W3C headers: version `00`, the ids in lower-case hex, the sampled flag
    /// alone. Written here, not by `TraceContextPropagator::inject_context`, whose
    /// formatting machinery and carrier were a third of an accept span's cost (callgrind);
    /// a test holds the two equal. Reading them back is the propagator's (`remote`).
    fn written(context: &SpanContext) -> Self {
        if !context.is_valid() {
            return Self::default();
        }
        let mut traceparent = String::with_capacity(55);
        traceparent.push_str("00-");
        traceparent.push_str(&hex::encode(context.trace_id().to_bytes()));
        traceparent.push('-');
        traceparent.push_str(&hex::encode(context.span_id().to_bytes()));
        traceparent.push_str(if context.is_sampled() { "-01" } else { "-00" });
        Self::stored(Some(traceparent), Some(context.trace_state().header()))
    }

    /// The remote context it holds, if it is a valid one.
    fn remote(&self) -> Option<opentelemetry::Context> {
        self.0.as_ref()?;
        let cx = TraceContextPropagator::new().extract(self);
        cx.span().span_context().is_valid().then_some(cx)
    }
}

impl Extractor for TraceContext {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent(),
            TRACESTATE => self.tracestate(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Whether the current span is a delivery's (looked up without cloning it).
fn in_delivery() -> bool {
    tracing::dispatcher::get_default(|dispatch| {
        dispatch
            .current_span()
            .metadata()
            .is_some_and(|m| m.name() == "webhook.delivery")
    })
}

/// The accept's span of `event`, before its context is first taken: the sender's context
/// its parent when `trusted`, else a link (a forged trace id never joins our traces); the
/// source and type recorded unless its parent is the delivery's span, which carries them
/// (each exported attribute costs the exporter allocations); its own context, to store.
pub(crate) fn accepted(
    span: &Span,
    event: &Event,
    sent: &TraceContext,
    trusted: bool,
) -> TraceContext {
    let mut under_delivery = in_delivery();
    if let Some(remote) = sent.remote() {
        match trusted {
            true => {
                let _ = span.set_parent(remote);
                under_delivery = false;
            }
            false => span.add_link(remote.span().span_context().clone()),
        }
    }
    if !under_delivery {
        span.record("source", event.source());
        span.record("event_type", event.event_type());
    }
    TraceContext::of(span)
}

/// An attempt's span, before it is entered: the accept's context its parent (`parent`:
/// the route's first run since the accept), else a new trace linked to it.
pub(crate) fn attempted(span: &Span, stored: &TraceContext, parent: bool) {
    match (stored.remote(), parent) {
        (Some(accept), true) => {
            let _ = span.set_parent(accept);
        }
        (Some(accept), false) => {
            // A root: not a child of whatever the worker's task was in.
            let _ = span.set_parent(opentelemetry::Context::new());
            span.add_link(accept.span().span_context().clone());
        }
        (None, _) => {
            let _ = span.set_parent(opentelemetry::Context::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracestate_without_a_traceparent_or_empty_is_dropped() {
        assert_eq!(
            TraceContext::stored(None, Some("a=b".into())),
            TraceContext::default()
        );
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let stored = TraceContext::stored(Some(tp.into()), Some(String::new()));
        assert_eq!(stored.tracestate(), None);
        assert!(stored.remote().is_some());
    }

    #[test]
    fn written_as_the_w3c_propagator_writes_it() {
        use opentelemetry::propagation::Injector;
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        use std::collections::HashMap;

        struct Carrier(HashMap<String, String>);
        impl Injector for Carrier {
            fn set(&mut self, key: &str, value: String) {
                self.0.insert(key.to_owned(), value);
            }
        }
        let state = TraceState::from_key_value([("vendor", "v1"), ("other", "x")]).unwrap();
        for (flags, state) in [
            (TraceFlags::SAMPLED, TraceState::default()),
            (TraceFlags::default(), state),
            (TraceFlags::new(0xff), TraceState::default()), // only the sampled bit is written
            (TraceFlags::new(0x02), TraceState::default()),
        ] {
            let context = SpanContext::new(
                TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                flags,
                false,
                state,
            );
            let mut carrier = Carrier(HashMap::new());
            let cx = opentelemetry::Context::new().with_remote_span_context(context.clone());
            TraceContextPropagator::new().inject_context(&cx, &mut carrier);
            let theirs =
                TraceContext::stored(carrier.0.remove(TRACEPARENT), carrier.0.remove(TRACESTATE));
            assert_eq!(TraceContext::written(&context), theirs);
            assert!(theirs.traceparent().is_some());
        }
        assert_eq!(
            TraceContext::written(&SpanContext::empty_context()),
            TraceContext::default()
        );
    }

    #[test]
    fn a_malformed_traceparent_is_no_remote_context() {
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, "00-not-a-trace-01".parse().unwrap());
        assert!(TraceContext::sent(&headers).remote().is_none());
    }
}

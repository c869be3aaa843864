//! One trace from a delivery to each attempt (feature `otel`, issue 35), read from the
//! SDK's in-memory exporter behind a `tracing` registry with tracing-opentelemetry's
//! layer: on SQLite, PostgreSQL (a fresh database each), JetStream (a stream each) and
//! RabbitMQ (an exchange and queue each, the accept only), the
//! accept is a PRODUCER span whose context is stored with the event; an event's first run
//! is a CONSUMER span that is its child (each processor's, with fan-out); a retry, a
//! requeue, a resumed snooze, a backfill, a parked message resumed and a rerun in the
//! worker start new traces linked to it; a sender's `traceparent` is a link unless trusted; links only
//! links the first run too; without a layer nothing is stored and nothing breaks. And a
//! `DedupeLayer` handler the client hung up on stays in its request's trace.
//!
//! Each test installs its own subscriber for its thread (`set_default`): `#[tokio::test]`
//! runs the test, its workers and the SQLite writer's callers on that one thread.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::seed::{eventually, SECRET};
use common::sql_db::Db;
use common::{at, request, verifier, NOW};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::TxDedupeLayer;
use tower_webhook::inbox::amqp::Amqp;
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Attempt, Backfill, Inbox, Later, ProcessorSpec, Requeue, Worker};
use tower_webhook::store::MemoryStore;
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};
use tracing_subscriber::layer::SubscriberExt as _;

/// A sender's trace context: sampled, so a trusted parent's child is exported.
const SENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENT_SPAN: &str = "00f067aa0ba902b7";

fn sent_traceparent() -> String {
    format!("00-{SENT_TRACE}-{SENT_SPAN}-01")
}

/// The spans this test's thread exports.
struct Traces {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Traces {
    fn install() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        Self {
            exporter,
            _provider: provider,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The finished spans named `name` of the event `id` (by its `messaging.message.id`,
    /// or the delivery's `event_id`).
    fn of(&self, name: &str, id: &str) -> Vec<SpanData> {
        let spans = self.exporter.get_finished_spans().unwrap();
        spans
            .into_iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                attribute(s, "messaging.message.id").or(attribute(s, "event_id")) == Some(id)
            })
            .collect()
    }

    /// The accept's span of `id`, once it has finished.
    async fn accept(&self, id: &str) -> SpanData {
        self.wait("webhook.accept", id, 1).await.remove(0)
    }

    /// Waits until `n` spans `name` of `id` have finished; in the order they started.
    async fn wait(&self, name: &str, id: &str, n: usize) -> Vec<SpanData> {
        eventually(&format!("{n} {name} spans of {id}"), async || {
            self.of(name, id).len() >= n
        })
        .await;
        let mut spans = self.of(name, id);
        spans.sort_by_key(|s| s.start_time);
        spans
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .and_then(|kv| match &kv.value {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
}

fn int_attribute(span: &SpanData, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .and_then(|kv| match &kv.value {
            Value::I64(n) => Some(*n),
            // tracing-opentelemetry writes a `u64` field as text
            Value::String(s) => s.as_str().parse().ok(),
            _ => None,
        })
}

fn linked(span: &SpanData) -> Vec<SpanContext> {
    span.links
        .links
        .iter()
        .map(|l| l.span_context.clone())
        .collect()
}

/// `attempt` is the accept's child: its trace, its parent span, no link.
fn assert_child(attempt: &SpanData, accept: &SpanData) {
    assert_eq!(attempt.span_kind, SpanKind::Consumer);
    assert_eq!(
        attempt.span_context.trace_id(),
        accept.span_context.trace_id(),
        "the first run is in the accept's trace"
    );
    assert_eq!(attempt.parent_span_id, accept.span_context.span_id());
    assert!(attempt.links.links.is_empty());
}

/// `attempt` starts a trace of its own, linked to the accept.
fn assert_linked(attempt: &SpanData, accept: &SpanData) {
    assert_eq!(attempt.span_kind, SpanKind::Consumer);
    assert_ne!(
        attempt.span_context.trace_id(),
        accept.span_context.trace_id(),
        "a later run is a new trace"
    );
    assert_eq!(attempt.parent_span_id, SpanId::INVALID, "a root");
    let links = linked(attempt);
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].trace_id(), accept.span_context.trace_id());
    assert_eq!(links[0].span_id(), accept.span_context.span_id());
}

fn body(id: &str) -> String {
    format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"pi_{id}"}}}}}}"#)
}

/// A signed Standard Webhooks delivery of `id`, with a `traceparent` when given.
fn delivery(id: &str, traceparent: Option<&str>) -> Request<Full<Bytes>> {
    let body = body(id);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    let mut req = request(headers, body);
    if let Some(tp) = traceparent {
        req.headers_mut()
            .insert("traceparent", HeaderValue::from_str(tp).unwrap());
    }
    req
}

/// Verify, then `accept`, as an application mounts them: stored (204).
async fn deliver<S>(accept: S, id: &str, traceparent: Option<&str>)
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Send
        + Clone
        + 'static,
    S::Future: Send,
{
    let svc = ServiceBuilder::new().layer(verify()).service(accept);
    let response = svc.oneshot(delivery(id, traceparent)).await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT, "{id} stored");
}

/// A processor failing the first `fails` runs of each event, then succeeding.
fn failing_first(fails: u32) -> impl Fn(Event, Attempt) -> std::future::Ready<Result<(), String>> {
    let runs = Arc::new(AtomicU32::new(0));
    move |_: Event, _: Attempt| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(match run < fails {
            true => Err("fails once".to_owned()),
            false => Ok(()),
        })
    }
}

fn sql_worker(inbox: &Inbox, processor: impl tower_webhook::inbox::Processor) -> Worker {
    Worker::new(inbox, processor)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(20))
        .unwrap()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap()
}

/// The stored `traceparent` of the event `id` (NULL: `None`).
async fn stored_traceparent(db: &Db, id: &str) -> Option<String> {
    let sql = format!("SELECT traceparent FROM webhook_events WHERE event_id = '{id}'");
    let rows: Vec<(Option<String>,)> = db.rows(&sql).await;
    rows.into_iter().next().expect("the event's row").0
}

/// The W3C `traceparent` of a span.
fn traceparent_of(span: &SpanData) -> String {
    let cx = &span.span_context;
    format!("00-{}-{}-01", cx.trace_id(), cx.span_id())
}

/// Attempt 1 is the accept's child (the accept a PRODUCER span in the delivery's trace,
/// its context stored with the event); attempt 2, after a failure, a new trace linked to
/// the accept.
async fn first_run_is_a_child_and_a_retry_is_linked(db: Db) {
    let traces = Traces::install();
    let inbox = db.inbox();
    let id = "evt_otel_retry";
    deliver(inbox.accept_service(), id, None).await;
    let worker = sql_worker(&inbox, failing_first(1)).spawn();
    let attempts = traces.wait("webhook.process", id, 2).await;
    worker.shutdown().await;
    let accept = &traces.accept(id).await;
    assert_eq!(accept.span_kind, SpanKind::Producer);
    assert_eq!(attribute(accept, "messaging.operation.type"), Some("send"));
    let delivery = &traces.wait("webhook.delivery", id, 1).await[0];
    assert_eq!(
        accept.parent_span_id,
        delivery.span_context.span_id(),
        "the accept is a child of the delivery"
    );
    // The source and type are the delivery's, not repeated on its child.
    assert!(attribute(delivery, "source").is_some());
    assert!(attribute(delivery, "event_type").is_some());
    assert_eq!(attribute(accept, "source"), None);
    assert_eq!(attribute(accept, "event_type"), None);
    assert_eq!(
        stored_traceparent(&db, id).await,
        Some(traceparent_of(accept))
    );
    assert_child(&attempts[0], accept);
    assert_eq!(
        attribute(&attempts[0], "messaging.operation.type"),
        Some("process")
    );
    assert_eq!(attribute(&attempts[0], "processor"), Some("default"));
    assert_eq!(int_attribute(&attempts[0], "attempt"), Some(1));
    assert_eq!(int_attribute(&attempts[1], "attempt"), Some(2));
    assert_linked(&attempts[1], accept);
}

/// A requeued event's run (attempt 1 again, its attempts reset) is linked, not a child.
async fn a_requeued_run_is_linked(db: Db) {
    let traces = Traces::install();
    let inbox = db.inbox();
    let id = "evt_otel_requeued";
    deliver(inbox.accept_service(), id, None).await;
    let worker = sql_worker(&inbox, failing_first(1))
        .with_max_attempts(1)
        .unwrap()
        .spawn();
    eventually("dead after one attempt", async || {
        inbox.counts().await.is_ok_and(|c| c.dead == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await; // a requeue a millisecond on
    assert_eq!(inbox.requeue(Requeue::id("standard", id)).await.unwrap(), 1);
    let attempts = traces.wait("webhook.process", id, 2).await;
    worker.shutdown().await;
    let accept = &traces.accept(id).await;
    assert_child(&attempts[0], accept);
    assert_eq!(int_attribute(&attempts[1], "attempt"), Some(1));
    assert_linked(&attempts[1], accept);
}

/// A sender's `traceparent` is a link of the accept by default, never its parent; trusted,
/// the accept's parent (and the first run in the sender's trace).
async fn a_senders_traceparent_is_a_link_unless_trusted(db: Db) {
    let traces = Traces::install();
    let sent = sent_traceparent();
    let untrusted = db.inbox();
    let id = "evt_otel_untrusted";
    deliver(untrusted.accept_service(), id, Some(&sent)).await;
    let accept = &traces.accept(id).await;
    assert_ne!(
        accept.span_context.trace_id(),
        TraceId::from_hex(SENT_TRACE).unwrap(),
        "a forged trace id never joins ours"
    );
    let links = linked(accept);
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].trace_id(), TraceId::from_hex(SENT_TRACE).unwrap());
    assert_eq!(links[0].span_id(), SpanId::from_hex(SENT_SPAN).unwrap());

    let trusted = db.inbox().with_trusted_traceparent(true);
    let id = "evt_otel_trusted";
    deliver(trusted.accept_service(), id, Some(&sent)).await;
    let accept = &traces.accept(id).await;
    assert_eq!(
        accept.span_context.trace_id(),
        TraceId::from_hex(SENT_TRACE).unwrap()
    );
    assert_eq!(accept.parent_span_id, SpanId::from_hex(SENT_SPAN).unwrap());
    assert!(accept.links.links.is_empty());
    let worker = sql_worker(&trusted, failing_first(0)).spawn();
    let attempt = &traces.wait("webhook.process", id, 1).await[0];
    worker.shutdown().await;
    assert_child(attempt, accept);
    // Its parent is the sender's, not the delivery's: the source and type are its own.
    assert!(attribute(accept, "source").is_some());
    assert_eq!(attribute(accept, "source"), attribute(attempt, "source"));
    assert_eq!(
        attribute(accept, "event_type"),
        attribute(attempt, "event_type")
    );
}

/// An accept outside a delivery (a direct call, as an ingest is) carries the event's
/// source and type itself: no delivery's span has them.
async fn an_accept_outside_a_delivery_carries_the_source_and_type(db: Db) {
    let traces = Traces::install();
    let inbox = db.inbox();
    let id = "evt_otel_direct";
    inbox.accept(&common::paid_event(id)).await.unwrap();
    let accept = &traces.accept(id).await;
    assert_eq!(accept.span_kind, SpanKind::Producer);
    assert_eq!(attribute(accept, "source"), Some("standard"));
    assert_eq!(
        attribute(accept, "event_type"),
        Some("payment_intent.succeeded")
    );
    assert_eq!(
        stored_traceparent(&db, id).await,
        Some(traceparent_of(accept))
    );
}

/// With links only, the first run is linked too.
async fn links_only_links_the_first_run(db: Db) {
    let traces = Traces::install();
    let inbox = db.inbox();
    let id = "evt_otel_links_only";
    deliver(inbox.accept_service(), id, None).await;
    let worker = sql_worker(&inbox, failing_first(0))
        .with_trace_links_only(true)
        .spawn();
    let attempt = &traces.wait("webhook.process", id, 1).await[0];
    worker.shutdown().await;
    let accept = &traces.accept(id).await;
    assert_linked(attempt, accept);
}

/// Without an OpenTelemetry layer (no subscriber at all), nothing is stored and the event
/// is processed as ever.
async fn without_a_layer_nothing_is_stored(db: Db) {
    let inbox = db.inbox();
    let id = "evt_otel_no_layer";
    deliver(inbox.accept_service(), id, None).await;
    assert_eq!(stored_traceparent(&db, id).await, None);
    let worker = sql_worker(&inbox, failing_first(0)).spawn();
    eventually("processed", async || {
        inbox.counts().await.is_ok_and(|c| c.processed == 1)
    })
    .await;
    worker.shutdown().await;
}

macro_rules! on_both {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Db::sqlite().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Db::postgres().await).await;
                }
            )*
        }
    };
}

on_both!(
    first_run_is_a_child_and_a_retry_is_linked,
    a_requeued_run_is_linked,
    a_senders_traceparent_is_a_link_unless_trusted,
    links_only_links_the_first_run,
    without_a_layer_nothing_is_stored,
    a_resumed_snooze_is_linked,
    fan_out_first_runs_are_children_and_a_backfill_is_linked,
    an_accept_outside_a_delivery_carries_the_source_and_type,
);

/// A stream of the test's own, in memory, deleted at the end.
async fn jetstream(trusted: bool) -> (JetStream, String) {
    let name = format!("tw_otel_{}", uuid::Uuid::new_v4().simple());
    let client = async_nats::connect(common::nats_url())
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)");
    let jetstream = JetStream::builder(client, &name)
        .with_memory_storage()
        .with_trusted_traceparent(trusted)
        .build()
        .await
        .unwrap();
    (jetstream, name)
}

async fn delete_streams(name: &str) {
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let _ = jetstream_streams(&js, name).await;
}

async fn jetstream_streams(js: &async_nats::jetstream::Context, name: &str) -> usize {
    use futures_util::StreamExt as _;
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|n| async { n.ok() })
        .collect()
        .await;
    let mut deleted = 0;
    for n in names {
        let ours = n == name
            || n.strip_prefix(name).is_some_and(|r| r.starts_with('-'))
            || n.strip_prefix("KV_")
                .and_then(|k| k.strip_prefix(name))
                .is_some_and(|r| r.starts_with('-'));
        if ours && js.delete_stream(&n).await.is_ok() {
            deleted += 1;
        }
    }
    deleted
}

fn js_worker(
    jetstream: &JetStream,
    processor: impl tower_webhook::inbox::Processor,
) -> JetStreamWorker {
    JetStreamWorker::new(jetstream, MemoryStore::new(), processor)
        .with_backoff(Duration::from_millis(20), Duration::from_millis(40))
        .unwrap()
}

/// JetStream: the message carries the accept's context in `traceparent`; attempt 1 is
/// the accept's child, attempt 2 a new trace linked to it.
#[tokio::test]
async fn jetstream_first_run_is_a_child_and_a_retry_is_linked() {
    let traces = Traces::install();
    let (jetstream, name) = jetstream(false).await;
    let id = "evt_otel_js_retry";
    deliver(jetstream.accept_service(), id, None).await;
    let accept = &traces.accept(id).await;
    assert_eq!(accept.span_kind, SpanKind::Producer);
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream(&name)
        .await
        .unwrap();
    let message = stream.get_raw_message(1).await.unwrap();
    let header = message.headers.get("traceparent").map(|v| v.as_str());
    assert_eq!(header, Some(traceparent_of(accept).as_str()));
    let worker = js_worker(&jetstream, failing_first(1)).spawn();
    let attempts = traces.wait("webhook.process", id, 2).await;
    worker.shutdown().await;
    assert_child(&attempts[0], accept);
    assert_eq!(int_attribute(&attempts[1], "attempt"), Some(2));
    assert_linked(&attempts[1], accept);
    delete_streams(&name).await;
}

/// JetStream: a sender's `traceparent` is a link by default, the parent when trusted; with
/// links only, the first run is linked.
#[tokio::test]
async fn jetstream_a_senders_traceparent_and_links_only() {
    let traces = Traces::install();
    let sent = sent_traceparent();
    let (untrusted, first) = jetstream(false).await;
    let id = "evt_otel_js_untrusted";
    deliver(untrusted.accept_service(), id, Some(&sent)).await;
    let accept = &traces.accept(id).await;
    assert_ne!(
        accept.span_context.trace_id(),
        TraceId::from_hex(SENT_TRACE).unwrap()
    );
    assert_eq!(
        linked(accept)[0].trace_id(),
        TraceId::from_hex(SENT_TRACE).unwrap()
    );
    let worker = js_worker(&untrusted, failing_first(0))
        .with_trace_links_only(true)
        .spawn();
    let attempt = &traces.wait("webhook.process", id, 1).await[0];
    worker.shutdown().await;
    assert_linked(attempt, accept);

    let (trusted, second) = jetstream(true).await;
    let id = "evt_otel_js_trusted";
    deliver(trusted.accept_service(), id, Some(&sent)).await;
    let accept = &traces.accept(id).await;
    assert_eq!(
        accept.span_context.trace_id(),
        TraceId::from_hex(SENT_TRACE).unwrap()
    );
    assert_eq!(accept.parent_span_id, SpanId::from_hex(SENT_SPAN).unwrap());
    delete_streams(&first).await;
    delete_streams(&second).await;
}

/// JetStream without an OpenTelemetry layer: no `traceparent` header, and the event runs.
#[tokio::test]
async fn jetstream_without_a_layer_publishes_no_traceparent() {
    let (jetstream, name) = jetstream(false).await;
    let id = "evt_otel_js_no_layer";
    deliver(jetstream.accept_service(), id, None).await;
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream(&name)
        .await
        .unwrap();
    let message = stream.get_raw_message(1).await.unwrap();
    assert!(message.headers.get("traceparent").is_none());
    let ran = Arc::new(AtomicU32::new(0));
    let r = ran.clone();
    let worker = js_worker(&jetstream, move |_: Event, _: Attempt| {
        r.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<(), String>(()))
    })
    .spawn();
    eventually("processed", async || ran.load(Ordering::SeqCst) == 1).await;
    worker.shutdown().await;
    delete_streams(&name).await;
}

/// An exchange and queue of RabbitMQ's of their own (`trusted`: the sender's
/// `traceparent` the accept's parent).
async fn amqp(trusted: bool) -> (Amqp, String) {
    let name = format!("tw_otel_{}", uuid::Uuid::new_v4().simple());
    let amqp = Amqp::builder(&common::amqp_url())
        .with_exchange(&name)
        .unwrap()
        .with_queue(&name)
        .unwrap()
        .with_trusted_traceparent(trusted)
        .build()
        .await
        .expect("RabbitMQ must be running (.ci/services starts it)");
    (amqp, name)
}

/// The headers of the one message in the queue `name` (taken off it).
async fn amqp_headers(name: &str) -> lapin::types::FieldTable {
    let url = common::amqp_url();
    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let options = lapin::options::BasicGetOptions { no_ack: true };
    let message = channel.basic_get(name.into(), options).await.unwrap();
    let message = message.expect("the accepted message");
    message
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default()
}

fn amqp_header(headers: &lapin::types::FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        lapin::types::AMQPValue::LongString(s) => Some(s.to_string()),
        other => panic!("{name}: {other:?}"),
    }
}

/// RabbitMQ: the message carries the accept's context in `traceparent`; a sender's is a
/// link by default, the parent when trusted; without a layer, no `traceparent`.
#[tokio::test]
async fn amqp_publishes_the_accepts_traceparent_and_a_senders_is_a_link_unless_trusted() {
    let sent = sent_traceparent();
    {
        let traces = Traces::install();
        let (untrusted, name) = amqp(false).await;
        let id = "evt_otel_amqp_untrusted";
        deliver(untrusted.accept_service(), id, Some(&sent)).await;
        let accept = &traces.accept(id).await;
        assert_eq!(accept.span_kind, SpanKind::Producer);
        assert_ne!(
            accept.span_context.trace_id(),
            TraceId::from_hex(SENT_TRACE).unwrap()
        );
        assert_eq!(
            linked(accept)[0].trace_id(),
            TraceId::from_hex(SENT_TRACE).unwrap()
        );
        let headers = amqp_headers(&name).await;
        assert_eq!(
            amqp_header(&headers, "traceparent"),
            Some(traceparent_of(accept))
        );
        untrusted.delete().await.unwrap();

        let (trusted, name) = amqp(true).await;
        let id = "evt_otel_amqp_trusted";
        deliver(trusted.accept_service(), id, Some(&sent)).await;
        let accept = &traces.accept(id).await;
        assert_eq!(
            accept.span_context.trace_id(),
            TraceId::from_hex(SENT_TRACE).unwrap()
        );
        assert_eq!(accept.parent_span_id, SpanId::from_hex(SENT_SPAN).unwrap());
        let headers = amqp_headers(&name).await;
        assert_eq!(
            amqp_header(&headers, "traceparent"),
            Some(traceparent_of(accept))
        );
        trusted.delete().await.unwrap();
    }
    let (amqp, name) = amqp(false).await;
    deliver(amqp.accept_service(), "evt_otel_amqp_no_layer", None).await;
    let headers = amqp_headers(&name).await;
    assert_eq!(amqp_header(&headers, "traceparent"), None);
    assert_eq!(
        amqp_header(&headers, "Webhook-Id").as_deref(),
        Some("evt_otel_amqp_no_layer")
    );
    amqp.delete().await.unwrap();
}

/// A handler that works 200 ms, then in a span `handler.work`.
async fn slow_handler(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _work = tracing::info_span!("handler.work").entered();
    Ok(Response::new(Full::new(Bytes::new())))
}

/// `DedupeLayer`'s handler goes on after the client hung up, in its own task: still in
/// the request's trace (the delivery span's trace id).
#[tokio::test]
async fn a_dedupe_handler_the_client_left_stays_in_the_requests_trace() {
    let traces = Traces::install();
    let dedupe = DedupeLayer::new(MemoryStore::new());
    let svc = ServiceBuilder::new().layer(verify()).layer(dedupe);
    hang_up(svc.service_fn(slow_handler), "evt_otel_hangup").await;
    traces.handler_in_delivery("evt_otel_hangup").await;
}

/// The same for `TxDedupeLayer`'s (PostgreSQL) detached handler.
#[tokio::test]
async fn a_tx_dedupe_handler_the_client_left_stays_in_the_requests_trace() {
    let traces = Traces::install();
    let pool = sqlx::PgPool::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    let dedupe = TxDedupeLayer::new(pool).await.unwrap();
    let svc = ServiceBuilder::new().layer(verify()).layer(dedupe);
    hang_up(svc.service_fn(slow_handler), "evt_otel_tx_hangup").await;
    traces.handler_in_delivery("evt_otel_tx_hangup").await;
}

/// Sends `id` to `svc` and hangs up mid-handler.
async fn hang_up<S>(svc: S, id: &str)
where
    S: tower::Service<Request<Full<Bytes>>>,
{
    let call = svc.oneshot(delivery(id, None));
    let hung_up = tokio::time::timeout(Duration::from_millis(50), call).await;
    assert!(hung_up.is_err(), "the client gave up mid-handler");
}

fn verify() -> VerifyWebhookLayer {
    VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]))
}

impl Traces {
    /// The handler's span `handler.work` is a child of the delivery `id`'s span.
    async fn handler_in_delivery(&self, id: &str) {
        eventually("the handler's work ended", async || {
            self.exporter
                .get_finished_spans()
                .unwrap()
                .iter()
                .any(|s| s.name == "handler.work")
        })
        .await;
        let spans = self.exporter.get_finished_spans().unwrap();
        let work = spans.iter().find(|s| s.name == "handler.work").unwrap();
        let delivery = &self.wait("webhook.delivery", id, 1).await[0];
        assert_eq!(
            work.span_context.trace_id(),
            delivery.span_context.trace_id()
        );
        assert_eq!(work.parent_span_id, delivery.span_context.span_id());
    }
}

/// JetStream: an event parked while its source was paused runs, once resumed, from a
/// message published again: a new trace linked to the accept, not its child.
#[tokio::test]
async fn jetstream_a_resumed_run_is_linked() {
    let traces = Traces::install();
    let (jetstream, name) = jetstream(false).await;
    assert!(jetstream.pause(Some("standard"), None).await.unwrap());
    let id = "evt_otel_js_resumed";
    deliver(jetstream.accept_service(), id, None).await;
    let ran = Arc::new(AtomicU32::new(0));
    let r = ran.clone();
    let worker = js_worker(&jetstream, move |_: Event, _: Attempt| {
        r.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<(), String>(()))
    })
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .spawn();
    eventually("parked", async || {
        jetstream.counts().await.is_ok_and(|c| c.paused == 1)
    })
    .await;
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(jetstream.resume(Some("standard"), None).await.unwrap());
    eventually("processed once resumed", async || {
        ran.load(Ordering::SeqCst) == 1
    })
    .await;
    let attempts = traces.wait("webhook.process", id, 2).await;
    worker.shutdown().await;
    let accept = &traces.accept(id).await;
    assert_linked(attempts.last().unwrap(), accept);
    delete_streams(&name).await;
}

/// A processor that snoozes the first run of each event ([`Later`]), then succeeds.
fn snoozing_first() -> impl Fn(Event, Attempt) -> std::future::Ready<Result<(), Later>> {
    let runs = Arc::new(AtomicU32::new(0));
    move |_: Event, _: Attempt| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(match run {
            0 => Err(Later::after(Duration::from_millis(20))),
            _ => Ok(()),
        })
    }
}

/// A snoozed event's resumed run (attempt 1 again: a snooze counts none) is linked, not a
/// child.
async fn a_resumed_snooze_is_linked(db: Db) {
    let traces = Traces::install();
    let inbox = db.inbox();
    let id = "evt_otel_snoozed";
    deliver(inbox.accept_service(), id, None).await;
    let worker = sql_worker(&inbox, snoozing_first()).spawn();
    let attempts = traces.wait("webhook.process", id, 2).await;
    worker.shutdown().await;
    let accept = &traces.accept(id).await;
    assert_child(&attempts[0], accept);
    assert_eq!(int_attribute(&attempts[1], "attempt"), Some(1));
    assert_linked(&attempts[1], accept);
}

/// JetStream under a per-object cap: a failed event runs again in the worker (its
/// object's turn kept), not redelivered: that run too is a new trace linked to the accept.
#[tokio::test]
async fn jetstream_a_rerun_in_the_worker_is_linked() {
    let traces = Traces::install();
    let (jetstream, name) = jetstream(false).await;
    let id = "evt_otel_js_rerun";
    deliver(jetstream.accept_service(), id, None).await;
    // Two: the worker keeps the objects' turns (at one, JetStream's lines keep them).
    let worker = js_worker(&jetstream, failing_first(1))
        .with_per_object(2)
        .unwrap()
        .spawn();
    eventually("processed", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 1)
    })
    .await;
    let accept = &traces.accept(id).await;
    let runs: Vec<SpanData> = traces
        .exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == "webhook.process" && int_attribute(s, "attempt") == Some(2))
        .collect();
    worker.shutdown().await;
    assert_eq!(runs.len(), 1, "attempt 2's span");
    assert_linked(&runs[0], accept);
    delete_streams(&name).await;
}

/// Fan-out: each processor's first run is the accept's child (its span names the
/// processor); a processor added later runs a backfilled route in a new trace linked to
/// the accept.
async fn fan_out_first_runs_are_children_and_a_backfill_is_linked(db: Db) {
    let traces = Traces::install();
    let spec = |name: &str| ProcessorSpec::new(name).unwrap();
    let inbox = db
        .inbox()
        .with_processors([spec("billing"), spec("email")])
        .unwrap();
    let id = "evt_otel_fan_out";
    deliver(inbox.accept_service(), id, None).await;
    let later = inbox
        .clone()
        .with_processors([spec("billing"), spec("email"), spec("audit")])
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await; // a backfill a millisecond on
    assert_eq!(later.backfill("audit", Backfill::all()).await.unwrap(), 1);
    let workers: Vec<_> = ["billing", "email", "audit"]
        .into_iter()
        .map(|name| {
            Worker::processor(&later, name, failing_first(0))
                .unwrap()
                .with_poll_interval(Duration::from_millis(50))
                .unwrap()
                .spawn()
        })
        .collect();
    let runs = traces.wait("webhook.process", id, 3).await;
    for worker in workers {
        worker.shutdown().await;
    }
    let accept = &traces.accept(id).await;
    let of = |name: &str| {
        runs.iter()
            .find(|s| attribute(s, "processor") == Some(name))
            .unwrap_or_else(|| panic!("{name}'s run"))
    };
    assert_child(of("billing"), accept);
    assert_child(of("email"), accept);
    assert_linked(of("audit"), accept);
}

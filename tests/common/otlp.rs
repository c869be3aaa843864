//! A small OTLP/HTTP collector on 127.0.0.1: it keeps every span posted to `/v1/traces`,
//! decoded from protobuf or JSON by its content type, as a real collector would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use http::{header, HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    /// The content type of each export, in order.
    content_types: Arc<Mutex<Vec<String>>>,
    /// The `service.name` of each export's resources.
    services: Arc<Mutex<Vec<String>>>,
}

/// The collector: its base URL (for `OTEL_EXPORTER_OTLP_ENDPOINT`) and what it received.
pub struct Collector {
    pub url: String,
    received: Received,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts a collector on a free port.
pub async fn collector() -> Collector {
    let received = Received::default();
    let app = Router::new()
        .route("/v1/traces", post(export))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Collector {
        url,
        received,
        server,
    }
}

async fn export(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> (
    StatusCode,
    [(header::HeaderName, &'static str); 1],
    &'static str,
) {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (request, answer): (ExportTraceServiceRequest, _) = match content_type.as_str() {
        "application/json" => (
            serde_json::from_slice(&body).unwrap(),
            ("application/json", "{}"),
        ),
        "application/x-protobuf" => (
            prost::Message::decode(body.as_ref()).unwrap(),
            ("application/x-protobuf", ""),
        ),
        other => panic!("an export with the content type {other:?}"),
    };
    received.content_types.lock().unwrap().push(content_type);
    for resource in request
        .resource_spans
        .iter()
        .filter_map(|r| r.resource.as_ref())
    {
        let name = resource
            .attributes
            .iter()
            .find(|kv| kv.key == "service.name");
        if let Some(Value::StringValue(name)) =
            name.and_then(|kv| kv.value.as_ref()?.value.as_ref())
        {
            received.services.lock().unwrap().push(name.clone());
        }
    }
    let spans = request
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans);
    received.spans.lock().unwrap().extend(spans);
    (StatusCode::OK, [(header::CONTENT_TYPE, answer.0)], answer.1)
}

impl Collector {
    /// The spans received so far once `done` holds of them, within 15 s.
    pub async fn spans_when(&self, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.received.spans.lock().unwrap().clone();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the collector has not received the spans wanted: {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The content type of each export received.
    pub fn content_types(&self) -> Vec<String> {
        self.received.content_types.lock().unwrap().clone()
    }

    /// The `service.name` of each export's resources.
    pub fn services(&self) -> Vec<String> {
        self.received.services.lock().unwrap().clone()
    }
}

/// `span`'s string (or integer, as text) attribute `key`.
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The spans named `name` whose `messaging.message.id` is `id`.
pub fn spans_of<'a>(spans: &'a [Span], name: &str, id: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.name == name && attribute(s, "messaging.message.id").as_deref() == Some(id))
        .collect()
}

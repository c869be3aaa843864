//! The receiver's OpenTelemetry: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the crate's spans
//! (`webhook.delivery`, the PRODUCER `webhook.accept`, the CONSUMER `webhook.process`) are
//! exported over OTLP/HTTP; unset, nothing is installed and nothing exported.
//!
//! The standard variables are read by the libraries themselves: the endpoint (to which
//! `/v1/traces` is appended) by the exporter, `OTEL_SERVICE_NAME` by the SDK's resource,
//! `OTEL_BSP_SCHEDULE_DELAY` by its batch processor. `OTEL_EXPORTER_OTLP_PROTOCOL` is read
//! here, so that a protocol this build cannot speak (`grpc`) stops the receiver at start.
//! Two of the batch processor's defaults are the receiver's own, each only where its
//! variable is unset: `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` 2048 and `OTEL_BSP_MAX_QUEUE_SIZE`
//! 16384 (the SDK's: 512, 2048).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The installed exporter: [`Otel::shutdown`] sends what its batch still holds.
pub struct Otel(SdkTracerProvider);

/// Installs the exporter and a `tracing` subscriber over it, if the endpoint is set.
pub fn install() -> Result<Option<Otel>, Box<dyn std::error::Error>> {
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("http/protobuf") => Protocol::HttpBinary,
        Ok("http/json") => Protocol::HttpJson,
        Ok(other) => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL: {other:?} is not one of http/protobuf, http/json"
            )
            .into())
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("OTEL_EXPORTER_OTLP_PROTOCOL: not UTF-8".into())
        }
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()?;
    // Larger batches than the SDK's: a quarter as many exports (BENCHMARKS.md, issue 35).
    // A variable that is set (and a number) wins; read here, as the SDK caps the batch at
    // its own queue size while it reads them.
    let set = |name| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let batch = BatchConfigBuilder::default() // the other OTEL_BSP_* variables
        .with_max_queue_size(set("OTEL_BSP_MAX_QUEUE_SIZE").unwrap_or(16384))
        .with_max_export_batch_size(set("OTEL_BSP_MAX_EXPORT_BATCH_SIZE").unwrap_or(2048));
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch.build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().build())
        .build();
    // Without the layer's source locations, thread names, target and busy/idle timings:
    // eight attributes a span the crate's own fields make redundant, and a clock read at
    // every poll of a delivery (a third of what exporting a span cost, measured by callgrind).
    let spans = tracing_opentelemetry::layer()
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_tracer(provider.tracer("tower-webhook"));
    // The crate's spans only: a dependency's (sqlx's, hyper's) would be exported too. A
    // global filter, not the layer's own (`with_filter`), which looks each span up again
    // at every enter, exit and close.
    let crate_only = Targets::new().with_target("tower_webhook", tracing::Level::INFO);
    tracing_subscriber::registry()
        .with(crate_only)
        .with(spans)
        .try_init()?;
    Ok(Some(Otel(provider)))
}

impl Otel {
    /// Flushes the spans still batched, then stops the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.0.shutdown() {
            eprintln!("OpenTelemetry: {error}");
        }
    }
}

//! [`JetStreamBuilder`]: the stream's settings when it is created, and the streams and
//! buckets beside it (dead, paused, the pauses, the held deliveries).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use super::processors::{self, Lane};
use super::{pause, Inner, JetStream};
use crate::inbox::processors::{Processors, DEFAULT_PROCESSOR};
use crate::inbox::ProcessorSpec;
use crate::store::{StoreError, StoreErrorKind};

/// Builds a [`JetStream`]: the stream's settings when this creates it, and the consumer
/// its workers share.
#[must_use]
#[derive(Debug)]
pub struct JetStreamBuilder {
    pub(super) client: async_nats::Client,
    pub(super) stream: String,
    pub(super) consumer: String,
    pub(super) duplicate_window: Duration,
    pub(super) max_age: Duration,
    pub(super) replicas: usize,
    pub(super) storage: stream::StorageType,
    pub(super) publish_timeout: Duration,
    /// The processors (`with_processors`); `None`: `default` alone, as before fan-out.
    pub(super) processors: Option<crate::inbox::processors::Processors>,
    /// `with_keys`: payloads sealed under it; `None`: published in clear.
    #[cfg(feature = "seal")]
    pub(super) keys: Option<crate::seal::KeyRing>,
    /// `with_trusted_traceparent`.
    #[cfg(feature = "otel")]
    pub(super) trusted_traceparent: bool,
    /// `with_schemas`.
    #[cfg(feature = "schemas")]
    pub(super) schemas: Option<crate::schemas::Schemas>,
    /// `with_alerts`.
    #[cfg(all(feature = "schemas", feature = "alerts"))]
    pub(super) alerts: Option<crate::alerts::Alerts>,
}

impl JetStreamBuilder {
    /// Replaces the name of the durable consumer the workers share (default
    /// `tower-webhook`): two groups of workers with two names each see every message.
    pub fn with_consumer(mut self, name: &str) -> Self {
        name.clone_into(&mut self.consumer);
        self
    }

    /// Replaces how long JetStream remembers a message id to drop its duplicates (default
    /// 2 minutes), for a stream this creates.
    pub fn with_duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Replaces how long the stream keeps messages (default 7 days), for a stream this
    /// creates.
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// Replaces how many servers hold each message (default 1), for a stream this
    /// creates: a 204 then means stored on that many.
    ///
    /// # Errors
    ///
    /// When `replicas` is 0 or more than 5 (JetStream's most).
    pub fn with_replicas(mut self, replicas: usize) -> Result<Self, crate::ConfigError> {
        if !(1..=5).contains(&replicas) {
            return Err(crate::ConfigError::new(
                crate::ConfigErrorKind::InvalidValue,
                "a stream has 1 to 5 replicas",
            ));
        }
        self.replicas = replicas;
        Ok(self)
    }

    /// Keeps a stream this creates in the servers' memory instead of on disk: for tests (a
    /// 204 then means held by a server that loses it when it restarts).
    pub fn with_memory_storage(mut self) -> Self {
        self.storage = stream::StorageType::Memory;
        self
    }

    /// Replaces how long a publish waits for JetStream's acknowledgement (default 5 s)
    /// before the delivery gets 503.
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Seals each accepted event's body under `keys`' current key before it is published
    /// (its key id and nonce in the headers `Webhook-Key-Id` and `Webhook-Nonce`), so the
    /// stream's files — and its dead and parked streams' — hold no plaintext body; every
    /// processor's worker opens it with any key of the ring and gets the plaintext
    /// [`Event`](crate::Event). A message published in clear (no `Webhook-Key-Id`, before
    /// keys were configured) is read as it is. A message no key opens (its key removed,
    /// or altered) is never run nor retried: it is buried at once in the dead stream with
    /// the reason, its payload as it was, to be opened there once its key is back. A
    /// processor's error on a dead message (`Webhook-Error`: it may quote the body) is
    /// sealed too (`sealed:v1:<key id>:<base64 of nonce ‖ ciphertext>`); the crate's own
    /// reasons stay in clear.
    ///
    /// The source, id, type, object id, livemode, timestamp (headers) and the subject
    /// stay in clear. Messages cannot be rewritten: keep an old key in the ring until the
    /// stream's `max_age` has passed since it was last current, and as long as the dead
    /// or parked streams hold messages it sealed (see `docs/design/payload-protection.md`
    /// §6).
    #[cfg(feature = "seal")]
    pub fn with_keys(mut self, keys: crate::seal::KeyRing) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Makes a verified delivery's W3C `traceparent` header the parent of its accept's
    /// span (feature `otel`), as the SQL inbox's `Inbox::with_trusted_traceparent` does:
    /// off by default, the header only a link (a forged trace id never joins your
    /// traces).
    #[cfg(feature = "otel")]
    pub fn with_trusted_traceparent(mut self, trusted: bool) -> Self {
        self.trusted_traceparent = trusted;
        self
    }

    /// Checks each accepted event's body against its type's schema, once, before any
    /// processor's consumer can see it: one that fails is answered 2xx and published to
    /// `<stream>-invalid` (kept until an operator deals with it, as dead messages are)
    /// with its errors in `Webhook-Validation-Errors`, never to the stream, so no worker
    /// runs it; `Counts::invalid` counts them. As `Inbox::with_schemas`.
    #[cfg(feature = "schemas")]
    pub fn with_schemas(mut self, schemas: crate::schemas::Schemas) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Raises [`AlertKind::Invalid`](crate::alerts::AlertKind::Invalid) through `alerts`
    /// for each new invalid event (one JetStream dropped as a duplicate raises nothing).
    /// As `Inbox::with_alerts`.
    #[cfg(all(feature = "schemas", feature = "alerts"))]
    pub fn with_alerts(mut self, alerts: crate::alerts::Alerts) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// Uses the stream, creating it if it does not exist.
    ///
    /// # Errors
    ///
    /// When the stream or consumer name is not a valid JetStream name
    /// ([`StoreErrorKind::InvalidInput`]), or the stream cannot be created.
    pub async fn build(self) -> Result<JetStream, StoreError> {
        for name in [&self.stream, &self.consumer] {
            if name.is_empty()
                || name
                    .chars()
                    .any(|c| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace())
            {
                return Err(StoreError::message(
                    "a JetStream stream or consumer name: no dots, wildcards, slashes or spaces",
                )
                .with_kind(StoreErrorKind::InvalidInput));
            }
        }
        let context = jetstream::ContextBuilder::new()
            .timeout(self.publish_timeout)
            .build(self.client);
        let config = |name: String| stream::Config {
            subjects: vec![format!("{name}.>")],
            name,
            storage: self.storage,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            max_age: self.max_age,
            ..Default::default()
        };
        // Dead and parked messages stay until an operator deals with them, as dead rows do.
        let kept = |what: &str| stream::Config {
            max_age: Duration::ZERO,
            ..config(format!("{}-{what}", self.stream))
        };
        let mut configs = vec![config(self.stream.clone()), kept("dead"), kept("paused")];
        #[cfg(feature = "schemas")]
        if self.schemas.is_some() {
            configs.push(kept("invalid"));
        }
        for spec in self.processors.iter().flat_map(|p| p.iter()) {
            if spec.name() != crate::inbox::processors::DEFAULT_PROCESSOR {
                let name = spec.name();
                configs.extend([
                    kept(&format!("dead-{name}")),
                    kept(&format!("paused-{name}")),
                ]);
            }
        }
        for config in configs {
            let stream = context.get_or_create_stream(config).await.map_err(|e| {
                // The server's answer (a stream of that name configured otherwise, a
                // limit) does not pass by itself; no answer in time may.
                use async_nats::jetstream::context::CreateStreamErrorKind as Why;
                let kind = match e.kind() {
                    Why::TimedOut | Why::JetStreamUnavailable => StoreErrorKind::Unavailable,
                    _ => StoreErrorKind::Other,
                };
                StoreError::new("jetstream stream", e).with_kind(kind)
            })?;
            let _replicas = stream.cached_info().config.num_replicas;
            #[cfg(feature = "tracing")]
            if _replicas <= 1 {
                tracing::warn!(
                    target: "tower_webhook",
                    stream = %stream.cached_info().config.name,
                    "JetStream stream has one replica: an event answered 204 is lost if this \
                     server loses its disk, or its power before it synced (NATS acknowledges \
                     before fsync); in production use 3 replicas and `sync_interval: always` \
                     (see RELIABILITY.md)"
                );
            }
        }
        let bucket = |what: &str, max_age| kv::Config {
            bucket: pause::bucket_name(&self.stream, what),
            history: 1,
            max_age,
            storage: self.storage,
            num_replicas: self.replicas,
            ..Default::default()
        };
        let pauses = pause::bucket(&context, bucket("pauses", Duration::ZERO)).await?;
        // A count outlives no message: a message is gone after the stream's `max_age`.
        let held = pause::bucket(&context, bucket("held", self.max_age)).await?;
        let processors = self.processors.as_ref();
        let ack_wait = super::worker::ACK_WAIT;
        let names = (self.stream.as_str(), self.consumer.as_str());
        // A pass is kept as long as its message.
        let passes = |what: &str| bucket(what, self.max_age);
        let lanes = processors::lanes(&context, names, processors, ack_wait, passes);
        let lanes = lanes.await?;
        let default = lanes
            .iter()
            .find(|l| l.name() == DEFAULT_PROCESSOR)
            .cloned();
        let default = default.unwrap_or_else(|| {
            // Not configured: `JetStreamWorker::new` still runs it, on the consumer alone.
            Arc::new(Lane::new(
                ProcessorSpec::default_processor(),
                &self.consumer,
            ))
        });
        let fan_out = !matches!(&lanes[..], [only] if only.name() == DEFAULT_PROCESSOR);
        Ok(JetStream {
            inner: Arc::new(Inner {
                context,
                stream: self.stream,
                consumer: self.consumer,
                processors: self.processors.unwrap_or_else(Processors::single),
                lanes,
                fan_out,
                pauses,
                held,
                #[cfg(feature = "seal")]
                keys: self.keys,
                #[cfg(feature = "otel")]
                trusted_traceparent: self.trusted_traceparent,
                #[cfg(feature = "schemas")]
                schemas: self.schemas,
                #[cfg(all(feature = "schemas", feature = "alerts"))]
                alerts: self.alerts,
            }),
            lane: default,
        })
    }
}

//! [`AmqpBuilder`]: the broker, the names and the settings, and `build`: connected, the
//! topology declared or checked.

use std::sync::Arc;
use std::time::Duration;

use super::connection::{self, Connection};
use super::topology::{self, Names};
use super::{Amqp, Inner};
use crate::inbox::processors::{Processors, DEFAULT_PROCESSOR};
use crate::store::StoreError;
use crate::{ConfigError, ConfigErrorKind};

/// Builds an [`Amqp`]: the broker's URL, the exchange and queue names, the queue's
/// delivery limit and the confirm timeout. Its `Debug` leaves the URL's password out.
#[must_use]
pub struct AmqpBuilder {
    url: String,
    exchange: String,
    pub(super) queue: String,
    delivery_limit: u32,
    /// `with_max_length`: `None`, unbounded.
    max_length: Option<u32>,
    confirm_timeout: Duration,
    /// `with_consumer_timeout`: the broker's.
    consumer_timeout: Duration,
    /// `with_trusted_traceparent`.
    #[cfg(feature = "otel")]
    trusted_traceparent: bool,
    /// `with_keys`: payloads sealed under it; `None`: published in clear.
    #[cfg(feature = "seal")]
    keys: Option<crate::seal::KeyRing>,
    /// `with_schemas`.
    #[cfg(feature = "schemas")]
    schemas: Option<crate::schemas::Schemas>,
    /// The processors (`with_processors`, `processors.rs`); `None`: `default` alone.
    pub(super) processors: Option<Processors>,
}

/// RabbitMQ's default `consumer_timeout`.
const DEFAULT_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The most a name may hold: AMQP's 255 bytes.
pub(super) const AMQP_NAME: usize = 255;
/// The most an exchange's name may hold: less `-dead`.
const MAX_EXCHANGE: usize = AMQP_NAME - "-dead".len();

/// The most a queue's name may hold: less its longest delay queue's suffix
/// (`-retry-104857600`), which is longer than `-dead`.
fn max_queue() -> usize {
    AMQP_NAME - super::worker::delays::longest_suffix()
}

impl AmqpBuilder {
    pub(super) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            exchange: "webhooks".to_owned(),
            queue: "webhooks".to_owned(),
            delivery_limit: 20,
            max_length: None,
            confirm_timeout: Duration::from_secs(5),
            consumer_timeout: DEFAULT_CONSUMER_TIMEOUT,
            #[cfg(feature = "otel")]
            trusted_traceparent: false,
            #[cfg(feature = "seal")]
            keys: None,
            #[cfg(feature = "schemas")]
            schemas: None,
            processors: None,
        }
    }

    /// Replaces the exchange's name (default `webhooks`); its dead exchange is
    /// `<exchange>-dead`.
    ///
    /// # Errors
    ///
    /// When the name is empty, longer than 250 bytes, or starts with `amq.` (the broker's own).
    pub fn with_exchange(mut self, name: &str) -> Result<Self, ConfigError> {
        check_name("exchange", name, MAX_EXCHANGE)?;
        name.clone_into(&mut self.exchange);
        Ok(self)
    }

    /// Replaces the quorum queue's name (default `webhooks`); its dead queue is
    /// `<queue>-dead`, its delay queues `<queue>-retry-<ms>`.
    ///
    /// # Errors
    ///
    /// When the name is empty, longer than 239 bytes (its longest delay queue's name must
    /// fit AMQP's 255), or starts with `amq.` (the broker's own); with
    /// [`with_processors`](Self::with_processors) set first, when a processor's queue
    /// names would not fit or clash (see there).
    pub fn with_queue(mut self, name: &str) -> Result<Self, ConfigError> {
        check_name("queue", name, max_queue())?;
        super::processors::check(name, self.processors.as_ref())?;
        name.clone_into(&mut self.queue);
        Ok(self)
    }

    /// Replaces the queue's delivery limit (default 20): a message delivered that many
    /// times without being acknowledged is dead-lettered to `<queue>-dead` by the broker
    /// — the backstop for a message whose every attempt crashed its worker. Part of the
    /// queue's arguments: a queue that exists with another limit is a configuration error
    /// at [`build`](Self::build).
    ///
    /// # Errors
    ///
    /// When `limit` is 0.
    pub fn with_delivery_limit(mut self, limit: u32) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "a queue's delivery limit is at least 1",
            ));
        }
        self.delivery_limit = limit;
        Ok(self)
    }

    /// Bounds the queue to `n` messages (`x-max-length`; unbounded unless set): once it
    /// holds `n`, the broker refuses (`basic.nack`) each publish, and the accept answers
    /// 503 with `Retry-After` until the workers have taken some, so a backlog pushes back
    /// on the providers instead of filling the broker's disk. It is one of the queue's
    /// arguments: a queue that exists with another bound is a configuration error at
    /// [`build`](Self::build).
    ///
    /// # Errors
    ///
    /// When `n` is 0 (a queue that takes nothing).
    pub fn with_max_length(mut self, n: u32) -> Result<Self, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "a queue's max length is at least 1",
            ));
        }
        self.max_length = Some(n);
        Ok(self)
    }

    /// Replaces how long a publish waits for its channel and the broker's confirm (default
    /// 5 s): an accept's — past it, the accept fails (503) and the message may still be
    /// stored — and the crate's own: a worker's retry, dead or parked copy, a pause's
    /// record, a requeued invalid event (past it, the copy is tried again: a copy stored
    /// twice is claimed once in the worker's store). Lowering it for the front door's
    /// latency makes those fail more often under load.
    ///
    /// # Errors
    ///
    /// When `timeout` is not between 10 ms and 60 s.
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        let range = Duration::from_millis(10)..=Duration::from_secs(60);
        if !range.contains(&timeout) {
            return Err(ConfigError::duration(
                "the confirm timeout",
                timeout,
                "between 10 ms and 60 s",
            ));
        }
        self.confirm_timeout = timeout;
        Ok(self)
    }

    /// Says what the broker's `consumer_timeout` is (default 30 min, RabbitMQ's own
    /// default): RabbitMQ closes a consumer's channel — every delivery on it handed back —
    /// when one of its deliveries stays unacknowledged longer. An [`AmqpWorker`]'s
    /// [`with_max_run`](super::AmqpWorker::with_max_run) must end well within it (its
    /// default is derived from it), so raise `consumer_timeout` in `rabbitmq.conf` (or the
    /// `consumer-timeout` policy on RabbitMQ 3.12+) before letting processors run longer,
    /// and say so here. The broker's setting cannot be read over AMQP, and RabbitMQ 3.10
    /// accepts a consumer's `x-consumer-timeout` argument without applying it (a delivery
    /// held 80 s past a 2 s one kept its channel), so the crate does not set it.
    ///
    /// [`AmqpWorker`]: super::AmqpWorker
    ///
    /// # Errors
    ///
    /// When `timeout` is shorter than 1 min.
    pub fn with_consumer_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout < Duration::from_secs(60) {
            return Err(ConfigError::duration(
                "the broker's consumer timeout",
                timeout,
                "at least 1 min",
            ));
        }
        self.consumer_timeout = timeout;
        Ok(self)
    }

    /// Makes a verified delivery's W3C `traceparent` header the parent of its accept's
    /// span (feature `otel`), as JetStream's `with_trusted_traceparent` does: off by
    /// default, the header only a link (a forged trace id never joins your traces).
    #[cfg(feature = "otel")]
    pub fn with_trusted_traceparent(mut self, trusted: bool) -> Self {
        self.trusted_traceparent = trusted;
        self
    }

    /// Seals each accepted event's body under `keys`' current key before it is published
    /// (its key id and nonce in the headers `Webhook-Key-Id` and `Webhook-Nonce`), so the
    /// broker's queue files — the queue's, the delay queues' and the dead queue's — hold
    /// no plaintext body; the worker opens it with any key of the ring and gets the
    /// plaintext [`Event`](crate::Event). A message published in clear (no
    /// `Webhook-Key-Id`) is read as it is. A message no key opens (its key removed, or
    /// altered) is never run nor retried: it is buried at once in `<queue>-dead` with the
    /// reason in `Webhook-Error`, its payload as it was, to be opened there once its key
    /// is back. A processor's error on a dead message (it may quote the body) is sealed
    /// too (`sealed:v1:<key id>:<base64 of nonce ‖ ciphertext>`); the crate's own reasons
    /// stay in clear. As `JetStreamBuilder::with_keys`: the source, id, type, object id,
    /// livemode, timestamp (headers) and the routing key stay in clear; keep an old key in
    /// the ring as long as the queues hold messages it sealed.
    #[cfg(feature = "seal")]
    pub fn with_keys(mut self, keys: crate::seal::KeyRing) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Checks each accepted event's body against its type's schema, once, at accept: one
    /// that fails is answered 2xx and published (confirmed, as any accept) to
    /// `<queue>-invalid` — a quorum queue bound to `<exchange>-dead`, declared at
    /// [`build`](Self::build) — with its errors in `Webhook-Validation-Errors` (JSON
    /// pointers and messages, never a value of the body), never to the exchange, so no
    /// worker runs it; it stays there until an operator deals with it, and
    /// `Counts::invalid` counts it. As `JetStreamBuilder::with_schemas`.
    #[cfg(feature = "schemas")]
    pub fn with_schemas(mut self, schemas: crate::schemas::Schemas) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Connects, declares what is missing — the topic exchange, the quorum queue bound to
    /// it with `#` (with [`with_processors`](Self::with_processors), each processor's),
    /// the dead exchange and dead queue(s) — and checks what exists, then hands the
    /// connection to the crate's supervisor (see the [module](super)).
    ///
    /// # Errors
    ///
    /// When the broker cannot be reached or refuses the credentials; when an exchange or
    /// queue exists with other settings (of kind
    /// [`Other`](crate::store::StoreErrorKind::Other), its source naming the exchange or
    /// queue and the argument that differs, as RabbitMQ's `PRECONDITION_FAILED` says).
    pub async fn build(self) -> Result<Amqp, StoreError> {
        let connection = Connection::start(&self.url).await?;
        let names = Names::new(&self.exchange, &self.queue);
        let limits = (self.delivery_limit, self.max_length);
        #[cfg(feature = "schemas")]
        let invalid = self.schemas.is_some();
        #[cfg(not(feature = "schemas"))]
        let invalid = false;
        let processors = self.processors.unwrap_or_else(Processors::single);
        let lanes = super::processors::lanes(&self.queue, &processors);
        topology::declare(&connection, &names, &lanes, limits, invalid).await?;
        let default = lanes
            .iter()
            .find(|l| l.name() == DEFAULT_PROCESSOR)
            .cloned();
        // Not configured: `AmqpWorker::new` would consume `<queue>`, which no processor has.
        let default = default.unwrap_or_else(|| {
            let spec = crate::inbox::ProcessorSpec::default_processor();
            Arc::new(super::processors::Lane::new(spec, &self.queue))
        });
        Ok(Amqp {
            lane: default,
            inner: Arc::new(Inner {
                connection,
                names,
                processors,
                lanes,
                confirm_timeout: self.confirm_timeout,
                consumer_timeout: self.consumer_timeout,
                delivery_limit: self.delivery_limit,
                #[cfg(feature = "otel")]
                trusted_traceparent: self.trusted_traceparent,
                #[cfg(feature = "seal")]
                keys: self.keys,
                #[cfg(feature = "schemas")]
                schemas: self.schemas,
                pauses: super::pause::Log::default(),
            }),
        })
    }
}

fn check_name(what: &str, name: &str, max: usize) -> Result<(), ConfigError> {
    let problem = if name.is_empty() {
        "is empty".to_owned()
    } else if name.len() > max {
        format!("is longer than {max} bytes")
    } else if name.starts_with("amq.") {
        "starts with `amq.`, the broker's own".to_owned()
    } else {
        return Ok(());
    };
    Err(ConfigError::new(
        ConfigErrorKind::InvalidValue,
        format!("the {what} name {problem}"),
    ))
}

impl std::fmt::Debug for AmqpBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBuilder")
            .field("broker", &connection::redact(&self.url))
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .field("delivery_limit", &self.delivery_limit)
            .field("max_length", &self.max_length)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("consumer_timeout", &self.consumer_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_leave_room_for_their_dead_and_delay_queues() {
        let builder = || AmqpBuilder::new("amqp://127.0.0.1:5672/%2f");
        assert!(builder().with_exchange(&"x".repeat(250)).is_ok());
        assert!(builder().with_exchange(&"x".repeat(251)).is_err());
        assert!(builder().with_queue(&"q".repeat(239)).is_ok());
        let error = builder().with_queue(&"q".repeat(240)).unwrap_err();
        assert_eq!(error.to_string(), "the queue name is longer than 239 bytes");
        let longest = crate::inbox::amqp::worker::delays::name(&"q".repeat(239), 20);
        assert_eq!(longest.len(), 255, "{longest}");
        assert!(builder().with_queue("").is_err());
        assert!(builder().with_queue("amq.mine").is_err());
    }
}

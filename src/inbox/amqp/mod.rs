//! RabbitMQ as the inbox (feature `amqp`): verified events published to a quorum queue a
//! platform already runs, each answered 2xx only once the broker confirmed it.
//!
//! ```text
//! request ─► VerifyWebhookLayer ─► DedupeLayer ─► amqp.accept() ── publish (mandatory, persistent)
//!                                   (every retry)        on a confirm-mode channel ─► Ack, nothing returned ─► 204
//!                                                        Nack, returned, late, no connection ─► 503 + Retry-After
//!            exchange `webhooks` (topic) ── `<source>.<type>` ─► quorum queue `webhooks` (bound with `#`)
//!                                   delivery limit reached ─► `webhooks-dead` (exchange) ─► `webhooks-dead` (queue)
//! ```
//!
//! - [`Amqp::accept`] publishes the event — its raw body, with its source, id, type,
//!   object id, livemode and timestamp in headers, `message_id` the event's dedupe id —
//!   persistent and `mandatory` to the exchange with the routing key `<source>.<type>`
//!   (the type's dots kept, so bindings can match `stripe.invoice.*`; an event without a
//!   type: `<source>._`), on a channel in confirm mode, and returns only once the broker
//!   acknowledged it with nothing returned. A 204 from [`accept_service`] means: routed
//!   to every queue bound to it, and for a quorum queue, written and synced to disk on a
//!   majority of its replicas (RabbitMQ confirms a quorum queue's message once its Raft
//!   log committed it).
//! - Anything else is a 503 with `Retry-After`, and the provider retries: no connection
//!   (the broker is away, or the connection is being re-established), a `basic.nack` (the
//!   queue refused it: `reject-publish` overflow, a queue without its majority), a
//!   message returned unroutable (no queue bound for its routing key: the queue deleted
//!   or unbound — lapin reports it as an `Ack` with the returned message, which counts as
//!   a failure here), or no confirm within the confirm timeout (5 s unless set: the
//!   message may still be stored, and its retry is a second message).
//! - RabbitMQ does not drop duplicates: put [`DedupeLayer`] with any store in front of
//!   [`accept_service`]. Its claim is held while the publish runs, released when it
//!   fails (so the provider's retry publishes again) and done when it was confirmed.
//! - The connection is the crate's, not lapin's recovery (which does not always come
//!   back after a broker restart): one task owns it, and when it errors or closes,
//!   connects again after 100 ms, doubling up to 1 s between tries, for as long as an
//!   [`Amqp`] exists. Publishing resumes on the first connection that works; while there
//!   is none, each accept fails at once (503), never waits for it. A connection gone
//!   silent (a partition, no reset) is found dead by its heartbeat: 10 s unless the URL
//!   sets `?heartbeat=` (RabbitMQ's default is 60 s); meanwhile each accept fails after
//!   the confirm timeout.
//! - [`AmqpWorker`] consumes the queue (manual acknowledgements, a prefetch), claims each
//!   event in a [`DedupeStore`](crate::store::DedupeStore) before running it and marks it
//!   done before the acknowledgement (a message delivered again is acknowledged unrun),
//!   sends a failure to wait out its backoff in a delay queue (`<queue>-retry-<ms>`, which
//!   dead-letters back to the queue) and buries it in `<queue>-dead` after the last
//!   attempt; it consumes again on a channel of its own after the connection came back.
//! - [`Amqp::pause`] holds back a source's events, a type's, or all, for every worker of
//!   the queue in every process, until [`Amqp::resume`]: the pauses are records in the
//!   stream queue `<queue>-pauses` each `Amqp` replays and tails, and a worker parks each
//!   paused message it pulls in `<queue>-paused`, moved back when the pause ends (see
//!   [`pause`](Amqp::pause)).
//! - Fan-out ([`AmqpBuilder::with_processors`]): one quorum queue per processor, every one
//!   bound to the exchange with `#` — `default` keeps `<queue>`, another processor `name`
//!   gets `<queue>-<name>` with its own dead queue (`<queue>-<name>-dead`) and delay
//!   queues — so the one confirmed publish reaches each; its workers
//!   ([`AmqpWorker::processor`]) consume it with their own retries, caps and claim keys,
//!   and acknowledge unrun an event its filter does not take;
//!   [`Amqp::counts_by_processor`] counts each. The broker confirms a publish it routed to
//!   at least one queue: a processor's queue deleted while the others are still bound
//!   misses the events published meanwhile (no queue at all is still a 503).
//! - With a key ring ([`with_keys`], feature `seal`) each body is published
//!   sealed, as JetStream's, so the broker's files hold no plaintext; the worker opens it,
//!   and buries one no key opens in `<queue>-dead` with the reason, never running it. With
//!   schemas ([`with_schemas`], feature `schemas`) an event its schema
//!   refuses goes to `<queue>-invalid` with its errors, answered 2xx, never run;
//!   `Amqp::list_invalid` lists them, `Amqp::requeue_invalid` requeues those valid now.
//! - The topology is declared at [`AmqpBuilder::build`] when missing, and checked when
//!   present: the exchange (topic, durable), the queue (quorum, with a delivery limit and
//!   at-least-once dead-lettering to `<exchange>-dead`, routing key the queue's name), the
//!   dead exchange (direct), the dead queue `<queue>-dead` (quorum), and the pauses'
//!   queues (`<queue>-paused` and `<queue>-pauses-seq`, quorum; `<queue>-pauses`, a
//!   stream) with the fanout exchange `<queue>-pauses` bound to the stream and the count,
//!   which a pause's record is published to once. The queues that only hold messages
//!   (dead, parked, invalid, the count) have a delivery limit past any count (RabbitMQ
//!   4.0–4.2 would put 20 on them). A queue that exists with other arguments is a
//!   configuration error naming it and what differs.
//!
//! What holds:
//!
//! | | RabbitMQ |
//! |---|---|
//! | 2xx means stored | confirmed by the broker: on disk on a majority of the quorum queue's replicas |
//! | a duplicate delivery | `DedupeLayer` in front: one message |
//! | no connection, a nack, an unroutable message, a late confirm | 503 + `Retry-After`, the dedupe claim released |
//!
//! [`DedupeLayer`]: crate::DedupeLayer
//! [`accept_service`]: Amqp::accept_service
//!
//! ```no_run
//! use axum::{routing::post_service, Router};
//! use tower::ServiceBuilder;
//! use tower_webhook::inbox::amqp::Amqp;
//! use tower_webhook::store::MemoryStore;
//! use tower_webhook::{DedupeLayer, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let amqp = Amqp::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .build()
//!     .await?;
//! let verifier = Verifier::new(Scheme::stripe(), ["whsec_from_the_dashboard_0123"])?;
//! let app: Router = Router::new().route(
//!     "/webhooks",
//!     post_service(amqp.accept_service()).layer(
//!         ServiceBuilder::new()
//!             .layer(VerifyWebhookLayer::new(verifier))
//!             .layer(DedupeLayer::new(MemoryStore::new())),
//!     ),
//! );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(feature = "seal", doc = "[`with_keys`]: AmqpBuilder::with_keys")]
#![cfg_attr(not(feature = "seal"), doc = "[`with_keys`]: crate#features")]
#![cfg_attr(
    feature = "schemas",
    doc = "[`with_schemas`]: AmqpBuilder::with_schemas"
)]
#![cfg_attr(not(feature = "schemas"), doc = "[`with_schemas`]: crate#features")]

mod builder; // the names and settings, and `build`: connected, the topology declared
mod connection; // the one connection, supervised: reconnected, channels handed out
#[cfg(feature = "schemas")]
mod invalid; // `<queue>-invalid`: listed, and requeued once valid
mod pause; // pauses every worker of every process sees (a stream); paused events parked
mod processors; // fan-out: a queue, dead and delay queues, workers and counts per processor
mod publish; // an event as a message: routing key, properties, headers; the confirm
mod topology; // the exchanges and quorum queues, declared or checked
mod worker; // `AmqpWorker`: the worker engine on the queue; retries in delay queues

use std::sync::Arc;
use std::time::Duration;

pub use self::builder::AmqpBuilder;
#[cfg(feature = "schemas")]
pub use self::invalid::{InvalidMessage, MAX_INVALID_LIST};
pub use self::worker::AmqpWorker;
use super::accept::{Accept, Destination};
use super::{Accepted, Counts};
use crate::store::StoreError;
use crate::Event;

/// A RabbitMQ exchange and quorum queue used as the inbox. Cloning shares the connection;
/// the connection closes when the last clone is dropped.
#[derive(Clone)]
pub struct Amqp {
    inner: Arc<Inner>,
    /// The processor this handle's workers run: `default`, but for a processor's worker.
    lane: Arc<processors::Lane>,
}

pub(crate) struct Inner {
    connection: connection::Connection,
    names: topology::Names,
    /// The processors configured (`{default}` without fan-out), and their queues.
    processors: crate::inbox::processors::Processors,
    lanes: Vec<Arc<processors::Lane>>,
    confirm_timeout: Duration,
    /// The broker's `consumer_timeout`, as configured (`AmqpBuilder::with_consumer_timeout`).
    consumer_timeout: Duration,
    /// The queue's delivery limit (`x-delivery-limit`).
    delivery_limit: u32,
    /// A verified delivery's `traceparent` is its accept's parent, not a link.
    #[cfg(feature = "otel")]
    trusted_traceparent: bool,
    /// The ring payloads are sealed and opened with (`AmqpBuilder::with_keys`); `None`:
    /// in clear.
    #[cfg(feature = "seal")]
    keys: Option<crate::seal::KeyRing>,
    /// Each event checked at accept (`AmqpBuilder::with_schemas`).
    #[cfg(feature = "schemas")]
    schemas: Option<crate::schemas::Schemas>,
    /// The pauses, replayed from `<queue>-pauses` (`pause.rs`).
    pauses: pause::Log,
}

impl Amqp {
    /// A builder for the exchange and queue named `webhooks` (see [`AmqpBuilder`]) on the
    /// broker at `url` (`amqp://user:password@host:5672/vhost`, the vhost `/` spelled
    /// `%2f`). Nothing connects before [`build`](AmqpBuilder::build).
    pub fn builder(url: &str) -> AmqpBuilder {
        AmqpBuilder::new(url)
    }

    /// The exchange events are published to.
    #[must_use]
    pub fn exchange(&self) -> &str {
        &self.inner.names.exchange
    }

    /// The quorum queue the exchange routes every event to.
    #[must_use]
    pub fn queue(&self) -> &str {
        &self.inner.names.queue
    }

    /// The queue dead messages go to: `<queue>-dead`.
    #[must_use]
    pub fn dead_queue(&self) -> &str {
        &self.inner.names.dead_queue
    }

    /// The queue's delivery limit: how many times a message is delivered before it is
    /// dead-lettered.
    #[must_use]
    pub fn delivery_limit(&self) -> u32 {
        self.inner.delivery_limit
    }

    /// The broker's `consumer_timeout` this `Amqp` was told of
    /// ([`AmqpBuilder::with_consumer_timeout`]; 30 min unless set).
    #[must_use]
    pub fn consumer_timeout(&self) -> Duration {
        self.inner.consumer_timeout
    }

    /// A fresh channel on the current connection (the worker's; closed when dropped by
    /// lapin once unused): fails at once when there is no connection.
    pub(crate) async fn channel(&self) -> Result<lapin::Channel, StoreError> {
        self.inner.connection.channel().await
    }

    /// The names: exchange, queue, dead exchange and dead queue.
    #[allow(dead_code)] // the worker's (issue 37, part 3)
    pub(crate) fn names(&self) -> &topology::Names {
        &self.inner.names
    }

    /// The queue events their schema refused go to: `<queue>-invalid` (declared with
    /// `AmqpBuilder::with_schemas` only).
    #[must_use]
    pub fn invalid_queue(&self) -> &str {
        &self.inner.names.invalid_queue
    }

    /// Whether events are checked against schemas at accept.
    fn has_schemas(&self) -> bool {
        #[cfg(feature = "schemas")]
        return self.inner.schemas.is_some();
        #[cfg(not(feature = "schemas"))]
        false
    }

    /// The ring payloads are sealed and opened with.
    pub(crate) fn keys(&self) -> crate::inbox::message::Keys<'_> {
        #[cfg(feature = "seal")]
        return self.inner.keys.as_ref();
        #[cfg(not(feature = "seal"))]
        None
    }

    /// The supervised connection (the worker waits on it after a cut).
    pub(crate) fn connection(&self) -> &connection::Connection {
        &self.inner.connection
    }

    /// Publishes a verified event and waits for the broker's confirm: `Ok(New)` only when
    /// it acknowledged the message with nothing returned. RabbitMQ keeps no message ids:
    /// a second accept of the same event is a second message (hence `DedupeLayer`).
    ///
    /// # Errors
    ///
    /// When there is no connection, the broker nacks the message, returns it unroutable,
    /// or does not confirm it within the confirm timeout ([`Unavailable`]: the event may
    /// be stored only after a late confirm). When its source or id holds a line break
    /// ([`InvalidInput`]: nothing is published).
    ///
    /// [`Unavailable`]: crate::store::StoreErrorKind::Unavailable
    /// [`InvalidInput`]: crate::store::StoreErrorKind::InvalidInput
    pub async fn accept(&self, event: &Event) -> Result<Accepted, StoreError> {
        self.accept_sent(event, &crate::span::TraceContext::default())
            .await
    }

    /// [`accept`](Self::accept), with the sender's trace context `sent` (feature `otel`:
    /// the accept's span context goes with the message, `traceparent` and `tracestate`).
    async fn accept_sent(
        &self,
        event: &Event,
        sent: &crate::span::TraceContext,
    ) -> Result<Accepted, StoreError> {
        publish::accept(self, event, sent).await?;
        Ok(Accepted::New)
    }

    /// A Tower service that accepts verified deliveries: 204 once the broker confirmed,
    /// 503 + `Retry-After` when it did not, 500 without `VerifyWebhookLayer`.
    #[must_use]
    pub fn accept_service(&self) -> Accept {
        Accept::new(Arc::new(self.clone()))
    }

    /// The queue and the dead queue, counted: `queued` the queue's messages ready for a
    /// consumer, `processing` those waiting out a retry's backoff or a snooze in the delay
    /// queues (`<queue>-retry-<ms>`), `dead` the dead queue's, `paused` the events parked
    /// while paused in `<queue>-paused` (see [`pause`](Self::pause)), `invalid` the invalid
    /// queue's. RabbitMQ does not count what is delivered and not yet acknowledged in a
    /// passive declare: running events are in none of them, and `oldest_due` is `None`.
    /// With [fan-out](AmqpBuilder::with_processors), the sum over the processors' queues:
    /// [`counts_by_processor`](Self::counts_by_processor) has each one's.
    ///
    /// # Errors
    ///
    /// When there is no connection, or a queue is missing.
    pub async fn counts(&self) -> Result<Counts, StoreError> {
        let by = self.counts_by_processor().await?;
        let mut counts = by.into_values().fold(Counts::default(), Counts::plus);
        if self.has_schemas() {
            let channel = self.inner.connection.channel().await?;
            let invalid = topology::message_count(&channel, &self.inner.names.invalid_queue);
            counts.invalid = invalid.await?.into();
            connection::close(&channel, "done").await;
        }
        Ok(counts)
    }

    /// Deletes the queues (every processor's, with their dead, parked and delay queues),
    /// the pauses' queues and the exchanges (the pauses' too), with every message in
    /// them: for tests and demos that made their own.
    ///
    /// # Errors
    ///
    /// When there is no connection, or the broker refuses.
    pub async fn delete(self) -> Result<(), StoreError> {
        for lane in self.lanes() {
            worker::delays::delete(&self, &lane.queue).await?;
        }
        let channel = self.inner.connection.channel().await?;
        topology::delete(&channel, &self.inner.names, &self.lane_queues()).await
    }
}

impl Destination for Amqp {
    fn accept<'a>(&'a self, event: &'a Event) -> crate::inbox::accept::Answer<'a, Accepted> {
        Box::pin(Amqp::accept(self, event))
    }

    fn accept_with<'a>(
        &'a self,
        event: &'a Event,
        _: Option<String>,
        sent: crate::span::TraceContext,
    ) -> crate::inbox::accept::Answer<'a, Accepted> {
        Box::pin(async move { self.accept_sent(event, &sent).await })
    }

    fn counts(&self) -> crate::inbox::accept::Answer<'_, Counts> {
        Box::pin(Amqp::counts(self))
    }
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("broker", &self.inner.connection.redacted_url())
            .field("exchange", &self.inner.names.exchange)
            .field("queue", &self.inner.names.queue)
            .field("processor", &self.lane.name())
            .field("delivery_limit", &self.inner.delivery_limit)
            .field("confirm_timeout", &self.inner.confirm_timeout)
            .finish_non_exhaustive()
    }
}

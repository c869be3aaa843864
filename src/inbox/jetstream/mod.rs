//! NATS JetStream as the inbox (feature `nats`): verified events handed to the stream a
//! platform already runs, and a worker that processes them from it.
//!
//! ```text
//! request ─► VerifyWebhookLayer ─► DedupeLayer ─► jetstream.accept() ── publish ─► ack ─► 204
//!                                   (the long tail)   Nats-Msg-Id: duplicates in the window dropped
//!            JetStreamWorker ─► fetch ─► claim (source, id) in a store ─► your processor(event, attempt)
//!                                   │ done already ─► ack ├─ Ok  ─► done in the store, then ack (confirmed)
//!                                   │                     └─ Err ─► release; nak with backoff; after N attempts, to the dead stream
//! ```
//!
//! - [`JetStream::accept`] publishes the event — its raw body, with its source, id, type,
//!   object id, livemode and timestamp in headers — to the subject
//!   `<stream>.<source>.<type>`, with `Nats-Msg-Id` naming `(source, id)`, and returns only
//!   once JetStream acknowledged the publish: a 204 from [`accept_service`] means stored
//!   on the cluster. Anything else (NATS unreachable, the acknowledgement late) is a 503
//!   and the provider retries.
//! - JetStream drops a second publish of the same id within the stream's duplicate window
//!   (2 minutes unless set). Providers retry for days: put [`DedupeLayer`] with any store
//!   in front of [`accept_service`] to catch the long tail (its claim is held while the
//!   publish runs, released when it fails, and done when it is acknowledged). A publish
//!   stored but acknowledged late still gets 503, and its retry after the window is a
//!   second message: the worker's claim (below) runs it once.
//! - The worker claims each event's `(source, id)` in a [`DedupeStore`] (its own keys, so
//!   it may be `DedupeLayer`'s store) before running the processor, and marks it done
//!   before acknowledging the message: a redelivered message whose key is done — its
//!   acknowledgement died with a crashed NATS server, or it is the late second message —
//!   is acknowledged without running. The store is an argument of
//!   [`JetStreamWorker::new`] because JetStream alone redelivers processed messages;
//!   [`JetStreamWorker::at_least_once`] goes without one, and says so.
//! - A [`JetStreamWorker`] pulls no more messages than it has room to run, renews each
//!   message (`+WPI`, confirmed by the server, every third of the consumer's `ack_wait`:
//!   1 s) and its claim (every third of the claim's lease: 20 s) until the outcome — the
//!   acknowledgement, the nak or the dead publish — has landed, and acknowledges a success
//!   only once the server confirmed it. A message delivered while another attempt holds
//!   its event's claim goes back, uncounted, until that claim ends. A failure
//!   is redelivered after the same capped, jittered backoff as the SQL worker's; after
//!   the last attempt the message is published to `<stream>-dead` and acknowledged. A
//!   message delivered more times than the attempts allow (every attempt crashed its
//!   worker) goes dead unprocessed. Workers in any number of processes share one durable
//!   consumer, so each message is delivered to one of them at a time.
//! - Flow control is the SQL worker's ([`JetStreamWorker`] shares its builder): a rate,
//!   caps per object, source and type (a message over a cap waits in the worker, renewed:
//!   the stream is read in order; one over its source's or type's cap waits without a
//!   processor while the worker reads on, up to
//!   [`with_lookahead`](JetStreamWorker::with_lookahead)), a processor's [`Later`](crate::inbox::Later) (the
//!   snoozed delivery is counted in the bucket `<stream>-held` and not as an attempt; with
//!   a per-object cap of 1, each object's line is kept there too, so its order holds across
//!   workers one after another: `turn.rs`), and
//!   [`JetStream::pause`]: the pauses are kept in the bucket `<stream>-pauses` every
//!   worker watches, and a paused message is parked in `<stream>-paused` until its pause
//!   ends.
//! - Fan-out ([`JetStreamBuilder::with_processors`]): one durable consumer per processor
//!   (`default`'s is `tower-webhook`, another's `<consumer>-<name>`), each with its own
//!   workers ([`JetStreamWorker::processor`]), claim keys, dead and parked streams, pauses
//!   and counts; a message its filter does not take is acknowledged unrun. With more than
//!   one, a dead or parked message stays in the stream, acknowledged, and a parked one
//!   comes back with `Webhook-Processor: <name>`, for that processor alone.
//!   [`JetStream::backfill`] gives a processor added later a window received before it.
//! - Sealed payloads (feature `seal`, [`with_keys`]): each body is
//!   published sealed under a key ring's current key, and opened by every worker with any
//!   key of the ring; one no key opens is buried at once, never run (`sealed.rs`).
//!
//! What holds, beside the SQL inbox (see the README's Guarantees):
//!
//! | | SQL inbox | JetStream |
//! |---|---|---|
//! | 2xx means stored | in the database | on the stream (its replicas): on disk only with `sync_interval: always` on the servers, and R3 to survive one's loss (see below) |
//! | a duplicate delivery | one row (the primary key) | one message within the window; `DedupeLayer` beyond it; processed once either way (the worker's claim) |
//! | a crashed worker | its rows come back after the lease, counted | its messages are redelivered after `ack_wait` (3 s); those it was running go back until their claims' lease (60 s) ends, then run, counted |
//! | a crashed NATS server | n/a | acknowledgements it lost: redelivered, acknowledged without running (the key is done) |
//! | an effect outside the store | at least once (`Once` makes it once) | at least once (`Once` makes it once) |
//! | effects in the store, exactly once | `Worker::transactional` | no: an acknowledgement cannot commit with another database |
//!
//! Durability: NATS acknowledges a publish before it is on disk (the server syncs every
//! 2 minutes unless `sync_interval: always`), and Jepsen's analysis of NATS 2.12.1
//! (December 2025) lost acknowledged writes on power loss and with one corrupted node of
//! five. A 204 is durable only with `sync_interval: always` on every server and streams
//! of 3 replicas ([`JetStreamBuilder::with_replicas`]); [`JetStreamBuilder::build`] logs a
//! warning (feature `tracing`) when the stream has one.
//!
//! Liveness: [`JetStream::connect`] reconnects to a server that came back within a
//! quarter of a second; a client of your own ([`JetStream::builder`]) reconnects on its
//! own schedule (`async-nats` waits up to 4 s between tries by default). Messages the
//! server had sent when the connection dropped are lost in transit: JetStream redelivers
//! them once the consumer's `ack_wait` ([`JetStreamWorker::with_ack_wait`], 3 s) has run
//! out: the worker keeps it short for that, and renews each message it holds.
//!
//! TLS to NATS (`tls://` URLs) needs a rustls crypto provider, which this crate leaves to
//! the application (two providers in one build make rustls refuse to pick): turn on
//! `async-nats`'s `ring` or `aws-lc-rs` feature, or install one at start-up.
//!
//! [`DedupeLayer`]: crate::DedupeLayer
//! [`DedupeStore`]: crate::store::DedupeStore
//! [`accept_service`]: JetStream::accept_service
//!
//! ```no_run
//! use axum::{routing::post_service, Router};
//! use tower::ServiceBuilder;
//! use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
//! use tower_webhook::inbox::Attempt;
//! use tower_webhook::store::SqliteStore;
//! use tower_webhook::{DedupeLayer, Event, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let jetstream = JetStream::connect("nats://127.0.0.1:4222", "webhooks").await?;
//! // One store for both: the worker's claim keys are apart from DedupeLayer's.
//! let store = SqliteStore::open("webhooks.db").await?;
//! let verifier = Verifier::new(Scheme::stripe(), ["whsec_from_the_dashboard_0123"])?;
//! let app: Router = Router::new().route(
//!     "/webhooks",
//!     post_service(jetstream.accept_service()).layer(
//!         ServiceBuilder::new()
//!             .layer(VerifyWebhookLayer::new(verifier))
//!             .layer(DedupeLayer::new(store.clone())),
//!     ),
//! );
//! let worker = JetStreamWorker::new(&jetstream, store, |event: Event, _: Attempt| async move {
//!     println!("handled {}", event.id().unwrap_or_default());
//!     Ok::<_, std::convert::Infallible>(())
//! })
//! .spawn();
//! # let _ = (app, worker);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(feature = "seal", doc = "[`with_keys`]: JetStreamBuilder::with_keys")]
#![cfg_attr(not(feature = "seal"), doc = "[`with_keys`]: crate#features")]

mod backfill; // fan-out: a processor added later runs a window of the stream
mod builder; // the stream's settings, and what is made beside it
mod held; // deliveries that were not attempts (snoozes)
#[cfg(feature = "schemas")]
mod invalid; // events their schema refused, kept in `<stream>-invalid`
mod passes; // fan-out: the messages a processor acknowledged unrun, one key each
mod pause; // pauses every worker sees; paused events parked
mod processors; // fan-out: a consumer, dead and parked streams, counts per processor
mod sealed; // payloads sealed with a key ring, and every read of a message
mod settle; // a message acknowledged, handed back, or moved to another stream
mod turn; // an object's turn across workers: its line in `<stream>-held`
mod worker;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;

pub use self::builder::JetStreamBuilder;
#[cfg(feature = "schemas")]
pub use self::invalid::{InvalidMessage, InvalidPage, MAX_INVALID_PAGE};
pub use self::worker::JetStreamWorker;
use super::accept::{Accept, Destination};
use super::{Accepted, Counts};
use crate::inbox::message::{header, word};
use crate::metrics::{self, Operation};
use crate::store::{StoreError, StoreErrorKind};
use crate::Event;
use sealed::event_of;

/// A JetStream stream used as the inbox. Cloning shares the connection.
#[derive(Clone)]
pub struct JetStream {
    inner: Arc<Inner>,
    /// The processor this handle's workers run: `default`, but for a processor's worker.
    lane: Arc<processors::Lane>,
}

struct Inner {
    context: jetstream::Context,
    stream: String,
    /// The durable consumer `default`'s workers share (another processor's is named after
    /// it: `processors.rs`).
    consumer: String,
    /// The processors configured (`{default}` without fan-out), and their lanes.
    processors: crate::inbox::processors::Processors,
    lanes: Vec<Arc<processors::Lane>>,
    /// More than the one processor `default`: a message moved out of the stream for one
    /// stays in it for the others.
    fan_out: bool,
    /// The pauses in force (`<stream>-pauses`).
    pauses: async_nats::jetstream::kv::Store,
    /// How many deliveries of a message were not attempts (`<stream>-held`).
    held: async_nats::jetstream::kv::Store,
    /// The ring payloads are sealed and opened with (`sealed.rs`); `None`: in clear.
    #[cfg(feature = "seal")]
    keys: Option<crate::seal::KeyRing>,
    /// A verified delivery's `traceparent` is its accept's parent, not a link.
    #[cfg(feature = "otel")]
    trusted_traceparent: bool,
    /// Each event checked at accept (`JetStreamBuilder::with_schemas`).
    #[cfg(feature = "schemas")]
    schemas: Option<crate::schemas::Schemas>,
    /// Told of each new invalid event (`JetStreamBuilder::with_alerts`).
    #[cfg(all(feature = "schemas", feature = "alerts"))]
    alerts: Option<crate::alerts::Alerts>,
}

impl JetStream {
    /// Connects to NATS at `url` and uses (or creates, with the defaults of
    /// [`builder`](Self::builder)) the stream named `stream`. The connection tries again
    /// every quarter of a second at most while the server is away.
    ///
    /// # Errors
    ///
    /// When NATS cannot be reached, the name is not a valid stream name, or the stream
    /// cannot be created.
    pub async fn connect(url: &str, stream: &str) -> Result<Self, StoreError> {
        let client = async_nats::ConnectOptions::new()
            // A server that came back is found within a quarter of a second, not after
            // async-nats's default wait of up to 4 s between tries.
            .reconnect_delay_callback(|tries| Duration::from_millis(50) * tries.min(5) as u32)
            .connect(url)
            .await
            .map_err(|e| StoreError::new("nats connect", e))?;
        Self::builder(client, stream).build().await
    }

    /// A stream named `stream` (subjects `<stream>.>`) on `client`'s server. When this
    /// creates it: file storage, one replica, a 2 minute duplicate window, messages kept
    /// 7 days; an existing stream keeps its own settings. Workers share the durable
    /// consumer `tower-webhook`; publishes wait up to 5 s for JetStream's acknowledgement.
    pub fn builder(client: async_nats::Client, stream: &str) -> JetStreamBuilder {
        JetStreamBuilder {
            client,
            stream: stream.to_owned(),
            consumer: "tower-webhook".to_owned(),
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(7 * 24 * 3600),
            replicas: 1,
            storage: stream::StorageType::File,
            publish_timeout: Duration::from_secs(5),
            processors: None,
            #[cfg(feature = "seal")]
            keys: None,
            #[cfg(feature = "otel")]
            trusted_traceparent: false,
            #[cfg(feature = "schemas")]
            schemas: None,
            #[cfg(all(feature = "schemas", feature = "alerts"))]
            alerts: None,
        }
    }

    /// The stream's name.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.inner.stream
    }

    /// The source of the workers' claim keys for events of `source`:
    /// `jetstream/<stream>/<consumer>/<source>`, apart from `DedupeLayer`'s keys of the same
    /// events (neither name holds a `/`), and per consumer (each sees every event), hence
    /// per processor.
    fn claim_source(&self, source: &str) -> String {
        format!(
            "jetstream/{}/{}/{source}",
            self.inner.stream,
            self.consumer()
        )
    }

    /// The stream dead messages are published to: `<stream>-dead`.
    #[must_use]
    pub fn dead_stream(&self) -> String {
        format!("{}-dead", self.inner.stream)
    }

    /// Publishes a verified event and waits for JetStream's acknowledgement: `New` once
    /// stored, `Duplicate` when JetStream already had its id within the duplicate window.
    ///
    /// # Errors
    ///
    /// When NATS cannot be reached or does not acknowledge within the publish timeout: the
    /// event may or may not be stored (publishing it again is harmless). When its source
    /// or id holds a line break, which no header value can
    /// ([`StoreErrorKind::InvalidInput`]: the layers answer 500, and nothing is published).
    pub async fn accept(&self, event: &Event) -> Result<Accepted, StoreError> {
        self.accept_sent(event, &crate::span::TraceContext::default())
            .await
    }

    /// [`accept`](Self::accept), with the sender's trace context `sent`, if any: the one
    /// choke point of JetStream's accepts, past verification. With the feature `otel`,
    /// the accept's span context goes with the message (`traceparent`, `tracestate`).
    async fn accept_sent(
        &self,
        event: &Event,
        sent: &crate::span::TraceContext,
    ) -> Result<Accepted, StoreError> {
        let (subject, mut headers) = message(&self.inner.stream, event)?;
        #[cfg(feature = "schemas")]
        let (subject, invalid) = self.route_valid(event, subject, &mut headers);
        #[cfg(feature = "otel")]
        let trusted = self.inner.trusted_traceparent;
        #[cfg(not(feature = "otel"))]
        let trusted = false;
        let (span, trace) = crate::span::accept(event, sent, trusted);
        if let Some(traceparent) = trace.traceparent() {
            headers.insert(header::TRACEPARENT, traceparent);
        }
        if let Some(tracestate) = trace.tracestate() {
            headers.insert(header::TRACESTATE, tracestate);
        }
        let payload = sealed::payload(self, event, &mut headers)?;
        let publish = async {
            self.inner
                .context
                .publish_with_headers(subject, headers, payload)
                .await
                .map_err(|e| StoreError::new("jetstream publish", e))?
                .await
                .map_err(|e| StoreError::new("jetstream publish", e))
        };
        let ack = metrics::timed(Operation::Accept, publish);
        let ack = crate::span::held(span, ack).await?;
        #[cfg(feature = "schemas")]
        if let (Some(invalid), false) = (&invalid, ack.duplicate) {
            metrics::invalid_accepted(event.source());
            #[cfg(all(feature = "schemas", feature = "alerts"))]
            if let Some(alerts) = &self.inner.alerts {
                let (source, id, ty) = (event.source(), event.dedupe_id(), event.event_type());
                alerts.invalid(source, id, ty, &invalid.to_string());
            }
            #[cfg(not(feature = "alerts"))]
            let _ = invalid;
        }
        Ok(if ack.duplicate {
            Accepted::Duplicate
        } else {
            Accepted::New
        })
    }

    /// A Tower service that accepts verified deliveries: 204 once JetStream acknowledged
    /// (duplicates too), 503 + `Retry-After` when it did not, 500 without
    /// `VerifyWebhookLayer`.
    #[must_use]
    pub fn accept_service(&self) -> Accept {
        Accept::new(Arc::new(self.clone()))
    }

    /// The workers' consumer and the dead stream, counted: `queued` the messages not yet
    /// delivered, `processing` those delivered and not yet acknowledged (running, or
    /// waiting out a retry's backoff), `dead` the dead stream's messages (a dead message
    /// leaves the stream), `processed` the rest of the stream (kept for its `max_age`),
    /// and `oldest_due` the age of the oldest message not yet acknowledged. Before a
    /// worker has created the consumer, every message is queued. With
    /// [fan-out](JetStreamBuilder::with_processors), the sum over the processors
    /// configured (`oldest_due` the longest): [`counts_by_processor`](Self::counts_by_processor)
    /// has each one's.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn counts(&self) -> Result<Counts, StoreError> {
        metrics::timed(Operation::InboxCounts, self.read_counts()).await
    }

    async fn read_counts(&self) -> Result<Counts, StoreError> {
        let by = self.counts_by_processor().await?;
        #[allow(unused_mut)]
        let mut counts = by.into_values().fold(Counts::default(), Counts::plus);
        #[cfg(feature = "schemas")]
        {
            counts.invalid = self.invalid_count().await?;
        }
        Ok(counts)
    }
}

impl JetStream {
    /// Deletes the stream, its dead and parked streams and its buckets, with every message
    /// in them: for tests and demos that made streams of their own.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer, or one of them is missing.
    pub async fn delete(self) -> Result<(), StoreError> {
        let context = &self.inner.context;
        let err = |e| StoreError::new("jetstream delete", e);
        // `default`'s dead and parked streams are made whether it is configured or not.
        let mut names = vec![
            self.inner.stream.clone(),
            self.dead_stream(),
            self.paused_stream(),
        ];
        for lane in &self.inner.lanes {
            for name in [
                lane.dead_stream(&self.inner.stream),
                lane.paused_stream(&self.inner.stream),
            ] {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        #[cfg(feature = "schemas")]
        if self.inner.schemas.is_some() {
            names.push(self.invalid_stream());
        }
        for name in names {
            context.delete_stream(name).await.map_err(err)?;
        }
        let mut buckets = vec!["pauses".to_owned(), "held".to_owned()];
        if self.inner.fan_out {
            buckets.extend(self.inner.lanes.iter().map(|l| l.passes_bucket()));
        }
        for what in buckets {
            let bucket = pause::bucket_name(&self.inner.stream, &what);
            let deleted = context.delete_key_value(bucket).await;
            deleted.map_err(|e| StoreError::new("jetstream delete", e))?;
        }
        Ok(())
    }
}

impl Destination for JetStream {
    fn accept<'a>(&'a self, event: &'a Event) -> crate::inbox::accept::Answer<'a, Accepted> {
        Box::pin(JetStream::accept(self, event))
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
        Box::pin(JetStream::counts(self))
    }
}

impl std::fmt::Debug for JetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStream")
            .field("stream", &self.inner.stream)
            .field("consumer", &self.inner.consumer)
            .field("processor", &self.lane.name())
            .finish_non_exhaustive()
    }
}

/// `Nats-Msg-Id` for `(source, id)`, unambiguous whatever either contains: the source's
/// length first (`6:stripe:evt_1`).
fn message_id(source: &str, id: &str) -> String {
    format!("{}:{source}:{id}", source.len())
}

/// The subject and headers an event is published with: `<stream>.<source>.<type>`, where
/// the type keeps its dots as subject levels (`payment_intent.succeeded`), so consumers
/// can filter on them; an event without a type goes to `<stream>.<source>._`.
fn message(stream: &str, event: &Event) -> Result<(String, HeaderMap), StoreError> {
    let id = event.dedupe_id();
    // Refused, not encoded: the headers are plain text that the platform's own consumers
    // read too, and no provider's id holds a line break (a forged header would follow it).
    if [event.source(), id]
        .iter()
        .any(|v| v.contains(['\r', '\n']))
    {
        return Err(StoreError::message(
            "jetstream accept: a source or event id with a line break cannot be a header",
        )
        .with_kind(StoreErrorKind::InvalidInput));
    }
    let mut subject = format!("{stream}.{}", word(event.source()));
    match event.event_type() {
        Some(ty) => {
            for part in ty.split('.').take(8) {
                subject.push('.');
                subject.push_str(&word(part));
            }
        }
        None => subject.push_str("._"),
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        message_id(event.source(), id),
    );
    headers.insert(header::SOURCE, event.source());
    headers.insert(header::ID, id);
    // Header values are text on one line: a value that is not is left out (it is in the
    // body, which is kept exactly).
    let mut optional = |name: &'static str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty() && !v.contains(['\r', '\n'])) {
            headers.insert(name, value);
        }
    };
    optional(header::TYPE, event.event_type().map(str::to_owned));
    optional(header::OBJECT_ID, event.object_id().map(str::to_owned));
    optional(header::LIVEMODE, event.livemode().map(|l| l.to_string()));
    optional(
        header::TIMESTAMP,
        event
            .timestamp()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_secs().to_string()),
    );
    Ok((subject, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_do_not_collide_across_sources() {
        assert_eq!(message_id("stripe", "evt_1"), "6:stripe:evt_1");
        assert_ne!(message_id("a:b", "c"), message_id("a", "b:c"));
    }

    #[test]
    fn subject_tokens_are_never_empty_and_never_wildcards() {
        assert_eq!(word("stripe/acme"), "stripe_acme");
        assert_eq!(word("a b*c>d.e"), "a_b_c_d_e");
        assert_eq!(word(""), "_");
        assert_eq!(word(&"x".repeat(100)).len(), 64);
    }
}

//! The inbox pattern: store the verified event, answer 204 at once, and process it in a
//! worker with retries — the seed guide's recommended shape for anything slow.
//!
//! ```text
//! request ─► VerifyWebhookLayer ─► inbox.accept() ── INSERT … ON CONFLICT DO NOTHING ─► 204
//!                                   worker ─► claim due rows ─► your processor(event, attempt)
//!                                          ├─ Ok  ─► processed_at
//!                                          └─ Err ─► processing_error, retry with backoff,
//!                                                    dead after N attempts
//! ```
//!
//! - [`Inbox::accept_service`] is a Tower service (an axum handler via `post_service`)
//!   behind `VerifyWebhookLayer`: it stores the event's raw body, type, object id and
//!   livemode, and answers 204 — duplicates too, they are already stored — or 503 when it
//!   could not store (the provider retries).
//! - A [`Worker`] claims due rows (`FOR UPDATE SKIP LOCKED` on PostgreSQL, one writer on
//!   SQLite) under a lease and a fencing token, runs your processor on the stored
//!   event ([`crate::Event`], the type handlers get; what its accessors hold here: its
//!   docs, "From the inbox") and the [`Attempt`], and records the outcome: an error's
//!   text with its source chain is the row's last error. The lease is renewed while the
//!   processor runs; a crashed worker's rows come back when their lease runs out, the
//!   attempt counted (a row whose every attempt crashed goes dead); [`WorkerHandle::shutdown`] waits for running events.
//! - On PostgreSQL, [`Worker::transactional`] hands the processor a
//!   [`PgTx`]: its writes and the row's `processed_at` commit
//!   together, so effects in the database happen exactly once, and a worker whose lease
//!   ran out cannot commit behind the one that took over.
//! - Operators [`requeue`][Inbox::requeue] rows (by id, type, dead, or a receipt window:
//!   replay), [`prune`][Inbox::prune] old processed ones (dead ones only by name:
//!   [`prune_dead`][Inbox::prune_dead]), read [`counts`][Inbox::counts], page through
//!   the dead and failing rows with their last error ([`list`][Inbox::list]) and read one
//!   event whole ([`event`][Inbox::event]); [`ingest`][Inbox::ingest] stores events
//!   fetched from a provider's events API through the same deduplicated path. The same
//!   calls over HTTP: `admin::router` (feature `admin`); from a shell: the
//!   `tower-webhook` command (feature `cli`). The types they read serialize to the JSON
//!   both answer with.
//!
//! A whole round on a SQLite file: a verified event accepted, a worker that processes it,
//! and a shutdown that waits for it.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::SystemTime;
//! use tower_webhook::inbox::{Accepted, Inbox, Worker};
//! use tower_webhook::store::SqliteStore;
//! use tower_webhook::{Scheme, Verifier};
//!
//! let path = std::env::temp_dir().join(format!("inbox-doc-{}.db", std::process::id()));
//! let store = SqliteStore::open(&path).await?;
//! let inbox = Inbox::sqlite(&store);
//!
//! // What `VerifyWebhookLayer` hands to `accept_service`: a verified event.
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let body = br#"{"type":"invoice.paid"}"#;
//! let headers = Scheme::standard().sign([secret], "msg_1", SystemTime::now(), body)?;
//! let event = Verifier::new(Scheme::standard(), [secret])?.verify(&headers, body.to_vec().into())?;
//! assert_eq!(inbox.accept(&event).await?, Accepted::New);
//! assert_eq!(inbox.accept(&event).await?, Accepted::Duplicate);
//!
//! let (handled, mut seen) = tokio::sync::mpsc::unbounded_channel();
//! let worker = Worker::new(&inbox, move |_event, _attempt| {
//!     let handled = handled.clone();
//!     async move { handled.send(()).map_err(|_| "nobody is listening") }
//! })
//! .spawn();
//! let ran = tokio::time::timeout(std::time::Duration::from_secs(10), seen.recv()).await?;
//! assert_eq!(ran, Some(())); // the processor ran
//! worker.shutdown().await; // waits for it, and its outcome recorded
//! assert_eq!(inbox.counts().await?.processed, 1);
//!
//! drop((inbox, store));
//! for suffix in ["", "-wal", "-shm"] {
//!     let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
//! }
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! Rows live in the `webhook_events` table of `migrations/`, beside `DedupeLayer`'s (a
//! row is the inbox's when it has a `next_attempt_at`). Use one or the other per source;
//! when a source moves from `DedupeLayer` to the inbox, a redelivery of an event that
//! dedupe left unfinished (released after a failure, or claimed) queues it.
//!
#![cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "
[`Inbox::accept_service`]: Inbox::accept_service
[`Worker`]: Worker
[Inbox::requeue]: Inbox::requeue
[Inbox::prune]: Inbox::prune
[Inbox::prune_dead]: Inbox::prune_dead
[Inbox::counts]: Inbox::counts
[Inbox::list]: Inbox::list
[Inbox::event]: Inbox::event
[Inbox::ingest]: Inbox::ingest"
)]
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "
[`Inbox::accept_service`]: crate#features
[`Worker`]: crate#features
[Inbox::requeue]: crate#features
[Inbox::prune]: crate#features
[Inbox::prune_dead]: crate#features
[Inbox::counts]: crate#features
[Inbox::list]: crate#features
[Inbox::event]: crate#features
[Inbox::ingest]: crate#features"
)]
#![cfg_attr(
    feature = "postgres",
    doc = "
[`Worker::transactional`]: Worker::transactional
[`PgTx`]: crate::dedupe::PgTx"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "
[`Worker::transactional`]: crate#features
[`PgTx`]: crate#features"
)]

pub(crate) mod accept;
#[cfg(feature = "amqp")]
pub mod amqp; // RabbitMQ as the inbox: a quorum queue, publisher confirms
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod backend;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod backfill; // the processor registry, backfill, dropping a processor
pub(crate) mod backpressure;
mod counts; // how many rows in each state
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod erasure; // bodies erased on request: erase, erase_subject
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod headers; // what of a delivery's request headers the SQL inbox stores
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod history; // each attempt's record
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod invalid; // events their schema refused: with_schemas, requeue_invalid
#[cfg(feature = "nats")]
pub mod jetstream;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    all(feature = "nats", feature = "admin")
))]
pub(crate) mod json;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod late; // hidden, for tests: chosen calls answered late
mod later; // a processor's "not now"
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod listing;
#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) mod message; // an event as a broker's message: headers, sealed payloads
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod operate; // count, list, requeue, pause, prune
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub(crate) mod pause;
mod process;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
mod processors; // fan-out: which processors take an event
mod rate;
#[cfg(all(feature = "seal", any(feature = "sqlite", feature = "postgres")))]
pub(crate) mod rekey; // rotation: what older keys sealed, sealed again under the current one
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod retention; // bodies expired apart from their keys: with_body_retention, expire_bodies
mod retry;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sealing; // payloads sealed at rest (feature `seal`): with_keys, accept's and errors'
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod stored; // one event whole: its body, routes and history
#[cfg(feature = "postgres")]
mod transactional;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub(crate) mod worker;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use std::sync::Arc;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use bytes::Bytes;

pub use self::accept::{Accept, AcceptFuture};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use self::backend::Backend;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::backfill::{Backfill, RegisteredProcessor};
pub use self::backpressure::Backpressure;
pub use self::counts::{Counts, RevalidatedCounts};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::headers::StoredHeaders;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::history::{AttemptOutcome, AttemptRecord};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::invalid::ValidationError;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[doc(hidden)] // for the crate's tests, not public API
pub use self::late::{LateAnswers, LateCall};
pub use self::later::Later;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::listing::{Cursor, EventSummary, InvalidCursor, Listing, Page, State};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::operate::{DeadRows, Requeue, Requeued};
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub use self::pause::Pause;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use self::process::PANICKED;
pub use self::process::{Attempt, Processor, WorkerHandle};
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub use self::processors::{ProcessorSpec, DEFAULT_PROCESSOR};
pub use self::rate::Rate;
#[cfg(all(feature = "seal", any(feature = "sqlite", feature = "postgres")))]
pub use self::rekey::{Rekeyed, REKEY_BATCH};
pub use self::retry::{Jitter, RetryPolicy};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::stored::{BodyState, RouteState, StoredEvent};
#[cfg(feature = "postgres")]
pub use self::transactional::TxProcessor;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use self::worker::Outcome;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::worker::Worker;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::metrics::{self, Operation};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::store::{StoreError, StoreErrorKind};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::Event;

/// A durable queue of verified events. Cloning shares it.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Clone)]
pub struct Inbox {
    backend: Arc<dyn Backend>,
    /// Who gets a route of each accepted event.
    processors: processors::Processors,
    /// Set once its processors are in `webhook_processors` (its first write).
    registered: Arc<tokio::sync::OnceCell<()>>,
    wake: Arc<tokio::sync::Notify>,
    /// When each processor's routes fall due later (retries, snoozes), for its workers
    /// (only) to wake then.
    due: worker::due::Dues,
    /// How long a processed event keeps its body ([`Inbox::with_body_retention`]).
    body_retention: Option<std::time::Duration>,
    /// What bodies, headers and errors are sealed under ([`Inbox::with_keys`]).
    #[cfg(feature = "seal")]
    keys: Option<crate::seal::KeyRing>,
    /// Whose data an event is, sealed and digested at accept ([`Inbox::with_subject`]).
    #[cfg(feature = "seal")]
    subject: Option<erasure::Subject>,
    /// A verified delivery's `traceparent` is its accept's parent, not a link
    /// ([`Inbox::with_trusted_traceparent`]).
    #[cfg(feature = "otel")]
    trusted_traceparent: bool,
    /// Each event's body checked against its type's schema ([`Inbox::with_schemas`]).
    #[cfg(feature = "schemas")]
    schemas: Option<crate::schemas::Schemas>,
    /// Told of each new invalid event ([`Inbox::with_alerts`]).
    #[cfg(all(feature = "schemas", feature = "alerts"))]
    alerts: Option<crate::alerts::Alerts>,
}

/// Whether [`Inbox::accept`] stored a new row.
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "[`Inbox::accept`]: Inbox::accept"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`Inbox::accept`]: crate#features"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Accepted {
    /// First seen: stored and queued.
    New,
    /// Already stored (a duplicate delivery).
    Duplicate,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Inbox {
    /// An inbox in the SQLite store's database, on the store's clock: receipt times,
    /// leases and due times are read from it, so tests can step through backoffs and
    /// leases without waiting (`Inbox::sqlite(&store.with_clock(…))`; a PostgreSQL inbox
    /// keeps the server's clock, shared by every replica).
    #[cfg(feature = "sqlite")]
    #[must_use]
    pub fn sqlite(store: &crate::store::SqliteStore) -> Self {
        Self::new(Arc::new(store.sql().clone()))
    }

    /// An inbox in the PostgreSQL store's database; workers wake on `NOTIFY` from any
    /// replica's `accept`, and for any replica's retries and snoozes when they fall due
    /// (each running worker keeps one of the pool's connections for its `LISTEN`).
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn postgres(store: &crate::store::PgStore) -> Self {
        Self::new(Arc::new(store.sql().clone()))
    }

    fn new(backend: Arc<dyn Backend>) -> Self {
        let due = worker::due::Dues::default();
        due.of(DEFAULT_PROCESSOR);
        Self {
            backend,
            processors: processors::Processors::single(),
            registered: Arc::new(tokio::sync::OnceCell::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
            due,
            body_retention: None,
            #[cfg(feature = "seal")]
            keys: None,
            #[cfg(feature = "seal")]
            subject: None,
            #[cfg(feature = "otel")]
            trusted_traceparent: false,
            #[cfg(feature = "schemas")]
            schemas: None,
            #[cfg(all(feature = "schemas", feature = "alerts"))]
            alerts: None,
        }
    }

    /// Makes a verified delivery's W3C `traceparent` header the parent of its accept's
    /// span, so the sender's trace goes on through the queue (feature `otel`). Off by
    /// default: the header is the sender's input, and a forged trace id would join your
    /// traces; untrusted, it is only a link of the accept's span. Turn it on only where
    /// every sender is yours (an internal service behind the verification).
    #[cfg(feature = "otel")]
    #[must_use]
    pub fn with_trusted_traceparent(mut self, trusted: bool) -> Self {
        self.trusted_traceparent = trusted;
        self
    }

    /// The inbox with these processors (fan-out): each accepted event gets a route for
    /// every processor whose filter takes it, created with the event in the same
    /// transaction, each with its own attempts, state and replay; a
    /// [`Worker::processor`] runs one processor's routes. Without it the inbox has one
    /// processor, [`default`](DEFAULT_PROCESSOR), taking every event (what
    /// [`Worker::new`] runs).
    ///
    /// Set it before anything is accepted or any worker runs, the same on every replica
    /// sharing the database: routes are made for the processors configured when an event
    /// is accepted, and a later change never rewrites them. An event no processor takes is
    /// stored (its key, metadata and body: a redelivery stays a duplicate) with no route,
    /// so no worker runs it. Deploy a processor's workers before adding it to the set:
    /// until they run, its routes wait, and count in the queue's lag.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(store: &tower_webhook::store::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_webhook::inbox::{Inbox, ProcessorSpec, Worker};
    ///
    /// let inbox = Inbox::sqlite(store).with_processors([
    ///     ProcessorSpec::new("billing")?.with_types(["invoice.*"])?,
    ///     ProcessorSpec::new("email")?,
    /// ])?;
    /// let billing = Worker::processor(&inbox, "billing", |_event, _attempt| async { Ok::<_, std::io::Error>(()) })?;
    /// let email = Worker::processor(&inbox, "email", |_event, _attempt| async { Ok::<_, std::io::Error>(()) })?;
    /// let (billing, email) = (billing.spawn(), email.spawn());
    /// # billing.shutdown().await; email.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// for an empty set (an inbox that routes nothing is a queue nobody drains) or a name
    /// given twice.
    pub fn with_processors(
        mut self,
        processors: impl IntoIterator<Item = ProcessorSpec>,
    ) -> Result<Self, crate::ConfigError> {
        self.processors = processors::Processors::new(processors)?;
        self.registered = Arc::new(tokio::sync::OnceCell::new()); // a set of its own
        for spec in self.processors.iter() {
            // Known from now on: a due time another replica tells of one is its alone.
            self.due.of(spec.name());
        }
        Ok(self)
    }

    /// The processors this inbox routes events to, in the order configured.
    pub fn processors(&self) -> impl Iterator<Item = &ProcessorSpec> {
        self.processors.iter()
    }

    /// Stores a verified event for processing; a duplicate stores nothing. No request
    /// headers are stored with it ([`accept_service`](Self::accept_service) stores the
    /// delivery's, credentials left out).
    ///
    /// # Errors
    ///
    /// When the event's source or id is one the stores refuse
    /// ([`StoreErrorKind::InvalidInput`]: longer than 1 KiB, or holding a NUL), or the
    /// database could not store it.
    pub async fn accept(&self, event: &Event) -> Result<Accepted, StoreError> {
        let sent = crate::span::TraceContext::default();
        self.accept_with_headers(event, None, &sent).await
    }

    /// [`accept`](Self::accept), the delivery's request headers stored beside the event
    /// (as [`headers`] keeps them), and its sender's trace context `sent`, if any.
    async fn accept_with_headers(
        &self,
        event: &Event,
        headers: Option<String>,
        sent: &crate::span::TraceContext,
    ) -> Result<Accepted, StoreError> {
        crate::store::check_key(event.source(), event.dedupe_id())?;
        self.register().await?;
        #[cfg(feature = "otel")]
        let trusted = self.trusted_traceparent;
        #[cfg(not(feature = "otel"))]
        let trusted = false;
        // The one choke point of the SQL inbox's accepts, past verification: the context
        // stored is this span's.
        let (span, trace) = crate::span::accept(event, sent, trusted);
        let d = crate::store::Delivery::from_event(event)
            .with_routes(self.processors.routes(event))
            .with_trace(trace);
        let d = self
            .sealed(d, event, headers.as_deref())?
            .with_headers(headers);
        #[cfg(feature = "schemas")]
        if let Some(invalid) = self.refused_by_schema(event) {
            let stored = self.accept_invalid(d, event, invalid);
            return crate::span::held(span, stored).await;
        }
        let stored = metrics::timed(Operation::Accept, self.backend.accept(d));
        let accepted = crate::span::held(span, stored).await?;
        if accepted == Accepted::New {
            self.wake.notify_waiters();
        }
        Ok(accepted)
    }

    /// Stores an event fetched from the provider's events API (catch-up after an outage):
    /// the same deduplicated path as a delivery, keyed as `verifier`'s deliveries of it
    /// are ([`Event::dedupe_id`]), so an event already received is skipped and one
    /// ingested first makes its late delivery a duplicate. The source is the verifier's
    /// (the scheme's name, unless set with [`Verifier::with_source`](crate::Verifier::with_source)).
    ///
    /// - `id`: the delivery's signed id header, for schemes whose deliveries carry one
    ///   (Standard Webhooks' `webhook-id`); `None` for the others, keyed on the body as
    ///   their deliveries are — by its id field (Stripe's `evt_…`, Slack's `event_id`), or,
    ///   where the id is not signed or there is none (GitHub, Shopify, Zoom, Meta, …), by
    ///   the `sha256:` digest of the body. An id given where the key comes from the body
    ///   is refused (unless it is the body's own), as it would not be the key.
    /// - `body`: as the provider signs it. For a scheme keyed on the body's digest, only
    ///   the exact bytes its delivery carried give the same key (an API that returns the
    ///   payload parsed, as GitHub's deliveries API does, gives other bytes: ask the
    ///   provider to redeliver instead). Schemes that sign the request itself (Twilio,
    ///   Square, HubSpot) cannot be ingested.
    ///
    /// The type, object id and livemode are read from the body (`type` or the scheme's
    /// type field, `data.object.id`, `livemode`); a type sent only in a header (GitHub's
    /// `X-GitHub-Event`) is not stored. `EventFilterLayer` does not see ingested events:
    /// skip unwanted types and test-mode events before ingesting.
    ///
    /// ```no_run
    /// # async fn catch_up(inbox: &tower_webhook::inbox::Inbox, page: Vec<serde_json::Value>) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_webhook::{Scheme, Verifier};
    ///
    /// let stripe = Verifier::new(Scheme::stripe(), [std::env::var("STRIPE_WEBHOOK_SECRET")?])?;
    /// // Each event of a page from GET /v1/events, as the provider's API returned it:
    /// // keyed on its `id` (evt_…), as its delivery was.
    /// for event in page {
    ///     inbox.ingest(&stripe, None, serde_json::to_vec(&event)?).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] when `id` is empty or not visible ASCII, missing
    /// where the scheme's deliveries are keyed on it, given where they are keyed on the
    /// body, or when the scheme's key cannot be computed from a body; otherwise when the
    /// database could not store it.
    pub async fn ingest(
        &self,
        verifier: &crate::Verifier,
        id: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<Accepted, StoreError> {
        let refused =
            |why: &'static str| StoreError::message(why).with_kind(StoreErrorKind::InvalidInput);
        let id = id
            .map(|id| {
                http::HeaderValue::from_str(id)
                    .ok()
                    .filter(|_| !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()))
                    .ok_or_else(|| refused("an event id is visible ASCII, not empty"))
            })
            .transpose()?;
        let event = verifier.fetched(id, body.into()).map_err(refused)?;
        self.accept(&event).await
    }

    /// A Tower service that accepts verified deliveries: 204 once stored (duplicates too),
    /// 503 when the database cannot store, 500 without `VerifyWebhookLayer`.
    #[must_use]
    pub fn accept_service(&self) -> Accept {
        Accept::new(Arc::new(self.clone()))
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl accept::Destination for Inbox {
    fn accept<'a>(&'a self, event: &'a Event) -> accept::Answer<'a, Accepted> {
        Box::pin(Inbox::accept(self, event))
    }

    fn keeps_headers(&self) -> bool {
        true
    }

    fn accept_with<'a>(
        &'a self,
        event: &'a Event,
        headers: Option<String>,
        sent: crate::span::TraceContext,
    ) -> accept::Answer<'a, Accepted> {
        Box::pin(async move { Inbox::accept_with_headers(self, event, headers, &sent).await })
    }

    fn counts(&self) -> accept::Answer<'_, Counts> {
        Box::pin(Inbox::counts(self))
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ingest_refuses_an_id_that_is_not_visible_ascii_as_invalid_input() {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-ingest-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = crate::store::SqliteStore::open(&path).await.unwrap();
        let inbox = Inbox::sqlite(&store);
        let standard = crate::Verifier::new(
            crate::Scheme::standard(),
            ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        )
        .unwrap();
        for id in ["", "evt 1", "evt_\u{e9}"] {
            let e = inbox.ingest(&standard, Some(id), "{}").await.unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{id:?}");
        }
        inbox.ingest(&standard, Some("evt_1"), "{}").await.unwrap();
        assert_eq!(inbox.counts().await.unwrap().queued, 1);
        drop((inbox, store));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}

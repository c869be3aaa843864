//! Receive webhooks correctly by default.
//!
//! Providers deliver at least once, and attackers post forged or replayed bodies.
//! `tower-webhook` puts a [`VerifyWebhookLayer`] in front of any Tower HTTP service (axum,
//! hyper, tonic): it buffers the raw body under a limit, checks the signature over the
//! exact bytes against a *list* of secrets (so secrets rotate without downtime), checks
//! the signed timestamp, and hands the inner service a verified [`Event`].
//!
//! The request path, in the order a request meets it:
//!
//! - [`verify`]: the layer — answer set-up handshakes, buffer under a limit, verify (with
//!   one key list, or each tenant's), insert the [`Event`];
//! - [`filter`]: acknowledge event types you do not handle, and test-mode events on a
//!   live endpoint, without calling the handler;
//! - `dedupe` (feature `dedupe`): the layer — claim `(source, id)` in a `store`, let each
//!   event through once;
//! - [`Verifier`]: the check itself, usable without HTTP;
//! - [`scheme`]: what each provider signs and how, with which key (seventeen presets, or
//!   your own scheme), and signing for tests;
//! - [`PublicUrl`]: the URL a provider signs (Twilio, Square, HubSpot);
//! - [`Secrets`]: keyed HMAC states and public keys, replaceable at runtime;
//! - `inbox` (features `sqlite`/`postgres`): or store the event, answer 204 at once, and
//!   process it in a worker with retries;
//! - [`Event`]: what the handler receives (an axum extractor with the `axum` feature);
//! - `once` (feature `dedupe`): in the handler or a worker, run a business action once per
//!   key;
//! - `latest` (features `sqlite`/`postgres`): and drop an event older than the last one
//!   applied to its object, so a late event never moves state back;
//! - `admin` (feature `admin`): the inbox's operator endpoints (counts, dead and failing
//!   rows, one event, requeue) as an axum router to mount behind your own authorization,
//!   and (feature `admin-ui`) `admin::ui`, the same as a web page for the person on call;
//! - `alerts` (feature `alerts`): a hook called when a source starts failing or
//!   recovers, an event goes dead, the queue lags or rejections spike — each at most
//!   once per interval — with a ready Slack-compatible JSON POST.
//!
//! ```
//! use axum::{routing::post, Router};
//! use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # fn main() -> Result<(), tower_webhook::ConfigError> {
//! // The first secret is the current one; older ones still verify during a rotation.
//! let verifier = Verifier::new(Scheme::stripe(), ["whsec_new_secret_abcdef", "whsec_old_secret_123456"])?;
//! let app: Router = Router::new().route(
//!     "/webhooks/stripe",
//!     post(|event: Event| async move {
//!         println!("{} {:?}", event.id().unwrap_or("?"), event.event_type());
//!     })
//!     .layer(VerifyWebhookLayer::new(verifier)),
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! The default build verifies and nothing more: [`VerifyWebhookLayer`], [`Verifier`], every
//! [`scheme`] and its handshake, tenants, fetched certificates, [`EventFilterLayer`] and
//! [`Event`] — on tokio's timers and `OnceCell` only (no runtime), without uuid or serde's
//! derive. Each integration is a feature of its own:
//!
//! - `dedupe`: `DedupeLayer`, `Once` and the `store` module with its `MemoryStore` (tokio's
//!   runtime, for the handler's task and the lease renewals; uuid, for fencing tokens).
//! - `sqlite`, `postgres`, `redis`: the stores (sqlx for the SQL ones); the SQL ones also
//!   give the `inbox` with its `Worker` and `latest`; `postgres` gives the transactional
//!   `dedupe::TxDedupeLayer`. Each
//!   implies `dedupe`.
//! - `nats`: `inbox::jetstream`, NATS JetStream as the inbox (implies `dedupe`).
//! - `amqp`: `inbox::amqp`, RabbitMQ as the inbox: a quorum queue, each accept answered
//!   2xx only after the broker's publisher confirm (lapin on tokio; implies `dedupe`).
//! - `axum`: [`Event`] as an axum extractor (depends on `axum-core` only).
//! - `tracing`: rejections logged at `warn` with their reason, never a secret; store
//!   errors at `error`; the inbox's failed attempts at `warn` and dead rows at `error`,
//!   with the event id and the processor's error. Each delivery runs in a
//!   `webhook.delivery` span (source, event id and type) and each inbox attempt in a
//!   `webhook.process` span, so the handler's own logs say which event they are about.
//! - `metrics`: counters, gauges and histograms through the `metrics` facade — deliveries
//!   verified and rejected, duplicates, 409s, 503s, handler outcomes, store latency, the
//!   inbox's attempts, depth and lag — for the exporter you install (see [`metrics`]).
//! - `admin` (with `sqlite` or `postgres`; with `nats`): `admin::router`, the inbox's
//!   operator endpoints, and `admin::jetstream_router`, a stream's counts and pauses (on
//!   `axum` without its default features).
//! - `admin-ui` (with `sqlite` or `postgres`): `admin::ui`, the operator's web page
//!   (server-rendered with maud; implies `admin`).
//! - `cli`: the `tower-webhook` command, the same operator calls over a database URL.
//! - `seal`: the `seal` module, XChaCha20-Poly1305 under a ring of rotating keys, for
//!   payloads at rest (with `nats`, `JetStreamBuilder::with_keys`; the SQL stores do not
//!   use it yet).
//! - `schemas`: the `schemas` module, a JSON Schema per event type (jsonschema without
//!   its resolvers: nothing is fetched).
//! - `alerts`: the `alerts` module, and `VerifyWebhookLayer::with_alerts` (implies
//!   `dedupe`; hyper's client, and rustls on aws-lc-rs for `https://`).
//! - `otel`: one trace from a delivery to each attempt, through `tracing` and
//!   tracing-opentelemetry (implies `tracing`; bring your own exporter). The accept is a
//!   PRODUCER span whose W3C context is stored with the event (the SQL inbox) or in the
//!   message's `traceparent`/`tracestate` headers (JetStream); each attempt is a CONSUMER
//!   span, the event's first run after its accept the accept's child, every other run
//!   (retry, requeue, replay, backfill, resumed snooze) a new trace linked to it
//!   (`with_trace_links_only`: all linked). A sender's `traceparent` is a link unless
//!   `with_trusted_traceparent`.
//!
//! # Security
//!
//! Signatures are compared in constant time after a length check; secrets are validated
//! when the verifier is built and never appear in `Debug` output, logs or responses.
// A doc link to an item of another feature is a reference link (`[`PgTx`]`) with two
// `cfg_attr` definitions: the item where its feature is on, else the crate's list of
// features (`crate#features`); `.ci/run` builds the docs per feature set to keep it so.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]
// With `amqp` alone, the worker engine is compiled before RabbitMQ's worker uses it
// (issue 37, part 3): removed with that worker.
#![cfg_attr(
    all(
        feature = "amqp",
        not(any(feature = "sqlite", feature = "postgres", feature = "nats"))
    ),
    allow(dead_code)
)]

// The request path, in the order a request meets it (one group each, so rustfmt keeps
// the order):
pub mod verify; // 1. buffer the body under a limit, verify it, insert the Event

mod verifier; //    the check itself: headers, signature, timestamp

pub mod filter; // 2. acknowledge unwanted types and test-mode events without a handler

#[cfg(feature = "dedupe")]
pub mod dedupe; // 3. claim (source, id) once; duplicates get 204 (or: in the handler's transaction)

#[cfg(feature = "dedupe")]
pub mod drain; //    at shutdown: wait for the work the layers detached, release what is left
#[cfg(feature = "dedupe")]
pub mod store; //    where claims live: memory, SQLite, PostgreSQL, Redis

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub mod inbox; //    or: store the event, answer 204, process it in a worker (SQL, JetStream, RabbitMQ)

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql; //    the one table behind the SQL stores, the inbox and the transactional dedupe, per dialect

#[cfg(all(
    feature = "admin",
    any(feature = "sqlite", feature = "postgres", feature = "nats")
))]
pub mod admin; //    the inbox's operator endpoints, as an axum router

mod event; // 4. what the handler receives
#[cfg(feature = "axum")]
mod extract; //    ... as an axum extractor
mod public_url; //    the URL a provider signs (Twilio, Square, HubSpot)
pub mod response; //    what the layers answer themselves: one Rejection, replaceable

// For the application, after the request path:
#[cfg(feature = "dedupe")]
pub mod once; // run a business action once per key ("order 7 fulfilled")

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod latest; // drop an event older than the last one applied to its object

#[cfg(feature = "alerts")]
pub mod alerts; // be told of failing sources, dead events, lag and rejection spikes

// What the path is configured with, and shared plumbing:
mod error;
mod json; // a few fields of a JSON body, read without serde's derive
pub mod metrics; // what is counted and timed (feature `metrics`): the names, in its docs
#[cfg(feature = "schemas")]
pub mod schemas; // a JSON Schema per event type: bodies that fail it kept apart as invalid
pub mod scheme;
#[cfg(feature = "seal")]
pub mod seal; // payloads sealed at rest under rotating keys (the SQL inbox's, JetStream's)
mod secret;
mod span; // the `tracing` spans of a delivery, an accept and an inbox attempt (and `otel`'s trace context)
mod timestamp;

#[cfg(feature = "dedupe")]
pub use dedupe::DedupeLayer;
#[cfg(feature = "dedupe")]
pub use drain::{Drain, Drained};
pub use error::{ConfigError, ConfigErrorKind, VerifyError, VerifyErrorKind};
pub use event::Event;
pub use filter::EventFilterLayer;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use inbox::{Inbox, Worker};
#[cfg(feature = "dedupe")]
pub use once::Once;
pub use public_url::PublicUrl;
pub use scheme::Scheme;
pub use secret::Secrets;
pub use verifier::Verifier;
pub use verify::VerifyWebhookLayer;

/// The README's examples run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

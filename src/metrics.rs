//! What the crate counts and times (feature `metrics`), through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! With the feature, every layer, the inbox and its worker record into whatever recorder
//! the application installed: pick an exporter (Prometheus, OpenTelemetry, StatsD, …) and
//! install it as usual; none is bundled. Without a recorder, each call is a thread-local
//! look-up that finds nothing; without the feature, nothing is compiled at all.
//!
//! | name | type | labels | what it counts |
//! |---|---|---|---|
//! | `tower_webhook_deliveries_verified_total` | counter | `source` | deliveries `VerifyWebhookLayer` verified (signature and timestamp), set-up handshakes that verified included |
//! | `tower_webhook_deliveries_rejected_total` | counter | `source`, `reason` | deliveries it refused, by [`VerifyErrorKind`] (below) |
//! | `tower_webhook_verification_duration_seconds` | histogram | `source` | the check of a collected body: signature (the MAC or public-key check) and timestamp; not the time the body took to arrive |
//! | `tower_webhook_duplicates_total` | counter | `source` | deliveries of an event already handled (`DedupeLayer`, `TxDedupeLayer`: 204) or already stored (the inbox's accept), and JetStream messages of an event already processed (acknowledged without running) |
//! | `tower_webhook_in_flight_conflicts_total` | counter | `source` | deliveries answered 409 because another attempt holds the event |
//! | `tower_webhook_store_unavailable_total` | counter | `source` | deliveries answered 503 because the store (or the PostgreSQL transaction) could not answer |
//! | `tower_webhook_inbox_backlogged_total` | counter | `source` | deliveries the inbox's accept answered 503 without storing them, its queue lagging beyond its [`Backpressure`] |
//! | `tower_webhook_handler_outcomes_total` | counter | `source`, `outcome` | handler runs behind `DedupeLayer` or `TxDedupeLayer`: `success` (2xx), `failure` (another status, or an error), `panic` |
//! | `tower_webhook_store_operation_duration_seconds` | histogram | `operation` | each round trip to a store, failed ones included: `claim`, `renew`, `complete`, `release` (`DedupeLayer`, [`Once`]); `accept`, `inbox_claim`, `inbox_renew`, `inbox_finish`, `inbox_counts` (the inbox) |
//! | `tower_webhook_inbox_held_back_total` | counter | `processor`, `rule` | events a worker held back by a rule, none an attempt: `paused` (parked by a JetStream or RabbitMQ worker, see [`JetStream::pause`]; a paused SQL row is not claimed, see the `paused` depth), `per_source` and `per_type` (handed back by a SQL worker, or waiting in a JetStream one, for its cap), `per_object` (waiting in a JetStream worker for its object's turn), `rate` (a source out of turns under its rate), `pauses_unread` (waiting in a RabbitMQ worker, once for each try, while the pauses' log cannot be read: none starts until it can) |
//! | `tower_webhook_inbox_attempts_total` | counter | `processor`, `outcome` | the inbox worker's attempts: `processed`, `retry` (failed, due again after a backoff), `dead` (failed the last allowed attempt), `abandoned` (stopped past the shutdown grace, back in the queue), `snoozed` (the processor answered [`Later`]: due again then, not counted as an attempt), `lost` (the row was no longer this worker's when the outcome was recorded, or the store did not hear it before the lease ended) |
//! | `tower_webhook_inbox_depth` | gauge | `processor`, `state` | rows `queued` (waiting for their first or next attempt), `processing` (claimed now) and `paused` (held back by a pause: see [`Counts::paused`]) |
//! | `tower_webhook_inbox_dead_rows` | gauge | `processor` | rows that gave up after the maximum attempts |
//! | `tower_webhook_inbox_lag_seconds` | gauge | `processor` | how long the longest-waiting due row has waited (`Counts::oldest_due`; 0 when none is due): alert on it |
//! | `tower_webhook_inbox_unreadable_total` | counter | `source`, `reason` | routes (SQL) and messages a processor may run (JetStream) ended dead without running because their body cannot be given to the processor: `unknown_key` (sealed under a key the inbox does not have), `tampered` (the key does not open it: altered or moved), `expired` and `erased` (gone before it was processed), `missing` (its body row deleted outside the crate); each also counts as a `dead` attempt |
//! | `tower_webhook_inbox_invalid_total` | counter | `source` | events stored invalid (SQL) or kept invalid (JetStream): their type's JSON Schema refused the body (`Inbox::with_schemas`, feature `schemas`); never processed, never retried |
//!
//! Labels are few and bounded, never an event id:
//!
//! - `source`: the verifier's [source](crate::Verifier::with_source) (the scheme's name by
//!   default). Per-tenant verification labels the layer's source, not each tenant's
//!   (`stripe`, not `stripe/acme`): tenants are many, and an event's own source names its
//!   tenant. `DedupeLayer::with_key` labels the key's source.
//! - `reason`: `missing_header`, `malformed_header`, `invalid_signature`,
//!   `timestamp_too_old`, `timestamp_in_future`, `body_too_large`, `body_read`,
//!   `body_timeout`, `misconfigured`, `unknown_tenant`, `secrets_unavailable`,
//!   `store_unavailable`, `method_not_allowed`.
//! - `outcome`, `operation`, `state`: the values above.
//!
//! Durations are in seconds, counts are plain numbers, and every metric is described once
//! per recorder (help text and unit). The inbox's gauges are set whenever
//! [`Inbox::counts`] runs, and a running
//! [`Worker`] runs it every poll interval (5 s by default; a few
//! tenths of a millisecond on either database): every replica's worker then reports the
//! same rows, so aggregate them with `max`, not `sum`. A verify layer without
//! `DedupeLayer` behind it counts deliveries, not handler outcomes.
//!
//! # Example
//!
//! With `metrics-exporter-prometheus` (without its default features: the recorder only),
//! serving `GET /metrics` beside the webhooks, as `examples/receiver.rs` does:
//!
//! ```
//! use axum::{routing::get, Router};
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let recorder = PrometheusBuilder::new()
//!     // Histograms as Prometheus histograms (the exporter's default is a summary).
//!     .set_buckets_for_metric(
//!         Matcher::Suffix("_seconds".into()),
//!         &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
//!     )?
//!     .build_recorder();
//! let handle = recorder.handle();
//! metrics::set_global_recorder(recorder)?; // before the layers serve a request
//! // Without the exporter's own listener, call `handle.run_upkeep()` every few seconds
//! // (it drains the histograms).
//! let app: Router = Router::new().route("/metrics", get(move || async move { handle.render() }));
//! # Ok(())
//! # }
//! ```
//!
//! Inside the crate, a worker of another queue (a broker's) records its attempts with
//! `attempt` and its depth with `inbox_gauges`, under the same names.
//!
#![cfg_attr(feature = "dedupe", doc = "[`Once`]: crate::once::Once")]
#![cfg_attr(not(feature = "dedupe"), doc = "[`Once`]: crate#features")]
#![cfg_attr(
    any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ),
    doc = "
[`Backpressure`]: crate::inbox::Backpressure
[`Later`]: crate::inbox::Later
[`Counts::paused`]: crate::inbox::Counts::paused"
)]
#![cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    doc = "
[`Backpressure`]: crate#features
[`Later`]: crate#features
[`Counts::paused`]: crate#features"
)]
#![cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "
[`Inbox::counts`]: crate::inbox::Inbox::counts
[`Worker`]: crate::inbox::Worker"
)]
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "
[`Inbox::counts`]: crate#features
[`Worker`]: crate#features"
)]
#![cfg_attr(
    feature = "nats",
    doc = "[`JetStream::pause`]: crate::inbox::jetstream::JetStream::pause"
)]
#![cfg_attr(not(feature = "nats"), doc = "[`JetStream::pause`]: crate#features")]

use std::future::Future;
use std::time::Duration;

use crate::VerifyErrorKind;

/// Whether the crate records metrics at all: work done only to feed them (reading the
/// inbox's counts on a timer) is skipped without the feature.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

/// The `outcome` of a handler run behind a dedupe layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // counted by `handled`
pub(crate) enum Handler {
    /// A 2xx.
    Success,
    /// Another status, or an error.
    Failure,
    /// It panicked.
    Panic,
}

/// A store round trip, the `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) enum Operation {
    Claim,
    Renew,
    Complete,
    Release,
    Accept,
    InboxClaim,
    InboxRenew,
    InboxFinish,
    InboxCounts,
}

/// How an inbox worker's attempt ended, the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) enum Attempt {
    /// The processor succeeded and the row is processed.
    Processed,
    /// It failed; the row is due again after a backoff.
    Retry,
    /// It failed the last allowed attempt; the row is dead.
    Dead,
    /// Stopped past the shutdown grace; the row is back in the queue, the attempt counted.
    Abandoned,
    /// The processor said "later": the event is due again then, the attempt not counted.
    Snoozed,
    /// Its outcome was not the row's: another worker held it by then, or the store did
    /// not hear the outcome before the lease ended.
    Lost,
}

/// The `source` label of one verifier's metrics, with their keys built once (on first
/// use), so recording allocates nothing. Cloning shares them. A zero-sized no-op without
/// the feature.
#[derive(Clone)]
pub(crate) struct Source {
    #[cfg(feature = "metrics")]
    keys: std::sync::Arc<imp::SourceKeys>,
}

impl Source {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(source: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: std::sync::Arc::new(imp::SourceKeys::new(source)),
        }
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source").finish_non_exhaustive()
    }
}

/// When something started, for a duration histogram. Zero-sized without the feature.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl Timer {
    #[must_use]
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// A timer that started at `started` (an instant the caller keeps anyway).
    #[must_use]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) fn since(started: std::time::Instant) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            started,
        }
    }
}

/// A delivery verified.
#[inline]
pub(crate) fn verified(_source: &Source) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Verified));
}

/// A delivery rejected for `kind`.
#[inline]
pub(crate) fn rejected(_source: &Source, _kind: VerifyErrorKind) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Rejected(_kind)));
}

/// A collected body checked, from `started`.
#[inline]
pub(crate) fn verification(_source: &Source, _started: Timer) {
    #[cfg(feature = "metrics")]
    imp::observe(
        _source.keys.key(imp::Slot::Verification),
        _started.started.elapsed(),
    );
}

/// A delivery of an event already handled or stored.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn duplicate(_source: &Source) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Duplicate));
}

/// A delivery answered 409: another attempt holds it.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn in_flight(_source: &Source) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::InFlight));
}

/// A delivery answered 503: the store could not answer.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn store_unavailable(_source: &Source) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Unavailable));
}

/// A delivery answered 503 unstored: the inbox lagged beyond its backpressure's bound.
#[inline]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) fn backlogged(_source: &Source) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Backlogged));
}

/// A handler run ended so.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn handler(_source: &Source, _outcome: Handler) {
    #[cfg(feature = "metrics")]
    imp::increment(_source.keys.key(imp::Slot::Handler(_outcome)));
}

/// A store round trip of `operation` took this long (from `started`).
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn store_operation(_operation: Operation, _started: Timer) {
    #[cfg(feature = "metrics")]
    imp::observe(imp::operation_key(_operation), _started.started.elapsed());
}

/// `future`, a store round trip, timed as `operation`.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn timed<F: Future>(operation: Operation, future: F) -> impl Future<Output = F::Output> {
    #[cfg(feature = "metrics")]
    {
        let started = Timer::start();
        async move {
            let output = future.await;
            store_operation(operation, started);
            output
        }
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = operation;
        future
    }
}

/// `handler` (a handler's response future), its outcome counted when it ends: `success`
/// when `succeeded` says so, `failure` otherwise, `panic` when it panics (the panic goes
/// on). Counted in the future, not by its caller: a dedupe layer runs the handler to its
/// end on a task of its own after the client hung up.
#[inline]
#[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
pub(crate) fn handled<F, P>(
    source: &Source,
    handler: F,
    succeeded: P,
) -> impl Future<Output = F::Output>
where
    F: Future,
    P: Fn(&F::Output) -> bool,
{
    #[cfg(feature = "metrics")]
    {
        imp::Handled::new(source.clone(), handler, succeeded)
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = (source, succeeded);
        handler
    }
}

/// The `processor` label of one inbox processor's metrics (fan-out), with their keys
/// built once, so recording allocates nothing. Cloning shares them. A zero-sized no-op
/// without the feature.
#[derive(Clone)]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) struct Processor {
    #[cfg(feature = "metrics")]
    keys: std::sync::Arc<imp::ProcessorKeys>,
}

#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
impl Processor {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(name: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: std::sync::Arc::new(imp::ProcessorKeys::new(name)),
        }
    }
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor").finish_non_exhaustive()
    }
}

/// An inbox worker's attempt for `processor` ended so. For any worker of a queue of
/// verified events.
#[inline]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) fn attempt(_processor: &Processor, _outcome: Attempt) {
    #[cfg(feature = "metrics")]
    imp::increment(_processor.keys.attempt(_outcome));
}

/// The rules that hold events back.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) enum HeldBack {
    Paused,
    PerSource,
    PerType,
    PerObject,
    Rate,
    /// Waiting in a RabbitMQ worker while the pauses' log cannot be read.
    #[cfg_attr(not(feature = "amqp"), allow(dead_code))]
    PausesUnread,
}

/// A worker of `processor` held an event back by `rule` (not an attempt).
#[inline]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) fn held_back(_processor: &Processor, _rule: HeldBack) {
    #[cfg(feature = "metrics")]
    imp::increment(_processor.keys.held_back(_rule));
}

/// The inbox's depth as last read: rows queued and being processed, dead rows, and how
/// long the longest-waiting due row has waited (`None`: none is due). For any queue of
/// verified events.
#[inline]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) fn inbox_gauges(
    _processor: &Processor,
    (_queued, _processing, _paused): (u64, u64, u64),
    _dead: u64,
    _lag: Option<Duration>,
) {
    #[cfg(feature = "metrics")]
    _processor
        .keys
        .gauges((_queued, _processing, _paused), _dead, _lag);
}

/// Why a route ended dead without running: its body cannot be given to the processor
/// (the `reason` label of `tower_webhook_inbox_unreadable_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// `Tampered` needs `seal`; `Expired`, `Erased` and `Missing` the SQL stores.
#[cfg_attr(
    not(all(feature = "seal", any(feature = "sqlite", feature = "postgres"))),
    allow(dead_code)
)]
pub(crate) enum Unreadable {
    /// Sealed under a key the inbox does not have.
    UnknownKey,
    /// The key does not open it (altered, moved from another row, not a ciphertext).
    Tampered,
    /// Deleted by the body retention before the event was processed.
    Expired,
    /// Erased before the event was processed.
    Erased,
    /// No body row, and no state saying why (deleted outside the crate).
    Missing,
}

#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
impl Unreadable {
    /// The label's value.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unreadable::UnknownKey => "unknown_key",
            Unreadable::Tampered => "tampered",
            Unreadable::Expired => "expired",
            Unreadable::Erased => "erased",
            Unreadable::Missing => "missing",
        }
    }

    /// Why a ciphertext did not open.
    #[cfg(feature = "seal")]
    pub(crate) fn of(kind: crate::seal::UnreadableKind) -> Self {
        match kind {
            crate::seal::UnreadableKind::UnknownKey => Unreadable::UnknownKey,
            // Malformed: stored parts that cannot be a ciphertext were altered too.
            _ => Unreadable::Tampered,
        }
    }
}

/// A route of an event of `source` (or a JetStream message) ended dead without running,
/// for `why`.
#[inline]
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    )),
    allow(dead_code)
)]
pub(crate) fn unreadable(_source: &str, _why: Unreadable) {
    #[cfg(feature = "metrics")]
    imp::unreadable(_source, _why);
}

/// An event stored invalid: its type's schema refused its body (issue 36).
#[inline]
#[cfg_attr(not(feature = "schemas"), allow(dead_code))]
pub(crate) fn invalid_accepted(_source: &str) {
    #[cfg(feature = "metrics")]
    imp::invalid(_source);
}

/// The implementation over the `metrics` facade.
#[cfg(feature = "metrics")]
mod imp;

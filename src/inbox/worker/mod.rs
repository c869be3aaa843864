//! The worker, written once for every queue: its settings here (and the builder methods
//! both public workers share), the queue it needs in `queue.rs`, the loop in `run.rs`.
//! The SQL inbox's [`Worker`] is in `sql.rs`; the JetStream one beside its stream.

mod again; // a failed event waiting out its backoff here, its object's turn kept
pub(crate) mod caps; // at most n running per source, per type
pub(crate) mod due; // when queued events fall due: told to every worker, woken for
mod freed; // an event's hold on a processor, lent while it waits for its turns
mod holding; // the events a worker holds, which its claims leave
pub(crate) mod queue; // what the worker needs of where events wait
mod record; // an attempt's outcome: written under the lease, counted, logged, alerted
mod run; // the loop: claim, process under a renewed lease, record, stop in time
mod runner; // what runs an event: the processor, or it and the row in one transaction
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql; // the SQL inbox as a queue, and `Worker`

use std::fmt;
use std::time::Duration;

pub(crate) use self::queue::{ClaimDue, Claimed, Outcome, Queue};
pub(crate) use self::runner::Runner;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::sql::Worker;
use super::process::WorkerHandle;
use super::{Rate, RetryPolicy};
use crate::store::Lease;

/// The default [`Engine::lookahead`]: a quarter of NATS's default `max_ack_pending`
/// (1 000, shared by every worker of a consumer).
pub(crate) const DEFAULT_LOOKAHEAD: usize = 256;

/// A worker's settings and its queue: what [`Worker`] and the JetStream worker each wrap.
pub(crate) struct Engine<Q> {
    pub(crate) queue: Q,
    pub(crate) runner: Runner,
    pub(crate) concurrency: usize,
    pub(crate) retry: RetryPolicy,
    pub(crate) lease: Lease,
    pub(crate) poll: Duration,
    /// `None`: shutdown waits for running events however long they take.
    pub(crate) grace: Option<Duration>,
    /// `None`: events start as fast as processors free up.
    pub(crate) rate: Option<Rate>,
    /// At most this many events of one object running, the first ones in arrival order
    /// (`None`: no cap).
    pub(crate) per_object: Option<u32>,
    /// At most this many events of one source, and of one type, running in this worker.
    pub(crate) per_source: Option<u32>,
    pub(crate) per_type: Option<u32>,
    /// At most this many events of one source started, in this worker.
    pub(crate) rate_per_source: Option<super::Rate>,
    /// Their turns, made as the worker starts.
    pub(crate) caps: caps::Caps,
    /// How many events may wait for their turns under the caps without a processor (a
    /// queue that cannot leave them: JetStream).
    pub(crate) lookahead: usize,
    /// Told of each recorded failure, success and dead event.
    #[cfg(feature = "alerts")]
    pub(crate) alerts: Option<crate::alerts::Alerts>,
    /// The events it runs or records now: its claims leave them.
    pub(crate) holding: holding::Holding,
    /// Every attempt's span a new trace linked to the accept's, the first one too.
    #[cfg(feature = "otel")]
    pub(crate) trace_links_only: bool,
}

impl<Q: Queue> Engine<Q> {
    /// 4 at a time, the default retries, a 60 s lease renewed for up to 1 h, no grace.
    pub(crate) fn new(queue: Q, runner: Runner, poll: Duration) -> Self {
        Self {
            queue,
            runner,
            concurrency: 4,
            retry: RetryPolicy::default(),
            lease: Lease::renewed_for(Duration::from_secs(3600)),
            poll,
            grace: None,
            rate: None,
            per_object: None,
            per_source: None,
            per_type: None,
            rate_per_source: None,
            caps: caps::Caps::default(),
            // A queue that leaves capped events where they are never has one waiting.
            lookahead: if Q::GIVES_BACK { 0 } else { DEFAULT_LOOKAHEAD },
            #[cfg(feature = "alerts")]
            alerts: None,
            holding: holding::Holding::default(),
            #[cfg(feature = "otel")]
            trace_links_only: false,
        }
    }

    pub(crate) fn spawn(self) -> WorkerHandle {
        let beside = self.queue.beside(self.poll);
        WorkerHandle::spawn(|stopped| self.run(stopped), beside)
    }

    /// The settings, for a worker's `Debug`.
    pub(crate) fn fields(&self, f: &mut fmt::DebugStruct<'_, '_>) {
        f.field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field("lease", &self.lease.length)
            .field("max_run", &self.lease.max_run)
            .field("rate", &self.rate)
            .field("per_object", &self.per_object)
            .field("per_source", &self.per_source)
            .field("per_type", &self.per_type)
            .field("rate_per_source", &self.rate_per_source)
            .field("lookahead", &self.lookahead);
    }
}

/// The builder methods every worker has, written once: expanded in each worker's `impl`,
/// whose `engine` field they set.
// With `amqp` alone, unused until its worker lands (issue 37, part 3).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "nats")),
    allow(unused_macros)
)]
macro_rules! shared_settings {
    // Every setting.
    () => {
        shared_settings!(without_max_run);
        shared_settings!(@max_run);
    };
    // `with_max_run`: the RabbitMQ worker has its own (bounded by the broker's consumer
    // timeout).
    (@max_run) => {
        /// Replaces how long a running processor keeps its event's lease renewed (default
        /// 1 h). Past it the lease runs out and another worker may take the event over;
        /// the late outcome is then fenced out (logged at `warn`).
        ///
        /// # Errors
        ///
        /// When `max_run` is shorter than 1 s.
        pub fn with_max_run(
            mut self,
            max_run: std::time::Duration,
        ) -> Result<Self, $crate::ConfigError> {
            self.engine.lease.max_run = $crate::store::Lease::checked_max_run(max_run)?;
            Ok(self)
        }
    };
    // Every setting but `with_max_run`.
    (without_max_run) => {
        /// Replaces how many events are processed at once (default 4). No more are claimed
        /// than there are free processors, so none waits out its lease in a buffer.
        ///
        /// It also bounds how fast a quick processor drains the queue: an event's attempt
        /// is counted as it is claimed (a worker that dies mid-event must have counted it;
        /// one that claimed events ahead would count attempts that never ran), so each
        /// processor takes at most one event per claim round trip — about `n` events per
        /// few milliseconds. Outcomes do not hold a processor: they are written while the
        /// processors go on. `benches/throughput/drain.sh` measures it: in BENCHMARKS.md a
        /// no-op processor drains the SQL inbox at about 2 400 rows/s at 8, and 8 000–8 700
        /// at 64.
        ///
        /// # Errors
        ///
        /// When `n` is 0.
        pub fn with_concurrency(mut self, n: usize) -> Result<Self, $crate::ConfigError> {
            let why = "a worker's concurrency must be at least 1";
            self.engine.concurrency = $crate::inbox::process::at_least_one(n, why)?;
            Ok(self)
        }

        /// Replaces how this worker retries (default: [`RetryPolicy::default`]).
        ///
        /// [`RetryPolicy::default`]: crate::inbox::RetryPolicy::default
        pub fn with_retry(mut self, retry: $crate::inbox::RetryPolicy) -> Self {
            self.engine.retry = retry;
            self
        }

        /// Replaces after how many failed attempts an event is dead (default 8): as
        /// [`RetryPolicy::with_max_attempts`].
        ///
        /// [`RetryPolicy::with_max_attempts`]: crate::inbox::RetryPolicy::with_max_attempts
        ///
        /// # Errors
        ///
        /// When `n` is 0.
        pub fn with_max_attempts(mut self, n: u32) -> Result<Self, $crate::ConfigError> {
            self.engine.retry = self.engine.retry.with_max_attempts(n)?;
            Ok(self)
        }

        /// Replaces the backoff: `first` after the first failure, doubling up to `cap`,
        /// each wait drawn between half and all of that: as
        /// [`RetryPolicy::with_backoff`].
        ///
        /// A retry starts when it is due (within a few milliseconds), not at the worker's
        /// next poll; so does an event a processor snoozed ([`Later`]). On the SQL inbox
        /// the worker that recorded the failure wakes for it, and so does every worker of
        /// the same `Inbox` (or a clone of it); on PostgreSQL the failure's `NOTIFY` tells
        /// every replica's workers when it falls due, so whichever is free then starts
        /// it. Whenever a claim comes back short, a worker also reads when the next
        /// queued row falls due, so a worker just started knows too. What no worker is
        /// told of starts at a worker's next claim (after a delivery it accepts, one of
        /// its processors ending, or its [poll](Self::with_poll_interval)): on SQLite, a
        /// retry recorded by another process on the same file, or through another `Inbox`
        /// opened on it; on PostgreSQL, one notified while a worker's `LISTEN` connection
        /// was down. On JetStream a failed message goes back to the stream with the delay
        /// (or, under a per-object cap, waits it out in the worker) and is delivered
        /// again when due.
        ///
        /// [`RetryPolicy::with_backoff`]: crate::inbox::RetryPolicy::with_backoff
        /// [`Later`]: crate::inbox::Later
        ///
        /// # Errors
        ///
        /// When `first` is zero, or `cap` is shorter than `first`.
        pub fn with_backoff(
            mut self,
            first: std::time::Duration,
            cap: std::time::Duration,
        ) -> Result<Self, $crate::ConfigError> {
            self.engine.retry = self.engine.retry.with_backoff(first, cap)?;
            Ok(self)
        }

        /// Bounds how long [`WorkerHandle::shutdown`] lets running events finish (by
        /// default it waits for them). Past it they are stopped mid-attempt, as a crash
        /// would stop them: the attempt counts, and the event is due again at once. A
        /// processor stopped midway may have done part of its work; prefer the default
        /// where you can.
        ///
        /// A processor stopped while its own `PgPool::begin()` waits for the server can
        /// leave that pool a connection stuck inside a transaction (sqlx 0.9, sqlx#4393):
        /// begin on a task of its own (`tokio::spawn(async move { pool.begin().await })`).
        /// The transactional worker's own transaction is begun that way.
        ///
        /// [`WorkerHandle::shutdown`]: crate::inbox::WorkerHandle::shutdown
        pub fn with_grace(mut self, grace: std::time::Duration) -> Self {
            self.engine.grace = Some(grace);
            self
        }

        /// Starts at most `rate` events per second or minute, evenly spaced (see
        /// [`Rate`]; by default, as fast as processors free up). An event held back by
        /// the rate is not claimed: no attempt is counted, it is not backed off, and it
        /// never goes dead for waiting. The rate is this worker's: workers in other
        /// processes start their own.
        ///
        /// [`Rate`]: crate::inbox::Rate
        pub fn with_rate(mut self, rate: $crate::inbox::Rate) -> Self {
            self.engine.rate = Some(rate);
            self
        }

        /// Runs at most `n` events of one object (an event's
        /// [`object_id`](crate::Event::object_id), per source) at once, the first `n` of
        /// its unfinished events in arrival order: with 1, one object's events run one at a
        /// time, in order, and an event waiting out a retry holds the later ones back.
        /// Events without an object id are not capped. By default, no cap.
        ///
        /// On the SQL inbox the cap holds across every worker on the database: an event
        /// over it is not claimed (no attempt counted). On JetStream, with 1, it holds
        /// across the consumer's workers one after another, graceful restarts and killed
        /// workers included: a worker writes each message it pulls into its object's line
        /// (in the bucket `<stream>-held`) before any of them runs, an event runs only
        /// while it is the first of its line, and it leaves the line only once processed,
        /// dead or parked — so the next worker waits for an earlier event however
        /// JetStream orders the redeliveries. It costs two bucket writes per event (a
        /// no-op processor drains at about half the rate: BENCHMARKS.md). Workers running
        /// at the same time on one consumer are ordered only as far as each wrote its
        /// pulls down before the other started a later event (milliseconds): run one at a
        /// time where the order must hold. With more than 1, the cap holds within each
        /// worker, in the order it pulled the messages.
        ///
        /// On JetStream a message waiting for its object's turn waits in the worker
        /// (renewed meanwhile) without holding a processor, and the worker reads on within
        /// its lookahead, as under [`with_per_source`](Self::with_per_source); one that
        /// has waited the consumer's `ack_wait` for an event this worker does not hold (a
        /// killed worker's, not yet delivered again) is handed back, uncounted, and pulled
        /// again. An event of a capped object that fails (or snoozes) waits out its
        /// backoff in the worker, its object's turn kept and its message renewed, and runs
        /// again there (a nak would hand the worker's turn to the object's next event); a
        /// wait that would outlast [`with_max_run`](Self::with_max_run) is handed back
        /// instead, and a shutdown hands it back at once — with 1, still first of its line.
        ///
        /// # Errors
        ///
        /// When `n` is 0.
        pub fn with_per_object(mut self, n: u32) -> Result<Self, $crate::ConfigError> {
            let why = "a per-object cap must be at least 1";
            self.engine.per_object = Some($crate::inbox::process::at_least_one(n, why)?);
            Ok(self)
        }

        /// Runs at most `n` events of one source (a tenant, a provider) at once in this
        /// worker. By default, no cap.
        ///
        /// On the SQL inbox a claim leaves the events of a source at its cap where they
        /// are (no attempt counted), so the worker's other processors take other sources'
        /// events: one source's backlog of 10 000 does not hold back another's 10, whose
        /// events start as soon as a processor is free. On JetStream, which delivers in
        /// the stream's order, a message over its source's cap waits in the worker for its
        /// turn (renewed meanwhile) without holding a processor, while the worker reads on
        /// — as far as its lookahead (`JetStreamWorker::with_lookahead`, default 256
        /// messages) reaches.
        ///
        /// The cap is this worker's: workers in other processes run their own.
        ///
        /// # Errors
        ///
        /// When `n` is 0.
        pub fn with_per_source(mut self, n: u32) -> Result<Self, $crate::ConfigError> {
            let why = "a per-source cap must be at least 1";
            self.engine.per_source = Some($crate::inbox::process::at_least_one(n, why)?);
            Ok(self)
        }

        /// Runs at most `n` events of one event type at once in this worker (events
        /// without a type share one cap), as [`with_per_source`](Self::with_per_source)
        /// does per source. By default, no cap.
        ///
        /// # Errors
        ///
        /// When `n` is 0.
        pub fn with_per_type(mut self, n: u32) -> Result<Self, $crate::ConfigError> {
            let why = "a per-type cap must be at least 1";
            self.engine.per_type = Some($crate::inbox::process::at_least_one(n, why)?);
            Ok(self)
        }

        /// Starts at most `rate` events of each source (see [`Rate`]), evenly spaced, in
        /// this worker: one source's storm does not use up the API calls another's need.
        /// By default, no limit per source ([`with_rate`](Self::with_rate) bounds them
        /// all together).
        ///
        /// On the SQL inbox a claim leaves the events of a source out of turns where they
        /// are (no attempt counted), so other sources' events start meanwhile. On
        /// JetStream, which delivers in the stream's order, a message waits in the worker
        /// for its source's turn, as under [`with_per_source`](Self::with_per_source).
        ///
        /// [`Rate`]: crate::inbox::Rate
        pub fn with_rate_per_source(mut self, rate: $crate::inbox::Rate) -> Self {
            self.engine.rate_per_source = Some(rate);
            self
        }

        /// Tells `alerts` of each attempt's recorded outcome (feature `alerts`): a source
        /// starting to fail, recovering, and each dead event (each alert at most once per
        /// its interval). A snoozed or stopped attempt tells nothing.
        #[cfg(feature = "alerts")]
        pub fn with_alerts(mut self, alerts: $crate::alerts::Alerts) -> Self {
            self.engine.alerts = Some(alerts);
            self
        }

        /// With `true`, every attempt's span starts a new trace linked to the accept's
        /// span (feature `otel`), the first one too. By default the first run of an event
        /// after its accept is the accept's child (one trace from the delivery to it),
        /// and every other run (a retry, a requeue or replay, a backfill, a resumed
        /// snooze) a new trace linked to it.
        #[cfg(feature = "otel")]
        pub fn with_trace_links_only(mut self, links_only: bool) -> Self {
            self.engine.trace_links_only = links_only;
            self
        }
    };
}
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "nats")),
    allow(unused_imports)
)]
pub(crate) use shared_settings;

//! [`Worker`]: claims due rows and runs the processor on them, with retries — the type
//! and its settings here, the loop in `run.rs`.

mod run; // the loop: claim, process under a renewed lease, record, stop in time

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::run::{gauges, Runner};
use super::process::{checked_concurrency, checked_poll, WorkerHandle};
use super::{Inbox, Processor, RetryPolicy};
use crate::metrics;
use crate::store::Lease;
use crate::ConfigError;

/// Processes an [`Inbox`]'s rows. Build it, then [`spawn`](Self::spawn) it.
#[must_use]
pub struct Worker {
    inbox: Inbox,
    runner: Runner,
    concurrency: usize,
    retry: RetryPolicy,
    lease: Lease,
    poll: Duration,
    /// `None`: shutdown waits for running events however long they take.
    grace: Option<Duration>,
}

impl Worker {
    /// A worker running `processor`: 4 at a time, 8 attempts, backoff from 1 s doubling
    /// to at most 10 min (with jitter), a 60 s lease renewed for up to 1 h of processing,
    /// polling every 5 s besides wake-ups, and a shutdown that waits for running events.
    pub fn new(inbox: &Inbox, processor: impl Processor) -> Self {
        Self::with_runner(inbox, Runner::Plain(Arc::new(processor)))
    }

    /// A worker whose processor writes in a transaction that also marks the row processed
    /// (PostgreSQL): the effects in this database happen exactly once — even when the
    /// worker dies mid-event, or its lease runs out and another worker takes the row over
    /// (the stale one's commit is refused). Defaults as for [`new`](Self::new).
    ///
    /// A business action inside it (fulfil order 7 once, across events) belongs in the
    /// same transaction: [`Once::run_in`](crate::once::Once::run_in) records its key there,
    /// so a rolled-back attempt leaves the key free and a committed one keeps it.
    ///
    /// Each running event holds one of the pool's connections until it commits: keep the
    /// concurrency below the pool's size, with room for the worker's `LISTEN` (one
    /// connection), claims, and any other connection the processor takes (a `PgStore` for
    /// [`Once`](crate::once::Once) on the same pool, say).
    ///
    /// It takes the [`PgStore`](crate::store::PgStore) whose inbox it processes
    /// ([`Inbox::postgres`] of it): only PostgreSQL has the form (SQLite has one writer, and
    /// a transaction open for the whole processing would stall every other write).
    #[cfg(feature = "postgres")]
    pub fn transactional(
        store: &crate::store::PgStore,
        processor: impl super::TxProcessor,
    ) -> Self {
        let runner = Runner::InTransaction(Arc::new(processor), store.pool().clone());
        Self::with_runner(&Inbox::postgres(store), runner)
    }

    fn with_runner(inbox: &Inbox, runner: Runner) -> Self {
        Self {
            inbox: inbox.clone(),
            runner,
            concurrency: 4,
            retry: RetryPolicy::default(),
            lease: Lease::renewed_for(Duration::from_secs(3600)),
            poll: Duration::from_secs(5),
            grace: None,
        }
    }

    /// Replaces how many events are processed at once (default 4).
    ///
    /// It also bounds how fast a quick processor drains the queue: a row is claimed, its
    /// attempt counted, in a commit of its own before its processor runs (a worker that
    /// dies mid-event must have counted it; one that claimed rows ahead would count
    /// attempts that never ran), so each processor takes at most one row per claim round
    /// trip — about `n` rows per few milliseconds. Outcomes do not hold a processor: they
    /// are written together, while the processors go on. `benches/throughput/drain.sh`
    /// measures it: in BENCHMARKS.md a no-op processor drains at about 2 400 rows/s at 8,
    /// and 8 000–8 700 at 64.
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn with_concurrency(mut self, n: usize) -> Result<Self, ConfigError> {
        self.concurrency = checked_concurrency(n)?;
        Ok(self)
    }

    /// Replaces how this worker retries (default: [`RetryPolicy::default`]).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Replaces after how many failed attempts an event is dead (default 8): as
    /// [`RetryPolicy::with_max_attempts`].
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn with_max_attempts(mut self, n: u32) -> Result<Self, ConfigError> {
        self.retry = self.retry.with_max_attempts(n)?;
        Ok(self)
    }

    /// Replaces the backoff: `first` after the first failure, doubling up to `cap`, each
    /// wait drawn between half and all of that: as [`RetryPolicy::with_backoff`].
    ///
    /// # Errors
    ///
    /// When `first` is zero, or `cap` is shorter than `first`.
    pub fn with_backoff(mut self, first: Duration, cap: Duration) -> Result<Self, ConfigError> {
        self.retry = self.retry.with_backoff(first, cap)?;
        Ok(self)
    }

    /// Replaces how long a claimed row stays with this worker between renewals (default
    /// 60 s): the lease is renewed every third of it while the processor runs, so it bounds
    /// how long a *crashed* worker's rows wait, not how long a processor may run (that is
    /// [`with_max_run`](Self::with_max_run)).
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day, or is shorter than the database
    /// keeps safely (SQLite: four busy timeouts, see
    /// [`DedupeStore::min_lease`](crate::store::DedupeStore::min_lease)).
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        let min = self.inbox.backend.min_lease();
        self.lease.length = crate::store::checked_lease(lease, min)?;
        Ok(self)
    }

    /// Replaces how long a running processor keeps its row's lease renewed (default 1 h).
    /// Past it the lease runs out and another worker may take the row over; the late
    /// outcome is then fenced out (logged at `warn`).
    ///
    /// # Errors
    ///
    /// When `max_run` is shorter than 1 s.
    pub fn with_max_run(mut self, max_run: Duration) -> Result<Self, ConfigError> {
        self.lease.max_run = Lease::checked_max_run(max_run)?;
        Ok(self)
    }

    /// Replaces how often the worker looks for due rows without a wake-up (default 5 s).
    ///
    /// # Errors
    ///
    /// When `poll` is not between 10 ms and 1 h.
    pub fn with_poll_interval(mut self, poll: Duration) -> Result<Self, ConfigError> {
        self.poll = checked_poll(poll)?;
        Ok(self)
    }

    /// Bounds how long [`WorkerHandle::shutdown`] lets running events finish (by default
    /// it waits for them). Past it they are stopped mid-attempt, as a crash would stop
    /// them: the attempt counts, and the row is due again at once. A processor stopped
    /// midway may have done part of its work; prefer the default where you can.
    ///
    /// A processor stopped while its own `PgPool::begin()` waits for the server can leave
    /// that pool a connection stuck inside a transaction (sqlx 0.9, sqlx#4393): begin on a
    /// task of its own (`tokio::spawn(async move { pool.begin().await })`). The
    /// transactional worker's own transaction is begun that way.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Starts the worker on the current Tokio runtime. With the `metrics` feature, it
    /// also reads the inbox's [`counts`](Inbox::counts) every poll interval, which sets
    /// the inbox's gauges.
    pub fn spawn(self) -> WorkerHandle {
        let listener = self.inbox.backend.listen(self.inbox.wake.clone());
        let gauges = metrics::ENABLED.then(|| tokio::spawn(gauges(self.inbox.clone(), self.poll)));
        let beside = listener.into_iter().chain(gauges).collect();
        WorkerHandle::spawn(|stopped| self.run(stopped), beside)
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field("lease", &self.lease.length)
            .field("max_run", &self.lease.max_run)
            .finish_non_exhaustive()
    }
}

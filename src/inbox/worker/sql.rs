//! [`Worker`]: the SQL inbox's worker — its constructors, and one processor's routes as
//! the worker's [`Queue`] (claimed, renewed and finished through the dialect's
//! [`Backend`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::super::backend::HeldRow;
use super::super::process::{checked_poll, WorkerHandle};
use super::super::{Inbox, Processor};

use super::due::DueTimes;
use super::{shared_settings, ClaimDue, Claimed, Engine, Outcome, Queue, Runner};
use crate::metrics;
use crate::store::{retry_until, Heartbeat, StoreError};
use crate::{ConfigError, Event};

/// Processes an [`Inbox`]'s rows: one processor's routes. Build it, then
/// [`spawn`](Self::spawn) it.
#[must_use]
pub struct Worker {
    engine: Engine<Routes>,
}

/// One processor's routes of an inbox: what a [`Worker`] claims.
#[derive(Clone)]
pub(crate) struct Routes {
    inbox: Inbox,
    processor: Arc<str>,
    metrics: metrics::Processor,
    /// When the processor's routes fall due (its own: another's retries wake none here).
    due: DueTimes,
}

impl Worker {
    /// A worker running `processor`: 4 at a time, 8 attempts, backoff from 1 s doubling
    /// to at most 10 min (with jitter), a 60 s lease renewed for up to 1 h of processing,
    /// polling every 5 s besides wake-ups, and a shutdown that waits for running events.
    ///
    /// It runs the processor [`default`](crate::inbox::DEFAULT_PROCESSOR)'s routes: every
    /// event of an inbox without [`with_processors`](Inbox::with_processors) (and, on one
    /// with them, the routes stored before fan-out, if `default` is not configured: the
    /// way to drain them).
    pub fn new(inbox: &Inbox, processor: impl Processor) -> Self {
        let name = Arc::from(crate::inbox::DEFAULT_PROCESSOR);
        Self::with_runner(inbox, name, Runner::Plain(Arc::new(processor)))
    }

    /// A worker running `processor` on the routes of the inbox's processor `name` (one of
    /// [`with_processors`](Inbox::with_processors)'): its own attempts, retries and flow
    /// control, never held by another processor's backlog or failures. Defaults as for
    /// [`new`](Self::new); run as many as you like, in any replica.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when the inbox has no processor `name`.
    pub fn processor(
        inbox: &Inbox,
        name: &str,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        let name = Self::known(inbox, name)?;
        Ok(Self::with_runner(
            inbox,
            name,
            Runner::Plain(Arc::new(processor)),
        ))
    }

    /// `name` if `inbox` has that processor.
    fn known(inbox: &Inbox, name: &str) -> Result<Arc<str>, ConfigError> {
        match inbox.processors.get(name) {
            Some(spec) => Ok(Arc::from(spec.name())),
            None => Err(inbox.processors.unknown(name)),
        }
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
        processor: impl super::super::TxProcessor,
    ) -> Self {
        let name: Arc<str> = Arc::from(crate::inbox::DEFAULT_PROCESSOR);
        let runner = Runner::InTransaction(Arc::new(processor), store.pool().clone(), name.clone());
        Self::with_runner(&Inbox::postgres(store), name, runner)
    }

    /// [`transactional`](Self::transactional) on the routes of the processor `name` of
    /// `inbox` (an [`Inbox::postgres`] with [`with_processors`](Inbox::with_processors)):
    /// each route's writes and its `processed_at` commit together.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when the inbox has no processor `name`.
    #[cfg(feature = "postgres")]
    pub fn transactional_processor(
        store: &crate::store::PgStore,
        inbox: &Inbox,
        name: &str,
        processor: impl super::super::TxProcessor,
    ) -> Result<Self, ConfigError> {
        let name = Self::known(inbox, name)?;
        let runner = Runner::InTransaction(Arc::new(processor), store.pool().clone(), name.clone());
        Ok(Self::with_runner(inbox, name, runner))
    }

    fn with_runner(inbox: &Inbox, processor: Arc<str>, runner: Runner) -> Self {
        // An unconfigured `default` (draining routes from before fan-out) counts as itself.
        let metrics = match inbox.processors.get(&processor) {
            Some(spec) => spec.metrics().clone(),
            None => metrics::Processor::new(&processor),
        };
        let routes = Routes {
            inbox: inbox.clone(),
            due: inbox.due.of(&processor),
            processor,
            metrics,
        };
        Self {
            engine: Engine::new(routes, runner, Duration::from_secs(5)),
        }
    }

    shared_settings!();

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
        let min = self.engine.queue.inbox.backend.min_lease();
        self.engine.lease.length = crate::store::checked_lease(lease, min)?;
        Ok(self)
    }

    /// Replaces how often the worker looks for due rows without a wake-up (default 5 s).
    /// Retries and snoozes do not wait for it (see [`with_backoff`](Self::with_backoff));
    /// it bounds how long rows no worker is told of wait: a crashed worker's rows once
    /// their lease has run out, and on SQLite a retry another process recorded.
    ///
    /// # Errors
    ///
    /// When `poll` is not between 10 ms and 1 h.
    pub fn with_poll_interval(mut self, poll: Duration) -> Result<Self, ConfigError> {
        self.engine.poll = checked_poll(poll)?;
        Ok(self)
    }

    /// Starts the worker on the current Tokio runtime. With the `metrics` feature, it
    /// also reads the inbox's [`counts`](Inbox::counts) every poll interval, which sets
    /// the inbox's gauges.
    pub fn spawn(self) -> WorkerHandle {
        self.engine.spawn()
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Worker");
        self.engine.fields(&mut f);
        f.finish_non_exhaustive()
    }
}

impl Routes {
    /// Ends a claimed route that must not run (its body is gone, or does not open) dead
    /// with `reason`, under the claim's token: never given to the processor, never
    /// retried, shown dead with its reason until an operator requeues it. Tried until
    /// `until` (half the claim's lease); not written by then, the route comes back when
    /// its lease runs out, and is refused again.
    async fn refuse(
        &self,
        held: HeldRow,
        (why, reason): (metrics::Unreadable, String),
        until: Instant,
    ) {
        #[cfg(feature = "tracing")]
        tracing::warn!(target: "tower_webhook", source = %held.source, id = %held.id, processor = %held.processor, "inbox route dead without running: {reason}");
        let finish = || {
            let reason = reason.clone();
            self.inbox
                .backend
                .finish(held.clone(), Outcome::Dead(reason))
        };
        // Counted once written: one not written is claimed and refused again.
        if matches!(retry_until(until, finish).await, Ok(true)) {
            metrics::unreadable(&held.source, why);
        }
    }
}

impl Queue for Routes {
    type Held = HeldRow;
    const CLAIM_WAITS: bool = false;
    // The claim's token fences the hand-back: rows another worker took over stay its own.
    const GIVES_BACK: bool = true;
    // A claim leaves an object's events over the cap unclaimed, for every worker at once.
    const CAPS_OBJECTS: bool = true;

    fn wake(&self) -> Arc<Notify> {
        self.inbox.wake.clone()
    }

    fn metrics(&self) -> &metrics::Processor {
        &self.metrics
    }

    fn processor(&self) -> &str {
        &self.processor
    }

    fn due(&self) -> Option<DueTimes> {
        Some(self.due.clone())
    }

    fn beside(&self, poll: Duration) -> Vec<tokio::task::JoinHandle<()>> {
        let inbox = &self.inbox;
        let listener = inbox.backend.listen(inbox.wake.clone(), inbox.due.clone());
        let gauges = metrics::ENABLED.then(|| tokio::spawn(gauges(inbox.clone(), poll)));
        listener.into_iter().chain(gauges).collect()
    }

    async fn open(
        &mut self,
        (lease, per_object): (Duration, Option<u32>),
        _: &mut watch::Receiver<bool>,
    ) -> Option<Duration> {
        // Not fatal: the registry serves operators' tools; the next accept tries again.
        if let Err(_error) = self.inbox.register().await {
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "tower_webhook", "inbox worker could not register its processors: {_error}");
        }
        if per_object.is_some() {
            // Without it the cap still holds, reading more of the table per claim.
            if let Err(_error) = self.inbox.backend.object_index().await {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "inbox worker could not make the per-object index: {_error}");
            }
        }
        Some(lease)
    }

    async fn claim(&self, due: ClaimDue) -> Result<Vec<Claimed<HeldRow>>, StoreError> {
        let (at, token, capped) = (Instant::now(), due.token, due.per_object.is_some());
        let (limit, lease) = (due.limit, due.lease);
        let rows = self
            .inbox
            .backend
            .claim(self.processor.clone(), due)
            .await?;
        if rows.len() < limit {
            // Nothing more is due now: when the processor's next route falls due (a retry
            // or snooze of any worker's), read beside the claim so that its rows start
            // meanwhile.
            let (backend, due) = (self.inbox.backend.clone(), self.due.clone());
            let processor = self.processor.clone();
            tokio::spawn(async move {
                if let Ok(Some(after)) = backend.next_due(processor).await {
                    due.after(after); // a read that failed: the poll covers it
                }
            });
        }
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let held = HeldRow {
                source: row.event.source().to_owned(),
                id: row.event.stored_id().to_owned(),
                processor: self.processor.clone(),
                token,
                wakes: capped && row.event.object_id().is_some(),
            };
            if let Some(reason) = row.refused {
                self.refuse(held, reason, at + lease / 2).await;
                continue;
            }
            claimed.push(Claimed {
                held,
                event: row.event,
                attempt: row.attempt,
                at,
                trace: row.trace,
            });
        }
        Ok(claimed)
    }

    async fn give_back(&self, held: Vec<HeldRow>) {
        let Some(token) = held.first().map(|row| row.token) else {
            return;
        };
        let keys = held.into_iter().map(|row| (row.source, row.id)).collect();
        let processor = self.processor.clone();
        let _ = self.inbox.backend.give_back(processor, keys, token).await;
    }

    async fn start(
        &self,
        _: &HeldRow,
        _: (&Event, u32),
        _: u32,
        _: &Heartbeat,
        _: &mut watch::Receiver<bool>,
    ) -> bool {
        // The claim counted the attempt, marked dead a row that crashed too often, and
        // took no more of an object's rows than its cap.
        true
    }

    async fn renew(&self, row: &HeldRow, lease: Duration) -> Result<bool, StoreError> {
        self.inbox.backend.renew(row.clone(), lease).await
    }

    async fn finish(
        &self,
        row: &HeldRow,
        outcome: Outcome,
        until: Instant,
    ) -> Result<bool, StoreError> {
        let after = match &outcome {
            Outcome::Retry(_, after) | Outcome::Later(after) => Some(*after),
            _ => None,
        };
        // Sealed once, before the retries: the error text never reaches the store in clear.
        let outcome = self.inbox.sealed_outcome(row, outcome);
        let finish = || self.inbox.backend.finish(row.clone(), outcome.clone());
        let held = retry_until(until, finish).await;
        if let (Ok(true), Some(after)) = (&held, after) {
            // Due `after` from when it was written, which is before now: never early.
            self.due.after(after);
        }
        held
    }
}

/// Reads the inbox's counts every `every`, which sets its gauges (feature `metrics`); a
/// failed read is tried again at the next tick.
async fn gauges(inbox: Inbox, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let _ = inbox.counts().await;
    }
}

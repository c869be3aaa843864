//! The worker's loop: claim due rows, run the processor on each under a renewed lease,
//! record the outcome, and stop within the grace period.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::super::backend::{Claimed, Outcome};
use super::super::process::{error_chain, hurry_up, AbortOnDrop};
use super::super::{Attempt, Inbox, Processor};
use super::Worker;
use crate::metrics::{self, Operation};
use crate::span;
use crate::store::{retry_until, Heartbeat, StoreError, Token};
use crate::Event;

/// How a worker runs a claimed row.
#[derive(Clone)]
pub(super) enum Runner {
    /// The processor; the worker records the outcome after it.
    Plain(Arc<dyn Processor>),
    /// The processor and the row's `processed_at` in one PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    InTransaction(Arc<dyn super::super::TxProcessor>, sqlx::PgPool),
}

/// How a run ended well.
enum Done {
    /// The processor succeeded; the worker records it.
    Succeeded,
    /// Already recorded in the processor's transaction (`false`: fenced out, rolled back).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Recorded(bool),
}

impl Runner {
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))] // the token fences commits
    fn run(
        &self,
        event: Event,
        attempt: Attempt,
        token: Token,
    ) -> Pin<Box<dyn Future<Output = Result<Done, String>> + Send>> {
        match self {
            Runner::Plain(p) => {
                let future = p.process(event, attempt);
                Box::pin(async move {
                    match future.await {
                        Ok(()) => Ok(Done::Succeeded),
                        Err(e) => Err(error_chain(&*e)),
                    }
                })
            }
            #[cfg(feature = "postgres")]
            Runner::InTransaction(p, pool) => {
                let future = super::super::transactional::run(
                    p.clone(),
                    pool.clone(),
                    event,
                    attempt,
                    token,
                );
                Box::pin(async move { future.await.map(Done::Recorded) })
            }
        }
    }
}

/// Rows whose processor has ended may wait for their outcome to be written, at most this
/// many per processor: the outcomes go out together (group commit) while the processors
/// go on with the next rows, and a database slower than the processors still bounds how
/// many rows this worker holds.
const RECORDING_PER_PROCESSOR: usize = 8;

/// At most this many claims are out at once: a processor freed while one is out need not
/// wait for it to come back, and more would spread the free processors over more
/// claims (a commit each) for no more rows.
const CLAIMS_IN_FLIGHT: usize = 2;

/// A claim's answer: its rows, how many it asked for, and the processors and slots held
/// for them.
struct Batch {
    rows: Vec<Claimed>,
    asked: usize,
    /// The worker's count of signals (wake-ups, polls, processors ending) when it was sent.
    sent_at: u64,
    token: Token,
    claimed_at: Instant,
    processors: OwnedSemaphorePermit,
    slots: OwnedSemaphorePermit,
}

impl Worker {
    pub(super) async fn run(self, mut stopped: watch::Receiver<bool>) {
        let this = Arc::new(self);
        // A row holds a processor from its claim until its processor ends, and a slot
        // until its outcome is written.
        let processors = Arc::new(Semaphore::new(this.concurrency));
        let slots = Arc::new(Semaphore::new(this.concurrency * RECORDING_PER_PROCESSOR));
        let freed = Arc::new(Notify::new());
        let mut claims: JoinSet<Batch> = JoinSet::new();
        let mut running: JoinSet<()> = JoinSet::new();
        // Set when the grace period is over: each running event stops and hands its row
        // back itself, so its hand-back can never race its own "processed".
        let (hurry, hurried) = watch::channel(false);
        // `signals` counts what says there may be due rows (a wake-up, a poll, a processor
        // ending); `drained_at`, the count when the last claim that came back short was
        // sent. No claim goes out while they are equal: a short claim says nothing of a
        // signal after it was sent (a row accepted meanwhile may be one it did not see).
        let (mut signals, mut drained_at) = (0u64, None);
        let wake = this.inbox.wake.clone();
        let mut woken = pin!(wake.notified());
        woken.as_mut().enable(); // an accept while a claim is out is not missed
        loop {
            if *stopped.borrow() {
                break;
            }
            while running.try_join_next().is_some() {}
            let free = processors
                .available_permits()
                .min(slots.available_permits());
            if drained_at != Some(signals) && free > 0 && claims.len() < CLAIMS_IN_FLIGHT {
                let n = u32::try_from(free).unwrap_or(u32::MAX);
                let held = (
                    processors.clone().try_acquire_many_owned(n),
                    slots.clone().try_acquire_many_owned(n),
                );
                if let (Ok(processors), Ok(slots)) = held {
                    claims.spawn(this.clone().claim(free, signals, processors, slots));
                    continue;
                }
            }
            let freed_meanwhile = freed.notified();
            tokio::select! {
                Some(batch) = claims.join_next(), if !claims.is_empty() => {
                    let Ok(mut batch) = batch else { continue }; // a panic: its rows come back with their lease
                    drained_at = (batch.rows.len() < batch.asked).then_some(batch.sent_at);
                    for Claimed { event, attempt } in std::mem::take(&mut batch.rows) {
                        let processor = batch.processors.split(1).expect("one held per row");
                        let slot = batch.slots.split(1).expect("one held per row");
                        let (worker, hurried) = (this.clone(), hurried.clone());
                        let freed = Freed(Some(processor), freed.clone());
                        let attempt = Attempt::new(attempt, &this.retry);
                        let span = span::attempt(&event, attempt);
                        let run = (event, attempt, batch.token, batch.claimed_at);
                        running.spawn(span::instrument(span, async move {
                            let _slot = slot;
                            worker.process(run, freed, hurried).await;
                        }));
                    }
                    // What the claim did not use is free again as `batch` drops.
                }
                () = &mut woken => {
                    signals += 1;
                    woken.set(wake.notified());
                    woken.as_mut().enable();
                }
                () = freed_meanwhile => signals += 1,
                () = tokio::time::sleep(this.poll) => signals += 1,
                _ = stopped.changed() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        // Claims still out: their rows go back uncounted, as a claim answered too late.
        while let Some(batch) = claims.join_next().await {
            if let Ok(batch) = batch {
                this.give_back(&batch.rows, batch.token).await;
            }
        }
        // Graceful: let running events finish; past a grace period, stop the rest, which
        // hand their rows back as a crash would (the attempt counted).
        let finish = async { while running.join_next().await.is_some() {} };
        match this.grace {
            None => finish.await,
            Some(grace) => {
                let _ = tokio::time::timeout(grace, finish).await;
            }
        }
        let _ = hurry.send(true);
        while running.join_next().await.is_some() {}
    }

    /// Claims up to `n` due rows, for which it holds `processors` and `slots`; sent when
    /// the worker had counted `sent_at` signals.
    async fn claim(
        self: Arc<Self>,
        n: usize,
        sent_at: u64,
        processors: OwnedSemaphorePermit,
        slots: OwnedSemaphorePermit,
    ) -> Batch {
        let (token, claimed_at) = (Token::new(), Instant::now());
        let claim =
            self.inbox
                .backend
                .claim(n, self.lease.length, token, self.retry.max_attempts());
        let rows = match metrics::timed(Operation::InboxClaim, claim).await {
            // Answered so late that the lease may run out before the first renewal: hand
            // the rows back uncounted (fenced on the token: rows another worker took over
            // meanwhile stay its own) rather than run beside a takeover. Not handed back,
            // they come back with their lease.
            Ok(rows) if claimed_at.elapsed() >= self.lease.length * 2 / 3 => {
                self.give_back(&rows, token).await;
                Vec::new()
            }
            Ok(rows) => rows,
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "inbox worker could not claim: {_error}");
                Vec::new()
            }
        };
        Batch {
            rows,
            asked: n,
            sent_at,
            token,
            claimed_at,
            processors,
            slots,
        }
    }

    /// Hands claimed rows back to the queue unrun, their attempt uncounted.
    async fn give_back(&self, rows: &[Claimed], token: Token) {
        if rows.is_empty() {
            return;
        }
        let keys = rows
            .iter()
            .map(|r| (r.event.source().to_owned(), r.event.stored_id().to_owned()))
            .collect();
        let _ = self.inbox.backend.give_back(keys, token).await;
    }

    async fn process(
        &self,
        (event, attempt, token, claimed_at): (Event, Attempt, Token, Instant),
        mut freed: Freed,
        mut hurried: watch::Receiver<bool>,
    ) {
        let (source, id) = (event.source().to_owned(), event.stored_id().to_owned());
        // Its own task: a panicking processor is a failed attempt, not a dead worker. The
        // guard stops it too when this task is stopped (a simulated crash). In this
        // attempt's span, so the processor's logs carry the event.
        let run = span::instrument(span::current(), self.runner.run(event, attempt, token));
        let mut task = AbortOnDrop(tokio::spawn(run));
        let heartbeat = Heartbeat::new(claimed_at, self.lease);
        let renew = || {
            let backend = &self.inbox.backend;
            let renewal = backend.renew(source.clone(), id.clone(), token, self.lease.length);
            metrics::timed(Operation::InboxRenew, renewal)
        };
        let beat = heartbeat.beat(renew);
        let mut beat = pin!(beat);
        let joined = tokio::select! {
            biased;
            joined = &mut task.0 => joined,
            () = hurry_up(&mut hurried) => {
                // Shut down past the grace period: stop it and wait until it has stopped.
                // Finished meanwhile: its outcome stands, as below.
                task.0.abort();
                (&mut task.0).await
            }
            () = &mut beat => unreachable!("the heartbeat never ends"),
        };
        // The processor is free for the next row while this one's outcome is written.
        freed.free();
        // The renewals go on until the outcome has landed: a slow "processed" must not cost
        // the lease that renewals would still have kept.
        let record = self.record(joined, &source, &id, token, attempt, &heartbeat);
        tokio::select! {
            biased;
            () = record => {}
            () = &mut beat => unreachable!("the heartbeat never ends"),
        }
    }

    /// Records how the run ended, while the heartbeat keeps the row's lease.
    async fn record(
        &self,
        joined: Result<Result<Done, String>, tokio::task::JoinError>,
        source: &str,
        id: &str,
        token: Token,
        attempt: Attempt,
        heartbeat: &Heartbeat,
    ) {
        let result = match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err("the processor panicked".to_owned()),
            Err(_) => {
                // Stopped by the hurry above: back to the queue, the attempt counted
                // (fenced: a transactional commit that landed first keeps it processed).
                let abandoned = self.finish_until(source, id, token, Outcome::Abandoned, heartbeat);
                let _ = abandoned.await;
                metrics::attempt(metrics::Attempt::Abandoned);
                return;
            }
        };
        let outcome = match result {
            Ok(Done::Recorded(held)) => {
                metrics::attempt(if held {
                    metrics::Attempt::Processed
                } else {
                    metrics::Attempt::Lost
                });
                return lease_report(held);
            }
            Ok(Done::Succeeded) => Outcome::Processed,
            Err(error) if attempt.is_last() => Outcome::Dead(error),
            Err(error) => Outcome::Retry(error, self.retry.delay(attempt.number())),
        };
        // Kept for the log only when there is a failure to tell.
        #[cfg(feature = "tracing")]
        let failure =
            matches!(outcome, Outcome::Retry(..) | Outcome::Dead(_)).then(|| outcome.clone());
        let counted = match outcome {
            Outcome::Processed => metrics::Attempt::Processed,
            Outcome::Retry(..) => metrics::Attempt::Retry,
            Outcome::Dead(_) => metrics::Attempt::Dead,
            Outcome::Abandoned => metrics::Attempt::Abandoned,
        };
        let finished = self
            .finish_until(source, id, token, outcome, heartbeat)
            .await;
        // Fenced out or not heard: the row's next attempt is another's to count.
        metrics::attempt(match finished {
            Ok(true) => counted,
            Ok(false) | Err(_) => metrics::Attempt::Lost,
        });
        match finished {
            Ok(held) => {
                // Said once recorded: a fenced-out attempt's outcome is not the row's.
                #[cfg(feature = "tracing")]
                if let (true, Some(outcome)) = (held, &failure) {
                    log_failure(source, id, attempt.number(), outcome);
                }
                lease_report(held)
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "inbox worker could not record an outcome: {_error}");
            }
        }
    }

    /// Records `outcome`, retrying a database that does not answer until the row's lease
    /// would end (renewed meanwhile): after that another worker may hold the row.
    async fn finish_until(
        &self,
        source: &str,
        id: &str,
        token: Token,
        outcome: Outcome,
        heartbeat: &Heartbeat,
    ) -> Result<bool, StoreError> {
        retry_until(heartbeat.lease_ends(), || {
            let outcome = outcome.clone();
            let finish =
                self.inbox
                    .backend
                    .finish(source.to_owned(), id.to_owned(), token, outcome);
            metrics::timed(Operation::InboxFinish, finish)
        })
        .await
    }
}

/// A row's hold on a processor, given back (and the claim loop told) when its processor
/// ends — or when its task is stopped.
struct Freed(Option<OwnedSemaphorePermit>, Arc<Notify>);

impl Freed {
    fn free(&mut self) {
        if self.0.take().is_some() {
            self.1.notify_one();
        }
    }
}

impl Drop for Freed {
    fn drop(&mut self) {
        self.free();
    }
}

/// A failed attempt at `warn`, a row gone dead at `error`; the processor's error as a field.
#[cfg(feature = "tracing")]
fn log_failure(source: &str, id: &str, attempt: u32, outcome: &Outcome) {
    match outcome {
        Outcome::Retry(error, after) => tracing::warn!(
            target: "tower_webhook",
            source, event_id = id, attempt, retry_in = ?after, error = %error,
            "inbox event failed, will retry"
        ),
        Outcome::Dead(error) => tracing::error!(
            target: "tower_webhook",
            source, event_id = id, attempt, error = %error,
            "inbox event failed for the last time, now dead (requeue it when fixed)"
        ),
        Outcome::Processed | Outcome::Abandoned => {}
    }
}

/// Reads the inbox's counts every `every`, which sets its gauges (feature `metrics`); a
/// failed read is tried again at the next tick.
pub(super) async fn gauges(inbox: Inbox, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let _ = inbox.counts().await;
    }
}

/// Warns when the worker no longer held the row it finished.
fn lease_report(_held: bool) {
    #[cfg(feature = "tracing")]
    if !_held {
        tracing::warn!(target: "tower_webhook", "an inbox row's lease ran out while it was processed: lengthen the lease");
    }
}

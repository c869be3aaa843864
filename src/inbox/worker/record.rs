//! Recording how an attempt ended: the outcome written (fenced by the lease), counted in
//! the metrics, logged and alerted once it has landed.

use super::super::process::{Failure, PANICKED};
use super::super::Attempt;
use super::runner::Done;
use super::{Engine, Outcome, Queue};
use crate::metrics::{self, Operation};
use crate::store::{Heartbeat, StoreError};

impl<Q: Queue> Engine<Q> {
    /// Records how the run ended, while the heartbeat keeps the event's lease; an outcome
    /// that ends the event wakes the worker when it `frees_turn` (its object's next event).
    pub(super) async fn record(
        &self,
        joined: Result<Result<Done, Failure>, tokio::task::JoinError>,
        held: &Q::Held,
        (_source, _id, _ty): (&str, &str, &Option<String>),
        (attempt, frees_turn): (Attempt, bool),
        heartbeat: &Heartbeat,
    ) {
        let result = match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err(Failure::from(PANICKED)),
            Err(_) => {
                // Stopped by the hurry above: back to the queue, the attempt counted
                // (fenced: a transactional commit that landed first keeps it processed).
                let _ = self.finish(held, Outcome::Abandoned, heartbeat).await;
                metrics::attempt(self.queue.metrics(), metrics::Attempt::Abandoned);
                return;
            }
        };
        let outcome = match result {
            Ok(Done::Recorded(held)) => {
                if held && frees_turn {
                    self.queue.wake().notify_waiters();
                }
                #[cfg(feature = "alerts")]
                if let (true, Some(alerts)) = (held, &self.alerts) {
                    alerts.succeeded(_source);
                }
                let metrics = self.queue.metrics();
                metrics::attempt(
                    metrics,
                    if held {
                        metrics::Attempt::Processed
                    } else {
                        metrics::Attempt::Lost
                    },
                );
                return lease_report(held);
            }
            Ok(Done::Succeeded) => Outcome::Processed,
            Err(Failure::Later(after)) => Outcome::Later(after),
            Err(Failure::Error(error)) if attempt.is_last() => Outcome::Dead(error),
            Err(Failure::Error(error)) => Outcome::Retry(error, self.retry.delay(attempt.number())),
        };
        // Kept for the log only when there is a failure to tell.
        #[cfg(feature = "tracing")]
        let failure = matches!(
            outcome,
            Outcome::Retry(..) | Outcome::Dead(_) | Outcome::Later(_)
        )
        .then(|| outcome.clone());
        #[cfg(feature = "alerts")]
        let alerted = outcome.clone();
        let counted = match outcome {
            Outcome::Processed => metrics::Attempt::Processed,
            Outcome::Retry(..) => metrics::Attempt::Retry,
            Outcome::Dead(_) => metrics::Attempt::Dead,
            Outcome::Later(_) => metrics::Attempt::Snoozed,
            Outcome::Abandoned => metrics::Attempt::Abandoned,
        };
        let ends = matches!(outcome, Outcome::Processed | Outcome::Dead(_));
        let finished = self.finish(held, outcome, heartbeat).await;
        if frees_turn && ends && matches!(finished, Ok(true)) {
            // The claim sent as its processor ended found the object's turn still taken.
            self.queue.wake().notify_waiters();
        }
        // Fenced out or not heard: the event's next attempt is another's to count.
        metrics::attempt(
            self.queue.metrics(),
            match finished {
                Ok(true) => counted,
                Ok(false) | Err(_) => metrics::Attempt::Lost,
            },
        );
        match finished {
            Ok(held) => {
                // Said once recorded: a fenced-out attempt's outcome is not the event's.
                #[cfg(feature = "tracing")]
                if let (true, Some(outcome)) = (held, &failure) {
                    log_failure(_source, _id, attempt.number(), outcome);
                }
                #[cfg(feature = "alerts")]
                if let (true, Some(alerts)) = (held, &self.alerts) {
                    let ty = _ty.as_deref();
                    match &alerted {
                        Outcome::Processed => alerts.succeeded(_source),
                        Outcome::Retry(error, _) => {
                            alerts.failed(_source, _id, ty, attempt.number(), error);
                        }
                        Outcome::Dead(error) => alerts.dead(_source, _id, ty, error),
                        Outcome::Later(_) | Outcome::Abandoned => {}
                    }
                }
                lease_report(held)
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "inbox worker could not record an outcome: {_error}");
            }
        }
    }

    /// Records `outcome`, trying again while the queue does not answer until the event's
    /// lease would end (renewed meanwhile): after that another worker may hold it.
    pub(super) async fn finish(
        &self,
        held: &Q::Held,
        outcome: Outcome,
        heartbeat: &Heartbeat,
    ) -> Result<bool, StoreError> {
        let finish = self.queue.finish(held, outcome, heartbeat.lease_ends());
        metrics::timed(Operation::InboxFinish, finish).await
    }
}

/// A failed attempt at `warn`, an event gone dead at `error`; the processor's error as a
/// field.
#[cfg(feature = "tracing")]
pub(super) fn log_failure(source: &str, id: &str, attempt: u32, outcome: &Outcome) {
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
        Outcome::Later(after) => tracing::info!(
            target: "tower_webhook",
            source, event_id = id, attempt, retry_in = ?after,
            "inbox event snoozed by its processor, the attempt not counted"
        ),
        Outcome::Processed | Outcome::Abandoned => {}
    }
}

/// Warns when the worker no longer held the event it finished.
fn lease_report(_held: bool) {
    #[cfg(feature = "tracing")]
    if !_held {
        tracing::warn!(target: "tower_webhook", "an inbox event's lease ran out while it was processed: lengthen the lease");
    }
}

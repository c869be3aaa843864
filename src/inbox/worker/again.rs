//! A failed or snoozed event whose object's turn this worker holds — where the queue
//! cannot hold an object's later events back itself (JetStream: a nak hands the turn to
//! the object's next event) — waits out its backoff here, its turn kept, its lease
//! renewed, no processor held, and then runs again here.

use std::time::Duration;

use tokio::time::Instant;

use super::super::process::{Failure, PANICKED};
use super::super::Attempt;
#[cfg(feature = "tracing")]
use super::record::log_failure;
use super::runner::Done;
use super::{Engine, Outcome, Queue};
use crate::metrics;
use crate::Event;

/// How a processor's task ended.
pub(super) type Joined = Result<Result<Done, Failure>, tokio::task::JoinError>;

impl<Q: Queue> Engine<Q> {
    /// The outcome of an attempt that waits here to run again (a retry or a snooze);
    /// `None` when it is recorded as usual: its object is not capped in this worker, it
    /// was the last attempt, or the wait would outlast the renewals (`max_run` from
    /// `at`), after which the queue would hand it to another attempt.
    pub(super) fn waits_here(
        &self,
        event: &Event,
        joined: &Joined,
        attempt: Attempt,
        at: Instant,
    ) -> Option<Outcome> {
        if !self.caps.holds_object(event) {
            return None;
        }
        let outcome = match joined {
            Ok(Err(Failure::Later(after))) => Outcome::Later(*after),
            Ok(Err(Failure::Error(error))) if !attempt.is_last() => {
                Outcome::Retry(error.clone(), self.retry.delay(attempt.number()))
            }
            Err(e) if e.is_panic() && !attempt.is_last() => {
                Outcome::Retry(PANICKED.to_owned(), self.retry.delay(attempt.number()))
            }
            _ => return None,
        };
        let (Outcome::Retry(_, after) | Outcome::Later(after)) = &outcome else {
            return None;
        };
        let renewed_until = at + self.lease.max_run;
        (Instant::now() + *after + self.lease.length < renewed_until).then_some(outcome)
    }

    /// Counts, logs and alerts `outcome` as recorded, and says how long it waits and
    /// whether the attempt counted.
    pub(super) fn told(
        &self,
        outcome: &Outcome,
        (_source, _id, _ty): (&str, &str, &Option<String>),
        attempt: Attempt,
    ) -> (Duration, bool) {
        #[cfg(feature = "tracing")]
        log_failure(_source, _id, attempt.number(), outcome);
        let _ = attempt;
        match outcome {
            Outcome::Retry(_error, after) => {
                metrics::attempt(self.queue.metrics(), metrics::Attempt::Retry);
                #[cfg(feature = "alerts")]
                if let Some(alerts) = &self.alerts {
                    let ty = _ty.as_deref();
                    alerts.failed(_source, _id, ty, attempt.number(), _error);
                }
                (*after, true)
            }
            Outcome::Later(after) => {
                metrics::attempt(self.queue.metrics(), metrics::Attempt::Snoozed);
                (*after, false)
            }
            _ => unreachable!("only retries and snoozes wait here"),
        }
    }
}

//! Keeping what a worker holds: each message on the consumer's `ack_wait` (short, so a
//! message lost in transit comes back soon), each event's claim in the store on its own
//! lease (long, so a store is not written every second) — neither waiting for the other;
//! the consumer's `ack_wait` set when the worker opens it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, FromConsumer, PullConsumer};
use async_nats::jetstream::{stream, AckKind};
use futures_util::FutureExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Pulled, Stream};
use crate::inbox::worker::Outcome;
use crate::store::{ClaimGuard, Renewed, StoreError};
use crate::ConfigError;

/// The consumer's `ack_wait` unless set: a message the server sent as a connection dropped
/// is lost in transit and redelivered only after it, so it bounds how soon the workers
/// process again after NATS returns (issue 31: within 5 s). Each held message is renewed
/// every third of it.
pub(in crate::inbox::jetstream) const ACK_WAIT: Duration = Duration::from_secs(3);

/// `ack_wait`, if it is between 100 ms and 1 day.
pub(super) fn checked(ack_wait: Duration) -> Result<Duration, ConfigError> {
    let range = Duration::from_millis(100)..=Duration::from_secs(24 * 3600);
    match range.contains(&ack_wait) {
        true => Ok(ack_wait),
        false => Err(ConfigError::duration(
            "an ack_wait",
            ack_wait,
            "between 100 ms and 1 day",
        )),
    }
}

/// An event's claim as its renewals left it.
#[derive(Default)]
pub(super) struct ClaimLease {
    /// When its lease ends, as far as this attempt knows (`None`: never claimed).
    ends: Option<Instant>,
    /// A renewal on its own task (a slow store must not hold the message's renewals
    /// back): when it was sent, and its answer.
    renewing: Option<(Instant, JoinHandle<Result<Renewed, StoreError>>)>,
}

impl Stream {
    /// Sets the `ack_wait` of a consumer made with another one (before, the claim's lease:
    /// 60 s) to `ack_wait`, its other settings kept; a consumer the server would not change
    /// keeps its own, and the worker renews on that.
    pub(super) async fn set_ack_wait(
        stream: &stream::Stream,
        consumer: PullConsumer,
        ack_wait: Duration,
    ) -> PullConsumer {
        let config = &consumer.cached_info().config;
        if config.ack_wait == ack_wait {
            return consumer;
        }
        let mut changed = config.clone();
        changed.ack_wait = ack_wait;
        let updated = match pull::Config::try_from_consumer_config(changed) {
            Ok(config) => stream.create_consumer(config).await.map_err(Into::into),
            Err(error) => Err(error),
        };
        match updated {
            Ok(updated) => updated,
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "jetstream worker could not set its consumer's ack_wait, and renews on the consumer's own: {_error}");
                consumer
            }
        }
    }

    /// Renews the message (`+WPI`, confirmed by the server) at every beat; `Ok(true)` once
    /// the server heard it. The event's claim is renewed beside it, on a task of its own,
    /// once a third of its lease will have passed by the next beat; its answer is read at
    /// a later beat. A claim another attempt took over is no longer renewed (and
    /// recording then finds none); the message still is, until its outcome lands.
    pub(super) async fn keep(&self, pulled: &Pulled) -> Result<bool, StoreError> {
        if self.renew_claim(pulled) == Some(Renewed::Fenced) {
            if let Some(lost) = pulled.take() {
                let _ = lost.into_parts(); // nothing to release: it is another's
            }
        }
        if pulled.delayed.load(Ordering::Relaxed) {
            return Ok(true);
        }
        // A request on the reply subject: the server answers once it has the renewal.
        let renewed = pulled.message.double_ack_with(AckKind::Progress).await;
        renewed.map_err(|e| StoreError::new("jetstream renew", e))?;
        Ok(true)
    }

    /// Reads the last claim renewal's answer if it came, and sends the next if it is due.
    fn renew_claim(&self, pulled: &Pulled) -> Option<Renewed> {
        let now = Instant::now();
        let mut claimed = pulled.claimed.lock().expect("not poisoned");
        let mut answer = None;
        if let Some((sent, task)) = &mut claimed.renewing {
            let sent = *sent;
            if let Some(answered) = task.now_or_never() {
                claimed.renewing = None;
                match answered {
                    Ok(Ok(renewed)) => answer = Some(renewed),
                    Ok(Err(_error)) => {
                        #[cfg(feature = "tracing")]
                        tracing::warn!(target: "tower_webhook", "could not renew a claim's lease: {_error}");
                    }
                    Err(_) => {} // not answered: due again
                }
                if answer == Some(Renewed::Held) {
                    claimed.ends = Some(sent + self.lease);
                }
            }
        }
        let beat = self.lease.min(self.ack_wait) / 3;
        let due = claimed.renewing.is_none()
            && answer != Some(Renewed::Fenced)
            && claimed
                .ends
                .is_some_and(|ends| now + beat + self.lease * 2 / 3 >= ends);
        if due {
            let guard = pulled.claim.lock().expect("not poisoned");
            if let Some(guard) = guard.as_ref() {
                let renewal = tokio::spawn(guard.renew(self.lease));
                claimed.renewing = Some((now, renewal));
            }
        }
        answer
    }
}

impl Pulled {
    /// Holds the event's claim, renewed from here on its lease.
    pub(super) fn hold_claim(&self, guard: ClaimGuard, lease: Duration) {
        let ends = Instant::from_std(guard.sent()) + lease;
        self.claimed.lock().expect("not poisoned").ends = Some(ends);
        *self.claim.lock().expect("not poisoned") = Some(guard);
    }

    /// When the claim's lease ends, as far as this attempt knows (`None`: it never held
    /// one).
    pub(super) fn claim_ends(&self) -> Option<Instant> {
        self.claimed.lock().expect("not poisoned").ends
    }

    /// Stops renewing the message before it is handed back with a delay (a retry's
    /// backoff, a snooze): a renewal the server heard after it would undo the delay.
    pub(super) fn delays(&self, outcome: &Outcome) {
        let delayed = match outcome {
            Outcome::Retry(..) => true,
            Outcome::Later(after) => !after.is_zero(),
            _ => false,
        };
        self.delayed.store(delayed, Ordering::Relaxed);
    }
}

//! [`Backpressure`]: the accept service refuses new deliveries (503 + `Retry-After`) while
//! the queue's oldest due event has waited longer than a bound — for the sources whose
//! providers retry — so a backlog the workers cannot work off stops growing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::accept::Destination;

/// When [`Accept`](super::Accept) pushes back: while the oldest due event (queued and not
/// yet started, [`Counts::oldest_due`](super::Counts::oldest_due)) has waited longer than
/// `max_lag`, a delivery of a source that retries is answered 503 with `Retry-After` and
/// not stored — the provider delivers it again later, when the workers have caught up.
///
/// Providers that never retry a failed delivery must not be refused: their event would
/// be lost. Their sources are *spared* (always accepted, the backlog grows for them):
/// by default `github` (GitHub does not redeliver on its own). Spare others with
/// [`spare`](Self::spare) — any provider of yours that gives up after one failure.
/// Stripe, Svix and Standard Webhooks senders, Shopify, Slack, Twilio and most others
/// retry for hours or days.
///
/// The lag is read from the queue's counts at most every 500 ms, in the background: an
/// accept never waits for it, and the first accepts after a start, before the first read,
/// are let through.
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::inbox::Backpressure;
///
/// let backpressure = Backpressure::max_lag(Duration::from_secs(300)).spare("legacy-crm");
/// # let _ = backpressure;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Backpressure {
    max_lag: Duration,
    spared: HashSet<String>,
}

impl Backpressure {
    /// Refuses deliveries of retrying sources while the oldest due event is older than
    /// `max_lag`; spares `github`.
    pub fn max_lag(max_lag: Duration) -> Self {
        Self {
            max_lag,
            spared: HashSet::from(["github".to_owned()]),
        }
    }

    /// Always accepts deliveries of `source` (its provider never retries).
    pub fn spare(mut self, source: &str) -> Self {
        self.spared.insert(source.to_owned());
        self
    }

    /// Refuses `source` too when the queue lags (its provider retries after all).
    pub fn refuse(mut self, source: &str) -> Self {
        self.spared.remove(source);
        self
    }

    /// The `Retry-After` of a refusal: the bound itself, from 1 s to 5 min — by then the
    /// workers have had as long as the bound allows a wait to be.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        self.max_lag.as_secs().clamp(1, 300)
    }
}

/// How often the lag is read, at most.
const READ_EVERY: Duration = Duration::from_millis(500);

/// The backpressure of one accept service, with the last lag read.
pub(crate) struct Gate {
    rule: Backpressure,
    /// When the lag was last read, and whether it was beyond the bound.
    last: Mutex<Option<(Instant, bool)>>,
    reading: AtomicBool,
}

impl Gate {
    pub(crate) fn new(rule: Backpressure) -> Self {
        Self {
            rule,
            last: Mutex::new(None),
            reading: AtomicBool::new(false),
        }
    }

    pub(crate) fn rule(&self) -> &Backpressure {
        &self.rule
    }

    /// Whether a delivery of `source` is refused now; reads the lag again, in the
    /// background, when the last read is older than [`READ_EVERY`].
    pub(crate) fn refuses(self: &Arc<Self>, source: &str, queue: &Arc<dyn Destination>) -> bool {
        let last = *self.last.lock().expect("not poisoned");
        let stale = last.is_none_or(|(at, _)| at.elapsed() >= READ_EVERY);
        if stale && !self.reading.swap(true, Ordering::AcqRel) {
            let (gate, queue) = (self.clone(), queue.clone());
            tokio::spawn(async move {
                // A failed read keeps the last answer: an unreachable queue refuses on its
                // own (the accept's 503).
                if let Ok(counts) = queue.counts().await {
                    let beyond = counts.oldest_due.is_some_and(|lag| lag > gate.rule.max_lag);
                    *gate.last.lock().expect("not poisoned") = Some((Instant::now(), beyond));
                }
                gate.reading.store(false, Ordering::Release);
            });
        }
        last.is_some_and(|(_, beyond)| beyond) && !self.rule.spared.contains(source)
    }
}

//! [`Backpressure`]: the accept service refuses new deliveries (503 + `Retry-After`) while
//! the queue's oldest due event has waited longer than a bound, or its depth is above one
//! — for the sources whose providers retry — so a backlog the workers cannot work off
//! stops growing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::accept::Destination;
use super::Counts;
use crate::{Event, Scheme};

/// When [`Accept`](super::Accept) pushes back: while the oldest due event (queued and not
/// yet started, [`Counts::oldest_due`](super::Counts::oldest_due)) has waited longer than
/// `max_lag`, or more than `max_depth` events are queued
/// ([`Counts::queued`](super::Counts::queued)), a delivery of a source that retries is
/// answered 503 with `Retry-After` and not stored — the provider delivers it again later,
/// when the workers have caught up.
///
/// Providers that never retry a failed delivery must not be refused: their event would
/// be lost. Their deliveries are *spared* (always accepted, the backlog grows for them):
/// by default GitHub's (GitHub does not redeliver on its own). A delivery is spared when
/// its provider — the name of the scheme that verified it, `github` — is spared, whatever
/// its source: a tenant's (`github/acme`) or one given with
/// [`Verifier::with_source`](crate::Verifier::with_source). Spare others with
/// [`spare`](Self::spare) — any provider of yours that gives up after one failure, or
/// one source. Stripe, Svix and Standard Webhooks senders, Shopify, Slack, Twilio and
/// most others retry for hours or days.
///
/// The lag is read from the queue's counts in the background, at most every 250 ms while
/// deliveries arrive: an accept never waits for it. Only a reading younger than 500 ms
/// refuses: the first accepts after a start, before the first read, and the first after a
/// quiet spell (the queue may have drained since) are let through, and read it again.
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::inbox::Backpressure;
///
/// let backpressure = Backpressure::max_lag(Duration::from_secs(300))
///     .with_max_depth(100_000)
///     .spare("legacy-crm");
/// # let _ = backpressure;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Backpressure {
    max_lag: Option<Duration>,
    max_depth: Option<u64>,
    spared: HashSet<String>,
}

impl Backpressure {
    /// Refuses deliveries of retrying sources while the oldest due event is older than
    /// `max_lag`; spares `github`.
    pub fn max_lag(max_lag: Duration) -> Self {
        Self {
            max_lag: Some(max_lag),
            max_depth: None,
            spared: HashSet::from(["github".to_owned()]),
        }
    }

    /// Refuses deliveries of retrying sources while more than `max_depth` events are
    /// queued; spares `github`.
    pub fn max_depth(max_depth: u64) -> Self {
        Self {
            max_lag: None,
            max_depth: Some(max_depth),
            spared: HashSet::from(["github".to_owned()]),
        }
    }

    /// Refuses also while more than `max_depth` events are queued.
    pub fn with_max_depth(mut self, max_depth: u64) -> Self {
        self.max_depth = Some(max_depth);
        self
    }

    /// Refuses also while the oldest due event is older than `max_lag`.
    pub fn with_max_lag(mut self, max_lag: Duration) -> Self {
        self.max_lag = Some(max_lag);
        self
    }

    /// Always accepts deliveries of `name`: a provider (a scheme's name: all its sources
    /// and tenants), a source, or a tenant's prototype source (`name/<tenant>`).
    pub fn spare(mut self, name: &str) -> Self {
        self.spared.insert(name.to_owned());
        self
    }

    /// Refuses `name` too when the queue lags (its provider retries after all): undoes
    /// [`spare`](Self::spare), `github`'s too.
    pub fn refuse(mut self, name: &str) -> Self {
        self.spared.remove(name);
        self
    }

    /// Whether `event` is spared: by its provider, its source, or its tenant's prototype.
    fn spares(&self, event: &Event) -> bool {
        let source = event.source();
        let provider = event.scheme().map(Scheme::name);
        let prototype = source.rsplit_once('/').map(|(prototype, _)| prototype);
        [provider, Some(source), prototype]
            .into_iter()
            .flatten()
            .any(|name| self.spared.contains(name))
    }

    /// The `Retry-After` of a refusal: the lag bound itself, from 1 s to 5 min — by then
    /// the workers have had as long as the bound allows a wait to be; a minute with a
    /// depth bound alone.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        self.max_lag.map_or(60, |lag| lag.as_secs().clamp(1, 300))
    }

    /// Whether `counts` are beyond a bound.
    fn beyond(&self, counts: &Counts) -> bool {
        let lagging =
            matches!((self.max_lag, counts.oldest_due), (Some(max), Some(lag)) if lag > max);
        lagging || self.max_depth.is_some_and(|max| counts.queued > max)
    }
}

/// How often the lag is read, at most.
pub(crate) const READ_EVERY: Duration = Duration::from_millis(500);

/// How old a reading may be and still refuse a delivery. The background read starts at
/// half of it, so while deliveries keep coming the reading is renewed before it is stale.
const FRESH_FOR: Duration = READ_EVERY;

/// The queue's lag (how long its oldest due event has waited), read in the background at
/// most every [`READ_EVERY`]: the gate's, and the alerts' lag watcher's.
pub(crate) struct LagReader {
    /// When the counts were last read, and what they were.
    last: Mutex<Option<(Instant, Counts)>>,
    reading: AtomicBool,
}

impl LagReader {
    pub(crate) fn new() -> Self {
        Self {
            last: Mutex::new(None),
            reading: AtomicBool::new(false),
        }
    }

    /// The counts last read (`None` before the first read); reads them again, in the
    /// background, when that read is older than [`READ_EVERY`].
    #[cfg_attr(not(feature = "alerts"), allow(dead_code))]
    pub(crate) fn latest_counts(self: &Arc<Self>, queue: &Arc<dyn Destination>) -> Option<Counts> {
        self.reading(queue, READ_EVERY).map(|(_, counts)| counts)
    }

    /// The counts last read if younger than [`FRESH_FOR`] (`None` otherwise); reads them
    /// again, in the background, when that read is older than half of it.
    fn fresh_counts(self: &Arc<Self>, queue: &Arc<dyn Destination>) -> Option<Counts> {
        self.reading(queue, FRESH_FOR / 2)
            .filter(|(at, _)| at.elapsed() < FRESH_FOR)
            .map(|(_, counts)| counts)
    }

    /// The last reading and when it was taken; a read in the background when it is
    /// older than `renew_after` (one at a time).
    fn reading(
        self: &Arc<Self>,
        queue: &Arc<dyn Destination>,
        renew_after: Duration,
    ) -> Option<(Instant, Counts)> {
        let last = *self.last.lock().expect("not poisoned");
        let stale = last.is_none_or(|(at, _)| at.elapsed() >= renew_after);
        if stale && !self.reading.swap(true, Ordering::AcqRel) {
            let (reader, queue) = (self.clone(), queue.clone());
            tokio::spawn(async move {
                // A failed read keeps the last answer: an unreachable queue refuses on its
                // own (the accept's 503).
                if let Ok(counts) = queue.counts().await {
                    *reader.last.lock().expect("not poisoned") = Some((Instant::now(), counts));
                }
                reader.reading.store(false, Ordering::Release);
            });
        }
        last
    }
}

/// The backpressure of one accept service, with the last lag read.
pub(crate) struct Gate {
    rule: Backpressure,
    lag: Arc<LagReader>,
}

impl Gate {
    pub(crate) fn new(rule: Backpressure) -> Self {
        Self {
            rule,
            lag: Arc::new(LagReader::new()),
        }
    }

    pub(crate) fn rule(&self) -> &Backpressure {
        &self.rule
    }

    /// Whether `event`'s delivery is refused now: only on a fresh reading (a stale one
    /// may predate a drain); reads the lag again, in the background, as it ages.
    pub(crate) fn refuses(&self, event: &Event, queue: &Arc<dyn Destination>) -> bool {
        let counts = self.lag.fresh_counts(queue);
        let beyond = counts.is_some_and(|counts| self.rule.beyond(&counts));
        beyond && !self.rule.spares(event)
    }
}

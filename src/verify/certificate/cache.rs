//! The certificates by URL: each fetched once, kept for its TTL, the misses bounded in
//! number and in the fetches they start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::Certificates;
use crate::error::{VerifyError, VerifyErrorKind};
use crate::Verifier;

/// The certificates by canonical URL, and the fetches started in the current window.
#[derive(Default)]
pub(super) struct Cache {
    pub(super) slots: HashMap<String, Slot>,
    /// When the current window began, and how many fetches started in it.
    window: Option<(Instant, u32)>,
}

/// One URL's verifier, fetched once for all the deliveries waiting on it — and a failure
/// shared the same way, and remembered briefly, so a slow or failing provider host costs
/// one fetch per URL at a time, not one per delivery.
#[derive(Clone)]
pub(super) struct Slot {
    pub(super) cell: Arc<OnceCell<Result<Verifier, VerifyError>>>,
    since: Instant,
    /// It verified a delivery: only other such slots may evict it before its TTL.
    trusted: bool,
}

impl Slot {
    fn fresh(&self, now: Instant, ttl: Duration) -> bool {
        let ttl = match self.cell.get() {
            Some(Err(_)) => FAILED_TTL,
            _ => ttl,
        };
        now.duration_since(self.since) < ttl
    }
}

/// At most this many certificate URLs are cached (providers use a handful).
const MAX_CACHED: usize = 256;

/// How long a failed fetch answers 503 for its URL before it is tried again.
const FAILED_TTL: Duration = Duration::from_secs(5);

const TOO_MANY_FETCHES: VerifyError = VerifyError::new(
    VerifyErrorKind::SecretsUnavailable,
    "too many certificate fetches: try again later",
);

impl Certificates {
    /// Marks the certificate at `url` as one that verified a delivery: misses no longer
    /// evict it before its TTL.
    pub(crate) fn trust(&self, url: &str) {
        if let Some(slot) = self.cache().slots.get_mut(url) {
            if matches!(slot.cell.get(), Some(Ok(_))) {
                slot.trusted = true;
            }
        }
    }

    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `url`: cached and fresh, or new — when a fetch may still start in
    /// this window (503 otherwise, without a fetch).
    pub(super) fn slot(&self, url: &str) -> Result<Slot, VerifyError> {
        let now = Instant::now();
        let ttl = self.inner.ttl;
        let mut cache = self.cache();
        let renewal = match cache.slots.get(url) {
            Some(slot) if slot.fresh(now, ttl) => return Ok(slot.clone()),
            // A certificate in use, expired: its one refetch a TTL is not a miss.
            Some(slot) => slot.trusted,
            None => false,
        };
        if !renewal {
            let (limit, per) = self.inner.fetch_limit;
            let window = match cache.window {
                Some((start, started)) if now.duration_since(start) < per => (start, started),
                _ => (now, 0),
            };
            if window.1 >= limit {
                return Err(TOO_MANY_FETCHES);
            }
            cache.window = Some((window.0, window.1 + 1));
        }
        if cache.slots.len() >= MAX_CACHED {
            cache.slots.retain(|_, s| s.fresh(now, ttl));
            // Still full: the oldest that verified nothing goes (the oldest of all only
            // if every one did), never the whole cache.
            while cache.slots.len() >= MAX_CACHED {
                let oldest = cache
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| (s.trusted, s.since))
                    .map(|(url, _)| url.clone())
                    .expect("not empty");
                cache.slots.remove(&oldest);
            }
        }
        let slot = Slot {
            cell: Arc::new(OnceCell::new()),
            since: now,
            trusted: false,
        };
        cache.slots.insert(url.to_owned(), slot.clone());
        Ok(slot)
    }
}

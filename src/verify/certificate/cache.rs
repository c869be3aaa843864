//! The certificates by URL: those that verified a delivery kept apart from the rest, each
//! other URL fetched once and kept for its TTL, the misses bounded in number and in the
//! fetches they start.

use std::collections::{HashMap, HashSet};
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
    /// The certificates that verified a delivery: apart from the misses, so no number of
    /// fresh URLs evicts one. Past its TTL, its URL is fetched again outside the fetch
    /// limit (a renewal, not a miss), and its entry stays until that fetch verifies
    /// a delivery again.
    pub(super) trusted: HashMap<String, Trusted>,
    /// URLs the application trusts before any delivery (`with_trusted_urls`): their
    /// fetch is not a miss.
    pub(super) known: HashSet<String>,
    /// URLs read from the trust store, as at its last read (at most 64): fetched outside
    /// the limit, as the known.
    pub(super) stored: HashSet<String>,
    /// Every other URL asked for: being fetched, fetched, or failed.
    pub(super) slots: HashMap<String, Slot>,
    /// When the current window began, and how many fetches started in it.
    window: Option<(Instant, u32)>,
}

/// A certificate that verified a delivery, and when it was fetched.
pub(super) struct Trusted {
    verifier: Verifier,
    since: Instant,
}

/// What a URL has: a trusted certificate's verifier, at once, or the slot its fetch fills.
pub(super) enum Found {
    Trusted(Verifier),
    Slot(Slot),
}

/// One URL's verifier, fetched once for all the deliveries waiting on it — and a failure
/// shared the same way, and remembered briefly, so a slow or failing provider host costs
/// one fetch per URL at a time, not one per delivery.
#[derive(Clone)]
pub(super) struct Slot {
    pub(super) cell: Arc<OnceCell<Result<Verifier, VerifyError>>>,
    since: Instant,
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

/// At most this many certificate URLs are cached besides the trusted (providers use a
/// handful; the rest are misses).
const MAX_CACHED: usize = 256;

/// At most this many trusted certificates are kept (only a genuine delivery makes one:
/// a bound against nothing but a provider's own churn), the oldest fetched going first.
pub(super) const MAX_TRUSTED: usize = 64;

/// How long a failed fetch answers 503 for its URL before it is tried again.
const FAILED_TTL: Duration = Duration::from_secs(5);

const TOO_MANY_FETCHES: VerifyError = VerifyError::new(
    VerifyErrorKind::SecretsUnavailable,
    "too many certificate fetches: try again later",
);

impl Certificates {
    /// Keeps the certificate at `url`, which just verified a delivery, apart from the
    /// misses (a no-op for one kept already), and records a URL new to the trusted in the
    /// trust store, if there is one.
    pub(crate) fn trust(&self, url: &str) {
        if self.keep(url) {
            #[cfg(feature = "dedupe")]
            self.record(url);
        }
    }

    /// Whether `url` is newly trusted.
    fn keep(&self, url: &str) -> bool {
        let mut cache = self.cache();
        let Some(slot) = cache.slots.get(url) else {
            return false;
        };
        let Some(Ok(verifier)) = slot.cell.get() else {
            return false;
        };
        let trusted = Trusted {
            verifier: verifier.clone(),
            since: slot.since,
        };
        cache.slots.remove(url);
        if !cache.trusted.contains_key(url) && cache.trusted.len() >= MAX_TRUSTED {
            let oldest = cache
                .trusted
                .iter()
                .min_by_key(|(_, t)| t.since)
                .map(|(url, _)| url.clone())
                .expect("not empty");
            cache.trusted.remove(&oldest);
        }
        cache.trusted.insert(url.to_owned(), trusted).is_none()
    }

    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `url` has: a trusted certificate within its TTL, a cached and fresh slot, or
    /// a new slot — when a fetch may still start in this window, or the URL's is a
    /// renewal (503 otherwise, without a fetch).
    pub(super) fn find(&self, url: &str) -> Result<Found, VerifyError> {
        let now = Instant::now();
        let ttl = self.inner.ttl;
        let mut cache = self.cache();
        let renewal = match cache.trusted.get(url) {
            Some(t) if now.duration_since(t.since) < ttl => {
                return Ok(Found::Trusted(t.verifier.clone()))
            }
            // A certificate in use, expired: its refetch is not a miss.
            Some(_) => true,
            None => cache.known.contains(url) || cache.stored.contains(url),
        };
        match cache.slots.get(url) {
            Some(slot) if slot.fresh(now, ttl) => return Ok(Found::Slot(slot.clone())),
            _ => {}
        }
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
            // Still full: the oldest goes, never the whole cache (the trusted are apart).
            while cache.slots.len() >= MAX_CACHED {
                let oldest = cache
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| s.since)
                    .map(|(url, _)| url.clone())
                    .expect("not empty");
                cache.slots.remove(&oldest);
            }
        }
        let slot = Slot {
            cell: Arc::new(OnceCell::new()),
            since: now,
        };
        cache.slots.insert(url.to_owned(), slot.clone());
        Ok(Found::Slot(slot))
    }
}

//! [`MemoryStore`]: claims in a mutex-guarded map, for tests and single-process servers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{
    Claim, Completed, DedupeStore, Delivery, Renewed, Retention, StoreError, StoreFuture, Token,
};

/// Claims in memory: atomic within one process, gone at restart.
///
/// Done event keys are remembered for the retention (default 7 days); done
/// [`Once`](crate::once::Once) keys and [kept keys](Delivery::is_kept) until
/// [`prune_once`](DedupeStore::prune_once) (call it, or a receiver of a scheme that signs
/// no time fills the map and answers 503). Bounded: at `capacity` keys it first drops done event keys past their retention and
/// expired claims; if it is still full, claims fail (503) rather than forget a done key
/// early, which would let a duplicate run twice. Cloning shares the map.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Mutex<Map>>,
}

#[derive(Debug)]
struct Map {
    entries: HashMap<(String, String), Entry>,
    capacity: usize,
    retention: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Claimed {
        token: Token,
        until: Instant,
    },
    /// `once`: a business key or a kept event key, kept until pruned by name.
    Done {
        token: Token,
        at: Instant,
        once: bool,
    },
}

impl Map {
    /// Whether `entry` no longer counts: a lease that ran out, or a done event key past
    /// retention.
    fn expired(&self, entry: &Entry, now: Instant) -> bool {
        match *entry {
            Entry::Claimed { until, .. } => until <= now,
            Entry::Done { at, once, .. } => {
                !once && now.saturating_duration_since(at) >= self.retention
            }
        }
    }
}

impl MemoryStore {
    /// A store of at most 100 000 keys.
    #[must_use]
    pub fn new() -> Self {
        Self::with_capacity(100_000)
    }

    /// A store of at most `capacity` keys.
    #[must_use]
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Map {
                entries: HashMap::new(),
                capacity: capacity.max(1),
                retention: Retention::default().get(),
            })),
        }
    }

    /// Replaces how long done event keys are remembered (default 7 days).
    #[must_use]
    pub fn with_retention(self, retention: Retention) -> Self {
        self.lock().retention = retention.get();
        self
    }

    /// How many keys it holds (claimed or done).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it holds no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // Every mutation is a single insert or remove: a poisoned map is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim_now(&self, d: &Delivery, token: Token, lease: Duration) -> Result<Claim, StoreError> {
        super::check_key(&d.source, &d.id)?;
        let now = Instant::now();
        let mut map = self.lock();
        let key = (d.source.clone(), d.id.clone());
        match map.entries.get(&key) {
            Some(e) if map.expired(e, now) => {}
            Some(Entry::Done { .. }) => return Ok(Claim::Done),
            Some(Entry::Claimed { until, .. }) => {
                return Ok(Claim::InFlight {
                    retry_after: *until - now,
                })
            }
            None => {}
        }
        if !map.entries.contains_key(&key) && map.entries.len() >= map.capacity {
            let mut entries = std::mem::take(&mut map.entries);
            entries.retain(|_, e| !map.expired(e, now));
            map.entries = entries;
            if map.entries.len() >= map.capacity {
                return Err(StoreError::message("memory store is full"));
            }
        }
        map.entries.insert(
            key,
            Entry::Claimed {
                token,
                until: now + lease,
            },
        );
        Ok(Claim::New(token))
    }

    /// Marks done (or forgets, on release) a claim `token` still holds; a key `token`
    /// already completed stays done. A key gone (our expired claim swept when the map was
    /// full) is marked done too: no other attempt holds it, and our work succeeded.
    fn finish(&self, d: &Delivery, token: Token, done: bool) -> Completed {
        let mut map = self.lock();
        let key = (d.source.clone(), d.id.clone());
        match map.entries.get(&key) {
            None if done => {
                let (at, once) = (Instant::now(), d.kept_until_pruned());
                map.entries.insert(key, Entry::Done { token, at, once });
                Completed::Done
            }
            Some(Entry::Claimed { token: held, .. }) if *held == token => {
                if done {
                    let (at, once) = (Instant::now(), d.kept_until_pruned());
                    map.entries.insert(key, Entry::Done { token, at, once });
                } else {
                    map.entries.remove(&key);
                }
                Completed::Done
            }
            Some(Entry::Done { token: held, .. }) if *held == token && done => Completed::Done,
            _ => Completed::Fenced,
        }
    }

    /// Extends a claim `token` still holds (even one whose lease ran out unnoticed: no
    /// other attempt took it, or the token would differ).
    fn renew_now(&self, d: &Delivery, token: Token, lease: Duration) -> Renewed {
        let mut map = self.lock();
        match map.entries.get_mut(&(d.source.clone(), d.id.clone())) {
            Some(Entry::Claimed { token: held, until }) if *held == token => {
                *until = Instant::now() + lease;
                Renewed::Held
            }
            _ => Renewed::Fenced,
        }
    }

    /// Deletes done keys of one kind (`once`, and then of one namespace) done that long ago.
    fn prune_done(&self, older_than: Duration, once: Option<&str>) -> u64 {
        let now = Instant::now();
        let mut map = self.lock();
        let before = map.entries.len();
        map.entries.retain(|(source, _), e| match *e {
            Entry::Done {
                at, once: is_once, ..
            } => {
                let old = now.saturating_duration_since(at) >= older_than;
                let kind = match once {
                    None => !is_once,
                    Some(namespace) => is_once && source == namespace,
                };
                !(old && kind)
            }
            Entry::Claimed { .. } => true,
        });
        (before - map.entries.len()) as u64
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl DedupeStore for MemoryStore {
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let result = self.claim_now(&delivery, token, lease);
        Box::pin(std::future::ready(result))
    }

    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let result = self.renew_now(&delivery, token, lease);
        Box::pin(std::future::ready(Ok(result)))
    }

    fn complete(&self, delivery: Delivery, token: Token) -> StoreFuture<Completed> {
        let result = self.finish(&delivery, token, true);
        Box::pin(std::future::ready(Ok(result)))
    }

    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()> {
        self.finish(&delivery, token, false);
        Box::pin(std::future::ready(Ok(())))
    }

    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        let older_than = older_than.get();
        let pruned = self.prune_done(older_than, None);
        Box::pin(std::future::ready(Ok(pruned)))
    }

    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        let pruned = self.prune_done(older_than, Some(namespace));
        Box::pin(std::future::ready(Ok(pruned)))
    }
}

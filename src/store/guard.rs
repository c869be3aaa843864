//! [`ClaimGuard`]: a claim held by one attempt, released if the attempt ends without
//! saying how it went.

use std::sync::Arc;

use super::{Completed, DedupeStore, Delivery, StoreFuture, Token};

/// A claim this attempt holds, or has asked for. Dropped before an outcome — the work
/// panicked, or the future running it (or still claiming) was dropped — it releases the
/// claim in the background, so the next attempt runs instead of waiting for the lease to
/// run out. A release under a token that never held the key changes nothing.
pub(crate) struct ClaimGuard {
    store: Arc<dyn DedupeStore>,
    delivery: Option<Delivery>,
    token: Token,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn DedupeStore>, delivery: Delivery, token: Token) -> Self {
        Self {
            store,
            delivery: Some(delivery),
            token,
        }
    }

    /// Forgets the claim without a word to the store: it was never granted (the key is
    /// done, or another attempt holds it).
    pub(crate) fn disarm(mut self) {
        self.delivery = None;
    }

    /// Takes the claim apart, the guard no longer watching it.
    pub(crate) fn into_parts(mut self) -> (Arc<dyn DedupeStore>, Delivery, Token) {
        let delivery = self.delivery.take().expect("one outcome per claim");
        (self.store.clone(), delivery, self.token)
    }

    /// Marks the key done (fenced on the token).
    pub(crate) fn complete(mut self) -> StoreFuture<Completed> {
        let delivery = self.delivery.take().expect("one outcome per claim");
        self.store.complete(delivery, self.token)
    }

    /// Gives the claim up so the next attempt runs.
    pub(crate) fn release(mut self) -> StoreFuture<()> {
        let delivery = self.delivery.take().expect("one outcome per claim");
        self.store.release(delivery, self.token)
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(delivery) = self.delivery.take() {
            let release = self.store.release(delivery, self.token);
            // Outside a runtime (at shutdown) the lease frees the claim instead.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(release);
            }
        }
    }
}

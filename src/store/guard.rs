//! [`ClaimGuard`]: a claim held by one attempt, released if the attempt ends without
//! saying how it went; [`PendingClaim`]: the same while the claim is still being asked for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use super::{Claim, Completed, DedupeStore, Delivery, StoreError, StoreFuture, Token};

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

/// A claim being asked for, with its guard. Polled, it answers the claim and hands over
/// the guard when the claim was granted. Dropped before the answer (the request or task
/// was cancelled), it lets the claim finish in the background and then releases it: a
/// database keeps running a statement it was sent, and a claim landing after its asker
/// is gone would otherwise hold the key until its lease runs out.
pub(crate) struct PendingClaim {
    claim: Option<StoreFuture<Claim>>,
    guard: Option<ClaimGuard>,
}

impl PendingClaim {
    pub(crate) fn new(
        store: Arc<dyn DedupeStore>,
        delivery: Delivery,
        token: Token,
        lease: Duration,
    ) -> Self {
        let claim = store.claim(delivery.clone(), token, lease);
        Self {
            claim: Some(claim),
            guard: Some(ClaimGuard::new(store, delivery, token)),
        }
    }
}

/// What a [`PendingClaim`] came to.
pub(crate) enum Claimed {
    /// This attempt owns the key; the guard watches it.
    Granted(ClaimGuard),
    /// Already handled successfully.
    Done,
    /// Another attempt holds it for up to this long.
    InFlight(Duration),
    /// The store failed.
    Failed(StoreError),
}

impl Future for PendingClaim {
    type Output = Claimed;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Claimed> {
        let claim = self.claim.as_mut().expect("polled after completion");
        let outcome = ready!(claim.as_mut().poll(cx));
        self.claim = None;
        let guard = self.guard.take().expect("polled after completion");
        Poll::Ready(match outcome {
            Ok(Claim::New(_)) => Claimed::Granted(guard),
            // Not granted: nothing to release.
            Ok(Claim::Done) => {
                guard.disarm();
                Claimed::Done
            }
            Ok(Claim::InFlight { retry_after }) => {
                guard.disarm();
                Claimed::InFlight(retry_after)
            }
            // It may have landed before the error (a lost connection): the guard, dropped
            // armed, releases it — a no-op under a token that holds nothing.
            Err(e) => Claimed::Failed(e),
        })
    }
}

impl Drop for PendingClaim {
    fn drop(&mut self) {
        let (Some(claim), Some(guard)) = (self.claim.take(), self.guard.take()) else {
            return;
        };
        let (store, delivery, token) = guard.into_parts();
        // Outside a runtime (at shutdown) the lease frees the claim instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = claim.await;
                let _ = store.release(delivery, token).await; // fenced: harmless if not ours
            });
        }
    }
}

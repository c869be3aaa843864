//! [`ClaimGuard`]: a claim held by one attempt, released if the attempt ends without
//! saying how it went; [`PendingClaim`]: the same while the claim is still being asked for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use super::{Claim, Completed, DedupeStore, Delivery, Renewed, StoreError, StoreFuture, Token};
use crate::metrics::{self, Operation};

/// A claim this attempt holds, or has asked for. Dropped before an outcome — the work
/// panicked, or the future running it (or still claiming) was dropped — it releases the
/// claim in the background, so the next attempt runs instead of waiting for the lease to
/// run out. A release under a token that never held the key changes nothing.
pub(crate) struct ClaimGuard {
    store: Arc<dyn DedupeStore>,
    delivery: Option<Delivery>,
    token: Token,
    /// When the claim was sent: its lease counts from no later than this.
    sent: Instant,
    lease: Duration,
}

impl ClaimGuard {
    pub(crate) fn new(
        store: Arc<dyn DedupeStore>,
        delivery: Delivery,
        token: Token,
        sent: Instant,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            delivery: Some(delivery),
            token,
            sent,
            lease,
        }
    }

    /// When the claim was sent; its lease ends no later than a lease after this.
    pub(crate) fn sent(&self) -> Instant {
        self.sent
    }

    /// The claim's parts, the guard still watching it (for renewals beside its outcome).
    pub(crate) fn parts(&self) -> (Arc<dyn DedupeStore>, Delivery, Token) {
        let delivery = self.delivery.clone().expect("before its outcome");
        (self.store.clone(), delivery, self.token)
    }

    /// Takes the claim apart, the guard no longer watching it.
    pub(crate) fn into_parts(mut self) -> (Arc<dyn DedupeStore>, Delivery, Token) {
        let delivery = self.delivery.take().expect("one outcome per claim");
        (self.store.clone(), delivery, self.token)
    }

    /// Extends the claim to `lease` from now (fenced on the token).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // the JetStream worker's heartbeat
    pub(crate) fn renew(
        &self,
        lease: Duration,
    ) -> impl Future<Output = Result<Renewed, StoreError>> {
        let delivery = self.delivery.clone().expect("renewed before its outcome");
        metrics::timed(
            Operation::Renew,
            self.store.renew(delivery, self.token, lease),
        )
    }

    /// Marks the key done (fenced on the token).
    pub(crate) fn complete(mut self) -> impl Future<Output = Result<Completed, StoreError>> {
        let delivery = self.delivery.take().expect("one outcome per claim");
        metrics::timed(
            Operation::Complete,
            self.store.complete(delivery, self.token),
        )
    }

    /// Marks the key done (fenced on the token), asking again while the store fails until
    /// `until`: an outcome recorded after the lease ends may be another attempt's to record.
    pub(crate) async fn complete_until(
        self,
        until: tokio::time::Instant,
    ) -> Result<Completed, StoreError> {
        let (store, delivery, token) = self.into_parts();
        let complete =
            || metrics::timed(Operation::Complete, store.complete(delivery.clone(), token));
        super::retry_until(until, complete).await
    }

    /// Gives the claim up so the next attempt runs. One try is awaited (so a retry that
    /// comes right after the answer finds the key free); a store that did not answer is
    /// asked again in the background while the lease lasts.
    pub(crate) async fn release(self) {
        let lease_ends = self.sent + self.lease;
        self.release_until(lease_ends).await;
    }

    /// [`release`](Self::release), the background tries lasting until `lease_ends` (a
    /// renewed lease ends later than the first).
    pub(crate) async fn release_until(mut self, lease_ends: Instant) {
        let delivery = self.delivery.take().expect("one outcome per claim");
        let (store, token) = (self.store.clone(), self.token);
        let release = store.release(delivery.clone(), token);
        if metrics::timed(Operation::Release, release).await.is_err() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(release_while_leased(store, delivery, token, lease_ends));
            }
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(delivery) = self.delivery.take() {
            let release = release_while_leased(
                self.store.clone(),
                delivery,
                self.token,
                self.sent + self.lease,
            );
            // Outside a runtime (at shutdown) the lease frees the claim instead.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(release);
            }
        }
    }
}

/// A claim being asked for, with its guard. Polled, it asks the store (not before: a
/// future dropped unpolled claims nothing), answers the claim, and hands over the guard
/// when the claim was granted. Dropped before the answer (the request or task was
/// cancelled), it lets the claim finish in the background and then releases it: a
/// database keeps running a statement it was sent, and a claim landing after its asker
/// is gone would otherwise hold the key until its lease runs out.
pub(crate) struct PendingClaim {
    store: Arc<dyn DedupeStore>,
    /// `None` once answered: it moved into the guard, or was no longer needed.
    delivery: Option<Delivery>,
    token: Token,
    lease: Duration,
    /// `None` until first polled; `Some` while the store has not answered.
    claim: Option<StoreFuture<Claim>>,
    /// When the claim was sent (first polled).
    sent: Option<Instant>,
}

impl PendingClaim {
    pub(crate) fn new(
        store: Arc<dyn DedupeStore>,
        delivery: Delivery,
        token: Token,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            delivery: Some(delivery),
            token,
            lease,
            claim: None,
            sent: None,
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
        let this = &mut *self;
        let delivery = this.delivery.as_ref().expect("polled after completion");
        let sent = *this.sent.get_or_insert_with(Instant::now);
        let claim = this
            .claim
            .get_or_insert_with(|| this.store.claim(delivery.clone(), this.token, this.lease));
        let outcome = ready!(claim.as_mut().poll(cx));
        metrics::store_operation(Operation::Claim, metrics::Timer::since(sent));
        this.claim = None;
        let delivery = this.delivery.take().expect("answered once");
        let guard = || ClaimGuard::new(this.store.clone(), delivery, this.token, sent, this.lease);
        Poll::Ready(match outcome {
            // Granted so late that the first renewal (a third of the lease after the
            // claim) could not come before the lease runs out, or it already has: another
            // attempt may hold the key by now. Give it back and ask the caller to retry,
            // rather than run beside that attempt.
            Ok(Claim::New(_)) if sent.elapsed() >= this.lease * 2 / 3 => {
                drop(guard()); // released in the background (fenced: harmless if taken)
                Claimed::InFlight(this.lease)
            }
            Ok(Claim::New(_)) => Claimed::Granted(guard()),
            // Not granted: nothing to release.
            Ok(Claim::Done) => Claimed::Done,
            Ok(Claim::InFlight { retry_after }) => Claimed::InFlight(retry_after),
            // It may have landed before the error (a lost connection): a guard dropped
            // armed releases it — a no-op under a token that holds nothing.
            Err(e) => {
                drop(guard());
                Claimed::Failed(e)
            }
        })
    }
}

impl Drop for PendingClaim {
    fn drop(&mut self) {
        // Never asked (dropped unpolled), or answered: nothing in flight.
        let (Some(claim), Some(delivery)) = (self.claim.take(), self.delivery.take()) else {
            return;
        };
        let (store, token) = (self.store.clone(), self.token);
        // Outside a runtime (at shutdown) the lease frees the claim instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let lease_ends = self.sent.unwrap_or_else(Instant::now) + self.lease;
            runtime.spawn(async move {
                let _ = claim.await;
                // Fenced: harmless if the key was never ours.
                release_while_leased(store, delivery, token, lease_ends).await;
            });
        }
    }
}

/// Releases the claim, retrying a store that does not answer until the lease would end
/// anyway (an outage that swallowed the claim's answer often swallows the first release
/// too): the next attempt runs as soon as the store is back, not when the lease runs out.
async fn release_while_leased(
    store: Arc<dyn DedupeStore>,
    delivery: Delivery,
    token: Token,
    lease_ends: Instant,
) {
    let until = tokio::time::Instant::from_std(lease_ends);
    let release = || metrics::timed(Operation::Release, store.release(delivery.clone(), token));
    let _ = super::retry_until(until, release).await;
}

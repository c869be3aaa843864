//! Messages handed back in the stream's order. JetStream redelivers handed-back messages
//! (a nak without a delay) in the order their naks came, before any new message: a
//! worker that hands back its lowest first has an object's events run again, by the
//! next worker, before the object's later ones. (A nak with a delay — even of zero — is
//! redelivered only once a timer finds it, after new messages pulled meanwhile.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Pulled, Stream};
use crate::inbox::jetstream::settle::nak;
use crate::store::StoreError;

/// The stream sequences of the messages a worker holds (pulled, not yet settled).
#[derive(Default)]
pub(super) struct Holding {
    /// Each sequence, and how many deliveries of it are held (a redelivery may come while
    /// an earlier delivery still runs).
    seqs: Mutex<BTreeMap<u64, u32>>,
    released: Notify,
}

/// A message's place among those held: given up when dropped (its task ended).
pub(super) struct Held {
    holding: Arc<Holding>,
    seq: u64,
}

impl Holding {
    pub(super) fn hold(self: &Arc<Self>, seq: u64) -> Held {
        *self.lock().entry(seq).or_default() += 1;
        Held {
            holding: self.clone(),
            seq,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u32>> {
        self.seqs.lock().expect("not poisoned")
    }

    /// Whether a delivery of the message at `seq` is held here.
    pub(super) fn holds(&self, seq: u64) -> bool {
        self.lock().contains_key(&seq)
    }

    /// Waits until no message before `seq` is held, or `until`.
    pub(super) async fn first(&self, seq: u64, until: Instant) {
        let wait = async {
            loop {
                let released = self.released.notified();
                let mut released = std::pin::pin!(released);
                released.as_mut().enable();
                if self.lock().range(..seq).next().is_none() {
                    return;
                }
                released.await;
            }
        };
        let _ = tokio::time::timeout_at(until, wait).await;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut seqs = self.holding.lock();
        if let Some(n) = seqs.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                seqs.remove(&self.seq);
            }
        }
        drop(seqs);
        self.holding.released.notify_waiters();
    }
}

impl Stream {
    /// Hands the message back to be delivered again after `after`; at once (a worker
    /// stopping, a snooze of zero) in the stream's order: once the messages before it
    /// that this worker holds are settled ([`Holding`]), or at `until` at the latest.
    pub(super) async fn hand_back(
        &self,
        pulled: &Pulled,
        after: Duration,
        until: Instant,
    ) -> Result<(), StoreError> {
        if !after.is_zero() {
            return nak(&pulled.message, Some(after), until).await;
        }
        self.holding.first(pulled.seq, until).await;
        nak(&pulled.message, None, until).await
    }
}

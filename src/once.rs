//! [`Once`]: run a business action at most once per key ("order 7 fulfilled"), on the same
//! stores as `DedupeLayer`.
//!
//! Deduplicating events protects one event; two *different* events about one order (a
//! `payment_intent.succeeded` and a late `charge.succeeded`, say) must not fulfil it twice
//! either. `Once` claims the key, runs the action, and marks the key done only if the
//! action succeeded; a failed or panicking action releases the claim so a later attempt
//! runs it.
//!
//! - **Runs to its end**: on a Tokio runtime the action runs on a task of its own, so a
//!   caller that is dropped (a request whose client hung up, a worker stopped past its
//!   grace period) does not stop an action that has started, and its outcome is recorded.
//!   That is why the action's future must be `Send + 'static`.
//! - **Renewed**: the claim is renewed every third of the lease while the action runs, for
//!   up to the max run time; an action whose claim was lost meanwhile reports
//!   [`Ran::Lost`].
//! - **A business key, not an event key**: done keys never expire with event keys (the
//!   memory and Redis retentions, `prune` of the SQL stores leave them alone); delete old
//!   ones by name with [`Once::prune`].
//! - **Effects outside your database**: the action gets an [`IdempotencyKey`], stable for
//!   the namespace and key. Pass it to APIs that accept one (Stripe's `Idempotency-Key`
//!   header, say): if this process crashes mid-action and a later attempt runs it again,
//!   the provider answers the second call with the first one's result.
//!
//! ```
//! use tower_webhook::once::{Once, Ran};
//! use tower_webhook::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fulfilments = Once::new(MemoryStore::new(), "fulfil-order");
//! let first = fulfilments
//!     .run("order-7", |key| async move {
//!         // e.g. POST /v1/refunds with the header `Idempotency-Key: {key}`
//!         assert!(key.as_str().starts_with("once_"));
//!         Ok::<_, std::io::Error>("shipped")
//!     })
//!     .await;
//! assert!(matches!(first, Ok(Ran::Now("shipped"))));
//! // Another event about the same order: the action does not run again.
//! let second = fulfilments.run("order-7", |_| async { Ok::<_, std::io::Error>("shipped") }).await;
//! assert!(matches!(second, Ok(Ran::Already)));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{
    hold, Claimed, Completed, DedupeStore, Delivery, Held, Lease, PendingClaim, StoreError, Token,
};
use crate::{ConfigError, Drain};

mod error; // why a run failed
mod idempotency_key; // the key for an external API's own deduplication
#[cfg(feature = "postgres")]
mod in_transaction; // `run_in`: the key recorded in the caller's transaction
#[cfg(test)]
mod tests;

pub use error::{OnceError, OnceErrorKind};
pub use idempotency_key::IdempotencyKey;

/// Runs actions at most once per key. Cloning shares the store and the
/// [`drain`](Self::drain).
#[derive(Clone)]
pub struct Once {
    store: Arc<dyn DedupeStore>,
    namespace: Arc<str>,
    lease: Lease,
    drain: Drain,
}

/// What [`Once::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ran<T> {
    /// The action ran now and succeeded; the key is done.
    Now(T),
    /// The action already ran for this key.
    Already,
    /// Another attempt is running it now; try again after this long.
    InProgress {
        /// Until the other attempt's lease runs out.
        retry_after: Duration,
    },
    /// The action ran now and succeeded, but its claim was not kept: the lease ran out
    /// (the store was out of reach longer than the lease, or the action ran past the max
    /// run time) and another attempt took the key, or the store could not hear "done"
    /// before the lease would end. Another attempt may run the action too — which the
    /// [`IdempotencyKey`] makes harmless where the effect's API honours it. Logged at
    /// `warn` (feature `tracing`).
    Lost(T),
}

impl Once {
    /// Actions keyed within `namespace` (kept apart from event ids and other namespaces),
    /// with a 60 s lease renewed for up to 10 min of run time.
    #[must_use]
    pub fn new(store: impl DedupeStore, namespace: &str) -> Self {
        Self::from_arc(Arc::new(store), namespace)
    }

    /// Like [`new`](Self::new), on a store already behind an `Arc` (the one a
    /// `DedupeLayer` uses, say).
    #[must_use]
    pub fn from_arc(store: Arc<dyn DedupeStore>, namespace: &str) -> Self {
        Self {
            store,
            // Event sources are scheme names; this prefix keeps the two key spaces apart
            // (and the store's `kind` keeps their retentions apart).
            namespace: Arc::from(format!("once:{namespace}")),
            lease: Lease::renewed_for(Duration::from_secs(600)),
            drain: Drain::new(),
        }
    }

    /// Replaces how long a claim holds before another attempt may take it over (default
    /// 60 s). It is renewed while the action runs: the lease bounds how long a *crashed*
    /// attempt blocks the others, [`with_max_run`](Self::with_max_run) how long an action
    /// may run.
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day, or is shorter than the store keeps
    /// safely ([`DedupeStore::min_lease`]).
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        self.lease.length = crate::store::checked_lease(lease, self.store.min_lease())?;
        Ok(self)
    }

    /// Replaces how long a running action keeps its claim renewed (default 10 min); past
    /// it the lease runs out and the run ends as [`Ran::Lost`] if another attempt took
    /// the key.
    ///
    /// # Errors
    ///
    /// When `max_run` is shorter than 1 s.
    pub fn with_max_run(mut self, max_run: Duration) -> Result<Self, ConfigError> {
        self.lease.max_run = Lease::checked_max_run(max_run)?;
        Ok(self)
    }

    /// The actions this `Once` (and every clone of it) runs on tasks of their own: at
    /// shutdown, wait for them with [`Drain::wait`], which stops and releases what is not
    /// done within its bound. See [`crate::drain`].
    pub fn drain(&self) -> Drain {
        self.drain.clone()
    }

    /// The idempotency key the action for `key` is given.
    #[must_use]
    pub fn idempotency_key(&self, key: &str) -> IdempotencyKey {
        IdempotencyKey::derive(&self.namespace, key)
    }

    /// Runs `action` unless it already ran (or is running) for `key`. The action gets the
    /// key's [`IdempotencyKey`].
    ///
    /// On a Tokio runtime the action runs on a task of its own, tracked by the
    /// [`drain`](Self::drain): dropping this future does not stop an action that has
    /// started, and its outcome is still recorded. Without a runtime it runs inline,
    /// without renewals.
    ///
    /// # Errors
    ///
    /// [`OnceErrorKind::Action`] when the action fails (the key is released, so it can run
    /// again); [`OnceErrorKind::Store`] when the store cannot claim the key (the action did
    /// not run); [`OnceErrorKind::Stopped`] when the drain stopped it, or had ended before.
    ///
    /// # Panics
    ///
    /// When the action panics (after its key was released), the panic goes on to the
    /// caller.
    pub async fn run<F, Fut, T, E>(&self, key: &str, action: F) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce(IdempotencyKey) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        if self.drain.is_stopped() {
            return Err(OnceError::stopped());
        }
        let delivery = Delivery::once_key(&self.namespace, key);
        let claim = PendingClaim::new(
            self.store.clone(),
            delivery,
            Token::new(),
            self.lease.length,
        );
        let guard = match claim.await {
            Claimed::Granted(guard) => guard,
            Claimed::Done => return Ok(Ran::Already),
            Claimed::InFlight(retry_after) => return Ok(Ran::InProgress { retry_after }),
            Claimed::Failed(e) => return Err(OnceError::of_store(e)),
        };
        let work = action(self.idempotency_key(key));
        let (result, held) = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let stop = self.drain.stopping();
                let work = hold(guard, self.lease, work, Result::is_ok, stop);
                match self.drain.spawn_on(&runtime, work).await {
                    Ok(Ok(finished)) => finished,
                    Ok(Err(_stopped)) => return Err(OnceError::stopped()),
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // The runtime is shutting down: the lease frees the key.
                    Err(_) => {
                        return Err(OnceError::of_store(StoreError::message(
                            "the runtime is shutting down",
                        )))
                    }
                }
            }
            // No runtime, no timers: run inline and record once.
            Err(_) => match work.await {
                Ok(value) => {
                    let held = match guard.complete().await {
                        Ok(Completed::Done) => Held::Done,
                        Ok(Completed::Fenced) => Held::Lost,
                        Err(e) => Held::Unrecorded(e),
                    };
                    (Ok(value), held)
                }
                Err(e) => {
                    guard.release().await;
                    (Err(e), Held::Released)
                }
            },
        };
        match (result, held) {
            (Err(e), _) => Err(OnceError::of_action(e)),
            (Ok(value), Held::Done) => Ok(Ran::Now(value)),
            (Ok(value), _held) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    target: "tower_webhook",
                    outcome = ?_held,
                    "a Once action finished without keeping its claim; another attempt may \
                     run it too"
                );
                Ok(Ran::Lost(value))
            }
        }
    }

    /// Deletes this namespace's done keys older than `older_than`; returns how many. Only
    /// when no event that could trigger the action again can still arrive (a provider's
    /// retries, a replay from its events API, a requeue of old inbox rows).
    ///
    /// # Errors
    ///
    /// When the store cannot answer.
    pub async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.store.prune_once(&self.namespace, older_than).await
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease.length)
            .field("max_run", &self.lease.max_run)
            .finish_non_exhaustive()
    }
}

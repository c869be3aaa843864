//! [`Once`]: run a business action at most once per key ("order 7 fulfilled"), on the same
//! stores as `DedupeLayer`.
//!
//! Deduplicating events protects one event; two *different* events about one order (a
//! `payment_intent.succeeded` and a late `charge.succeeded`, say) must not fulfil it twice
//! either. `Once` claims the key, runs the action, and marks the key done only if the
//! action succeeded; a failed or panicking action releases the claim so a later attempt
//! runs it.
//!
//! ```
//! use tower_webhook::once::{Once, Ran};
//! use tower_webhook::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fulfilments = Once::new(MemoryStore::new(), "fulfil-order");
//! let first = fulfilments.run("order-7", || async { Ok::<_, std::io::Error>("shipped") }).await;
//! assert!(matches!(first, Ok(Ran::Now("shipped"))));
//! // Another event about the same order: the action does not run again.
//! let second = fulfilments.run("order-7", || async { Ok::<_, std::io::Error>("shipped") }).await;
//! assert!(matches!(second, Ok(Ran::Already)));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{
    ClaimGuard, Claimed, Completed, DedupeStore, Delivery, PendingClaim, StoreError, Token,
};

/// Runs actions at most once per key. Cloning shares the store.
#[derive(Clone)]
pub struct Once {
    store: Arc<dyn DedupeStore>,
    namespace: Arc<str>,
    lease: Duration,
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
}

/// Why [`Once::run`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OnceError<E> {
    /// The action failed; its claim was released, so a later attempt runs it.
    Action(E),
    /// The store could not claim or record the key.
    Store(StoreError),
}

impl<E: fmt::Display> fmt::Display for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnceError::Action(e) => write!(f, "action failed: {e}"),
            OnceError::Store(e) => write!(f, "once store failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OnceError::Action(e) => Some(e),
            OnceError::Store(e) => Some(e),
        }
    }
}

impl Once {
    /// Actions keyed within `namespace` (kept apart from event ids and other namespaces),
    /// with a 60 s lease.
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
            // Event sources are scheme names; this prefix keeps the two key spaces apart.
            namespace: Arc::from(format!("once:{namespace}")),
            lease: Duration::from_secs(60),
        }
    }

    /// Replaces how long a running action holds its key before another attempt may take
    /// it over (default 60 s). Longer than the action ever runs.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Runs `action` unless it already ran (or is running) for `key`.
    ///
    /// # Errors
    ///
    /// [`OnceError::Action`] when the action fails (the key is released, so it can run
    /// again); [`OnceError::Store`] when the store cannot claim the key (the action did
    /// not run) or cannot record it done (the action ran; the key frees itself when the
    /// lease runs out).
    pub async fn run<F, Fut, T, E>(&self, key: &str, action: F) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let delivery = Delivery::new(self.namespace.as_ref(), key);
        let claim = PendingClaim::new(self.store.clone(), delivery, Token::new(), self.lease);
        let guard = match claim.await {
            Claimed::Granted(guard) => guard,
            Claimed::Done => return Ok(Ran::Already),
            Claimed::InFlight(retry_after) => return Ok(Ran::InProgress { retry_after }),
            Claimed::Failed(e) => return Err(OnceError::Store(e)),
        };
        match action().await {
            Ok(value) => match record_done(guard).await {
                Ok(Completed::Done) => Ok(Ran::Now(value)),
                Ok(Completed::Fenced) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(
                        target: "tower_webhook",
                        "a Once action finished after its lease ran out; \
                         another attempt may have run it too: lengthen the lease"
                    );
                    Ok(Ran::Now(value))
                }
                Err(e) => Err(OnceError::Store(e)),
            },
            Err(e) => {
                // A failed release is not the action's error: the lease frees the key.
                let _ = guard.release().await;
                Err(OnceError::Action(e))
            }
        }
    }
}

/// Marks the key done. On a Tokio runtime, spawned: the action ran, so "done" reaches the
/// store even if the caller is dropped while it waits (a worker stopped mid-event).
async fn record_done(guard: ClaimGuard) -> Result<Completed, StoreError> {
    let complete = guard.complete();
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime
            .spawn(complete)
            .await
            .unwrap_or_else(|_| Err(StoreError::message("the runtime is shutting down"))),
        Err(_) => complete.await,
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

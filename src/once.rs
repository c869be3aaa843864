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

use sha2::{Digest, Sha256};

#[cfg(feature = "postgres")]
use crate::store::Claim;
use crate::store::{
    hold, Claimed, Completed, DedupeStore, Delivery, Held, Lease, PendingClaim, StoreError, Token,
};
use crate::{ConfigError, Drain};

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

/// Why [`Once::run`] failed: the action's own error, or the store's;
/// [`kind`](Self::kind) says which.
///
/// ```
/// use tower_webhook::once::{OnceError, OnceErrorKind};
///
/// fn report(e: OnceError<std::io::Error>) {
///     match e.kind() {
///         // Released: a later attempt runs the action again.
///         OnceErrorKind::Action => eprintln!("the action failed: {:?}", e.action()),
///         // Whether the store may come back: `StoreError::kind`.
///         OnceErrorKind::Store => eprintln!("not run: {:?}", e.store_error()),
///         _ => eprintln!("{e}"),
///     }
/// }
/// ```
pub struct OnceError<E> {
    repr: Repr<E>,
}

#[derive(Debug)]
enum Repr<E> {
    Action(E),
    Store(StoreError),
    Stopped,
}

/// The kinds of [`OnceError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnceErrorKind {
    /// The action failed; its claim was released, so a later attempt runs it. The error
    /// is [`OnceError::action`].
    Action,
    /// The store could not claim the key (the action did not run), or, in
    /// `Once::run_in` (feature `postgres`), a statement of the transaction failed. The error is
    /// [`OnceError::store_error`].
    Store,
    /// Stopped by [`Drain::wait`] at shutdown: the action ran past the drain's bound and was
    /// stopped midway (its key released, so a later attempt runs it again), or it came
    /// after the drain and never started.
    Stopped,
}

impl<E> OnceError<E> {
    fn of_action(e: E) -> Self {
        Self {
            repr: Repr::Action(e),
        }
    }

    fn of_store(e: StoreError) -> Self {
        Self {
            repr: Repr::Store(e),
        }
    }

    fn stopped() -> Self {
        Self {
            repr: Repr::Stopped,
        }
    }

    /// Whose failure this is.
    #[must_use]
    pub fn kind(&self) -> OnceErrorKind {
        match self.repr {
            Repr::Action(_) => OnceErrorKind::Action,
            Repr::Store(_) => OnceErrorKind::Store,
            Repr::Stopped => OnceErrorKind::Stopped,
        }
    }

    /// The action's error, when the action failed.
    #[must_use]
    pub fn action(&self) -> Option<&E> {
        match &self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(_) | Repr::Stopped => None,
        }
    }

    /// The action's error, when the action failed, by value.
    #[must_use]
    pub fn into_action(self) -> Option<E> {
        match self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(_) | Repr::Stopped => None,
        }
    }

    /// The store's error, when the store failed.
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.repr {
            Repr::Store(e) => Some(e),
            Repr::Action(_) | Repr::Stopped => None,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Action(e) => f.debug_tuple("OnceError::Action").field(e).finish(),
            Repr::Store(e) => f.debug_tuple("OnceError::Store").field(e).finish(),
            Repr::Stopped => f.write_str("OnceError::Stopped"),
        }
    }
}

impl<E: fmt::Display> fmt::Display for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Action(e) => write!(f, "action failed: {e}"),
            Repr::Store(e) => write!(f, "once store failed: {e}"),
            Repr::Stopped => f.write_str("action stopped by the drain at shutdown"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(e) => Some(e),
            Repr::Stopped => None,
        }
    }
}

/// A key for an external API's own deduplication (Stripe's `Idempotency-Key` header, say),
/// derived from a [`Once`]'s namespace and key: the same for every attempt at one action,
/// in every process, and different for every other action. 37 ASCII characters:
/// `once_` and 32 hex digits of a SHA-256 of the namespace and the key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    fn derive(namespace: &str, key: &str) -> Self {
        // Lengths first, so no namespace and key can spell another pair's input.
        let mut digest = Sha256::new();
        digest.update(b"tower-webhook once v1\0");
        digest.update((namespace.len() as u64).to_be_bytes());
        digest.update(namespace.as_bytes());
        digest.update(key.as_bytes());
        let hash = digest.finalize();
        Self(format!("once_{}", hex::encode(&hash[..16])))
    }

    /// The key, to put in a header.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
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

#[cfg(feature = "postgres")]
impl Once {
    /// Runs `action` unless it already ran for `key`, recording the key **in `tx`**: the
    /// key is done exactly when the transaction commits, together with the action's own
    /// writes (make them through the same [`PgTx`](crate::dedupe::PgTx)). For a
    /// [`Worker::transactional`](crate::inbox::Worker::transactional) processor or a
    /// handler behind [`TxDedupeLayer`](crate::dedupe::TxDedupeLayer).
    ///
    /// The key and the action's writes sit in a savepoint: a failed action rolls back to
    /// it (the key is not done, the transaction goes on), so the caller may still commit
    /// its other work. A transaction that rolls back later takes the key with it, and the
    /// retry runs the action again — its writes were rolled back too. A concurrent
    /// transaction with the same key waits for this one to end.
    ///
    /// The keys live in the same table as [`run`](Self::run)'s, on the transaction's
    /// database: use one `Once` namespace with a [`PgStore`](crate::store::PgStore) on the
    /// same database to mix the two.
    ///
    /// # Errors
    ///
    /// [`OnceErrorKind::Action`] when the action fails (rolled back to the savepoint);
    /// [`OnceErrorKind::Store`] when a statement fails (the transaction is then aborted: let
    /// it roll back).
    pub async fn run_in<F, Fut, T, E>(
        &self,
        tx: &crate::dedupe::PgTx,
        key: &str,
        action: F,
    ) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce(IdempotencyKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = |e| OnceError::of_store(crate::sql::store_error("once in transaction", e));
        // Refused before any statement: a key PostgreSQL cannot keep would abort the caller's transaction.
        crate::store::check_key(&self.namespace, key).map_err(OnceError::of_store)?;
        let claimed = {
            let mut conn = tx.lock().await;
            sqlx::query("SAVEPOINT tower_webhook_once")
                .execute(&mut **conn)
                .await
                .map_err(store)?;
            let once_key = Delivery::once_key(&self.namespace, key);
            let claim = crate::sql::postgres::done_in(&mut conn, &once_key, Token::new())
                .await
                .map_err(store)?;
            match claim {
                Claim::New(_) => None,
                Claim::Done | Claim::InFlight { .. } => {
                    sqlx::query("RELEASE SAVEPOINT tower_webhook_once")
                        .execute(&mut **conn)
                        .await
                        .map_err(store)?;
                    Some(match claim {
                        Claim::InFlight { retry_after } => Ran::InProgress { retry_after },
                        _ => Ran::Already,
                    })
                }
            }
        };
        if let Some(answer) = claimed {
            return Ok(answer);
        }
        let outcome = action(self.idempotency_key(key)).await;
        let mut conn = tx.lock().await;
        if outcome.is_err() {
            sqlx::query("ROLLBACK TO SAVEPOINT tower_webhook_once")
                .execute(&mut **conn)
                .await
                .map_err(store)?;
        }
        sqlx::query("RELEASE SAVEPOINT tower_webhook_once")
            .execute(&mut **conn)
            .await
            .map_err(store)?;
        outcome.map(Ran::Now).map_err(OnceError::of_action)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_stable_and_apart() {
        let a = IdempotencyKey::derive("once:fulfil", "order-7");
        assert_eq!(a, IdempotencyKey::derive("once:fulfil", "order-7"));
        assert_eq!(a.as_str().len(), 37);
        assert!(a.as_str().starts_with("once_"));
        assert_ne!(a, IdempotencyKey::derive("once:fulfil", "order-8"));
        assert_ne!(a, IdempotencyKey::derive("once:refund", "order-7"));
        // No namespace and key spell another pair's input.
        assert_ne!(
            IdempotencyKey::derive("once:a", "bc"),
            IdempotencyKey::derive("once:ab", "c")
        );
        // Pinned: a change would give every pending action a new key.
        assert_eq!(
            a.as_str(),
            IdempotencyKey::derive("once:fulfil", "order-7").as_str()
        );
    }
}

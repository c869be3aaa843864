//! Where `DedupeLayer` keeps its claims: one entry per `(source, event id)`.
//!
//! | store | for | survives a restart | shared by replicas |
//! |---|---|---|---|
//! | [`MemoryStore`] | tests, one process | no | no |
//! | `SqliteStore` (feature `sqlite`) | the embedded default | yes | no (one host) |
//! | `PgStore` (feature `postgres`) | many replicas | yes | yes |
//! | `RedisStore` (feature `redis`) | dedupe without SQL | with Redis persistence | yes |
//!
//! Every store keeps the same small state machine: **claimed** (by one attempt, until a
//! lease runs out, under a fencing token; the attempt **renews** the lease while it runs)
//! → **done** (kept for the retention period), or back to nothing when the attempt
//! **releases** its claim. A claim is one atomic store operation, never a check followed
//! by an insert. Completing is idempotent under its token: a retried completion whose
//! first acknowledgement was lost answers [`Completed::Done`], not [`Completed::Fenced`].
//!
//! Three kinds of keys share a store: event keys (`DedupeLayer`, pruned after the
//! retention), [`Once`](crate::once::Once)'s business keys ("order 7 fulfilled"), and
//! **kept** event keys: those of events whose scheme signs no time (GitHub, Shopify,
//! Twilio, Meta, Intercom, Microsoft Graph, …). Nothing but the key stops a replay of such
//! a delivery, so it must outlive every capture of it. Business keys and kept keys never
//! expire with event keys: they are kept until pruned by name
//! ([`DedupeStore::prune_once`], which takes the business keys' namespace or the kept
//! keys' source).

mod delivery; // what a claim is about: the key and its event
mod error; // why a store could not answer
mod guard;
mod hold;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod retention; // how long done event keys are kept
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql; // the dedupe store over a dialect's table, for both
#[cfg(feature = "sqlite")]
mod sqlite;
mod token; // the fencing token of a claim
mod trust; // the URLs of the certificates that verified a delivery

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub(crate) use delivery::check_key;
pub use delivery::Delivery;
#[cfg(all(feature = "seal", any(feature = "sqlite", feature = "postgres")))]
pub(crate) use delivery::SealedBody;
pub use error::{StoreError, StoreErrorKind};
pub(crate) use guard::{ClaimGuard, Claimed, PendingClaim};
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub(crate) use hold::Heartbeat; // the inbox's workers
pub(crate) use hold::{hold, retry_until, Held, Lease};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
pub use retention::Retention;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use token::Token;
pub use trust::TrustStore;
pub(crate) use trust::MAX_TRUSTED_URLS;

use crate::ConfigError;

/// A store operation in flight. Store calls are round trips to a database; one allocation
/// per call is noise beside them, and it keeps [`DedupeStore`] object-safe, so the layer's
/// type does not name the store.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// Whether a renewal took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The claim is still ours and now holds for the new lease.
    Held,
    /// The claim is no longer ours (its lease ran out and another attempt took it, or it
    /// was released or completed). Nothing was changed.
    Fenced,
}

/// The outcome of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// First seen, released, or its last claim's lease ran out: this attempt owns it,
    /// under the token it claimed with.
    New(Token),
    /// Already handled successfully.
    Done,
    /// Another attempt holds a live claim; it ends within this long at the latest.
    InFlight {
        /// Until the other attempt's lease runs out.
        retry_after: Duration,
    },
}

/// Whether a completion took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completed {
    /// The key is now done.
    Done,
    /// The claim was no longer ours: its lease ran out and another attempt claimed it (or
    /// it was released). Nothing was changed.
    Fenced,
}

/// A store of claims. Implemented by this crate's stores; implement it for your own.
///
/// Every method is one atomic operation on the store.
pub trait DedupeStore: Send + Sync + 'static {
    /// Claims `delivery` for `lease` under `token`, atomically: [`Claim::New`] for exactly
    /// one of any number of concurrent callers. The caller picks the token before asking,
    /// so an attempt dropped while the claim is on the wire can still release it.
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim>;

    /// Extends the claim to `lease` from now, if `token` still holds it: the heartbeat of
    /// an attempt that is still running.
    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed>;

    /// Marks the claim done, if `token` still holds it — or already completed it: a retry
    /// whose first acknowledgement was lost answers [`Completed::Done`] again. A claim
    /// whose lease ran out but that no other attempt took over is still the token's:
    /// completing it answers [`Completed::Done`] (the work succeeded); only a claim
    /// another attempt holds now (or completed) answers [`Completed::Fenced`]. Done event
    /// keys are kept until pruned (SQL stores) or until the store's retention runs out
    /// (memory, Redis); done [`once keys`](Delivery::is_once_key) and
    /// [kept keys](Delivery::is_kept) until [`prune_once`](Self::prune_once).
    fn complete(&self, delivery: Delivery, token: Token) -> StoreFuture<Completed>;

    /// Gives the claim up, if `token` still holds it, so the next attempt runs.
    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()>;

    /// Deletes done event keys completed more than `older_than` ago, and event keys that
    /// failed attempts gave back, first received that long ago; returns how many (stores
    /// that expire keys by themselves answer 0). Never touches
    /// [`once keys`](Delivery::is_once_key) nor [kept keys](Delivery::is_kept).
    fn prune(&self, older_than: Retention) -> StoreFuture<u64>;

    /// Deletes the done [`once keys`](Delivery::is_once_key) of `namespace`, and the done
    /// [kept keys](Delivery::is_kept) of the source `namespace`, completed more than
    /// `older_than` ago; returns how many. Called only by name
    /// ([`Once::prune`](crate::once::Once::prune), or yourself with a source): pruning
    /// a kept key lets a captured delivery of its event run the handler again.
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64>;

    /// The shortest lease this store keeps safely: a renewal is sent every third of a
    /// lease, and must land before the lease ends however long the store may keep it
    /// waiting. `with_lease` of `DedupeLayer`, `Once` and the inbox's `Worker` refuses a
    /// shorter one. [`SqliteStore`]: four busy timeouts (the writer may wait that long for
    /// another process's lock, for the batch ahead and again for its own). By default no
    /// floor beyond the layers' own 100 ms.
    ///
    #[cfg_attr(feature = "sqlite", doc = "[`SqliteStore`]: SqliteStore")]
    #[cfg_attr(not(feature = "sqlite"), doc = "[`SqliteStore`]: crate#features")]
    fn min_lease(&self) -> Duration {
        Duration::ZERO
    }
}

/// `lease`, if the layers take it (100 ms to 1 day) and a store whose floor is `min`
/// keeps it.
pub(crate) fn checked_lease(lease: Duration, min: Duration) -> Result<Duration, ConfigError> {
    let lease = Lease::checked_length(lease)?;
    if lease < min {
        return Err(ConfigError::duration(
            "a lease",
            lease,
            format_args!(
                "at least {min:?} on this store (a renewal may wait that long for the \
                 store's write lock; SQLite: four busy timeouts)"
            ),
        ));
    }
    Ok(lease)
}

/// How many times a claim is tried when the row changed between the atomic claim and the
/// read that explains why it failed (it was released in between).
#[allow(dead_code)]
pub(crate) const CLAIM_TRIES: usize = 3;

/// Rounds a wait up to whole seconds, at least one: the unit of `Retry-After`.
pub(crate) fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(Duration::from_secs(1))
}

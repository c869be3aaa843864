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

mod guard;
mod hold;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub(crate) use guard::{ClaimGuard, Claimed, PendingClaim};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "nats"))]
pub(crate) use hold::Heartbeat; // the inbox's workers
pub(crate) use hold::{hold, retry_until, Held, Lease};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

use crate::{ConfigError, Event};

/// A store operation in flight. Store calls are round trips to a database; one allocation
/// per call is noise beside them, and it keeps [`DedupeStore`] object-safe, so the layer's
/// type does not name the store.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// What a claim is about: the key, and the verified event when there is one (SQL stores
/// keep its body, type, object id and livemode as the audit trail).
#[derive(Debug, Clone)]
pub struct Delivery {
    source: String,
    id: String,
    event: Option<Event>,
    once: bool,
    /// An event key kept until pruned by name: its scheme signs no time.
    kept: bool,
}

impl Delivery {
    /// A delivery keyed by `(source, id)`, without an event.
    #[must_use]
    pub fn new(source: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            id: id.into(),
            event: None,
            once: false,
            kept: false,
        }
    }

    /// A [`Once`](crate::once::Once) business key: `id` within the namespace `source`.
    pub(crate) fn once_key(source: &str, id: &str) -> Self {
        Self {
            once: true,
            ..Self::new(source, id)
        }
    }

    /// The delivery of a verified event, keyed on its
    /// [`dedupe_id`](Event::dedupe_id): the id when the signature covers it, else a digest
    /// of the body. An event of a scheme that signs no time gives a [kept](Self::is_kept)
    /// key.
    #[must_use]
    pub fn from_event(event: &Event) -> Self {
        Self {
            source: event.source().to_owned(),
            id: event.dedupe_id().to_owned(),
            event: Some(event.clone()),
            once: false,
            // No signed time: a replay passes every check but the key, however late.
            kept: event.keeps_key(),
        }
    }

    /// Which endpoint or provider.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The provider's event id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The verified event, when the delivery came through `VerifyWebhookLayer`.
    #[must_use]
    pub fn event(&self) -> Option<&Event> {
        self.event.as_ref()
    }

    /// Whether this is a [`Once`](crate::once::Once) business key rather than an event
    /// key. A store keeps done business keys until [`DedupeStore::prune_once`] names their
    /// namespace: they must outlive every event that could trigger the action again.
    #[must_use]
    pub fn is_once_key(&self) -> bool {
        self.once
    }

    /// Whether this is the key of an event whose scheme signs no time (GitHub, Shopify,
    /// Twilio, Meta, Intercom, Microsoft Graph, …): only the key stops a replay of it, at
    /// any age. A store keeps such a key, once done, until
    /// [`DedupeStore::prune_once`] names its source — never by the retention.
    #[must_use]
    pub fn is_kept(&self) -> bool {
        self.kept
    }

    /// Whether a done key outlives the retention: a business key or a kept event key.
    pub(crate) fn kept_until_pruned(&self) -> bool {
        self.once || self.kept
    }

    /// The `kind` column of the key's row in SQL stores.
    #[allow(dead_code)]
    pub(crate) fn kind(&self) -> &'static str {
        if self.once {
            "once"
        } else if self.kept {
            "kept"
        } else {
            "event"
        }
    }

    /// What SQL stores record beside the key.
    #[allow(dead_code)]
    pub(crate) fn audit(&self) -> Audit<'_> {
        match &self.event {
            Some(e) => Audit {
                event_type: e.event_type(),
                object_id: e.object_id(),
                livemode: e.livemode(),
                body: Some(e.body()),
            },
            None => Audit::default(),
        }
    }
}

/// The longest source, and the longest id, the built-in stores keep (bytes): together they
/// fit PostgreSQL's index (at most 2 704 bytes a row), and every store refuses alike.
pub(crate) const MAX_KEY_PART: usize = 1024;

/// Refuses, as [`StoreErrorKind::InvalidInput`], a key the built-in stores cannot keep
/// alike: a source or id over [`MAX_KEY_PART`] bytes, or holding a NUL (PostgreSQL's text
/// cannot). Checked before a claim or an accept reaches a store, so such a key is a 500 on
/// every store — not a 503 the provider retries for days, nor one store keeping what
/// another refuses.
pub(crate) fn check_key(source: &str, id: &str) -> Result<(), StoreError> {
    let fits = |part: &str| part.len() <= MAX_KEY_PART && !part.contains('\0');
    if fits(source) && fits(id) {
        return Ok(());
    }
    Err(
        StoreError::message("a source and an id are at most 1 KiB each, without NUL")
            .with_kind(StoreErrorKind::InvalidInput),
    )
}

/// The audit columns of a claim row: type, object id, livemode and the raw body.
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Audit<'a> {
    pub(crate) event_type: Option<&'a str>,
    pub(crate) object_id: Option<&'a str>,
    pub(crate) livemode: Option<bool>,
    pub(crate) body: Option<&'a [u8]>,
}

/// How long done event keys are kept: long enough that no redelivery of an event comes
/// after its key is gone (a redelivery then runs the handler again).
///
/// It is also longer than every preset's signed-time window (at most 48 hours, Square's),
/// so a capture replayed after its key is gone is refused as stale. Keys of schemes that
/// sign no time ([kept keys](Delivery::is_kept)) are not subject to it.
///
/// At least 4 days unless asked for less by name: the longest retry windows providers
/// document end within it (Stripe retries for 3 days, Standard Webhooks senders for about
/// 75 hours; GitHub does not retry on its own), with most of a day to spare for a retry
/// that runs late. The default is 7 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Retention(Duration);

impl Retention {
    /// The floor [`new`](Self::new) holds: 4 days, beyond the longest provider retry
    /// window (about 75 hours).
    pub const MIN: Duration = Duration::from_secs(4 * 24 * 3600);

    /// Keeps done keys for `keep`.
    ///
    /// # Errors
    ///
    /// When `keep` is shorter than [`MIN`](Self::MIN): use [`shorter`](Self::shorter)
    /// to mean it.
    pub fn new(keep: Duration) -> Result<Self, ConfigError> {
        if keep < Self::MIN {
            return Err(ConfigError::duration(
                "a retention",
                keep,
                "at least 4 days (beyond the longest provider retry window, about 75 \
                 hours; Retention::shorter to mean less)",
            ));
        }
        Ok(Self(keep))
    }

    /// Keeps done keys for `keep`, below the 4-day floor too: for tests, or a provider
    /// known to stop retrying sooner. A redelivery after it runs the handler again.
    #[must_use]
    pub fn shorter(keep: Duration) -> Self {
        Self(keep)
    }

    /// The length.
    #[must_use]
    pub fn get(self) -> Duration {
        self.0
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self(Duration::from_secs(7 * 24 * 3600))
    }
}

/// A fencing token: it names one claim, so a slow attempt whose lease ran out cannot
/// complete or release a newer attempt's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(uuid::Uuid);

impl Token {
    /// A fresh random token.
    #[must_use]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// The token's UUID, for stores of your own to keep.
    #[must_use]
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// A token a store of your own kept as a UUID.
    #[must_use]
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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

/// A store that could not do what was asked: unreachable, timed out, refusing the input,
/// or failing otherwise; [`kind`](Self::kind) says which.
///
/// `Display` says which operation failed; the cause (a driver error) is the `source()`.
/// Neither goes into a response body.
///
/// A store of your own builds its errors with [`new`](Self::new) or
/// [`message`](Self::message), which mean [`StoreErrorKind::Unavailable`] (the layers
/// answer 503 and the provider retries), and [`with_kind`](Self::with_kind) for another
/// kind:
///
/// ```
/// use tower_webhook::store::{StoreError, StoreErrorKind};
///
/// let down = StoreError::new("claim", "connection refused");
/// assert_eq!(down.kind(), StoreErrorKind::Unavailable);
///
/// let refused = StoreError::message("claim: an id longer than 255 bytes")
///     .with_kind(StoreErrorKind::InvalidInput);
/// assert_eq!(refused.kind(), StoreErrorKind::InvalidInput);
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    context: &'static str,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The kinds of [`StoreError`]: what a caller branches on.
///
/// A lost lease is not an error: it is an answer ([`Renewed::Fenced`], [`Completed::Fenced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached, timed out, was busy, locked or full, or is shutting
    /// down: trying again later may work. `DedupeLayer` and the inbox's accept service
    /// answer 503 with `Retry-After`.
    Unavailable,
    /// The store refused the input before trying: an event id, a name or a URL that does
    /// not validate (the built-in stores refuse a source or an event id longer than
    /// 1 KiB, or holding a NUL byte). Trying again with the same input fails again. The layers answer 500
    /// (the delivery was verified: the fault is the receiver's); the admin router 400; the
    /// command exits 2.
    InvalidInput,
    /// The store answered, but the operation failed otherwise: a statement the database
    /// refused, a row that does not decode, a migration that does not apply, a server
    /// configured in a way the store refuses. Not known to pass by itself; the layers still
    /// answer 503 (the provider retries, perhaps after the operator fixed it).
    Other,
}

impl StoreError {
    /// An error of `context` (such as `"claim"`) caused by `source`, of kind
    /// [`Unavailable`](StoreErrorKind::Unavailable): for stores of your own.
    pub fn new(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            context,
            source: Some(source.into()),
        }
    }

    /// An error of `context` with no underlying cause, of kind
    /// [`Unavailable`](StoreErrorKind::Unavailable): for stores of your own.
    #[must_use]
    pub fn message(context: &'static str) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            context,
            source: None,
        }
    }

    /// The same error, of kind `kind`.
    #[must_use]
    pub fn with_kind(mut self, kind: StoreErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.context)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// How many times a claim is tried when the row changed between the atomic claim and the
/// read that explains why it failed (it was released in between).
#[allow(dead_code)]
pub(crate) const CLAIM_TRIES: usize = 3;

/// Rounds a wait up to whole seconds, at least one: the unit of `Retry-After`.
pub(crate) fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(Duration::from_secs(1))
}

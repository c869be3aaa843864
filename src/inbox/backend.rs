//! What the inbox needs of its database: the queue's operations, implemented once per
//! dialect in [`crate::sql`] (where the states they move rows through are drawn).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::StoredEvent;
use super::{Accepted, Counts, DeadRows, EventSummary, Listing, Pause, Requeue, Requeued};
use crate::inbox::worker::due::Dues;
use crate::inbox::worker::ClaimDue;
pub(crate) use crate::sql::Outcome;
use crate::store::{Delivery, StoreFuture, Token};
use crate::Event;

/// A claimed row: the event as stored, and the number of this attempt at it (from 1).
pub(crate) struct Claimed {
    pub(crate) event: Event,
    pub(crate) attempt: u32,
    /// Why it must not run (its body is gone, or does not open): the worker ends it dead
    /// with this reason under the claim's token, never giving it to the processor, and
    /// counts it under this kind.
    pub(crate) refused: Option<(crate::metrics::Unreadable, String)>,
    /// The accept's trace context, and whether this is the route's first run since it.
    pub(crate) trace: (crate::span::TraceContext, bool),
}

/// A claimed row: its key, and the token its claim holds it under.
#[derive(Clone)]
pub(crate) struct HeldRow {
    pub(crate) source: String,
    pub(crate) id: String,
    /// Whose route it is.
    pub(crate) processor: Arc<str>,
    pub(crate) token: Token,
    /// Its object's later events wait for it (a per-object cap): an outcome that ends it
    /// wakes the workers of other processes too.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only PostgreSQL notifies others
    pub(crate) wakes: bool,
}

pub(crate) trait Backend: Send + Sync + 'static {
    /// Stores the delivery's event with its request headers as
    /// [`headers::stored`](super::headers) made them (none: none kept), and a route for
    /// each of its processors ([`Delivery::routes`]), in one transaction.
    fn accept(&self, d: Delivery) -> StoreFuture<Accepted>;
    /// Claims what `due` asks for in one statement, counting an attempt each; a due row
    /// whose `max_attempts` attempts all ended without an outcome (each crashed its
    /// worker) is marked dead instead, in the same statement. With `per_object`, a row of
    /// an object is due only while fewer than that many of the object's unfinished rows
    /// are running or came before it. Rows of the sources and types in `skip` are not
    /// claimed (their caps are reached). Only `processor`'s routes.
    fn claim(&self, processor: Arc<str>, due: ClaimDue) -> StoreFuture<Vec<Claimed>>;
    /// Hands rows a claim under `token` took back to the queue, due at once, their attempt
    /// uncounted (the claim was answered too late to run them); returns how many.
    fn give_back(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
        token: Token,
    ) -> StoreFuture<u64>;
    /// The shortest lease the database keeps safely (SQLite: a multiple of its busy
    /// timeout).
    fn min_lease(&self) -> Duration {
        Duration::ZERO
    }
    /// Extends the row's lease if its token still holds it; `false` when fenced out.
    fn renew(&self, row: HeldRow, lease: Duration) -> StoreFuture<bool>;
    /// Records `outcome` if the row's token still holds it; `false` when fenced out.
    fn finish(&self, row: HeldRow, outcome: Outcome) -> StoreFuture<bool>;
    /// Queues the matching routes again, leaving out (and counting apart) those whose
    /// event's body is gone by a recorded reason (`body_state`: expired, erased).
    fn requeue(&self, which: &Requeue) -> StoreFuture<Requeued>;
    /// Makes the index a per-object cap reads, if it is missing.
    fn object_index(&self) -> StoreFuture<()>;
    /// Pauses (`true`) or resumes (`false`) a processor, source and type (`""`: any);
    /// whether that changed anything.
    fn pause(&self, rule: super::pause::Rule, pause: bool) -> StoreFuture<bool>;
    /// What is paused now, in order of processor, source and type.
    fn pauses(&self) -> StoreFuture<Vec<Pause>>;
    /// Deletes the processed rows older than `older_than` (`None`), or the dead rows `dead`
    /// names that went dead before it.
    fn prune(&self, older_than: Duration, dead: Option<&DeadRows>) -> StoreFuture<u64>;
    /// One batch of body expiry (`docs/design/payload-protection.md` §7), in one
    /// transaction: the processed routes after the bookmark and processed more than
    /// `retention` ago, up to `batch` of them (ties at the last time taken whole); each of
    /// their events whose every route was processed that long ago loses its body, headers
    /// and error texts (`body_state` expired), and the bookmark moves past them. How many
    /// events it expired; `None` when no such route was left to walk.
    fn expire_bodies(&self, retention: Duration, batch: usize) -> StoreFuture<Option<u64>>;
    /// Erases these events (`docs/design/payload-protection.md` §8), in one transaction:
    /// each loses its body row and every error text of its routes and attempts, is
    /// marked `body_state` erased, and its routes that could still run (queued, failing,
    /// or a lease run out) go dead with the erased reason; a route running now keeps its
    /// lease, and its outcome drops its error (P11). How many of them the inbox has.
    fn erase(&self, keys: Vec<(String, String)>) -> StoreFuture<u64>;
    /// Up to `limit` events whose body row holds one of the subject `digests`
    /// (`webhook_bodies_subject`).
    #[cfg(feature = "seal")]
    fn by_subject(&self, digests: Vec<Vec<u8>>, limit: usize)
        -> StoreFuture<Vec<(String, String)>>;
    /// How many of `processor`'s routes are in each state.
    fn counts(&self, processor: Arc<str>) -> StoreFuture<Counts>;
    /// Up to `listing.limit + 1` rows of the listing (one more than a page: whether there
    /// is a next one), from its partial index.
    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>>;
    /// How many inbox rows were processed in each of the last `minutes` minutes (from 1):
    /// the current minute's start (milliseconds since the epoch, by the database's clock)
    /// and the minutes that had any, each by its start.
    fn processed_per_minute(&self, minutes: u32) -> StoreFuture<(i64, Vec<(i64, i64)>)>;
    /// The inbox's row of `(source, id)`, body, headers and attempts included.
    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>>;
    /// How long until the earliest queued row that is not due yet falls due (a retry's
    /// backoff, a snooze) of `processor`'s routes, by the database's clock; `None` when
    /// none waits so.
    fn next_due(&self, processor: Arc<str>) -> StoreFuture<Option<Duration>>;
    /// Wakes `wake` whenever another process queues a row, and tells the processor's
    /// `due` times when any process's retry or snooze of its routes falls due (PostgreSQL
    /// `LISTEN`); `None` where only this process writes (SQLite).
    fn listen(&self, wake: Arc<Notify>, due: Dues) -> Option<tokio::task::JoinHandle<()>>;
    /// The processor registry, backfill and dropping a processor.
    fn registry(&self) -> &dyn super::backfill::Registry;
    /// The invalid events' marks (issue 36).
    fn invalids(&self) -> &dyn super::invalid::Invalids;
    /// Rekey's reads and writes (`Inbox::rekey`).
    #[cfg(feature = "seal")]
    fn rekeying(&self) -> &dyn super::rekey::Rekeying;
    /// The backend opening what it reads with `keys` (a body, headers, error texts sealed
    /// by an inbox with them).
    #[cfg(feature = "seal")]
    fn with_keys(&self, keys: crate::seal::KeyRing) -> Arc<dyn Backend>;
}

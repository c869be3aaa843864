//! Every SQLite statement on `webhook_events` (see the [state diagram](super)), one file
//! per concern; `Sqlite`, its writer's operations and what they share here. Times are
//! milliseconds since the epoch from the process's clock (one host: one clock).
//!
//! Fan-out's schema (issue 33, the migration `webhook_routes`): an inbox event's row in
//! `webhook_events` is its key, metadata and the marker `next_attempt_at` (its accept
//! time, never moved; its state columns NULL); its body and headers are in
//! `webhook_bodies`, and the states of the diagram are its routes' (`webhook_routes`, one
//! per event and processor). A dead route deleted is a
//! tombstone (`next_attempt_at` NULL, `processed_at` when deleted); the event stays the
//! key until the inbox's prune deletes it with its routes, body and history.

mod claims; // `DedupeLayer`'s claims of an event key
mod erasure; // events' bodies erased on request, their routes buried
mod expiry; // the body retention: processed events' bodies, a batch from a bookmark
mod latest; // the ordering guard (`webhook_objects`)
mod listing; // the inbox's counts, listings and one event, for operators
mod processors; // fan-out's registry, backfill and dropping a processor
mod prune; // what the inbox deletes, and the per-object index
mod queue; // the inbox: accept, and the worker's claims, renewals and outcomes
#[cfg(feature = "seal")]
mod rekey; // rotation: rekey's reads, and its batches' writes
mod routes; // the writer's statements on the inbox's routes
#[cfg(test)]
mod tests;
mod trusted; // the URLs of the certificates that verified a delivery
mod writer; // the one writer: each batch of operations in one transaction

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::SqlitePool;

use super::batch::{Batcher, Lane, Run, MAX_BATCH, MAX_BATCH_BYTES};
use super::shared::{bind_claim, bind_delivery};
use super::{ClaimedRow, Outcome};
use crate::inbox::{Accepted, Requeue};
use crate::store::{Claim, Delivery, StoreError, Token};
pub(crate) use latest::advance;
use writer::{write_batch, WriterConnection};

#[cfg(test)]
use crate::inbox::DEFAULT_PROCESSOR as PROCESSOR;

/// What the times are read from.
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The table in one SQLite database. Cloning shares the pool, the clock and the writer.
#[derive(Clone)]
pub(crate) struct Sqlite {
    pool: SqlitePool,
    clock: Clock,
    /// How long the writer waits for another process's write lock.
    busy_timeout: Duration,
    /// Every write on the table, gathered into one transaction per batch: SQLite has one
    /// writer, and a commit (its fsync) is the cost to share.
    writer: Arc<Batcher<Op, Done>>,
    /// The inbox's keys: what its reads open with (`Inbox::with_keys`).
    pub(super) keys: super::sealed::Ring,
    /// The invalid events' marks (issue 36), on the pool: rare writes, outside the writer.
    pub(super) marks: super::invalid::Marks<sqlx::Sqlite>,
}

/// A write on the table: every one goes through the [writer](Sqlite::writer), so no
/// write of this process waits on SQLite's lock behind another of this process.
enum Op {
    Claim(Delivery, Token, Duration),
    Complete(String, String, Token),
    Accept(Delivery),
    Renew(String, String, Token, Duration),
    Release(String, String, Token),
    /// The inbox's: a worker's claim of due rows.
    ClaimDue(Arc<str>, crate::inbox::worker::ClaimDue),
    /// The inbox's: claimed rows handed back uncounted.
    GiveBack(Arc<str>, Vec<(String, String)>, Token),
    RenewRow(crate::inbox::backend::HeldRow, Duration),
    Finish(crate::inbox::backend::HeldRow, Outcome),
    Requeue(Requeue),
    /// A batch of body expiry: routes processed before the cutoff (milliseconds before
    /// the writer's now), at most this many.
    ExpireBodies(std::time::Duration, usize),
    /// These events' bodies and error texts erased, their routes that could run buried.
    Erase(Vec<(String, String)>),
    /// An operator's pause (`true`) or resume of a processor, source and type.
    Pause(crate::inbox::pause::Rule, bool),
    Prune(Duration),
    PruneOnce(String, Duration),
    /// The inbox's processed (`false`) or dead (`true`) rows older than that.
    /// Processed rows (`None`), or the dead rows named.
    PruneRows(Duration, Option<crate::inbox::DeadRows>),
    /// A certificate URL that verified a delivery, kept as trusted now.
    Trust(String),
    /// An inbox's processors, in the registry.
    Register(Vec<crate::inbox::backfill::Registration>),
    /// A backfill's routes of a processor, for these events.
    Backfill(Arc<str>, Vec<(String, String)>),
    /// A processor's routes, counts, pauses and registry row deleted.
    DropProcessor(String),
    /// A batch of rekey's rewrites, each compare-and-set.
    #[cfg(feature = "seal")]
    Rekey(super::rekey::Rewrites),
}

/// An [`Op`]'s answer.
enum Done {
    Claim(Claim),
    /// Held, done or recorded (`false`: fenced out).
    Held(bool),
    Accept(Accepted),
    Claimed(Vec<ClaimedRow>),
    Count(u64),
    /// Requeued, and left out for their body's state.
    Requeued(crate::inbox::Requeued),
    /// A batch of body expiry's events (`None`: nothing left to walk).
    Expired(Option<u64>),
}

impl Op {
    /// What it adds to its batch: an accept's body and headers (a claim writes no body).
    fn size(&self) -> usize {
        match self {
            Op::Accept(d) => d.size(),
            #[cfg(feature = "seal")]
            Op::Rekey(rewrites) => rewrites.size(),
            _ => 0,
        }
    }

    /// New work from the front door (and the operator's bulk writes) waits behind what
    /// keeps or ends a running lease.
    fn lane(&self) -> Lane {
        match self {
            Op::Claim(..)
            | Op::Accept(_)
            | Op::Requeue(_)
            | Op::ExpireBodies(..)
            | Op::Erase(_)
            | Op::Pause(..)
            | Op::Prune(_)
            | Op::PruneOnce(..)
            | Op::PruneRows(..)
            | Op::Trust(_)
            | Op::Register(_)
            | Op::Backfill(..)
            | Op::DropProcessor(_) => Lane::Front,
            #[cfg(feature = "seal")]
            Op::Rekey(_) => Lane::Front,
            Op::Complete(..)
            | Op::Renew(..)
            | Op::Release(..)
            | Op::ClaimDue(..)
            | Op::GiveBack(..)
            | Op::RenewRow(..)
            | Op::Finish(..) => Lane::Urgent,
        }
    }
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Sqlite {
    /// The table in `pool`'s database, on `clock`; the writer waits up to `busy_timeout`
    /// for another process's write lock.
    pub(crate) fn new(pool: SqlitePool, clock: Clock, busy_timeout: Duration) -> Self {
        let writer = Self::writer(pool.clone(), clock.clone(), busy_timeout);
        Self {
            marks: super::invalid::Marks(pool.clone()),
            pool,
            clock,
            busy_timeout,
            writer,
            keys: None,
        }
    }

    /// One writer: a batch at a time (SQLite's lock would serialise more anyway), on a
    /// connection of its own, its lease times read once it holds the lock.
    fn writer(pool: SqlitePool, clock: Clock, busy_timeout: Duration) -> Arc<Batcher<Op, Done>> {
        let conn = WriterConnection::default();
        let run: Run<Op, Done> = Arc::new(move |ops| {
            let (pool, conn, clock) = (pool.clone(), conn.clone(), clock.clone());
            Box::pin(async move { write_batch(&pool, &conn, &clock, busy_timeout, ops).await })
        });
        let batcher = Batcher::new(MAX_BATCH, MAX_BATCH_BYTES, Op::size, 1, run);
        Arc::new(batcher.with_lanes(Op::lane))
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// This table with another clock (an inbox's, in tests).
    pub(crate) fn with_clock(&self, clock: Clock) -> Self {
        Self::new(self.pool.clone(), clock, self.busy_timeout)
    }

    /// This table with another busy timeout (and a writer of its own).
    pub(crate) fn with_busy_timeout(&self, busy_timeout: Duration) -> Self {
        Self::new(self.pool.clone(), self.clock.clone(), busy_timeout)
    }

    /// The shortest lease this table keeps: a renewal sent a third into a lease may wait
    /// for the batch ahead of it and then its own, each up to the busy timeout — at four
    /// busy timeouts, that ends by 5/6 of the lease.
    pub(crate) fn min_lease(&self) -> Duration {
        self.busy_timeout.saturating_mul(4)
    }

    /// Milliseconds since the epoch, by this clock.
    fn now_ms(&self) -> i64 {
        epoch_ms((self.clock)())
    }

    async fn write(&self, op: Op) -> Result<Done, StoreError> {
        self.writer.write(op).await
    }

    async fn held(&self, op: Op) -> Result<bool, StoreError> {
        match self.write(op).await? {
            Done::Held(held) => Ok(held),
            _ => unreachable!("a yes or no"),
        }
    }

    async fn count(&self, op: Op) -> Result<u64, StoreError> {
        match self.write(op).await? {
            Done::Count(n) => Ok(n),
            _ => unreachable!("a count"),
        }
    }
}

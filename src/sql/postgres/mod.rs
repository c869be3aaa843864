//! Every PostgreSQL statement on `webhook_events` (see the [state diagram](super)) and on
//! the inbox's `webhook_bodies` and `webhook_routes` (the migration
//! `webhook_routes`), one file per concern; `Pg` itself and what they share here.

mod accept; // the inbox's accepts: events, bodies and routes, a batch in one statement
mod claims; // `DedupeLayer`'s claims, and keys done in the caller's transaction
mod erasure; // events' bodies erased on request, their routes buried
mod expiry; // the body retention: processed events' bodies, a batch from a bookmark
mod group_commit; // the writer's batches: claims, completions, accepts, "processed"
mod kept; // the writer's own connections, kept between its batches
mod latest; // the ordering guard (`webhook_objects`)
mod listing; // the inbox's counts, listings and one event, for operators
mod outcome; // an attempt's outcome on its row, fenced on the token
mod processors; // fan-out's registry, backfill and dropping a processor
mod prune; // the inbox's prunes: finished events, old keys, dead routes
mod queue; // the inbox: the worker's claims, renewals and outcomes, on routes
#[cfg(feature = "seal")]
mod rekey; // rotation: rekey's reads and its batches' writes
mod sized; // the tables' sizes: analyzed as they double, the worker's claim planned anew
#[cfg(test)]
mod tests;
mod wake; // the workers' `LISTEN` (accepts, due times) and the next due time

use std::sync::Arc;

use sqlx::postgres::PgPool;

use super::batch::{Batcher, Run, MAX_BATCH, MAX_BATCH_BYTES};
use super::shared::bind_claim;
use crate::store::StoreError;
pub(crate) use claims::done_in;
use group_commit::{Write, Written};
pub(crate) use latest::advance;
pub(crate) use outcome::processed_in;

/// The channel `accept` and `requeue` notify, for workers in other processes (and retries
/// and snoozes, with when they fall due).
const CHANNEL: &str = "webhook_events";

#[cfg(test)]
use crate::inbox::DEFAULT_PROCESSOR;

/// The table in one PostgreSQL database. Cloning shares the pool and the writers.
#[derive(Clone, Debug)]
pub(crate) struct Pg {
    pool: PgPool,
    /// The writer's kept connections (`kept.rs`), which the worker's claims share.
    kept: Arc<kept::Kept>,
    /// Claims and inbox accepts (the front door's), gathered into one statement per kind.
    writer: Arc<Batcher<Write, Written>>,
    /// Completions and the worker's "processed" (what ends a running lease), likewise, in
    /// slots of their own: behind a storm's claims and accepts, an outcome that waited
    /// for a slot could outlive its lease, and its event run again.
    outcomes: Arc<Batcher<Write, Written>>,
    /// The inbox's keys: what its reads open with (`Inbox::with_keys`).
    pub(super) keys: super::sealed::Ring,
    /// The invalid events' marks (issue 36).
    pub(super) marks: super::invalid::Marks<sqlx::Postgres>,
    /// The tables' sizes: each analyzed as it doubles, the claim's statement named after
    /// them.
    sized: sized::Sized,
}

/// `persistent(false)` for the statements that join a table to a list of keys
/// (`PROCESSED_MANY`, `GIVE_BACK`, the registry's and the key ring's): each is planned for
/// its own arrays and the table as it is now. Prepared, a connection keeps the generic
/// plan it made at its sixth run; one made while the table was small (a new database,
/// before autovacuum's first ANALYZE) is a hash join over a sequential scan, kept as the
/// table grows (issue 20: every batch of completions read the whole table). Each table of
/// the hot path is now also analyzed as it doubles, which makes a prepared statement's
/// plan over (`sized`): so the front door's batch statements (`CLAIM_AND_COMPLETE_MANY`,
/// `ACCEPT_MANY`: planning the accept's each time cost a third of its rate) and the
/// worker's claim are kept prepared.
const PLANNED_EACH_TIME: bool = false;

/// At most this many batches of claims, completions and accepts are in flight at once
/// (past the first, only full ones, or ones behind a batch held up past its commit: see
/// [`super::batch`]): enough to keep the server's disk busy under a storm, few enough to
/// leave the pool to workers and renewals.
const SLOTS: usize = 4;

/// At most this many batches of outcomes are in flight at once, beside those.
const OUTCOME_SLOTS: usize = 2;

impl Pg {
    pub(crate) fn new(pool: PgPool) -> Self {
        let kept = Arc::new(kept::Kept::new(pool.clone()));
        let batcher = |slots| {
            let kept = kept.clone();
            let run: Run<Write, Written> = Arc::new(move |writes| {
                let kept = kept.clone();
                Box::pin(async move { group_commit::write_batch(&*kept, writes).await })
            });
            Arc::new(
                Batcher::new(MAX_BATCH, MAX_BATCH_BYTES, Write::size, slots, run)
                    .with_lanes(Write::lane),
            )
        };
        Self {
            writer: batcher(SLOTS),
            outcomes: batcher(OUTCOME_SLOTS),
            marks: super::invalid::Marks(pool.clone()),
            sized: sized::Sized::new(),
            kept,
            pool,
            keys: None,
        }
    }

    /// Writes `write` in the next batch of its kind: the inbox worker's outcomes in the
    /// outcomes' slots; `DedupeLayer`'s claims and completions and the inbox's accepts in
    /// the front door's, the completions first (urgent lane: each ends a running lease),
    /// so a batch's claims and completions share one statement and one commit.
    async fn write(&self, write: Write) -> Result<Written, StoreError> {
        self.sized.observe(&self.pool); // what grows the tables passes here
        match write {
            Write::Processed(..) => self.outcomes.write(write).await,
            _ => self.writer.write(write).await,
        }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }
}

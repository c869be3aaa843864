//! Retention of bodies apart from their keys (issue 34 step 4,
//! `docs/design/payload-protection.md` §7): a processed event's body, stored headers and
//! error texts are deleted once its last route was processed more than the retention
//! ago, while its key — the event's row — stays until [`Inbox::prune`], so a late
//! redelivery is still a duplicate.
//!
//! The expiry walks the processed routes' index (`webhook_routes_processed_at`) from a
//! bookmark (`webhook_body_expiry`), a batch a transaction, so the drain writes nothing
//! more for it and a long history costs a batch at a time, never one unbounded `DELETE`.

use std::time::Duration;

use super::Inbox;
use crate::store::StoreError;

/// The largest batch [`Inbox::expire_bodies`] walks in one transaction: a larger one is
/// walked in batches of this many (one transaction must not hold SQLite's writer long).
const MAX_BATCH: usize = 10_000;

impl Inbox {
    /// The inbox keeping a processed event's body for `retention` after its last route
    /// was processed (or its last dead route deleted): [`expire_bodies`](Self::expire_bodies)
    /// then deletes its body, its stored request headers and every error text of its
    /// routes and attempts (which can quote the payload), and marks it
    /// [`BodyState::Expired`](super::BodyState::Expired). The event's key, metadata,
    /// routes' states and attempts' outcomes stay until [`prune`](Self::prune): a
    /// redelivery is still a duplicate (204, not stored, not run). Events with a route
    /// queued, running, failing or dead keep their body; so do events no processor took
    /// (they are never processed: [`prune`](Self::prune) deletes them whole).
    ///
    /// Without it, bodies stay as long as their events. Set it the same on every replica
    /// sharing the database. A requeue leaves an expired event's routes out
    /// ([`requeue_counted`](Self::requeue_counted) counts them), and a backfill makes no
    /// route for it.
    #[must_use]
    pub fn with_body_retention(mut self, retention: Duration) -> Self {
        self.body_retention = Some(retention);
        self
    }

    /// Deletes the bodies the [body retention](Self::with_body_retention) lets go, up to
    /// `batch` processed routes a transaction (ties at a batch's last time taken whole;
    /// 0 is taken as 1, more than 10 000 as 10 000), until none is left; returns how many
    /// events lost their body. Run it periodically (the receiver example does, on a tick):
    /// each run starts where the last one ended, so it costs what was processed since,
    /// read from the processed routes' index; the first run after the retention is set
    /// walks the whole processed history, a batch at a time. 0 without a retention.
    ///
    /// An event is expired when its newest route's processing is older than the
    /// retention; one with a route still queued, running or dead then is passed over and
    /// found again when that route is processed (or made a tombstone by
    /// [`prune_dead`](Self::prune_dead)).
    ///
    /// # Errors
    ///
    /// When the database fails (the batches before it stay done).
    pub async fn expire_bodies(&self, batch: usize) -> Result<u64, StoreError> {
        let Some(retention) = self.body_retention else {
            return Ok(0);
        };
        let batch = batch.clamp(1, MAX_BATCH);
        let (started, mut expired) = (std::time::Instant::now(), 0);
        // The cutoff stays where the call began: a drain faster than the batches would
        // otherwise keep a short retention's call going.
        let held = || retention.saturating_add(started.elapsed());
        while let Some(n) = self.backend.expire_bodies(held(), batch).await? {
            expired += n;
        }
        Ok(expired)
    }
}

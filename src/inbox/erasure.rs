//! Erasure on request (issue 34 step 5, `docs/design/payload-protection.md` §8): an
//! event's body, stored headers and error texts deleted, while its key — the event's row,
//! its routes' states and attempts' outcomes — stays, so a redelivery is still a
//! duplicate and the operator sees what happened.

use super::Inbox;
use crate::store::StoreError;

impl Inbox {
    /// Erases the body of `source`'s event `id`, in one transaction (on SQLite one
    /// operation of its writer): its body, its stored request headers and its subject
    /// are deleted, every error text of its routes and attempts (which can quote the
    /// payload) is cleared, it is marked [`BodyState::Erased`](super::BodyState::Erased),
    /// and each of its routes that could still run — queued, failing, or claimed by a
    /// lease that ran out — goes dead at once with the reason "the body was erased before
    /// the event was processed", never run. A route running now finishes with the body
    /// its worker already holds; its outcome is recorded, but a failure's error text is
    /// not written back. A requeue leaves its routes out
    /// ([`requeue_counted`](Self::requeue_counted) counts them); a redelivery is still a
    /// duplicate (204, not stored, not run).
    ///
    /// `true` when the inbox has the event (erasing it again is harmless: `true`
    /// again), `false` when it has no such event. Works with or without
    /// keys (`with_keys`, feature `seal`).
    ///
    /// What it does not reach: see SECURITY.md, "Bodies at rest" — the database's freed
    /// pages, write-ahead log and backups, the provider's copy, a JetStream stream.
    ///
    /// # Errors
    ///
    /// When the database fails (nothing is erased then).
    pub async fn erase(
        &self,
        source: impl Into<String>,
        id: impl Into<String>,
    ) -> Result<bool, StoreError> {
        let erased = self.backend.erase(vec![(source.into(), id.into())]).await?;
        Ok(erased > 0)
    }
}

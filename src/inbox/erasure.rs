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

/// What [`Inbox::with_subject`] computes at accept.
#[cfg(feature = "seal")]
pub(super) type Subject = std::sync::Arc<dyn Fn(&crate::Event) -> Option<String> + Send + Sync>;

/// How many events [`Inbox::erase_subject`] erases in one transaction.
#[cfg(feature = "seal")]
const SUBJECT_BATCH: usize = 500;

#[cfg(feature = "seal")]
impl Inbox {
    /// The inbox recording whose data each accepted event is: `subject` (a customer id,
    /// say; `None`: no one's) is computed at accept, sealed beside the body under the same
    /// key and stored with its keyed digest (HMAC-SHA256 under a key derived from the
    /// ring's, so the database alone cannot test a guessed id), for
    /// [`erase_subject`](Self::erase_subject) to find. Rekey seals it again and
    /// recomputes its digest under the new key.
    ///
    /// Requires [keys](Self::with_keys): without them no subject is stored (there is no
    /// key to digest it with), and `erase_subject` refuses. Only events accepted after it
    /// is set have one.
    #[must_use]
    pub fn with_subject(
        mut self,
        subject: impl Fn(&crate::Event) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.subject = Some(std::sync::Arc::new(subject));
        self
    }

    /// Erases, as [`erase`](Self::erase) does, every event whose subject
    /// ([`with_subject`](Self::with_subject)) is `subject`, found by its digest under
    /// every configured key (a row sealed before a rotation is found until rekey rewrites
    /// it; a row under a key no longer configured is not), 500 events a transaction;
    /// how many it erased.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`](crate::store::StoreErrorKind::InvalidInput)
    /// without keys; when the database fails (the batches before it stay erased).
    pub async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let Some(ring) = &self.keys else {
            return Err(StoreError::new(
                "inbox erase by subject",
                "the inbox has no keys: a subject is stored only with them (Inbox::with_keys)",
            )
            .with_kind(crate::store::StoreErrorKind::InvalidInput));
        };
        let digests: Vec<Vec<u8>> = ring
            .subject_digests(subject)
            .into_iter()
            .map(|(_, d)| d.to_vec())
            .collect();
        let mut erased = 0;
        loop {
            let keys = self
                .backend
                .by_subject(digests.clone(), SUBJECT_BATCH)
                .await?;
            if keys.is_empty() {
                return Ok(erased);
            }
            let n = self.backend.erase(keys).await?;
            if n == 0 {
                // Body rows of no inbox event (left by hand): nothing erase can take.
                return Ok(erased);
            }
            erased += n;
        }
    }
}

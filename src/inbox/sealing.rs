//! The SQL inbox's payload protection (issue 34, `docs/design/payload-protection.md`
//! §3–§5): with a key ring ([`Inbox::with_keys`], feature `seal`), each accepted event's
//! body and stored headers are sealed before they reach the store, and each processor's
//! error text before its outcome is written; the store opens them on every read
//! (`crate::sql::sealed`).
//!
//! Sealing is CPU work on the accepting request's task and the worker's, never inside
//! SQLite's one writer or a PostgreSQL batch. A body that does not open when a worker
//! claims it (its key removed, or the ciphertext altered or moved from another row) is
//! never given to the processor and never retried: its route ends dead with the reason
//! in clear (crate text quoting the key id), and runs again once requeued with the key
//! configured.

use super::backend::HeldRow;
use super::{Inbox, Outcome};
use crate::store::{Delivery, StoreError};
use crate::Event;

impl Inbox {
    /// The inbox with its payloads sealed at rest under `keys` (feature `seal`): each
    /// accepted event's body and stored request headers, and every processor's error text
    /// (which can quote the payload: serde's errors do), are sealed with
    /// XChaCha20-Poly1305 under the ring's current key, the associated data binding each
    /// ciphertext to its event and column (and an error to its processor), so one cannot
    /// be moved to another row. Every key of the ring opens what it sealed; what was
    /// stored in clear before stays readable. The processor always gets the plaintext.
    ///
    /// Set it the same on every replica sharing the database, and give a new key to all of
    /// them (second in the ring, opening only) before any seals with it (first). A body
    /// sealed under a key no longer configured is never run: its route ends dead with the
    /// reason ("sealed under key \"k1\", which no configured key has"), and a requeue after
    /// the key is configured again runs it.
    ///
    /// Not covered: the metadata columns (source, id, type, object id, livemode, times,
    /// states: the dedupe key and what the listings and caps read), the crate's own error
    /// texts, `DedupeLayer`'s claim rows, memory, the processor's logs.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # async fn run(store: &tower_webhook::store::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_webhook::inbox::Inbox;
    /// use tower_webhook::seal::KeyRing;
    ///
    /// let keys = KeyRing::parse(&std::env::var("WEBHOOK_ENCRYPTION_KEYS")?)?;
    /// let inbox = Inbox::sqlite(store).with_keys(keys);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "seal")]
    #[must_use]
    pub fn with_keys(mut self, keys: crate::seal::KeyRing) -> Self {
        self.backend = self.backend.with_keys(keys.clone());
        self.keys = Some(keys);
        self
    }

    /// `d` with `event`'s body and `headers` sealed, when the inbox has keys.
    #[cfg_attr(not(feature = "seal"), allow(clippy::unnecessary_wraps))]
    pub(super) fn sealed(
        &self,
        d: Delivery,
        event: &Event,
        headers: Option<&str>,
    ) -> Result<Delivery, StoreError> {
        #[cfg(feature = "seal")]
        if let Some(ring) = &self.keys {
            use crate::seal::{Aad, Column};
            let (source, id) = (event.source(), event.dedupe_id());
            let refused = |e: crate::seal::SealError| StoreError::new("inbox accept", e);
            let body = ring
                .seal(&Aad::new(source, id, Column::Body), event.body())
                .map_err(refused)?;
            let headers = headers
                .map(|h| ring.seal(&Aad::new(source, id, Column::Headers), h.as_bytes()))
                .transpose()
                .map_err(refused)?
                .map(|h| (h.nonce().to_vec(), h.into_ciphertext()))
                .map(|(nonce, ciphertext)| (ciphertext, nonce));
            // The subject under the body's key: one key id a row (rekey reseals them together).
            let subject = self
                .subject
                .as_ref()
                .and_then(|of| of(event))
                .map(|s| {
                    let digest = ring.subject_digests(&s)[0].1.to_vec();
                    let sealed = ring.seal(&Aad::new(source, id, Column::Subject), s.as_bytes())?;
                    Ok((
                        sealed.ciphertext().to_vec(),
                        sealed.nonce().to_vec(),
                        digest,
                    ))
                })
                .transpose()
                .map_err(refused)?;
            return Ok(d.with_sealed(crate::store::SealedBody {
                key_id: body.key_id().to_owned(),
                body_nonce: body.nonce().to_vec(),
                body: body.into_ciphertext(),
                headers,
                subject,
            }));
        }
        let _ = (event, headers);
        Ok(d)
    }

    /// `outcome` with its error text sealed for `row`'s route, when the inbox has keys;
    /// the crate's own texts (a panic's), which carry no payload, stay in clear.
    pub(crate) fn sealed_outcome(&self, row: &HeldRow, outcome: Outcome) -> Outcome {
        #[cfg(feature = "seal")]
        if let Some(ring) = &self.keys {
            use crate::sql::sealed::{crate_text, seal_error};
            let seal = |text: String| {
                if crate_text(&text) {
                    return text;
                }
                seal_error(ring, &row.source, &row.id, &row.processor, &text)
            };
            return match outcome {
                Outcome::Retry(text, after) => Outcome::Retry(seal(text), after),
                Outcome::Dead(text) => Outcome::Dead(seal(text)),
                other => other,
            };
        }
        let _ = row;
        outcome
    }
}

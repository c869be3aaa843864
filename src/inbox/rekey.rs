//! Rotation's last step (issue 34 step 3, `docs/design/payload-protection.md` §9):
//! [`Inbox::rekey`] rewrites what was sealed under an older key, or stored in clear,
//! under the ring's current key, so the older key can then be removed.
//!
//! A batch at a time: its rows read from the database (bodies from the covering index
//! `webhook_bodies_key`, never a body's pages until it is a candidate), opened and sealed
//! again in Rust off the writer, then written in one transaction (on SQLite one operation
//! of its one writer, waiting its turn like any write and holding it for one batch only),
//! each row compare-and-set on what was read, so a concurrent erase, expiry, re-accept or
//! another replica's rekey wins. Bodies first (each with its headers and subject), then
//! the error texts of routes and attempts. Nothing to remember between runs: a rerun
//! finds what is left.

use super::Inbox;
use crate::sql::rekey::{
    reseal_body, reseal_error, BodyKey, BodyRewrite, BodyRow, ErrorRewrite, ErrorRow, Resealed,
    Rewrites, RouteKey,
};
use crate::store::{StoreError, StoreErrorKind, StoreFuture};

/// What [`Inbox::rekey`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rekeyed {
    /// Stored values rewritten under the current key: body rows (each with its headers
    /// and subject), routes' errors and attempts' errors, one each.
    pub rekeyed: u64,
    /// Stored values no configured key opens (sealed under a key no longer in the ring,
    /// or altered): left as they are, never deleted. Configure their key again and rerun,
    /// or they stay unreadable.
    pub unreadable: u64,
}

/// Default batch: the rows read, sealed again and written in one transaction.
pub const REKEY_BATCH: usize = 100;

/// Rekey's reads and writes, per dialect.
pub(crate) trait Rekeying: Send + Sync {
    /// Up to `limit` body rows' keys stored in clear (`key_id` NULL), after `after`
    /// (source, id), in the index's order.
    fn clear_bodies(&self, after: (String, String), limit: usize) -> StoreFuture<Vec<BodyKey>>;
    /// Up to `limit` body rows' keys sealed under a key other than `current`, after
    /// `after` (key id, source, id), in the index's order.
    fn stale_bodies(
        &self,
        current: String,
        after: (String, String, String),
        limit: usize,
    ) -> StoreFuture<Vec<BodyKey>>;
    /// These body rows whole (those still there).
    fn bodies(&self, keys: Vec<(String, String)>) -> StoreFuture<Vec<BodyRow>>;
    /// Up to `limit` routes after `after` whose error, or an attempt's, does not start
    /// with `prefix` (the current key's sealed prefix), in key order; and their error
    /// texts that do not, one a column (its own and each attempt's).
    fn stale_errors(
        &self,
        prefix: String,
        after: RouteKey,
        limit: usize,
    ) -> StoreFuture<(Vec<RouteKey>, Vec<ErrorRow>)>;
    /// Writes the rewrites in one transaction, each compare-and-set; how many values
    /// changed.
    fn rewrite(&self, rewrites: Rewrites) -> StoreFuture<u64>;
}

impl Inbox {
    /// Rewrites every stored value sealed under a key other than the ring's current one,
    /// or stored in clear (before the inbox had keys), under the current key, `batch`
    /// rows at a time (at least 1; [`REKEY_BATCH`] is a fair default), each batch in one
    /// transaction: body rows (with their headers), then the error texts of routes and
    /// attempts. The crate's own texts (a crash, a shutdown, why a body was refused) stay
    /// in clear.
    ///
    /// Rotation: give every replica the new key second in its ring (opening), then first
    /// (sealing), run this, and only then remove the old key: what it leaves unreadable
    /// (it says how many) would otherwise be lost with that key.
    ///
    /// Safe beside the workers, accepts and other replicas: each row is written only if
    /// it is still what was read (its key id and nonce; an error, its text), so a change
    /// in between wins and is not overwritten; a rerun finds what is left, so it can be
    /// stopped at any time. A value no configured key opens is left as it is and counted
    /// in [`Rekeyed::unreadable`], never deleted.
    ///
    /// # Errors
    ///
    /// The database failed (what was written before stays written); the system's random
    /// source failed (nothing more is sealed); or the inbox has no keys
    /// ([`with_keys`](Self::with_keys)): [`StoreErrorKind::InvalidInput`].
    pub async fn rekey(&self, batch: usize) -> Result<Rekeyed, StoreError> {
        let Some(ring) = self.keys.clone() else {
            return Err(StoreError::new(
                "inbox rekey",
                "the inbox has no encryption keys to rekey under (Inbox::with_keys)",
            )
            .with_kind(StoreErrorKind::InvalidInput));
        };
        let batch = batch.max(1);
        let store = self.backend.rekeying();
        let refused = |e: crate::seal::SealError| StoreError::new("inbox rekey", e);
        let mut done = Rekeyed::default();

        // Bodies in clear, then those under other keys: two ranges of the index, walked
        // once each (a row left unreadable is passed, not read again).
        let mut clear = Some((String::new(), String::new()));
        let mut stale = (String::new(), String::new(), String::new());
        loop {
            let mut keys = Vec::new();
            if let Some(after) = clear.take() {
                keys = store.clear_bodies(after, batch).await?;
                clear = keys.last().map(|(_, s, id)| (s.clone(), id.clone()));
            }
            if clear.is_none() {
                keys = store
                    .stale_bodies(ring.current_id().to_owned(), stale.clone(), batch)
                    .await?;
                let Some((key_id, source, id)) = keys.last() else {
                    break;
                };
                let key_id = key_id.clone().unwrap_or_default();
                stale = (key_id, source.clone(), id.clone());
            }
            let keys = keys.into_iter().map(|(_, s, id)| (s, id)).collect();
            let mut rewrites: Vec<BodyRewrite> = Vec::new();
            for row in store.bodies(keys).await? {
                match reseal_body(&ring, row).map_err(refused)? {
                    Resealed::Rewrite(rewrite) => rewrites.push(rewrite),
                    Resealed::Unreadable => done.unreadable += 1,
                    Resealed::Kept => {}
                }
            }
            if !rewrites.is_empty() {
                done.rekeyed += store.rewrite(Rewrites::Bodies(rewrites)).await?;
            }
        }

        // Error texts: the routes in key order, each with its attempts'.
        let prefix = format!("{}{}:", crate::sql::sealed::ERROR_PREFIX, ring.current_id());
        let mut after = (String::new(), String::new(), String::new());
        loop {
            let (routes, texts) = store.stale_errors(prefix.clone(), after, batch).await?;
            let Some(last) = routes.into_iter().last() else {
                break;
            };
            after = last;
            // A route's error is its last attempt's text too: each text sealed once, and
            // counted once per column holding it.
            let mut distinct = std::collections::BTreeMap::new();
            for row in texts {
                let key = (row.source, row.event_id, row.processor, row.text);
                *distinct.entry(key).or_insert(0_u64) += 1;
            }
            let mut rewrites: Vec<ErrorRewrite> = Vec::new();
            for ((source, event_id, processor, text), columns) in distinct {
                let row = ErrorRow {
                    source,
                    event_id,
                    processor,
                    text,
                };
                match reseal_error(&ring, row).map_err(refused)? {
                    Resealed::Rewrite(rewrite) => rewrites.push(rewrite),
                    Resealed::Unreadable => done.unreadable += columns,
                    Resealed::Kept => {}
                }
            }
            if !rewrites.is_empty() {
                done.rekeyed += store.rewrite(Rewrites::Errors(rewrites)).await?;
            }
        }
        Ok(done)
    }

    /// The inbox's keys, if it has any.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))] // the admin route's 409
    pub(crate) fn keys(&self) -> Option<&crate::seal::KeyRing> {
        self.keys.as_ref()
    }
}

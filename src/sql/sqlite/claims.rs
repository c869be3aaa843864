//! `DedupeLayer`'s claims of an event key: claim, renew, complete, release, prune.

use std::time::Duration;

use sqlx::Row;

use super::super::shared::not_claimed;
use super::super::{store_error, CLAIM_TRIES};
use super::super::{KeyOp, Keyed};
use super::{bind_claim, ms, Done, Op, Sqlite};
use crate::store::{Claim, Delivery, StoreError, Token};

/// A new key, or one released or expired taken over, in one statement: SQLite's one
/// writer makes the upsert's check and write atomic. The row keeps the event's type,
/// object id and livemode, never its body (`bind_claim`).
pub(super) const CLAIM: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, received_at, attempts, locked_until, lock_token, kind)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?8, ?9)
ON CONFLICT (source, event_id) DO UPDATE SET
    locked_until = excluded.locked_until,
    lock_token = excluded.lock_token,
    attempts = webhook_events.attempts + 1
WHERE webhook_events.processed_at IS NULL AND webhook_events.next_attempt_at IS NULL
  AND (webhook_events.locked_until IS NULL OR webhook_events.locked_until <= ?6)
RETURNING lock_token";

/// Why a claim took nothing: done (or the inbox's: an accepted event is a duplicate to
/// `DedupeLayer`), else claimed until when.
pub(super) const STATE: &str = "
SELECT processed_at IS NOT NULL OR next_attempt_at IS NOT NULL, locked_until
FROM webhook_events WHERE source = ?1 AND event_id = ?2";

/// A claim's completion: the done row keeps its token, so a retry whose first
/// acknowledgement was lost matches again (and changes nothing). A claim row the inbox
/// adopted is the inbox's (`INBOX_HAS`).
pub(super) const COMPLETE: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4), processing_error = NULL,
    locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND next_attempt_at IS NULL";

pub(super) const RENEW: &str = "
UPDATE webhook_events SET locked_until = ?4
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
  AND next_attempt_at IS NULL";

pub(super) const RELEASE: &str = "
UPDATE webhook_events SET locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
  AND next_attempt_at IS NULL";

/// Whether the key is the inbox's: the claim whose completion or renewal did not match
/// was adopted by the inbox's accept — its handler stored it. One mechanism per event: the
/// claim leaves the row to the inbox's worker, and its attempt is done (the event stored).
pub(super) const INBOX_HAS: &str = "
SELECT 1 FROM webhook_events WHERE source = ?1 AND event_id = ?2 AND next_attempt_at IS NOT NULL";

/// Done event keys older than the cutoff, and event keys a failed attempt gave back
/// (released, or a lease long run out) first received before it: the provider has stopped
/// retrying those. The inbox's unprocessed rows (`next_attempt_at` set) are the inbox's to
/// prune; `Once` keys are pruned only by name (`PRUNE_ONCE`).
pub(super) const PRUNE: &str = "
DELETE FROM webhook_events
WHERE kind = 'event'
  AND ((processed_at IS NOT NULL AND processed_at < ?1)
    OR (processed_at IS NULL AND next_attempt_at IS NULL AND received_at < ?1
        AND (locked_until IS NULL OR locked_until <= ?2)))";

pub(super) const PRUNE_ONCE: &str = "
DELETE FROM webhook_events
WHERE kind IN ('once', 'kept') AND source = ?1 AND processed_at IS NOT NULL AND processed_at < ?2";

impl Sqlite {
    /// Answers a dedupe store's [`KeyOp`]: each through the one writer.
    pub(crate) async fn key(&self, op: KeyOp) -> Result<Keyed, StoreError> {
        let op = match op {
            KeyOp::Claim(d, token, lease) => Op::Claim(d, token, lease),
            KeyOp::Renew(d, token, lease) => {
                Op::Renew(d.source().into(), d.id().into(), token, lease)
            }
            KeyOp::Complete(d, token) => Op::Complete(d.source().into(), d.id().into(), token),
            KeyOp::Release(d, token) => Op::Release(d.source().into(), d.id().into(), token),
            KeyOp::Prune(older_than) => Op::Prune(older_than),
            KeyOp::PruneOnce(namespace, older_than) => Op::PruneOnce(namespace, older_than),
        };
        Ok(match self.write(op).await? {
            Done::Claim(claim) => Keyed::Claim(claim),
            Done::Held(held) => Keyed::Held(held),
            Done::Count(n) => Keyed::Count(n),
            _ => unreachable!("a key's answer"),
        })
    }
}

/// One claim: a new row, or one released or expired taken over; else why not.
pub(super) async fn claim_one(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    d: &Delivery,
    token: Token,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let err = |e| store_error("sqlite claim", e);
    for _ in 0..CLAIM_TRIES {
        let claimed = bind_claim(sqlx::query(CLAIM), d)
            .bind(now)
            .bind(now.saturating_add(ms(lease)))
            .bind(token.to_string())
            .bind(d.kind())
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if claimed.is_some() {
            return Ok(Claim::New(token));
        }
        let row = sqlx::query(STATE)
            .bind(d.source())
            .bind(d.id())
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        let Some(row) = row else { continue };
        let until: Option<i64> = row.try_get(1).map_err(err)?;
        let held = until
            .filter(|until| *until > now)
            .map(|until| Duration::from_millis((until - now).unsigned_abs()));
        if let Some(claim) = not_claimed(row.try_get(0).map_err(err)?, held) {
            return Ok(claim);
        }
    }
    Ok(Claim::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

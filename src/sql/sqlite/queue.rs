//! The inbox: accept, and the worker's claims, renewals and outcomes (see the
//! [state diagram](super::super)).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::super::shared;
use super::super::{claimed, store_error, Outcome, OBJECT_INDEX};
use super::{Done, Op, Sqlite};
use crate::inbox::backend::{Backend, Claimed, HeldRow};
use crate::inbox::worker::due::DueTimes;
use crate::inbox::worker::ClaimDue;
use crate::inbox::Pause;
use crate::inbox::{Accepted, Counts, DeadRows, EventSummary, Listing, Requeue, StoredEvent};
use crate::store::{Delivery, StoreError, StoreFuture, Token};

/// A new row queued, with the delivery's request headers (`?9`, credentials left out) and
/// its place in arrival order (`?10`, the writer's next number); a
/// row `DedupeLayer` left unfinished is queued instead (adopted), its
/// claim's lock dropped: the row is the inbox's from now on, due at once (a `DedupeLayer`
/// in front of this accept then finds it done, `INBOX_HAS`).
pub(super) const ACCEPT: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, received_at, attempts, next_attempt_at, kind,
     headers, arrival)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?7, ?8, ?9, ?10)
ON CONFLICT (source, event_id) DO UPDATE SET next_attempt_at = ?7, attempts = 0,
    locked_until = NULL, lock_token = NULL, headers = ?9, arrival = ?10
WHERE webhook_events.next_attempt_at IS NULL AND webhook_events.processed_at IS NULL
  AND webhook_events.kind <> 'once'";

/// SQLite has one writer: this UPDATE is atomic, no two workers get the same row; the rows
/// the claiming worker holds (`?9`: running, or their outcome not yet written) are left,
/// whatever their lease says. A due
/// row whose every attempt ended without an outcome (each crashed its worker) is left as
/// it was (every SET sees the old row) and returned `buried`, for `BURY_CRASHED` to mark
/// dead in the same transaction: a claim that assigned `dead_at` or `processing_error`
/// would rewrite every claimed row's entries in the partial indexes over them (about 6 %
/// of the drain with a per-object cap, `benches/sql/claim.py`). The attempt's start is
/// kept for its record; a trigger records the attempt before it as crashed when it never
/// finished (the migration `webhook_events_history`).
/// Under a per-object cap of n (`?6`), a row is claimed while fewer than n of its
/// object's other unfinished rows run or came before it (in arrival order: rows no accept
/// numbered, from before, first by time and key): counted up to n and no further,
/// so an object with a backlog of thousands costs a claim n rows of it, not its whole
/// backlog.
pub(super) const CLAIM_DUE: &str = "
UPDATE webhook_events
SET attempts = attempts + (attempts < ?5),
    locked_until = CASE WHEN attempts < ?5 THEN ?1 + ?2 ELSE locked_until END,
    lock_token = CASE WHEN attempts < ?5 THEN ?3 ELSE lock_token END,
    attempt_started_at = CASE WHEN attempts < ?5 THEN ?1 ELSE attempt_started_at END
WHERE rowid IN (
    SELECT rowid FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?1
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= ?1)
      AND NOT EXISTS (SELECT 1 FROM webhook_pauses p
          WHERE p.source IN ('', webhook_events.source)
            AND p.event_type IN ('', coalesce(webhook_events.event_type, '')))
      AND (?6 IS NULL OR object_id IS NULL OR (
          SELECT count(*) FROM (SELECT 1 FROM webhook_events o
          WHERE o.object_id = webhook_events.object_id AND o.rowid <> webhook_events.rowid
            AND o.source = webhook_events.source
            AND o.next_attempt_at IS NOT NULL AND o.processed_at IS NULL AND o.dead_at IS NULL
            AND (o.locked_until > ?1 OR (coalesce(o.arrival, 0), o.received_at, o.event_id)
                < (coalesce(webhook_events.arrival, 0), webhook_events.received_at,
                   webhook_events.event_id))
          LIMIT ?6)) < ?6)
      AND source NOT IN (SELECT value FROM json_each(?7))
      AND coalesce(event_type, '') NOT IN (SELECT value FROM json_each(?8))
      AND (source, event_id) NOT IN (SELECT value ->> 0, value ->> 1 FROM json_each(?9))
    ORDER BY next_attempt_at LIMIT ?4)
RETURNING source, event_id, event_type, object_id, livemode, body, attempts,
    lock_token IS NOT ?3 AS buried";

/// A row the claim found crashed too often (`?1`, `?2`): dead, with `?4` after its last
/// error. Assigning `attempts` fires the trigger that records its last attempt as crashed.
pub(super) const BURY_CRASHED: &str = "
UPDATE webhook_events SET attempts = attempts, dead_at = ?3,
    processing_error = coalesce(processing_error || '; then ', '') || ?4,
    locked_until = NULL, lock_token = NULL, attempt_started_at = NULL
WHERE source = ?1 AND event_id = ?2";

/// How many milliseconds after `?1` the earliest queued row not due by then falls due: on
/// the due rows' index, one row read.
const NEXT_DUE: &str = "
SELECT next_attempt_at - ?1 FROM webhook_events
WHERE next_attempt_at > ?1 AND processed_at IS NULL AND dead_at IS NULL
ORDER BY next_attempt_at LIMIT 1";

/// Numbers `?1` accepts in arrival order: the last of them comes back.
pub(super) const TAKE_ARRIVALS: &str =
    "UPDATE webhook_arrivals SET last = last + ?1 RETURNING last";

/// An operator's pause (`?1` source, `?2` type, `''`: any); a second one changes nothing.
pub(super) const PAUSE: &str = "
INSERT INTO webhook_pauses (source, event_type, paused_at) VALUES (?1, ?2, ?3)
ON CONFLICT DO NOTHING";

pub(super) const RESUME: &str = "DELETE FROM webhook_pauses WHERE source = ?1 AND event_type = ?2";

const PAUSES: &str =
    "SELECT source, event_type, paused_at FROM webhook_pauses ORDER BY source, event_type";

/// Claimed rows a worker hands back unprocessed (its claim was answered too late to run
/// them safely): due again at once, the attempt uncounted.
pub(super) const GIVE_BACK: &str = "
UPDATE webhook_events SET attempts = attempts - 1, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3
  AND processed_at IS NULL AND dead_at IS NULL";

pub(super) const RENEW_ROW: &str = "
UPDATE webhook_events SET locked_until = ?4
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

/// The row processed; kept idempotent under its token like a claim's completion. Its
/// attempt is no row of `webhook_attempts`: the row's own `attempt_started_at` and
/// `processed_at` are its record (read back as one by `ATTEMPTS`; a requeue copies it into
/// the table), so the drain's outcomes write nothing more than before. The other finishes
/// return the attempt's number and start, for the writer to record.
pub(super) const PROCESSED: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4), processing_error = NULL,
    locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3";

pub(super) const RETRY: &str = "
UPDATE webhook_events SET next_attempt_at = ?4, processing_error = ?5,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
RETURNING attempts, attempt_started_at";

pub(super) const DEAD: &str = "
UPDATE webhook_events SET dead_at = ?4, processing_error = ?5,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
RETURNING attempts, attempt_started_at";

/// Snoozed by the processor: due again at `?4`, the attempt uncounted (its record keeps
/// the number it ran as).
pub(super) const LATER: &str = "
UPDATE webhook_events SET next_attempt_at = ?4, attempts = attempts - 1,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
RETURNING attempts + 1, attempt_started_at";

pub(super) const ABANDON: &str = "
UPDATE webhook_events SET processing_error = ?4, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
RETURNING attempts, attempt_started_at";

/// The attempts a batch finished, in its transaction: one statement for the batch,
/// whatever its size (a statement per attempt would cost the drain a round trip to
/// SQLite's thread each; a trigger could not tell the outcome). `?1`: a JSON array of
/// `[source, id, attempt, started, finished, outcome, error]`.
pub(super) const RECORD_ATTEMPTS: &str = "
INSERT INTO webhook_attempts (source, event_id, attempt, started_at, finished_at, outcome, error)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6
FROM json_each(?1)";

/// An event's attempt records past the newest `?3` deleted (after a failing, snoozed or
/// abandoned attempt added its own: see `MAX_ATTEMPT_RECORDS`).
pub(super) const CAP_ATTEMPTS: &str = "
DELETE FROM webhook_attempts WHERE rowid IN (
    SELECT rowid FROM webhook_attempts WHERE source = ?1 AND event_id = ?2
    ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?3)";

pub(super) const REQUEUE: &str = "
UPDATE webhook_events
SET next_attempt_at = ?1, attempts = 0, processed_at = NULL, dead_at = NULL,
    processing_error = NULL, locked_until = NULL, lock_token = NULL
WHERE next_attempt_at IS NOT NULL
  AND (locked_until IS NULL OR locked_until <= ?1)
  AND (?2 IS NULL OR (source = ?2 AND event_id = ?3))
  AND (?4 = 0 OR dead_at IS NOT NULL)
  AND (?5 IS NULL OR event_type = ?5)
  AND (?6 IS NULL OR received_at >= ?6)
  AND (?7 IS NULL OR received_at < ?7)";

/// Processed inbox rows older than the cutoff (and the keys deleted dead rows left, done
/// that long ago: done, without a token), and (by name only) dead ones: two
/// statements, each on its partial index (a `CASE` between them would use neither).
/// Kept rows (no signed time: only the row refuses a replay) are pruned by name only.
pub(super) const PRUNE_PROCESSED: &str = "
DELETE FROM webhook_events WHERE kind = 'event' AND processed_at IS NOT NULL
AND processed_at < ?1 AND (next_attempt_at IS NOT NULL OR lock_token IS NULL)";

/// Dead rows deleted: each leaves its key, done at `?4` (no longer the inbox's: its body,
/// headers, error and history go), so its delivery posted again is a duplicate until the
/// retention has passed (the migration `webhook_events_deleted`).
pub(super) const PRUNE_DEAD: &str = "
UPDATE webhook_events SET next_attempt_at = NULL, processed_at = ?4, dead_at = NULL,
    body = NULL, headers = NULL, processing_error = NULL, attempt_started_at = NULL,
    locked_until = NULL, lock_token = NULL
WHERE next_attempt_at IS NOT NULL AND kind <> 'once'
AND dead_at IS NOT NULL AND dead_at < ?1
AND (?2 IS NULL OR source = ?2) AND (?3 IS NULL OR event_type = ?3)";

impl Sqlite {
    /// Queues a verified event in the inbox.
    pub(crate) async fn accept(&self, d: Delivery) -> Result<Accepted, StoreError> {
        match self.write(Op::Accept(d)).await? {
            Done::Accept(accepted) => Ok(accepted),
            _ => unreachable!("an accept's answer"),
        }
    }
}

#[cfg(test)]
impl Sqlite {
    /// The worker's claim, unwrapped.
    pub(super) async fn claim_due(
        &self,
        limit: usize,
        lease: Duration,
        token: Token,
    ) -> Vec<Claimed> {
        Backend::claim(self, ClaimDue::plain(limit, lease, token))
            .await
            .unwrap()
    }
}

impl Backend for Sqlite {
    fn accept(&self, d: Delivery) -> StoreFuture<Accepted> {
        let this = self.clone();
        Box::pin(async move { this.accept(d).await })
    }

    fn claim(&self, due: ClaimDue) -> StoreFuture<Vec<Claimed>> {
        let this = self.clone();
        Box::pin(async move {
            match this.write(Op::ClaimDue(due)).await? {
                Done::Claimed(rows) => Ok(claimed(rows)),
                _ => unreachable!("a claim's rows"),
            }
        })
    }

    fn give_back(&self, keys: Vec<(String, String)>, token: Token) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::GiveBack(keys, token)).await })
    }

    fn renew(&self, row: HeldRow, lease: Duration) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::RenewRow(row, lease)).await })
    }

    fn finish(&self, row: HeldRow, outcome: Outcome) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::Finish(row, outcome)).await })
    }

    fn requeue(&self, which: &Requeue) -> StoreFuture<u64> {
        let (this, which) = (self.clone(), which.clone());
        Box::pin(async move { this.count(Op::Requeue(which)).await })
    }

    fn pause(&self, source: String, event_type: String, pause: bool) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            let changed = this.count(Op::Pause(source, event_type, pause)).await?;
            Ok(changed > 0)
        })
    }

    fn object_index(&self) -> StoreFuture<()> {
        shared::object_index(&self.pool, OBJECT_INDEX)
    }

    fn pauses(&self) -> StoreFuture<Vec<Pause>> {
        shared::pauses(&self.pool, PAUSES)
    }

    fn prune(&self, older_than: Duration, dead: Option<&DeadRows>) -> StoreFuture<u64> {
        let (this, dead) = (self.clone(), dead.cloned());
        Box::pin(async move { this.count(Op::PruneRows(older_than, dead)).await })
    }

    fn min_lease(&self) -> Duration {
        Sqlite::min_lease(self)
    }

    fn counts(&self) -> StoreFuture<Counts> {
        super::listing::counts(&self.pool, self.now_ms())
    }

    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        super::listing::list(&self.pool, self.now_ms(), listing)
    }

    fn processed_per_minute(&self, minutes: u32) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
        super::listing::processed_per_minute(&self.pool, self.now_ms(), minutes)
    }

    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        super::listing::event(&self.pool, self.now_ms(), source, id)
    }

    fn next_due(&self) -> StoreFuture<Option<Duration>> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            let after: Option<i64> = sqlx::query_scalar(NEXT_DUE)
                .bind(now)
                .fetch_optional(&pool)
                .await
                .map_err(|e| store_error("inbox next due", e))?;
            Ok(after.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
        })
    }

    /// No notifications: a process's own accepts wake its workers, its own retries tell
    /// them when they fall due (another process's are read at a claim).
    fn listen(&self, _: Arc<Notify>, _: DueTimes) -> Option<tokio::task::JoinHandle<()>> {
        None
    }
}

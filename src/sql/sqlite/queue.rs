//! The inbox: accept, and the worker's claims, renewals and outcomes, on the events'
//! routes (see the [state diagram](super::super) and the migration
//! `webhook_routes`). Every route statement binds its processor.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::super::shared;
use super::super::{claimed, store_error, Outcome};
#[cfg(test)]
use super::PROCESSOR;
use super::{Done, Op, Sqlite};
use crate::inbox::backend::{Backend, Claimed, HeldRow};
use crate::inbox::worker::due::Dues;
use crate::inbox::worker::ClaimDue;
use crate::inbox::Pause;
use crate::inbox::StoredEvent;
use crate::inbox::{Accepted, Counts, DeadRows, EventSummary, Listing, Requeue, Requeued};
use crate::store::{Delivery, StoreError, StoreFuture, Token};

/// A new event: its key and metadata, `next_attempt_at` its accept time (`?7`: the marker
/// "the inbox's", which never moves), its place in arrival order (`?10`, the writer's next
/// number). A row `DedupeLayer` left unfinished is the event instead (adopted): its
/// claim's lock and inline body dropped, the row is the inbox's from now on (a
/// `DedupeLayer` in front of this accept then finds it done, `INBOX_HAS`). The body
/// (`?6`) and headers (`?9`), bound here as the other accepts bind them, go to
/// `webhook_bodies` ([`ACCEPT_BODIES`]), the state to the event's routes
/// ([`ACCEPT_ROUTES`]), when this changed the row: both once for a run of accepts. The
/// accept's trace context (`?11`, `?12`: feature `otel`, else NULL) stays with the event.
pub(super) const ACCEPT: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, received_at, attempts, next_attempt_at, kind,
     arrival, traceparent, tracestate)
VALUES (?1, ?2, ?3, ?4, ?5, ?7, 0, ?7, ?8, ?10, ?11, ?12)
ON CONFLICT (source, event_id) DO UPDATE SET next_attempt_at = ?7, attempts = 0,
    locked_until = NULL, lock_token = NULL, body = NULL, arrival = ?10,
    traceparent = ?11, tracestate = ?12
WHERE webhook_events.next_attempt_at IS NULL AND webhook_events.processed_at IS NULL
  AND webhook_events.kind <> 'once'";

/// The bodies and request headers (credentials left out) of a run of accepts, in one
/// statement, without JSON (`json_each` rendered an entry back to text for each field
/// read from it, and parsed it again: most of the statement's cost): `?2` the run's byte
/// strings end to end, a blob (`substr` counts its bytes from 1, in constant time); `?1`
/// a blob of fixed records, one an accept, of 22 numbers of 10 decimal digits: the start
/// and length in `?2` of its source, id, key id, body, headers, body nonce, sealed
/// headers, headers nonce, sealed subject, subject nonce and subject digest, in that
/// order, start 0 for none (NULL: in clear no key id and no sealed parts; sealed, no
/// headers in clear). The text columns get text (`CAST`: the same bytes), the others
/// blobs, as they always had. An adopted claim's row is overwritten whole, its key id
/// with its ciphertext (P6).
pub(super) const ACCEPT_BODIES: &str = "
WITH RECURSIVE entry(at) AS (
    SELECT 1 UNION ALL SELECT at + 220 FROM entry WHERE at + 220 <= length(?1)
)
INSERT INTO webhook_bodies
    (source, event_id, body, headers, key_id, body_nonce, sealed_headers, headers_nonce,
     sealed_subject, subject_nonce, subject_digest)
SELECT CAST(substr(?2, NULLIF(CAST(substr(?1, at + 0, 10) AS INTEGER), 0), CAST(substr(?1, at + 10, 10) AS INTEGER)) AS TEXT),
    CAST(substr(?2, NULLIF(CAST(substr(?1, at + 20, 10) AS INTEGER), 0), CAST(substr(?1, at + 30, 10) AS INTEGER)) AS TEXT),
    substr(?2, NULLIF(CAST(substr(?1, at + 60, 10) AS INTEGER), 0), CAST(substr(?1, at + 70, 10) AS INTEGER)),
    CAST(substr(?2, NULLIF(CAST(substr(?1, at + 80, 10) AS INTEGER), 0), CAST(substr(?1, at + 90, 10) AS INTEGER)) AS TEXT),
    CAST(substr(?2, NULLIF(CAST(substr(?1, at + 40, 10) AS INTEGER), 0), CAST(substr(?1, at + 50, 10) AS INTEGER)) AS TEXT),
    substr(?2, NULLIF(CAST(substr(?1, at + 100, 10) AS INTEGER), 0), CAST(substr(?1, at + 110, 10) AS INTEGER)),
    substr(?2, NULLIF(CAST(substr(?1, at + 120, 10) AS INTEGER), 0), CAST(substr(?1, at + 130, 10) AS INTEGER)),
    substr(?2, NULLIF(CAST(substr(?1, at + 140, 10) AS INTEGER), 0), CAST(substr(?1, at + 150, 10) AS INTEGER)),
    substr(?2, NULLIF(CAST(substr(?1, at + 160, 10) AS INTEGER), 0), CAST(substr(?1, at + 170, 10) AS INTEGER)),
    substr(?2, NULLIF(CAST(substr(?1, at + 180, 10) AS INTEGER), 0), CAST(substr(?1, at + 190, 10) AS INTEGER)),
    substr(?2, NULLIF(CAST(substr(?1, at + 200, 10) AS INTEGER), 0), CAST(substr(?1, at + 210, 10) AS INTEGER))
FROM entry WHERE true
ON CONFLICT (source, event_id) DO UPDATE SET body = excluded.body, headers = excluded.headers,
    key_id = excluded.key_id, body_nonce = excluded.body_nonce,
    sealed_headers = excluded.sealed_headers, headers_nonce = excluded.headers_nonce,
    sealed_subject = excluded.sealed_subject, subject_nonce = excluded.subject_nonce,
    subject_digest = excluded.subject_digest";

/// The routes of a run of accepts, in one statement: `?1` a JSON array of `[source, id,
/// [processor, …]]`, one entry an event, each route queued and due at its event's accept
/// time, its immutable columns copied from the event (an adopted claim's own), found by
/// key (`CROSS JOIN`: the array outer, one primary-key probe an event, not a route).
pub(super) const ACCEPT_ROUTES: &str = "
INSERT INTO webhook_routes
    (source, event_id, processor, event_type, object_id, arrival, received_at, attempts,
     next_attempt_at)
SELECT e.source, e.event_id, p.value, e.event_type, e.object_id, e.arrival, e.received_at, 0,
    e.next_attempt_at
FROM json_each(?1) AS r CROSS JOIN webhook_events AS e CROSS JOIN json_each(r.value, '$[2]') AS p
WHERE e.source = r.value ->> 0 AND e.event_id = r.value ->> 1
ON CONFLICT (source, event_id, processor) DO NOTHING";

/// SQLite has one writer: this UPDATE is atomic, no two workers get the same route; the
/// routes the claiming worker holds (`?9`: running, or their outcome not yet written) are
/// left, whatever their lease says. A due route whose every attempt ended without an
/// outcome (each crashed its worker) is left as it was (every SET sees the old row) and
/// returned `buried`, for `BURY_CRASHED` to mark dead in the same transaction: a claim
/// that assigned `dead_at` or `processing_error` would rewrite every claimed route's
/// entries in the partial indexes over them (about 6 % of the drain with a per-object
/// cap, `benches/sql/claim.py`). The attempt's start is kept for its record; a trigger
/// records the attempt before it as crashed when it never finished.
/// Under a per-object cap of n (`?6`), a route is claimed while fewer than n of its
/// object's other unfinished routes of its processor run or came before it (in arrival
/// order: routes no accept numbered, from before, first by time and key): counted up to n
/// and no further, so an object with a backlog of thousands costs a claim n routes of it,
/// not its whole backlog: on `webhook_routes_by_object`, which the count's terms must not
/// let the due routes' index take over (with the processor leading both): it leaves out
/// `next_attempt_at IS NOT NULL`, implied (a tombstone is processed). The processor
/// (`?10`) leads the due routes' index. `RETURNING`
/// cannot join: [`CLAIMED_BODIES`] reads the livemode and body after it.
pub(super) const CLAIM_DUE: &str = "
UPDATE webhook_routes
SET attempts = attempts + (attempts < ?5),
    locked_until = CASE WHEN attempts < ?5 THEN ?1 + ?2 ELSE locked_until END,
    lock_token = CASE WHEN attempts < ?5 THEN ?3 ELSE lock_token END,
    attempt_started_at = CASE WHEN attempts < ?5 THEN ?1 ELSE attempt_started_at END
WHERE rowid IN (
    SELECT rowid FROM webhook_routes
    WHERE processor = ?10 AND next_attempt_at IS NOT NULL AND next_attempt_at <= ?1
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= ?1)
      AND NOT EXISTS (SELECT 1 FROM webhook_pauses p
          WHERE p.processor IN ('', webhook_routes.processor)
            AND p.source IN ('', webhook_routes.source)
            AND p.event_type IN ('', coalesce(webhook_routes.event_type, '')))
      AND (?6 IS NULL OR object_id IS NULL OR (
          SELECT count(*) FROM (SELECT 1 FROM webhook_routes o
          WHERE o.processor = webhook_routes.processor
            AND o.object_id = webhook_routes.object_id AND o.rowid <> webhook_routes.rowid
            AND o.source = webhook_routes.source
            AND o.processed_at IS NULL AND o.dead_at IS NULL
            AND (o.locked_until > ?1 OR (coalesce(o.arrival, 0), o.received_at, o.event_id)
                < (coalesce(webhook_routes.arrival, 0), webhook_routes.received_at,
                   webhook_routes.event_id))
          LIMIT ?6)) < ?6)
      AND source NOT IN (SELECT value FROM json_each(?7))
      AND coalesce(event_type, '') NOT IN (SELECT value FROM json_each(?8))
      AND (source, event_id) NOT IN (SELECT value ->> 0, value ->> 1 FROM json_each(?9))
    ORDER BY next_attempt_at LIMIT ?4)
RETURNING source, event_id, event_type, object_id, attempts, lock_token IS NOT ?3 AS buried,
    next_attempt_at";

/// The livemode and body of the events a claim took (`?1`, a JSON array of `[source,
/// id]`), why a body is gone, the accept's trace context and its time (`first_run`): one
/// statement for the claim, each a lookup by key.
pub(super) const CLAIMED_BODIES: &str = "
SELECT e.source, e.event_id, e.livemode, b.body, b.key_id, b.body_nonce, e.body_state,
    e.traceparent, e.tracestate, e.next_attempt_at
FROM json_each(?1) k
JOIN webhook_events e ON e.source = k.value ->> 0 AND e.event_id = k.value ->> 1
LEFT JOIN webhook_bodies b ON b.source = e.source AND b.event_id = e.event_id";

/// A route the claim found crashed too often (`?1`, `?2`, processor `?5`): dead, with
/// `?4` after its last error. Assigning `attempts` fires the trigger that records its last
/// attempt as crashed.
pub(super) const BURY_CRASHED: &str = "
UPDATE webhook_routes SET attempts = attempts, dead_at = ?3,
    processing_error = coalesce(processing_error || '; then ', '') || ?4,
    locked_until = NULL, lock_token = NULL, attempt_started_at = NULL
WHERE source = ?1 AND event_id = ?2 AND processor = ?5";

/// How many milliseconds after `?1` the earliest queued route of processor `?2` not due
/// by then falls due: on the due routes' index, one row read.
const NEXT_DUE: &str = "
SELECT next_attempt_at - ?1 FROM webhook_routes
WHERE processor = ?2 AND next_attempt_at > ?1 AND processed_at IS NULL AND dead_at IS NULL
ORDER BY next_attempt_at LIMIT 1";

/// Numbers `?1` accepts in arrival order: the last of them comes back.
pub(super) const TAKE_ARRIVALS: &str =
    "UPDATE webhook_arrivals SET last = last + ?1 RETURNING last";

/// An operator's pause (`?1` source, `?2` type, `?4` processor, `''`: any); a second one
/// changes nothing.
pub(super) const PAUSE: &str = "
INSERT INTO webhook_pauses (source, event_type, paused_at, processor) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT DO NOTHING";

pub(super) const RESUME: &str =
    "DELETE FROM webhook_pauses WHERE source = ?1 AND event_type = ?2 AND processor = ?3";

const PAUSES: &str = "
SELECT processor, source, event_type, paused_at FROM webhook_pauses
ORDER BY processor, source, event_type";

// The statements on one held route: its key `?1`, `?2`, the claim's token `?3`, its
// processor `?4` (a claim's token is shared by all its routes), the rest from `?5`.

/// A failed attempt's error `?6` as its route keeps it: NULL once the event's body is
/// gone for a recorded reason (an erase raced the attempt, P11: the error can quote the
/// payload), unless `?7`, the crate's own text.
macro_rules! kept_error {
    () => {
        "CASE WHEN ?7 OR NOT EXISTS (SELECT 1 FROM webhook_events AS e
        WHERE e.source = ?1 AND e.event_id = ?2 AND e.body_state IS NOT NULL) THEN ?6 END"
    };
}

/// Claimed routes a worker hands back unprocessed (its claim was answered too late to run
/// them safely): due again at once, the attempt uncounted.
pub(super) const GIVE_BACK: &str = "
UPDATE webhook_routes SET attempts = attempts - 1, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL AND dead_at IS NULL";

pub(super) const RENEW_ROW: &str = "
UPDATE webhook_routes SET locked_until = ?5
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL";

/// The route processed; kept idempotent under its token like a claim's completion. Its
/// attempt is no row of `webhook_attempts`: the route's own `attempt_started_at` and
/// `processed_at` are its record (read back as one by `ATTEMPTS`; a requeue copies it into
/// the table), so the drain's outcomes write nothing more than before. The other finishes
/// return the attempt's number and start, for the writer to record.
pub(super) const PROCESSED: &str = "
UPDATE webhook_routes SET processed_at = coalesce(processed_at, ?5), processing_error = NULL,
    locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4";

/// The error `?6` is dropped when the event lost its body meanwhile (erased, expired:
/// P11), unless `?7` says it is the crate's own text (it names no payload).
pub(super) const RETRY: &str = concat!(
    "
UPDATE webhook_routes SET next_attempt_at = ?5, processing_error = ",
    kept_error!(),
    ",
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL
RETURNING attempts, attempt_started_at"
);

/// As [`RETRY`], the error kept only as it says.
pub(super) const DEAD: &str = concat!(
    "
UPDATE webhook_routes SET dead_at = ?5, processing_error = ",
    kept_error!(),
    ",
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL
RETURNING attempts, attempt_started_at"
);

/// Snoozed by the processor: due again at `?5`, the attempt uncounted (its record keeps
/// the number it ran as).
pub(super) const LATER: &str = "
UPDATE webhook_routes SET next_attempt_at = ?5, attempts = attempts - 1,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL
RETURNING attempts + 1, attempt_started_at";

pub(super) const ABANDON: &str = "
UPDATE webhook_routes SET processing_error = ?5, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processor = ?4
  AND processed_at IS NULL
RETURNING attempts, attempt_started_at";

/// The attempts a batch finished, in its transaction: one statement for the batch,
/// whatever its size (a statement per attempt would cost the drain a round trip to
/// SQLite's thread each; a trigger could not tell the outcome). `?1`: a JSON array of
/// `[source, id, attempt, started, finished, outcome, error, processor, own]`; the error
/// dropped as [`RETRY`] drops it (an erase earlier in the batch, P11), unless `own`.
pub(super) const RECORD_ATTEMPTS: &str = "
INSERT INTO webhook_attempts
    (source, event_id, attempt, started_at, finished_at, outcome, error, processor)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5,
    CASE WHEN value ->> 8 OR NOT EXISTS (SELECT 1 FROM webhook_events AS e
        WHERE e.source = value ->> 0 AND e.event_id = value ->> 1
          AND e.body_state IS NOT NULL) THEN value ->> 6 END,
    value ->> 7
FROM json_each(?1)";

/// A route's attempt records past the newest `?3` deleted (after a failing, snoozed or
/// abandoned attempt added its own: see `MAX_ATTEMPT_RECORDS`); `?4` its processor.
pub(super) const CAP_ATTEMPTS: &str = "
DELETE FROM webhook_attempts WHERE rowid IN (
    SELECT rowid FROM webhook_attempts
    WHERE source = ?1 AND event_id = ?2 AND processor = ?4
    ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?3)";

/// The routes a requeue matches (every processor's, or `?8`'s; tombstones left), at `?1`.
macro_rules! requeue_matching {
    () => {
        "next_attempt_at IS NOT NULL
  AND (locked_until IS NULL OR locked_until <= ?1)
  AND (?2 IS NULL OR (source = ?2 AND event_id = ?3))
  AND (?4 = 0 OR dead_at IS NOT NULL)
  AND (?5 IS NULL OR event_type = ?5)
  AND (?6 IS NULL OR received_at >= ?6)
  AND (?7 IS NULL OR received_at < ?7)
  AND (?8 IS NULL OR processor = ?8)
  AND "
    };
}

/// Whether the route's event lost its body for a recorded reason (expired, erased).
macro_rules! without_body {
    () => {
        "EXISTS (SELECT 1 FROM webhook_events AS e
      WHERE e.source = webhook_routes.source AND e.event_id = webhook_routes.event_id
        AND e.body_state IS NOT NULL)"
    };
}

/// The matching routes queued again, those of events without a body left out (they could
/// only end dead again).
pub(super) const REQUEUE: &str = concat!(
    "
UPDATE webhook_routes
SET next_attempt_at = ?1, attempts = 0, processed_at = NULL, dead_at = NULL,
    processing_error = NULL, locked_until = NULL, lock_token = NULL
WHERE ",
    requeue_matching!(),
    "NOT ",
    without_body!()
);

/// How many matching routes [`REQUEUE`] leaves out for their event's body state.
pub(super) const REQUEUE_WITHOUT_BODY: &str = concat!(
    "SELECT count(*) FROM webhook_routes WHERE ",
    requeue_matching!(),
    without_body!()
);

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
        let processor = std::sync::Arc::from(PROCESSOR);
        Backend::claim(self, processor, ClaimDue::plain(limit, lease, token))
            .await
            .unwrap()
    }
}

impl Backend for Sqlite {
    fn accept(&self, d: Delivery) -> StoreFuture<Accepted> {
        let this = self.clone();
        Box::pin(async move { this.accept(d).await })
    }

    fn claim(&self, processor: Arc<str>, due: ClaimDue) -> StoreFuture<Vec<Claimed>> {
        let this = self.clone();
        Box::pin(async move {
            match this.write(Op::ClaimDue(processor, due)).await? {
                Done::Claimed(rows) => Ok(claimed(rows, &this.keys)),
                _ => unreachable!("a claim's rows"),
            }
        })
    }

    fn give_back(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
        token: Token,
    ) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::GiveBack(processor, keys, token)).await })
    }

    fn renew(&self, row: HeldRow, lease: Duration) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::RenewRow(row, lease)).await })
    }

    fn finish(&self, row: HeldRow, outcome: Outcome) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::Finish(row, outcome)).await })
    }

    fn requeue(&self, which: &Requeue) -> StoreFuture<Requeued> {
        let (this, which) = (self.clone(), which.clone());
        Box::pin(async move {
            match this.write(Op::Requeue(which)).await? {
                Done::Requeued(done) => Ok(done),
                _ => unreachable!("a requeue's counts"),
            }
        })
    }

    fn expire_bodies(&self, retention: Duration, batch: usize) -> StoreFuture<Option<u64>> {
        let this = self.clone();
        Box::pin(async move {
            match this.write(Op::ExpireBodies(retention, batch)).await? {
                Done::Expired(done) => Ok(done),
                _ => unreachable!("a batch of expiry's count"),
            }
        })
    }

    fn erase(&self, keys: Vec<(String, String)>) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::Erase(keys)).await })
    }

    #[cfg(feature = "seal")]
    fn by_subject(
        &self,
        digests: Vec<Vec<u8>>,
        limit: usize,
    ) -> StoreFuture<Vec<(String, String)>> {
        super::erasure::by_subject(&self.pool, digests, limit)
    }

    fn pause(&self, rule: crate::inbox::pause::Rule, pause: bool) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            let changed = this.count(Op::Pause(rule, pause)).await?;
            Ok(changed > 0)
        })
    }

    fn object_index(&self) -> StoreFuture<()> {
        shared::object_index(&self.pool, super::prune::OBJECT_INDEX)
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

    fn counts(&self, processor: Arc<str>) -> StoreFuture<Counts> {
        super::listing::counts(&self.pool, self.now_ms(), processor)
    }

    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        super::listing::list(&self.pool, self.now_ms(), listing, &self.keys)
    }

    fn processed_per_minute(&self, minutes: u32) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
        super::listing::processed_per_minute(&self.pool, self.now_ms(), minutes)
    }

    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        super::listing::event(&self.pool, self.now_ms(), source, id, &self.keys)
    }

    fn next_due(&self, processor: Arc<str>) -> StoreFuture<Option<Duration>> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            let after: Option<i64> = sqlx::query_scalar(NEXT_DUE)
                .bind(now)
                .bind(&*processor)
                .fetch_optional(&pool)
                .await
                .map_err(|e| store_error("inbox next due", e))?;
            Ok(after.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
        })
    }

    /// No notifications: a process's own accepts wake its workers, its own retries tell
    /// them when they fall due (another process's are read at a claim).
    fn listen(&self, _: Arc<Notify>, _: Dues) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    fn registry(&self) -> &dyn crate::inbox::backfill::Registry {
        self
    }

    fn invalids(&self) -> &dyn crate::inbox::invalid::Invalids {
        &self.marks
    }

    #[cfg(feature = "seal")]
    fn rekeying(&self) -> &dyn crate::inbox::rekey::Rekeying {
        self
    }

    #[cfg(feature = "seal")]
    fn with_keys(&self, keys: crate::seal::KeyRing) -> Arc<dyn Backend> {
        let mut keyed = self.clone();
        keyed.keys = Some(keys);
        Arc::new(keyed)
    }
}

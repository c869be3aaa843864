//! Every SQLite statement on `webhook_events` (see the [state diagram](super)). Times are
//! milliseconds since the epoch from the process's clock (one host: one clock).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite as Db, SqliteArguments, SqlitePool};
use sqlx::Row;
use tokio::sync::Notify;

use super::batch::{Batcher, Lane, Run, MAX_BATCH, MAX_BATCH_BYTES};
use super::{
    after, claimed, listing_statement, store_error, summaries, ClaimedRow, CountsRow, Outcome,
    StoredRow, ABANDONED, CLAIM_TRIES, CRASHED,
};
use crate::inbox::backend::{Backend, Claimed};
use crate::inbox::{Accepted, Counts, EventSummary, Listing, Requeue, StoredEvent};
use crate::store::{Claim, Delivery, StoreError, StoreErrorKind, StoreFuture, Token};
use crate::Event;

/// What the times are read from.
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Binds a delivery's key and audit columns as `?1`…`?6`: source, event id, type, object
/// id, livemode, body.
fn bind_delivery<'q>(
    query: Query<'q, Db, SqliteArguments>,
    d: &'q Delivery,
) -> Query<'q, Db, SqliteArguments> {
    let audit = d.audit();
    query
        .bind(d.source())
        .bind(d.id())
        .bind(audit.event_type)
        .bind(audit.object_id)
        .bind(audit.livemode)
        .bind(audit.body)
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
}

/// A write on the table: every one goes through the [writer](Sqlite::writer), so no
/// write of this process waits on SQLite's lock behind another of this process.
enum Op {
    Claim(Delivery, Token, Duration),
    Complete(String, String, Token),
    Accept(Delivery),
    Renew(String, String, Token, Duration),
    Release(String, String, Token),
    /// The inbox's: a worker's claim of up to `limit` due rows.
    ClaimDue {
        limit: usize,
        lease: Duration,
        token: Token,
        max_attempts: u32,
    },
    /// The inbox's: claimed rows handed back uncounted.
    GiveBack(Vec<(String, String)>, Token),
    RenewRow(String, String, Token, Duration),
    Finish(String, String, Token, Outcome),
    Requeue(Requeue),
    Prune(Duration),
    PruneOnce(String, Duration),
    /// The inbox's processed (`false`) or dead (`true`) rows older than that.
    PruneRows(Duration, bool),
}

/// An [`Op`]'s answer.
enum Done {
    Claim(Claim),
    /// Held, done or recorded (`false`: fenced out).
    Held(bool),
    Accept(Accepted),
    Claimed(Vec<ClaimedRow>),
    Count(u64),
}

impl Op {
    /// What it adds to its batch: its body.
    fn size(&self) -> usize {
        match self {
            Op::Claim(d, ..) | Op::Accept(d) => d.audit().body.map_or(0, <[u8]>::len),
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
            | Op::Prune(_)
            | Op::PruneOnce(..)
            | Op::PruneRows(..) => Lane::Front,
            Op::Complete(..)
            | Op::Renew(..)
            | Op::Release(..)
            | Op::ClaimDue { .. }
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

// ---- Claims ----

/// A new key, or one released or expired taken over, in one statement: SQLite's one
/// writer makes the upsert's check and write atomic.
const CLAIM: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, received_at, attempts, locked_until, lock_token, kind)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10)
ON CONFLICT (source, event_id) DO UPDATE SET
    locked_until = excluded.locked_until,
    lock_token = excluded.lock_token,
    attempts = webhook_events.attempts + 1
WHERE webhook_events.processed_at IS NULL AND webhook_events.next_attempt_at IS NULL
  AND (webhook_events.locked_until IS NULL OR webhook_events.locked_until <= ?7)
RETURNING lock_token";

/// Why a claim took nothing: done (or the inbox's: an accepted event is a duplicate to
/// `DedupeLayer`), else claimed until when.
const STATE: &str = "
SELECT processed_at IS NOT NULL OR next_attempt_at IS NOT NULL, locked_until
FROM webhook_events WHERE source = ?1 AND event_id = ?2";

/// A claim's completion: the done row keeps its token, so a retry whose first
/// acknowledgement was lost matches again (and changes nothing). A claim row the inbox
/// adopted is the inbox's (`INBOX_HAS`).
const COMPLETE: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4), processing_error = NULL,
    locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND next_attempt_at IS NULL";

const RENEW: &str = "
UPDATE webhook_events SET locked_until = ?4
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
  AND next_attempt_at IS NULL";

const RELEASE: &str = "
UPDATE webhook_events SET locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL
  AND next_attempt_at IS NULL";

/// Whether the key is the inbox's: the claim whose completion or renewal did not match
/// was adopted by the inbox's accept — its handler stored it. One mechanism per event: the
/// claim leaves the row to the inbox's worker, and its attempt is done (the event stored).
const INBOX_HAS: &str = "
SELECT 1 FROM webhook_events WHERE source = ?1 AND event_id = ?2 AND next_attempt_at IS NOT NULL";

/// Done event keys older than the cutoff, and event keys a failed attempt gave back
/// (released, or a lease long run out) first received before it: the provider has stopped
/// retrying those. The inbox's unprocessed rows (`next_attempt_at` set) are the inbox's to
/// prune; `Once` keys are pruned only by name (`PRUNE_ONCE`).
const PRUNE: &str = "
DELETE FROM webhook_events
WHERE kind = 'event'
  AND ((processed_at IS NOT NULL AND processed_at < ?1)
    OR (processed_at IS NULL AND next_attempt_at IS NULL AND received_at < ?1
        AND (locked_until IS NULL OR locked_until <= ?2)))";

const PRUNE_ONCE: &str = "
DELETE FROM webhook_events
WHERE kind IN ('once', 'kept') AND source = ?1 AND processed_at IS NOT NULL AND processed_at < ?2";

impl Sqlite {
    /// The table in `pool`'s database, on `clock`; the writer waits up to `busy_timeout`
    /// for another process's write lock.
    pub(crate) fn new(pool: SqlitePool, clock: Clock, busy_timeout: Duration) -> Self {
        let writer = Self::writer(pool.clone(), clock.clone(), busy_timeout);
        Self {
            pool,
            clock,
            busy_timeout,
            writer,
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

    /// Claims `d` for an attempt under `token` for `lease`: a new row, or one released or
    /// expired taken over; else done, or in flight (for how much longer).
    pub(crate) async fn claim(
        &self,
        d: Delivery,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        match self.write(Op::Claim(d, token, lease)).await? {
            Done::Claim(claim) => Ok(claim),
            _ => unreachable!("a claim's answer"),
        }
    }

    /// Extends the lease if `token` still holds the claim (or the inbox adopted it);
    /// `false` when fenced out.
    pub(crate) async fn renew(
        &self,
        source: &str,
        id: &str,
        token: Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.held(Op::Renew(source.into(), id.into(), token, lease))
            .await
    }

    /// Marks the row done if `token` holds it (or already did this, or the inbox adopted
    /// it); `false` when fenced.
    pub(crate) async fn complete(
        &self,
        source: String,
        id: String,
        token: Token,
    ) -> Result<bool, StoreError> {
        self.held(Op::Complete(source, id, token)).await
    }

    /// Queues a verified event in the inbox.
    pub(crate) async fn accept(&self, d: Delivery) -> Result<Accepted, StoreError> {
        match self.write(Op::Accept(d)).await? {
            Done::Accept(accepted) => Ok(accepted),
            _ => unreachable!("an accept's answer"),
        }
    }

    /// Gives the claim back, so the provider's retry runs.
    pub(crate) async fn release(
        &self,
        source: &str,
        id: &str,
        token: Token,
    ) -> Result<(), StoreError> {
        self.held(Op::Release(source.into(), id.into(), token))
            .await
            .map(|_| ())
    }

    pub(crate) async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.count(Op::Prune(older_than)).await
    }

    pub(crate) async fn prune_once(
        &self,
        namespace: &str,
        older_than: Duration,
    ) -> Result<u64, StoreError> {
        self.count(Op::PruneOnce(namespace.into(), older_than))
            .await
    }
}

// ---- The ordering guard (`webhook_objects`, `crate::latest`) ----

/// `ON CONFLICT DO UPDATE … WHERE` updates only when not older; SQLite's one writer
/// serialises the caller's whole transaction.
const ADVANCE: &str = "
INSERT INTO webhook_objects (namespace, object, applied_at) VALUES (?1, ?2, ?3)
ON CONFLICT (namespace, object) DO UPDATE SET applied_at = excluded.applied_at
WHERE webhook_objects.applied_at <= excluded.applied_at";

/// Moves `(namespace, object)`'s time to `at_ms` unless a newer one was applied; `true`
/// when it moved (or was first seen).
pub(crate) async fn advance(
    conn: &mut sqlx::SqliteConnection,
    namespace: &str,
    object: &str,
    at_ms: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(ADVANCE)
        .bind(namespace)
        .bind(object)
        .bind(at_ms)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

// ---- The inbox ----

/// A new row queued; a row `DedupeLayer` left unfinished is queued instead (adopted), its
/// claim's lock dropped: the row is the inbox's from now on, due at once (a `DedupeLayer`
/// in front of this accept then finds it done, `INBOX_HAS`).
const ACCEPT: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, received_at, attempts, next_attempt_at, kind)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?7, ?8)
ON CONFLICT (source, event_id) DO UPDATE SET next_attempt_at = ?7, attempts = 0,
    locked_until = NULL, lock_token = NULL
WHERE webhook_events.next_attempt_at IS NULL AND webhook_events.processed_at IS NULL
  AND webhook_events.kind <> 'once'";

/// SQLite has one writer: this UPDATE is atomic, no two workers get the same row. A due
/// row whose every attempt ended without an outcome (each crashed its worker) is marked
/// dead in the same statement instead of claimed again (every SET sees the old row).
const CLAIM_DUE: &str = "
UPDATE webhook_events
SET attempts = attempts + (attempts < ?5),
    dead_at = CASE WHEN attempts >= ?5 THEN ?1 END,
    processing_error = CASE WHEN attempts >= ?5
        THEN coalesce(processing_error || '; then ', '') || ?6 ELSE processing_error END,
    locked_until = CASE WHEN attempts < ?5 THEN ?1 + ?2 END,
    lock_token = CASE WHEN attempts < ?5 THEN ?3 END
WHERE rowid IN (
    SELECT rowid FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?1
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= ?1)
    ORDER BY next_attempt_at LIMIT ?4)
RETURNING source, event_id, event_type, object_id, livemode, body, attempts,
    dead_at IS NOT NULL AS buried";

/// Claimed rows a worker hands back unprocessed (its claim was answered too late to run
/// them safely): due again at once, the attempt uncounted.
const GIVE_BACK: &str = "
UPDATE webhook_events SET attempts = attempts - 1, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3
  AND processed_at IS NULL AND dead_at IS NULL";

const RENEW_ROW: &str = "
UPDATE webhook_events SET locked_until = ?4
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

/// The row processed; kept idempotent under its token like a claim's completion.
const PROCESSED: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, ?4), processing_error = NULL,
    locked_until = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3";

const RETRY: &str = "
UPDATE webhook_events SET next_attempt_at = ?4, processing_error = ?5,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

const DEAD: &str = "
UPDATE webhook_events SET dead_at = ?4, processing_error = ?5,
    locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

const ABANDON: &str = "
UPDATE webhook_events SET processing_error = ?4, locked_until = NULL, lock_token = NULL
WHERE source = ?1 AND event_id = ?2 AND lock_token = ?3 AND processed_at IS NULL";

const REQUEUE: &str = "
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

/// Processed inbox rows older than the cutoff, and (by name only) dead ones: two
/// statements, each on its partial index (a `CASE` between them would use neither).
/// Kept rows (no signed time: only the row refuses a replay) are pruned by name only.
const PRUNE_PROCESSED: &str = "
DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind = 'event'
AND processed_at IS NOT NULL AND processed_at < ?1";

const PRUNE_DEAD: &str = "
DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind <> 'once'
AND dead_at IS NOT NULL AND dead_at < ?1";

/// The queue from its partial index (`webhook_events_due`), the dead rows from theirs,
/// and the processed ones from the counter the triggers keep (`webhook_counts`): the
/// answer costs the size of the queue, not of the history kept.
const COUNTS: &str = "
SELECT q.queued, q.processing,
    (SELECT processed FROM webhook_counts) AS processed,
    (SELECT count(*) FROM webhook_events
     WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL) AS dead,
    q.oldest_due_ms
FROM (
    SELECT
        count(*) FILTER (WHERE locked_until IS NULL OR locked_until <= ?1) AS queued,
        count(*) FILTER (WHERE locked_until > ?1) AS processing,
        ?1 - min(next_attempt_at) FILTER (WHERE
            (locked_until IS NULL OR locked_until <= ?1) AND next_attempt_at <= ?1)
            AS oldest_due_ms
    FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
) q";

/// What a listing and an event read of a row: times as microseconds since the epoch, and
/// whether a worker holds it now (`?1`: now).
macro_rules! listed_columns {
    () => {
        "source, event_id, event_type, object_id, attempts,
    received_at * 1000 AS received_us, next_attempt_at * 1000 AS next_attempt_us,
    processed_at * 1000 AS processed_us, dead_at * 1000 AS dead_us,
    coalesce(locked_until > ?1, 0) AS locked, processing_error"
    };
}

/// The listings, one statement per row set and order, each a range of its partial index
/// (`webhook_events_dead`, `webhook_events_failing`, on the time and the key: the terms
/// of its `WHERE` are repeated, so SQLite sees it applies) read in the index's order from
/// the position `?2`, `?3`, `?4` (the time in milliseconds, the source and id that break
/// ties in time; `NULL` for the first page: before or after every row), one row-value
/// comparison on the index's columns: a page reads its own rows, not the ones before it.
const LIST_DEAD_NEWEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL
  AND (dead_at, source, event_id) < (coalesce(?2, 9223372036854775807), coalesce(?3, ''), coalesce(?4, ''))
ORDER BY dead_at DESC, source DESC, event_id DESC
LIMIT ?5"
);

const LIST_DEAD_OLDEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL
  AND (dead_at, source, event_id) > (coalesce(?2, -9223372036854775808), coalesce(?3, ''), coalesce(?4, ''))
ORDER BY dead_at, source, event_id
LIMIT ?5"
);

const LIST_FAILING_NEWEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
  AND processing_error IS NOT NULL
  AND (received_at, source, event_id) < (coalesce(?2, 9223372036854775807), coalesce(?3, ''), coalesce(?4, ''))
ORDER BY received_at DESC, source DESC, event_id DESC
LIMIT ?5"
);

const LIST_FAILING_OLDEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
  AND processing_error IS NOT NULL
  AND (received_at, source, event_id) > (coalesce(?2, -9223372036854775808), coalesce(?3, ''), coalesce(?4, ''))
ORDER BY received_at, source, event_id
LIMIT ?5"
);

/// One inbox row by its key, body included.
const EVENT: &str = concat!(
    "SELECT ",
    listed_columns!(),
    ", livemode, body
FROM webhook_events
WHERE source = ?2 AND event_id = ?3 AND next_attempt_at IS NOT NULL"
);

#[cfg(test)]
impl Sqlite {
    /// The worker's claim, unwrapped.
    async fn claim_due(&self, limit: usize, lease: Duration, token: Token) -> Vec<Claimed> {
        Backend::claim(self, limit, lease, token, 8).await.unwrap()
    }
}

impl Backend for Sqlite {
    fn accept(&self, event: &Event) -> StoreFuture<Accepted> {
        let (this, d) = (self.clone(), Delivery::from_event(event));
        Box::pin(async move { this.accept(d).await })
    }

    fn claim(
        &self,
        limit: usize,
        lease: Duration,
        token: Token,
        max_attempts: u32,
    ) -> StoreFuture<Vec<Claimed>> {
        let this = self.clone();
        Box::pin(async move {
            let op = Op::ClaimDue {
                limit,
                lease,
                token,
                max_attempts,
            };
            match this.write(op).await? {
                Done::Claimed(rows) => Ok(claimed(rows)),
                _ => unreachable!("a claim's rows"),
            }
        })
    }

    fn give_back(&self, keys: Vec<(String, String)>, token: Token) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::GiveBack(keys, token)).await })
    }

    fn renew(
        &self,
        source: String,
        id: String,
        token: Token,
        lease: Duration,
    ) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::RenewRow(source, id, token, lease)).await })
    }

    fn finish(
        &self,
        source: String,
        id: String,
        token: Token,
        outcome: Outcome,
    ) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move { this.held(Op::Finish(source, id, token, outcome)).await })
    }

    fn requeue(&self, which: &Requeue) -> StoreFuture<u64> {
        let (this, which) = (self.clone(), which.clone());
        Box::pin(async move { this.count(Op::Requeue(which)).await })
    }

    fn prune(&self, older_than: Duration, dead: bool) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::PruneRows(older_than, dead)).await })
    }

    fn min_lease(&self) -> Duration {
        Sqlite::min_lease(self)
    }

    fn counts(&self) -> StoreFuture<Counts> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            sqlx::query_as::<_, CountsRow>(COUNTS)
                .bind(now)
                .fetch_one(&pool)
                .await
                .map(Counts::from)
                .map_err(|e| store_error("inbox counts", e))
        })
    }

    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        let sql = listing_statement(
            listing,
            [
                LIST_DEAD_NEWEST,
                LIST_DEAD_OLDEST,
                LIST_FAILING_NEWEST,
                LIST_FAILING_OLDEST,
            ],
        );
        let (at_us, source, id) = after(listing);
        let limit = i64::try_from(listing.limit + 1).unwrap_or(i64::MAX);
        Box::pin(async move {
            let rows = sqlx::query_as(sql)
                .bind(now)
                .bind(at_us.map(|us| us.div_euclid(1000)))
                .bind(source)
                .bind(id)
                .bind(limit)
                .fetch_all(&pool)
                .await;
            summaries(rows)
        })
    }

    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        let (pool, now) = (self.pool.clone(), self.now_ms());
        Box::pin(async move {
            sqlx::query_as::<_, StoredRow>(EVENT)
                .bind(now)
                .bind(source)
                .bind(id)
                .fetch_optional(&pool)
                .await
                .map(|row| row.map(StoredEvent::from))
                .map_err(|e| store_error("inbox event", e))
        })
    }

    /// Only this process writes the file's inbox: its own accepts wake its workers.
    fn listen(&self, _wake: Arc<Notify>) -> Option<tokio::task::JoinHandle<()>> {
        None
    }
}

// ---- Group commit ----

/// The writer's own connection, opened with the pool's options and the table's busy
/// timeout: the pool's connections (reads) never make the writer wait for a connection —
/// only for another process's lock on the file, up to the busy timeout, after which its
/// writes answer 503.
type WriterConnection = Arc<tokio::sync::Mutex<Option<sqlx::SqliteConnection>>>;

/// Runs one batch of writes in one transaction (one commit, one fsync), each with its own
/// statements and answer, at one time read once the write lock is held. If the
/// transaction fails, every write in it gets the error (503): SQLite's statements here
/// fail together — the file locked past the busy timeout, the disk full — never for one
/// write's values, and retrying them one by one would hold each caller through another
/// busy timeout.
async fn write_batch(
    pool: &SqlitePool,
    conn: &WriterConnection,
    clock: &Clock,
    busy_timeout: Duration,
    ops: Vec<Op>,
) -> Vec<Result<Done, StoreError>> {
    let all_failed = |kind: StoreErrorKind, why: String| -> Vec<Result<Done, StoreError>> {
        ops.iter()
            .map(|_| Err(StoreError::new("sqlite write", why.clone()).with_kind(kind)))
            .collect()
    };
    let mut guard = conn.lock().await;
    if pool.is_closed() {
        *guard = None;
        return all_failed(
            StoreErrorKind::Unavailable,
            "the store's pool is closed".into(),
        );
    }
    if guard.is_none() {
        use sqlx::ConnectOptions as _;
        let options = (*pool.connect_options()).clone().busy_timeout(busy_timeout);
        match options.connect().await {
            Ok(opened) => *guard = Some(opened),
            Err(e) => return all_failed(super::error_kind(&e), e.to_string()),
        }
    }
    let c = guard.as_mut().expect("opened above");
    match write_in_one_transaction(c, clock, &ops).await {
        Ok(results) => results,
        Err(e) => {
            *guard = None; // whatever went wrong, the next batch starts on a fresh connection
            all_failed(e.kind(), e.to_string())
        }
    }
}

/// The writes in one transaction; an error if any statement or the commit fails (the
/// transaction is then rolled back as it is dropped).
async fn write_in_one_transaction(
    conn: &mut sqlx::SqliteConnection,
    clock: &Clock,
    ops: &[Op],
) -> Result<Vec<Result<Done, StoreError>>, StoreError> {
    use sqlx::Connection as _;
    // IMMEDIATE: take the write lock now, not at the first write (no upgrade to fail).
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| store_error("sqlite begin", e))?;
    // Read once the lock is held: a lease granted after a wait for it is still whole.
    let now = epoch_ms(clock());
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(Ok(write_one(&mut tx, now, op).await?));
    }
    tx.commit()
        .await
        .map_err(|e| store_error("sqlite commit", e))?;
    Ok(results)
}

/// Binds a row's key and the token as `?1`…`?3`.
fn keyed<'q>(
    sql: &'static str,
    source: &'q str,
    id: &'q str,
    token: Token,
) -> Query<'q, Db, SqliteArguments> {
    sqlx::query(sql)
        .bind(source)
        .bind(id)
        .bind(token.to_string())
}

/// Whether the key is the inbox's ([`INBOX_HAS`]).
async fn inbox_has(
    conn: &mut sqlx::SqliteConnection,
    source: &str,
    id: &str,
) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(INBOX_HAS)
        .bind(source)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.is_some())
}

/// One write's statements on `conn`, at `now`.
async fn write_one(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    op: &Op,
) -> Result<Done, StoreError> {
    let changed = |done: sqlx::sqlite::SqliteQueryResult| done.rows_affected();
    Ok(match op {
        Op::Claim(d, token, lease) => Done::Claim(claim_one(conn, now, d, *token, *lease).await?),
        Op::Complete(source, id, token) => {
            let err = |e| store_error("sqlite complete", e);
            let done = keyed(COMPLETE, source, id, *token)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            Done::Held(changed(done) == 1 || inbox_has(conn, source, id).await.map_err(err)?)
        }
        Op::Renew(source, id, token, lease) => {
            let err = |e| store_error("sqlite renew", e);
            let done = keyed(RENEW, source, id, *token)
                .bind(now.saturating_add(ms(*lease)))
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            Done::Held(changed(done) == 1 || inbox_has(conn, source, id).await.map_err(err)?)
        }
        Op::Release(source, id, token) => {
            let done = keyed(RELEASE, source, id, *token)
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("sqlite release", e))?;
            Done::Held(changed(done) == 1)
        }
        Op::Accept(d) => {
            let done = bind_delivery(sqlx::query(ACCEPT), d)
                .bind(now)
                .bind(d.kind())
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox accept", e))?;
            Done::Accept(if changed(done) == 1 {
                Accepted::New
            } else {
                Accepted::Duplicate
            })
        }
        Op::ClaimDue {
            limit,
            lease,
            token,
            max_attempts,
        } => {
            let rows = sqlx::query_as(CLAIM_DUE)
                .bind(now)
                .bind(ms(*lease))
                .bind(token.to_string())
                .bind(i64::try_from(*limit).unwrap_or(i64::MAX))
                .bind(*max_attempts)
                .bind(CRASHED)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error("inbox claim", e))?;
            Done::Claimed(rows)
        }
        Op::GiveBack(keys, token) => {
            let mut n = 0;
            for (source, id) in keys {
                let done = keyed(GIVE_BACK, source, id, *token)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| store_error("inbox give back", e))?;
                n += changed(done);
            }
            Done::Count(n)
        }
        Op::RenewRow(source, id, token, lease) => {
            let done = keyed(RENEW_ROW, source, id, *token)
                .bind(now.saturating_add(ms(*lease)))
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox renew", e))?;
            Done::Held(changed(done) == 1)
        }
        Op::Finish(source, id, token, outcome) => {
            let key = |sql| keyed(sql, source, id, *token);
            let query = match outcome {
                Outcome::Processed => key(PROCESSED).bind(now),
                Outcome::Retry(error, after) => key(RETRY)
                    .bind(now.saturating_add(ms(*after)))
                    .bind(error.as_str()),
                Outcome::Dead(error) => key(DEAD).bind(now).bind(error.as_str()),
                Outcome::Abandoned => key(ABANDON).bind(ABANDONED),
            };
            let done = query
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox finish", e))?;
            Done::Held(changed(done) == 1)
        }
        Op::Requeue(which) => {
            let (source, id) = which.id.clone().unzip();
            let done = sqlx::query(REQUEUE)
                .bind(now)
                .bind(source)
                .bind(id)
                .bind(which.dead_only)
                .bind(which.event_type.clone())
                .bind(which.received_from)
                .bind(which.received_before)
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox requeue", e))?;
            Done::Count(changed(done))
        }
        Op::Prune(older_than) => {
            let done = sqlx::query(PRUNE)
                .bind(now.saturating_sub(ms(*older_than)))
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("sqlite prune", e))?;
            Done::Count(changed(done))
        }
        Op::PruneOnce(namespace, older_than) => {
            let done = sqlx::query(PRUNE_ONCE)
                .bind(namespace.as_str())
                .bind(now.saturating_sub(ms(*older_than)))
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("sqlite prune", e))?;
            Done::Count(changed(done))
        }
        Op::PruneRows(older_than, dead) => {
            let sql = if *dead { PRUNE_DEAD } else { PRUNE_PROCESSED };
            let done = sqlx::query(sql)
                .bind(now.saturating_sub(ms(*older_than)))
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox prune", e))?;
            Done::Count(changed(done))
        }
    })
}

/// One claim: a new row, or one released or expired taken over; else why not.
async fn claim_one(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    d: &Delivery,
    token: Token,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let err = |e| store_error("sqlite claim", e);
    for _ in 0..CLAIM_TRIES {
        let claimed = bind_delivery(sqlx::query(CLAIM), d)
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
        let done: bool = row.try_get(0).map_err(err)?;
        let until: Option<i64> = row.try_get(1).map_err(err)?;
        if done {
            return Ok(Claim::Done);
        }
        if let Some(until) = until.filter(|u| *u > now) {
            return Ok(Claim::InFlight {
                retry_after: Duration::from_millis((until - now).unsigned_abs()),
            });
        }
    }
    Ok(Claim::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listings read their partial index in its order, not the history (20 000
    /// processed rows here), and rows tied in time page by their key, each once.
    #[tokio::test]
    async fn listings_read_their_partial_index_and_page_through_ties() {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-unit-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = crate::store::SqliteStore::open(&path).await.unwrap();
        sqlx::raw_sql(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
             INSERT INTO webhook_events
                 (source, event_id, received_at, attempts, next_attempt_at, processed_at)
             SELECT 's', 'p' || i, 1000, 1, 1000, 2000 FROM n;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5)
             INSERT INTO webhook_events
                 (source, event_id, received_at, attempts, next_attempt_at, dead_at, processing_error)
             SELECT 's', 'd' || i, 1000, 3, 1000, 5000, 'boom' FROM n;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3)
             INSERT INTO webhook_events
                 (source, event_id, received_at, attempts, next_attempt_at, processing_error)
             SELECT 's', 'f' || i, 3000, 1, 9000, 'late' FROM n;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
             INSERT INTO webhook_events (source, event_id, received_at, attempts, next_attempt_at)
             SELECT 's', 'q' || i, 4000, 0, 4000 FROM n;
             ANALYZE;",
        )
        .execute(store.pool())
        .await
        .unwrap();
        for (sql, index) in [
            (LIST_DEAD_NEWEST, "webhook_events_dead"),
            (LIST_DEAD_OLDEST, "webhook_events_dead"),
            (LIST_FAILING_NEWEST, "webhook_events_failing"),
            (LIST_FAILING_OLDEST, "webhook_events_failing"),
        ] {
            for after in [None, Some(5000_i64)] {
                let plan: Vec<String> =
                    sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                        .bind(10_000_i64)
                        .bind(after)
                        .bind(after.map(|_| "s"))
                        .bind(after.map(|_| "d3"))
                        .bind(51_i64)
                        .fetch_all(store.pool())
                        .await
                        .unwrap()
                        .iter()
                        .map(|row| row.get::<String, _>("detail"))
                        .collect();
                let plan = plan.join("\n");
                assert!(plan.contains(&format!("USING INDEX {index}")), "{plan}");
                assert!(
                    !plan.contains("TEMP B-TREE"),
                    "read in the index's order: {plan}"
                );
            }
        }

        let inbox = crate::inbox::Inbox::sqlite(&store);
        let all = |listing| crate::inbox::listing::ids_page_by_page(&inbox, listing);
        use crate::inbox::Listing;
        assert_eq!(all(Listing::dead()).await, ["d5", "d4", "d3", "d2", "d1"]);
        assert_eq!(
            all(Listing::dead().oldest_first()).await,
            ["d1", "d2", "d3", "d4", "d5"]
        );
        assert_eq!(all(Listing::failing()).await, ["f3", "f2", "f1"]);
        assert_eq!(
            all(Listing::failing().oldest_first()).await,
            ["f1", "f2", "f3"]
        );
        drop(store);
        let _ = std::fs::remove_file(&path);
    }

    /// A clock that reads `secs` after the epoch.
    fn at(secs: u64) -> Clock {
        Arc::new(move || UNIX_EPOCH + Duration::from_secs(secs))
    }

    /// The batch goes as one transaction, not through the write-by-write fallback.
    #[tokio::test]
    async fn a_mixed_batch_is_one_transaction_with_each_write_answered() {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-unit-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = crate::store::SqliteStore::open(&path).await.unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        let (t1, t2) = (Token::new(), Token::new());
        let lease = Duration::from_secs(30);
        let writes = vec![
            Op::Claim(Delivery::new("s", "a"), t1, lease),
            Op::Claim(Delivery::new("s", "a"), t2, lease),
            Op::Accept(Delivery::new("s", "c")),
            Op::Accept(Delivery::new("s", "c")),
        ];
        let answers = write_in_one_transaction(&mut conn, &at(1), &writes)
            .await
            .expect("one transaction");
        assert!(matches!(answers[0], Ok(Done::Claim(Claim::New(_)))));
        assert!(matches!(
            answers[1],
            Ok(Done::Claim(Claim::InFlight { .. }))
        ));
        assert!(matches!(answers[2], Ok(Done::Accept(Accepted::New))));
        assert!(matches!(answers[3], Ok(Done::Accept(Accepted::Duplicate))));
        let writes = vec![
            Op::Complete("s".into(), "a".into(), t1),
            Op::Complete("s".into(), "a".into(), t2),
        ];
        let answers = write_in_one_transaction(&mut conn, &at(2), &writes)
            .await
            .expect("one transaction");
        assert!(matches!(answers[0], Ok(Done::Held(true))));
        assert!(matches!(answers[1], Ok(Done::Held(false))));
        drop(conn);
        drop(store);
        let _ = std::fs::remove_file(&path);
    }

    /// A claim handed back under its token is due again with its attempt uncounted; a
    /// hand-back under another token changes nothing.
    #[tokio::test]
    async fn rows_handed_back_are_due_again_uncounted_and_fenced_on_the_token() {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-unit-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = crate::store::SqliteStore::open(&path).await.unwrap();
        let sql = store.sql().clone();
        let inbox = crate::inbox::Inbox::sqlite(&store);
        let verifier = crate::Verifier::new(
            crate::Scheme::standard(),
            ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        )
        .unwrap()
        .with_source("s");
        inbox.ingest(&verifier, Some("evt_1"), "{}").await.unwrap();
        let lease = Duration::from_secs(60);
        let claim = |token| sql.claim_due(1, lease, token);
        let token = Token::new();
        let rows = claim(token).await;
        assert_eq!(rows.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1]);
        let key = || vec![("s".to_owned(), "evt_1".to_owned())];
        assert_eq!(
            Backend::give_back(&sql, key(), Token::new()).await.unwrap(),
            0
        );
        assert!(claim(Token::new()).await.is_empty(), "still held");
        assert_eq!(Backend::give_back(&sql, key(), token).await.unwrap(), 1);
        let again = claim(Token::new()).await;
        assert_eq!(again.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1]);
        drop((inbox, sql, store));
        let _ = std::fs::remove_file(&path);
    }
}

//! Every PostgreSQL statement on `webhook_events` (see the [state diagram](super)).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgListener, PgPool, Postgres};
use sqlx::query::Query;
use sqlx::{PgConnection, Row};
use tokio::sync::Notify;

use super::batch::{Batcher, Run, Write, Written, MAX_BATCH, MAX_BATCH_BYTES};
use super::{
    after, claimed, listing_statement, store_error, summaries, CountsRow, Outcome, StoredRow,
    ABANDONED, CLAIM_TRIES, CRASHED,
};
use crate::inbox::backend::{Backend, Claimed};
use crate::inbox::{Accepted, Counts, EventSummary, Listing, Requeue, StoredEvent};
use crate::store::{Claim, Delivery, StoreError, StoreFuture, Token};
use crate::Event;

/// The channel `accept` and `requeue` notify, for workers in other processes.
const CHANNEL: &str = "webhook_events";

/// Binds a delivery's key and audit columns as `$1`…`$6`: source, event id, type, object
/// id, livemode, body.
fn bind_delivery<'q>(
    query: Query<'q, Postgres, PgArguments>,
    d: &'q Delivery,
) -> Query<'q, Postgres, PgArguments> {
    let audit = d.audit();
    query
        .bind(d.source())
        .bind(d.id())
        .bind(audit.event_type)
        .bind(audit.object_id)
        .bind(audit.livemode)
        .bind(audit.body)
}

/// The table in one PostgreSQL database. Cloning shares the pool and the writer.
#[derive(Clone, Debug)]
pub(crate) struct Pg {
    pool: PgPool,
    /// Claims, completions, inbox accepts and the worker's "processed", gathered into one
    /// statement per kind.
    writer: Arc<Batcher<Write, Written>>,
}

/// `persistent(false)` for the updates that join the table to a list of keys
/// (`COMPLETE_MANY`, `PROCESSED_MANY`, `GIVE_BACK`): each is planned for its own arrays and
/// the table as it is now. Prepared, a connection keeps the generic plan it made at its
/// sixth run; one made while the table was small (a new database, before autovacuum's
/// first ANALYZE) is a hash join over a sequential scan, kept as the table grows: every batch of completions read
/// the whole table, and small bodies, more rows to a page, looked like a small table longer
/// (issue 20: `DedupeLayer` on PostgreSQL ran at half the rate on 100-byte bodies than on
/// 1 KiB ones). `ACCEPT_MANY` and `CLAIM_DUE` keep their prepared plans: theirs go through
/// partial indexes however small the table (seen with `auto_explain`), and planning
/// `ACCEPT_MANY` each time cost a third of the inbox's accept rate.
const PLANNED_EACH_TIME: bool = false;

/// At most this many batches are in flight at once: enough to keep the server's disk
/// busy while a batch commits, few enough to leave the pool to workers and renewals.
const SLOTS: usize = 4;

// ---- Claims ----

/// A first-seen key: one round trip. `DO NOTHING` takes no lock on a conflicting row,
/// so a duplicate writes nothing and costs the server no commit flush.
const CLAIM: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, attempts, locked_until, lock_token, kind)
VALUES ($1, $2, $3, $4, $5, $6, 1, clock_timestamp() + make_interval(secs => $7), $8, $9)
ON CONFLICT (source, event_id) DO NOTHING
RETURNING lock_token";

/// A row that exists: take it over if it was released or its lease ran out (the `UPDATE`
/// re-checks that under the row lock, so one of several racers wins), and say why not
/// otherwise — in the same round trip.
const TAKE_OVER: &str = "
WITH taken AS (
    UPDATE webhook_events
    SET locked_until = clock_timestamp() + make_interval(secs => $3), lock_token = $4,
        attempts = attempts + 1
    WHERE source = $1 AND event_id = $2 AND processed_at IS NULL AND next_attempt_at IS NULL
      AND (locked_until IS NULL OR locked_until <= clock_timestamp())
    RETURNING lock_token
)
SELECT EXISTS (SELECT 1 FROM taken),
       processed_at IS NOT NULL OR next_attempt_at IS NOT NULL,
       (EXTRACT(EPOCH FROM (locked_until - clock_timestamp())) * 1000)::float8
FROM webhook_events WHERE source = $1 AND event_id = $2";

/// A claim's completion: the done row keeps its token, so a retry whose first
/// acknowledgement was lost matches again (and changes nothing). A claim row the inbox's
/// accept adopted is the inbox's: its handler stored the event, so the attempt is done and
/// the row left to the inbox's worker (one mechanism per event).
const COMPLETE: &str = "
WITH done AS (
    UPDATE webhook_events SET processed_at = coalesce(processed_at, now()),
        processing_error = NULL, locked_until = NULL
    WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND next_attempt_at IS NULL
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM done) OR EXISTS (SELECT 1 FROM webhook_events
    WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL)";

/// A claim's renewal; held too once the inbox adopted the row (as `COMPLETE`).
const RENEW: &str = "
WITH renewed AS (
    UPDATE webhook_events SET locked_until = clock_timestamp() + make_interval(secs => $4)
    WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL
      AND next_attempt_at IS NULL
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM renewed) OR EXISTS (SELECT 1 FROM webhook_events
    WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL)";

const RELEASE: &str = "
UPDATE webhook_events SET locked_until = NULL, lock_token = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL
  AND next_attempt_at IS NULL";

/// Done event keys older than the cutoff, and event keys a failed attempt gave back
/// (released, or a lease long run out) first received before it: the provider has stopped
/// retrying those. The inbox's rows are the inbox's to prune; `Once` keys only by name.
const PRUNE: &str = "
DELETE FROM webhook_events
WHERE kind = 'event'
  AND ((processed_at IS NOT NULL AND processed_at < now() - make_interval(secs => $1))
    OR (processed_at IS NULL AND next_attempt_at IS NULL
        AND received_at < now() - make_interval(secs => $1)
        AND (locked_until IS NULL OR locked_until <= now())))";

const PRUNE_ONCE: &str = "
DELETE FROM webhook_events
WHERE kind IN ('once', 'kept') AND source = $1
  AND processed_at IS NOT NULL AND processed_at < now() - make_interval(secs => $2)";

/// The key's row, done, inside the caller's transaction — or a claim whose lease ran out
/// (or that was released) taken over. A concurrent transaction inserting the same key
/// waits on the unique index, then sees the committed row (already) or nothing (it runs).
const DONE_IN: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, attempts, processed_at, lock_token, kind)
VALUES ($1, $2, $3, $4, $5, $6, 1, now(), $7, $8)
ON CONFLICT (source, event_id) DO UPDATE SET
    processed_at = now(), locked_until = NULL, lock_token = excluded.lock_token,
    attempts = webhook_events.attempts + 1
WHERE webhook_events.processed_at IS NULL AND webhook_events.next_attempt_at IS NULL
  AND (webhook_events.locked_until IS NULL OR webhook_events.locked_until <= clock_timestamp())
RETURNING 1";

/// Why a claim took nothing: done (or the inbox's: a duplicate to `DedupeLayer`), or
/// claimed by a live attempt (for how much longer).
const STATE: &str = "
SELECT processed_at IS NOT NULL OR next_attempt_at IS NOT NULL,
       (EXTRACT(EPOCH FROM (locked_until - clock_timestamp())) * 1000)::float8
FROM webhook_events WHERE source = $1 AND event_id = $2";

/// Claimed, or why not, from the `STATE` of a row.
fn not_claimed(done: bool, remaining_ms: Option<f64>) -> Option<Claim> {
    if done {
        return Some(Claim::Done);
    }
    remaining_ms
        .filter(|ms| *ms > 0.0)
        .map(|ms| Claim::InFlight {
            retry_after: Duration::from_secs_f64(ms / 1000.0),
        })
}

impl Pg {
    pub(crate) fn new(pool: PgPool) -> Self {
        let for_writer = pool.clone();
        let run: Run<Write, Written> = Arc::new(move |writes| {
            let pool = for_writer.clone();
            Box::pin(async move { write_batch(&pool, writes).await })
        });
        Self {
            pool,
            writer: Arc::new(
                Batcher::new(MAX_BATCH, MAX_BATCH_BYTES, Write::size, SLOTS, run)
                    .with_lanes(Write::lane),
            ),
        }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Claims `d` for an attempt under `token` for `lease`: a new row, or one released or
    /// expired taken over; else done, or in flight (for how much longer).
    pub(crate) async fn claim(
        &self,
        d: Delivery,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        match self.writer.write(Write::Claim(d, token, lease)).await? {
            Written::Claim(claim) => Ok(claim),
            _ => unreachable!("a claim's answer"),
        }
    }

    /// Extends the lease if `token` still holds the claim; `false` when fenced out.
    pub(crate) async fn renew(
        &self,
        source: &str,
        id: &str,
        token: Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(RENEW)
            .bind(source)
            .bind(id)
            .bind(token.as_uuid())
            .bind(lease.as_secs_f64())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| store_error("postgres renew", e))
    }

    /// Marks the row done if `token` holds it (or already did this); `false` when fenced.
    pub(crate) async fn complete(
        &self,
        source: String,
        id: String,
        token: Token,
    ) -> Result<bool, StoreError> {
        match self
            .writer
            .write(Write::Complete(source, id, token))
            .await?
        {
            Written::Complete(done) => Ok(done),
            _ => unreachable!("a completion's answer"),
        }
    }

    /// Queues a verified event in the inbox.
    pub(crate) async fn accept(&self, d: Delivery) -> Result<Accepted, StoreError> {
        match self.writer.write(Write::Accept(d)).await? {
            Written::Accept(accepted) => Ok(accepted),
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
        sqlx::query(RELEASE)
            .bind(source)
            .bind(id)
            .bind(token.as_uuid())
            .execute(&self.pool)
            .await
            .map_err(|e| store_error("postgres release", e))?;
        Ok(())
    }

    pub(crate) async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let pruned = sqlx::query(PRUNE)
            .bind(older_than.as_secs_f64())
            .execute(&self.pool)
            .await
            .map_err(|e| store_error("postgres prune", e))?;
        Ok(pruned.rows_affected())
    }

    pub(crate) async fn prune_once(
        &self,
        namespace: &str,
        older_than: Duration,
    ) -> Result<u64, StoreError> {
        let pruned = sqlx::query(PRUNE_ONCE)
            .bind(namespace)
            .bind(older_than.as_secs_f64())
            .execute(&self.pool)
            .await
            .map_err(|e| store_error("postgres prune", e))?;
        Ok(pruned.rows_affected())
    }
}

/// Marks `d` done in the caller's transaction (visible when it commits): `Claim::New` when
/// this transaction did it, else done, or in flight (a lease-based claim still running,
/// or `Claim::InFlight` of a second when it just ended). `Once::run_in` and
/// `TxDedupeLayer` call it.
pub(crate) async fn done_in(
    conn: &mut PgConnection,
    d: &Delivery,
    token: Token,
) -> Result<Claim, sqlx::Error> {
    let inserted = bind_delivery(sqlx::query(DONE_IN), d)
        .bind(token.as_uuid())
        .bind(d.kind())
        .fetch_optional(&mut *conn)
        .await?;
    if inserted.is_some() {
        return Ok(Claim::New(token));
    }
    let (done, remaining_ms): (bool, Option<f64>) = sqlx::query_as(STATE)
        .bind(d.source())
        .bind(d.id())
        .fetch_one(&mut *conn)
        .await?;
    Ok(not_claimed(done, remaining_ms).unwrap_or(Claim::InFlight {
        retry_after: Duration::from_secs(1),
    }))
}

/// Marks an inbox row processed in the processor's own transaction; `false` when `token`
/// was fenced out (its lease ran out and another worker took the row).
pub(crate) async fn processed_in(
    conn: &mut PgConnection,
    source: &str,
    id: &str,
    token: Token,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(PROCESSED)
        .bind(source)
        .bind(id)
        .bind(token.as_uuid())
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

// ---- The ordering guard (`webhook_objects`, `crate::latest`) ----

/// `ON CONFLICT DO UPDATE … WHERE` updates only when not older, and locks the row either
/// way, until the caller's transaction ends.
const ADVANCE: &str = "
INSERT INTO webhook_objects (namespace, object, applied_at)
VALUES ($1, $2, to_timestamp($3 / 1000.0))
ON CONFLICT (namespace, object) DO UPDATE SET applied_at = excluded.applied_at
WHERE webhook_objects.applied_at <= excluded.applied_at";

/// Moves `(namespace, object)`'s time to `at_ms` unless a newer one was applied; `true`
/// when it moved (or was first seen).
pub(crate) async fn advance(
    conn: &mut PgConnection,
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

/// Stores the row and, only if it is new, notifies listening workers — one round trip.
/// A row `DedupeLayer` left unfinished (released, or claimed) is queued instead, its
/// claim's lock dropped (the row is the inbox's from now on, due at once: a `DedupeLayer`
/// in front of this accept then finds it done), so a source switched from dedupe to the
/// inbox loses no event; a duplicate of a queued row
/// matches neither and writes nothing (`DO NOTHING` takes no row lock).
const ACCEPT: &str = "
WITH inserted AS (
    INSERT INTO webhook_events
        (source, event_id, event_type, object_id, livemode, body, attempts, next_attempt_at, kind)
    VALUES ($1, $2, $3, $4, $5, $6, 0, now(), $7)
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING 1
), adopted AS (
    UPDATE webhook_events SET next_attempt_at = now(), attempts = 0,
        locked_until = NULL, lock_token = NULL
    WHERE source = $1 AND event_id = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
      AND next_attempt_at IS NULL AND processed_at IS NULL AND kind <> 'once'
    RETURNING 1
), queued AS (SELECT 1 FROM inserted UNION ALL SELECT 1 FROM adopted)
SELECT EXISTS (SELECT 1 FROM queued) AS new,
       CASE WHEN EXISTS (SELECT 1 FROM queued) THEN pg_notify('webhook_events', '') END";

/// `SKIP LOCKED`: concurrent workers (in any replica) each take different rows. A due
/// row whose every attempt ended without an outcome (each crashed its worker) is
/// marked dead in the same statement instead of claimed again.
const CLAIM_DUE: &str = "
UPDATE webhook_events w
SET attempts = w.attempts + (w.attempts < $4)::int,
    dead_at = CASE WHEN w.attempts >= $4 THEN now() END,
    processing_error = CASE WHEN w.attempts >= $4
        THEN coalesce(w.processing_error || '; then ', '') || $5 ELSE w.processing_error END,
    locked_until = CASE WHEN w.attempts < $4
        THEN clock_timestamp() + make_interval(secs => $1) END,
    lock_token = CASE WHEN w.attempts < $4 THEN $2 END
FROM (
    SELECT source, event_id FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= now()
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= clock_timestamp())
    ORDER BY next_attempt_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
) due
WHERE w.source = due.source AND w.event_id = due.event_id
RETURNING w.source, w.event_id, w.event_type, w.object_id, w.livemode, w.body,
    w.attempts::int8 AS attempts, w.dead_at IS NOT NULL AS buried";

/// Claimed rows a worker hands back unprocessed (its claim was answered too late to run
/// them safely): due again at once, the attempt uncounted.
const GIVE_BACK: &str = "
UPDATE webhook_events w SET attempts = w.attempts - 1, locked_until = NULL, lock_token = NULL
FROM unnest($1::text[], $2::text[]) AS input(source, event_id)
WHERE w.source = input.source AND w.event_id = input.event_id AND w.lock_token = $3
  AND w.processed_at IS NULL AND w.dead_at IS NULL";

const RENEW_ROW: &str = "
UPDATE webhook_events SET locked_until = clock_timestamp() + make_interval(secs => $4)
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

/// The row processed; idempotent under its token like a claim's completion.
const PROCESSED: &str = "
UPDATE webhook_events SET processed_at = coalesce(processed_at, now()), processing_error = NULL,
    locked_until = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3";

/// The end of an attempt that did not succeed, if `$3` still holds the row.
const RETRY: &str = "
UPDATE webhook_events SET next_attempt_at = now() + make_interval(secs => $5),
    processing_error = $4, locked_until = NULL, lock_token = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

const DEAD: &str = "
UPDATE webhook_events SET dead_at = now(), processing_error = $4,
    locked_until = NULL, lock_token = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

const ABANDON: &str = "
UPDATE webhook_events SET processing_error = $4, locked_until = NULL, lock_token = NULL
WHERE source = $1 AND event_id = $2 AND lock_token = $3 AND processed_at IS NULL";

const REQUEUE: &str = "
WITH requeued AS (
    UPDATE webhook_events
    SET next_attempt_at = now(), attempts = 0, processed_at = NULL, dead_at = NULL,
        processing_error = NULL, locked_until = NULL, lock_token = NULL
    WHERE next_attempt_at IS NOT NULL
      AND (locked_until IS NULL OR locked_until <= now())
      AND ($1::text IS NULL OR (source = $1 AND event_id = $2))
      AND (NOT $3 OR dead_at IS NOT NULL)
      AND ($4::text IS NULL OR event_type = $4)
      AND ($5::int8 IS NULL OR received_at >= to_timestamp($5 / 1000.0))
      AND ($6::int8 IS NULL OR received_at < to_timestamp($6 / 1000.0))
    RETURNING 1)
SELECT count(*), pg_notify('webhook_events', '') FROM requeued";

/// Processed inbox rows older than the cutoff, and (by name only) dead ones: two
/// statements, each on its partial index (a `CASE` between them would use neither).
/// Kept rows (no signed time: only the row refuses a replay) are pruned by name only.
const PRUNE_PROCESSED: &str = "
DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind = 'event'
AND processed_at IS NOT NULL AND processed_at < now() - make_interval(secs => $1)";

const PRUNE_DEAD: &str = "
DELETE FROM webhook_events WHERE next_attempt_at IS NOT NULL AND kind <> 'once'
AND dead_at IS NOT NULL AND dead_at < now() - make_interval(secs => $1)";

/// The queue from its partial index (`webhook_events_due`), the dead rows from theirs,
/// and the processed ones from the log the triggers keep (`webhook_counts`): the answer
/// costs the size of the queue, not of the history kept.
const COUNTS: &str = "
SELECT q.queued, q.processing, l.processed, l.log_rows,
    (SELECT count(*) FROM webhook_events
     WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL) AS dead,
    q.oldest_due_ms
FROM (
    SELECT
        count(*) FILTER (WHERE locked_until IS NULL OR locked_until <= now()) AS queued,
        count(*) FILTER (WHERE locked_until > now()) AS processing,
        (extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE
            (locked_until IS NULL OR locked_until <= now()) AND next_attempt_at <= now()))
            * 1000)::int8 AS oldest_due_ms
    FROM webhook_events
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
) q, (SELECT coalesce(sum(delta), 0)::int8 AS processed, count(*) AS log_rows
      FROM webhook_counts) l";

/// `counts` folds the log into one row once it holds more than this many.
const FOLD_AFTER: i64 = 4096;

/// The log summed into one row, in a file of its own: `TRUNCATE` gives the space back at
/// once, where deleted rows would leave pages every later sum reads through. It needs
/// the table to itself for a moment: a fold that cannot have it within 50 ms gives up
/// (the next one folds), rather than hold the processed rows' writes queued behind it. A
/// role without `TRUNCATE` on the table deletes the rows instead.
const FOLD_COUNTS: &str = "
DO $$
DECLARE
    total BIGINT;
    entries BIGINT;
BEGIN
    PERFORM set_config('lock_timeout', '50ms', true);
    LOCK TABLE webhook_counts IN ACCESS EXCLUSIVE MODE;
    SELECT coalesce(sum(delta), 0), count(*) INTO total, entries FROM webhook_counts;
    IF entries > 1 THEN
        BEGIN
            TRUNCATE webhook_counts;
        EXCEPTION WHEN insufficient_privilege THEN
            DELETE FROM webhook_counts;
        END;
        INSERT INTO webhook_counts (delta) VALUES (total);
    END IF;
END $$";

/// What a listing and an event read of a row: times as microseconds since the epoch, and
/// whether a worker holds it now.
macro_rules! listed_columns {
    () => {
        "source, event_id, event_type, object_id, attempts::int8 AS attempts,
    (extract(epoch FROM received_at) * 1000000)::int8 AS received_us,
    (extract(epoch FROM next_attempt_at) * 1000000)::int8 AS next_attempt_us,
    (extract(epoch FROM processed_at) * 1000000)::int8 AS processed_us,
    (extract(epoch FROM dead_at) * 1000000)::int8 AS dead_us,
    coalesce(locked_until > now(), false) AS locked, processing_error"
    };
}

/// The listings, one statement per row set and order, each a range of its partial index
/// (`webhook_events_dead`, `webhook_events_failing`, on the time and the key) read in the
/// index's order from the position `$1`, `$2`, `$3` (the time in microseconds, the source
/// and id that break ties in time; `NULL` for the first page: before or after every row).
/// The position is one row comparison on the index's columns, always bound, so a generic
/// plan starts the scan there too: a page reads its own rows, not the ones before it.
const LIST_DEAD_NEWEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL
  AND (dead_at, source, event_id) <
      (coalesce(to_timestamp($1::int8 / 1000000.0), 'infinity'), coalesce($2::text, ''), coalesce($3::text, ''))
ORDER BY dead_at DESC, source DESC, event_id DESC
LIMIT $4"
);

const LIST_DEAD_OLDEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE dead_at IS NOT NULL AND next_attempt_at IS NOT NULL
  AND (dead_at, source, event_id) >
      (coalesce(to_timestamp($1::int8 / 1000000.0), '-infinity'), coalesce($2::text, ''), coalesce($3::text, ''))
ORDER BY dead_at, source, event_id
LIMIT $4"
);

const LIST_FAILING_NEWEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
  AND processing_error IS NOT NULL
  AND (received_at, source, event_id) <
      (coalesce(to_timestamp($1::int8 / 1000000.0), 'infinity'), coalesce($2::text, ''), coalesce($3::text, ''))
ORDER BY received_at DESC, source DESC, event_id DESC
LIMIT $4"
);

const LIST_FAILING_OLDEST: &str = concat!(
    "SELECT ",
    listed_columns!(),
    "
FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
  AND processing_error IS NOT NULL
  AND (received_at, source, event_id) >
      (coalesce(to_timestamp($1::int8 / 1000000.0), '-infinity'), coalesce($2::text, ''), coalesce($3::text, ''))
ORDER BY received_at, source, event_id
LIMIT $4"
);

/// One inbox row by its key, body included.
const EVENT: &str = concat!(
    "SELECT ",
    listed_columns!(),
    ", livemode, body
FROM webhook_events
WHERE source = $1 AND event_id = $2 AND next_attempt_at IS NOT NULL"
);

/// [`COUNTS`]' row: the counts, and how long the log has grown.
#[derive(sqlx::FromRow)]
struct CountsWithLog {
    #[sqlx(flatten)]
    counts: CountsRow,
    log_rows: i64,
}

impl Backend for Pg {
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
        let pool = self.pool.clone();
        let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        Box::pin(async move {
            let rows = sqlx::query_as(CLAIM_DUE)
                .bind(lease.as_secs_f64())
                .bind(token.as_uuid())
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(max_attempts)
                .bind(CRASHED)
                .fetch_all(&pool)
                .await
                .map_err(|e| store_error("inbox claim", e))?;
            Ok(claimed(rows))
        })
    }

    fn give_back(&self, keys: Vec<(String, String)>, token: Token) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let (sources, ids): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
            let done = sqlx::query(GIVE_BACK)
                .persistent(PLANNED_EACH_TIME)
                .bind(sources)
                .bind(ids)
                .bind(token.as_uuid())
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox give back", e))?;
            Ok(done.rows_affected())
        })
    }

    fn renew(
        &self,
        source: String,
        id: String,
        token: Token,
        lease: Duration,
    ) -> StoreFuture<bool> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let done = sqlx::query(RENEW_ROW)
                .bind(source)
                .bind(id)
                .bind(token.as_uuid())
                .bind(lease.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox renew", e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn finish(
        &self,
        source: String,
        id: String,
        token: Token,
        outcome: Outcome,
    ) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            match outcome {
                // The common outcome, gathered with others into one statement.
                Outcome::Processed => match this
                    .writer
                    .write(Write::Processed(source, id, token))
                    .await?
                {
                    Written::Complete(held) => Ok(held),
                    _ => unreachable!("an outcome's answer"),
                },
                outcome => finish_one(&this.pool, &source, &id, token, outcome).await,
            }
        })
    }

    fn requeue(&self, which: &Requeue) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        let which = which.clone();
        Box::pin(async move {
            let (source, id) = which.id.unzip();
            let done = sqlx::query(REQUEUE)
                .bind(source)
                .bind(id)
                .bind(which.dead_only)
                .bind(which.event_type)
                .bind(which.received_from)
                .bind(which.received_before)
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox requeue", e))?;
            let n: i64 = done
                .try_get(0)
                .map_err(|e| store_error("inbox requeue", e))?;
            Ok(n.unsigned_abs())
        })
    }

    fn prune(&self, older_than: Duration, dead: bool) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let sql = if dead { PRUNE_DEAD } else { PRUNE_PROCESSED };
            let done = sqlx::query(sql)
                .bind(older_than.as_secs_f64())
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox prune", e))?;
            if !dead {
                // The pruned rows' -1s, and what was processed since, into one row.
                let _ = sqlx::raw_sql(FOLD_COUNTS).execute(&pool).await;
            }
            Ok(done.rows_affected())
        })
    }

    fn counts(&self) -> StoreFuture<Counts> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let row = sqlx::query_as::<_, CountsWithLog>(COUNTS)
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox counts", e))?;
            if row.log_rows > FOLD_AFTER {
                // Housekeeping, not the answer: a fold that fails is done by a later call.
                let _ = sqlx::raw_sql(FOLD_COUNTS).execute(&pool).await;
            }
            Ok(Counts::from(row.counts))
        })
    }

    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        let pool = self.pool.clone();
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
                .bind(at_us)
                .bind(source)
                .bind(id)
                .bind(limit)
                .fetch_all(&pool)
                .await;
            summaries(rows)
        })
    }

    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            sqlx::query_as::<_, StoredRow>(EVENT)
                .bind(source)
                .bind(id)
                .fetch_optional(&pool)
                .await
                .map(|row| row.map(StoredEvent::from))
                .map_err(|e| store_error("inbox event", e))
        })
    }

    fn listen(&self, wake: Arc<Notify>) -> Option<tokio::task::JoinHandle<()>> {
        let pool = self.pool.clone();
        Some(tokio::spawn(async move {
            // Reconnects after a failure; the worker's polling covers the gap.
            loop {
                if let Ok(mut listener) = PgListener::connect_with(&pool).await {
                    if listener.listen(CHANNEL).await.is_ok() {
                        while listener.recv().await.is_ok() {
                            wake.notify_waiters();
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }))
    }
}

// ---- Group commit ----

/// Many new keys in one statement, in key order (two batches lock shared keys in the same
/// order: no deadlock); the tokens that went in come back.
const CLAIM_MANY: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, body, attempts, locked_until, lock_token, kind)
SELECT source, event_id, event_type, object_id, livemode, body, 1,
       clock_timestamp() + make_interval(secs => lease), token, kind
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bytea[],
            $7::float8[], $8::uuid[], $9::text[])
    AS input(source, event_id, event_type, object_id, livemode, body, lease, token, kind)
ON CONFLICT (source, event_id) DO NOTHING
RETURNING source, event_id, lock_token";

/// Many completions in one statement; the tokens that matched come back.
const COMPLETE_MANY: &str = "
UPDATE webhook_events w
SET processed_at = coalesce(w.processed_at, now()), processing_error = NULL, locked_until = NULL
FROM unnest($1::text[], $2::text[], $3::uuid[]) AS input(source, event_id, token)
WHERE w.source = input.source AND w.event_id = input.event_id AND w.lock_token = input.token
  AND w.next_attempt_at IS NULL
RETURNING w.source, w.event_id, w.lock_token";

/// Many inbox rows processed in one statement (as `PROCESSED`): the worker's outcomes,
/// gathered by the group commit.
const PROCESSED_MANY: &str = "
UPDATE webhook_events w
SET processed_at = coalesce(w.processed_at, now()), processing_error = NULL, locked_until = NULL
FROM unnest($1::text[], $2::text[], $3::uuid[]) AS input(source, event_id, token)
WHERE w.source = input.source AND w.event_id = input.event_id AND w.lock_token = input.token
RETURNING w.source, w.event_id, w.lock_token";

/// Many accepts in one statement (as `ACCEPT`, adoption included); the keys queued come
/// back, and workers are notified (once: PostgreSQL folds identical notifications of a
/// transaction into one).
const ACCEPT_MANY: &str = "
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bytea[],
                         $7::text[])
        AS input(source, event_id, event_type, object_id, livemode, body, kind)
), inserted AS (
    INSERT INTO webhook_events
        (source, event_id, event_type, object_id, livemode, body, attempts, next_attempt_at, kind)
    SELECT source, event_id, event_type, object_id, livemode, body, 0, now(), kind FROM input
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING source, event_id
), adopted AS (
    UPDATE webhook_events w SET next_attempt_at = now(), attempts = 0,
        locked_until = NULL, lock_token = NULL
    FROM input
    WHERE w.source = input.source AND w.event_id = input.event_id
      AND NOT EXISTS (SELECT 1 FROM inserted
                      WHERE inserted.source = input.source AND inserted.event_id = input.event_id)
      AND w.next_attempt_at IS NULL AND w.processed_at IS NULL AND w.kind <> 'once'
    RETURNING w.source, w.event_id
), queued AS (SELECT * FROM inserted UNION ALL SELECT * FROM adopted)
SELECT source, event_id, pg_notify('webhook_events', '')::text FROM queued";

/// A delivery's columns, as arrays for `unnest`.
#[derive(Default)]
struct Columns<'a> {
    source: Vec<&'a str>,
    event_id: Vec<&'a str>,
    event_type: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    livemode: Vec<Option<bool>>,
    body: Vec<Option<&'a [u8]>>,
}

impl<'a> Columns<'a> {
    fn of(deliveries: impl IntoIterator<Item = &'a Delivery>) -> Self {
        let mut columns = Self::default();
        for d in deliveries {
            let audit = d.audit();
            columns.source.push(d.source());
            columns.event_id.push(d.id());
            columns.event_type.push(audit.event_type);
            columns.object_id.push(audit.object_id);
            columns.livemode.push(audit.livemode);
            columns.body.push(audit.body);
        }
        columns
    }

    fn bind(self, query: Query<'a, Postgres, PgArguments>) -> Query<'a, Postgres, PgArguments> {
        query
            .bind(self.source)
            .bind(self.event_id)
            .bind(self.event_type)
            .bind(self.object_id)
            .bind(self.livemode)
            .bind(self.body)
    }
}

type Claiming<'a> = (&'a Delivery, Token, Duration);
type Completing<'a> = (&'a str, &'a str, Token);

/// Runs one batch: each kind of write in one statement of its own, the three at once (one
/// statement for all three measured at half the throughput: its plan is rebuilt for every
/// batch). A statement the server refused (a value one write carries, such as a NUL in an
/// id, or a deadlock) is retried write by write, so one bad write answers alone; a server
/// that cannot be reached answers every write of the kind with the error at once (503),
/// rather than each after its own timeout. No write is ever granted by a failed
/// statement.
async fn write_batch(pool: &PgPool, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
    let (mut claims, mut completes, mut accepts) = (Vec::new(), Vec::new(), Vec::new());
    let mut processed = Vec::new();
    for (i, write) in writes.iter().enumerate() {
        match write {
            Write::Claim(d, token, lease) => claims.push((i, (d, *token, *lease))),
            Write::Complete(source, id, token) => {
                completes.push((i, (source.as_str(), id.as_str(), *token)));
            }
            Write::Accept(d) => accepts.push((i, d)),
            Write::Processed(source, id, token) => {
                processed.push((i, (source.as_str(), id.as_str(), *token)));
            }
        }
    }
    let (claimed, completed, accepted, recorded) = tokio::join!(
        claim_many(pool, claims.iter().map(|c| c.1).collect()),
        complete_many(pool, completes.iter().map(|c| c.1).collect()),
        accept_many(pool, accepts.iter().map(|c| c.1).collect()),
        processed_many(pool, processed.iter().map(|c| c.1).collect()),
    );
    let mut results: Vec<Option<Result<Written, StoreError>>> =
        std::iter::repeat_with(|| None).take(writes.len()).collect();
    for ((i, _), r) in claims.iter().zip(claimed) {
        results[*i] = Some(r.map(Written::Claim));
    }
    for ((i, _), r) in completes.iter().zip(completed) {
        results[*i] = Some(r.map(Written::Complete));
    }
    for ((i, _), r) in accepts.iter().zip(accepted) {
        results[*i] = Some(r.map(Written::Accept));
    }
    for ((i, _), r) in processed.iter().zip(recorded) {
        results[*i] = Some(r.map(Written::Complete));
    }
    results
        .into_iter()
        .map(|r| r.expect("every write answered"))
        .collect()
}

/// Whether a failed statement says the server cannot be used now (no connection, the
/// pool exhausted, the server shutting down), not that one write's values were refused.
fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        // Connection exceptions, insufficient resources, operator intervention.
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57")),
        _ => true,
    }
}

/// Every write of a kind answered with the statement's error.
fn all_failed<T>(n: usize, context: &'static str, e: &sqlx::Error) -> Vec<Result<T, StoreError>> {
    let why = e.to_string();
    let kind = super::error_kind(e);
    (0..n)
        .map(|_| Err(StoreError::new(context, why.clone()).with_kind(kind)))
        .collect()
}

async fn claim_many(pool: &PgPool, claims: Vec<Claiming<'_>>) -> Vec<Result<Claim, StoreError>> {
    let mut inserted = match claims.len() {
        0 | 1 => None,
        n => match insert_claims(pool, &claims).await {
            Ok(inserted) => Some(inserted),
            Err(e) if unavailable(&e) => return all_failed(n, "postgres claim", &e),
            Err(_) => None,
        },
    };
    let mut results = Vec::with_capacity(claims.len());
    for (d, token, lease) in claims {
        // Each row that went in answers one claim: the key's and the token's (two claims
        // of one key under one token are both in the batch, and only one is new).
        let key = (d.source().to_owned(), d.id().to_owned(), token.as_uuid());
        let new = inserted.as_mut().is_some_and(|rows| rows.remove(&key));
        results.push(match new {
            true => Ok(Claim::New(token)),
            // Not new (or the statement failed): the single path, which also takes over.
            false => claim_one(pool, d, token, lease).await,
        });
    }
    results
}

/// The claims' one statement: the keys and tokens that went in.
async fn insert_claims(
    pool: &PgPool,
    claims: &[Claiming<'_>],
) -> Result<HashSet<(String, String, uuid::Uuid)>, sqlx::Error> {
    let mut sorted = claims.to_vec();
    sorted.sort_by_key(|(d, ..)| (d.source(), d.id()));
    let rows = Columns::of(sorted.iter().map(|c| c.0))
        .bind(sqlx::query(CLAIM_MANY))
        .bind(sorted.iter().map(|c| c.2.as_secs_f64()).collect::<Vec<_>>())
        .bind(sorted.iter().map(|c| c.1.as_uuid()).collect::<Vec<_>>())
        .bind(sorted.iter().map(|c| c.0.kind()).collect::<Vec<_>>())
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect()
}

/// One claim: insert, else take over or say why not.
async fn claim_one(
    pool: &PgPool,
    d: &Delivery,
    token: Token,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let err = |e| store_error("postgres claim", e);
    for _ in 0..CLAIM_TRIES {
        let inserted = bind_delivery(sqlx::query(CLAIM), d)
            .bind(lease.as_secs_f64())
            .bind(token.as_uuid())
            .bind(d.kind())
            .fetch_optional(pool)
            .await
            .map_err(err)?;
        if inserted.is_some() {
            return Ok(Claim::New(token));
        }
        let row = sqlx::query(TAKE_OVER)
            .bind(d.source())
            .bind(d.id())
            .bind(lease.as_secs_f64())
            .bind(token.as_uuid())
            .fetch_optional(pool)
            .await
            .map_err(err)?;
        // No row: pruned between the two statements; try the insert again.
        let Some(row) = row else { continue };
        let taken: bool = row.try_get(0).map_err(err)?;
        if taken {
            return Ok(Claim::New(token));
        }
        if let Some(claim) = not_claimed(row.try_get(1).map_err(err)?, row.try_get(2).map_err(err)?)
        {
            return Ok(claim);
        }
    }
    Ok(Claim::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

async fn complete_many(
    pool: &PgPool,
    completes: Vec<Completing<'_>>,
) -> Vec<Result<bool, StoreError>> {
    let mut done = HashSet::new();
    if completes.len() > 1 {
        match update_done(pool, COMPLETE_MANY, &completes).await {
            Ok(matched) => done = matched,
            Err(e) if unavailable(&e) => {
                return all_failed(completes.len(), "postgres complete", &e)
            }
            Err(_) => {}
        }
    }
    let mut results = Vec::with_capacity(completes.len());
    for (source, id, token) in completes {
        if done.contains(&done_key(source, id, token)) {
            results.push(Ok(true));
            continue;
        }
        // Not matched (or the batch failed): the single statement, which also tells a
        // row the inbox adopted from one another attempt took over.
        let done = sqlx::query_scalar(COMPLETE)
            .bind(source)
            .bind(id)
            .bind(token.as_uuid())
            .fetch_one(pool)
            .await
            .map_err(|e| store_error("postgres complete", e));
        results.push(done);
    }
    results
}

/// A row marked done by [`update_done`]: its key and token.
type DoneKey = (String, String, uuid::Uuid);

fn done_key(source: &str, id: &str, token: Token) -> DoneKey {
    (source.to_owned(), id.to_owned(), token.as_uuid())
}

/// Records one attempt's outcome if `token` still holds the row; `false` when fenced out.
async fn finish_one(
    pool: &PgPool,
    source: &str,
    id: &str,
    token: Token,
    outcome: Outcome,
) -> Result<bool, StoreError> {
    let key = |sql| sqlx::query(sql).bind(source).bind(id).bind(token.as_uuid());
    let query = match outcome {
        Outcome::Processed => key(PROCESSED),
        Outcome::Retry(error, after) => key(RETRY).bind(error).bind(after.as_secs_f64()),
        Outcome::Dead(error) => key(DEAD).bind(error),
        Outcome::Abandoned => key(ABANDON).bind(ABANDONED),
    };
    let done = query
        .execute(pool)
        .await
        .map_err(|e| store_error("inbox finish", e))?;
    Ok(done.rows_affected() == 1)
}

/// The inbox worker's outcomes "processed" in one statement; a row not matched was fenced
/// out. A statement the server refused is retried row by row, as `complete_many`.
async fn processed_many(pool: &PgPool, rows: Vec<Completing<'_>>) -> Vec<Result<bool, StoreError>> {
    if rows.is_empty() {
        return Vec::new();
    }
    match update_done(pool, PROCESSED_MANY, &rows).await {
        Ok(done) => rows
            .iter()
            .map(|&(source, id, token)| Ok(done.contains(&done_key(source, id, token))))
            .collect(),
        Err(e) if unavailable(&e) => all_failed(rows.len(), "inbox finish", &e),
        Err(_) => {
            let mut results = Vec::with_capacity(rows.len());
            for (source, id, token) in rows {
                let outcome = Outcome::Processed;
                results.push(finish_one(pool, source, id, token, outcome).await);
            }
            results
        }
    }
}

/// Marks done, in one statement (`COMPLETE_MANY` or `PROCESSED_MANY`), the rows `token`
/// still holds: the keys and tokens that matched.
async fn update_done(
    pool: &PgPool,
    sql: &'static str,
    rows: &[Completing<'_>],
) -> Result<HashSet<DoneKey>, sqlx::Error> {
    let mut sorted = rows.to_vec();
    sorted.sort_by_key(|c| (c.0, c.1));
    let rows = sqlx::query(sql)
        .persistent(PLANNED_EACH_TIME)
        .bind(sorted.iter().map(|c| c.0).collect::<Vec<_>>())
        .bind(sorted.iter().map(|c| c.1).collect::<Vec<_>>())
        .bind(sorted.iter().map(|c| c.2.as_uuid()).collect::<Vec<_>>())
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect()
}

/// The inbox accepts: for a key given twice in a batch, the first is new.
async fn accept_many(pool: &PgPool, accepts: Vec<&Delivery>) -> Vec<Result<Accepted, StoreError>> {
    if accepts.len() > 1 {
        match insert_accepts(pool, &accepts).await {
            Ok(mut queued) => {
                return accepts
                    .iter()
                    .map(|d| {
                        let key = (d.source().to_owned(), d.id().to_owned());
                        Ok(if queued.remove(&key) {
                            Accepted::New
                        } else {
                            Accepted::Duplicate
                        })
                    })
                    .collect()
            }
            Err(e) if unavailable(&e) => return all_failed(accepts.len(), "inbox accept", &e),
            Err(_) => {}
        }
    }
    let mut results = Vec::with_capacity(accepts.len());
    for d in accepts {
        let err = |e| store_error("inbox accept", e);
        let row = bind_delivery(sqlx::query(ACCEPT), d)
            .bind(d.kind())
            .fetch_one(pool)
            .await;
        results.push(row.map_err(err).and_then(|row| {
            let new: bool = row.try_get(0).map_err(err)?;
            Ok(if new {
                Accepted::New
            } else {
                Accepted::Duplicate
            })
        }));
    }
    results
}

/// The accepts' one statement: the keys queued.
async fn insert_accepts(
    pool: &PgPool,
    accepts: &[&Delivery],
) -> Result<HashSet<(String, String)>, sqlx::Error> {
    let mut sorted = accepts.to_vec();
    sorted.sort_by_key(|d| (d.source(), d.id()));
    let kinds: Vec<&str> = sorted.iter().map(|d| d.kind()).collect();
    let rows = Columns::of(sorted)
        .bind(sqlx::query(ACCEPT_MANY))
        .bind(kinds)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migrated database of its own on the local server (as the integration tests'):
    /// the batch statements are checked against PostgreSQL itself.
    async fn fresh_pool() -> PgPool {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let admin = PgPool::connect(&url).await.expect("PostgreSQL is running");
        let name = format!("tower_webhook_unit_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .unwrap();
        let base = &url[..url.rfind('/').expect("a database in the URL")];
        let store = crate::store::PgStore::connect(&format!("{base}/{name}"))
            .await
            .unwrap();
        store.pool().clone()
    }

    /// The key-list joins are never kept as a prepared statement (whose generic plan,
    /// made while the table was small, would scan the whole table for every batch after
    /// it grew); the other batch statements are, which shows the check sees them.
    #[tokio::test]
    async fn key_list_joins_are_planned_for_each_call_not_kept_prepared() {
        let options = fresh_pool().await.connect_options().as_ref().clone();
        // One connection: its session's prepared statements are the ones listed below.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        let lease = Duration::from_secs(30);
        for i in 0..8 {
            let (a, b) = (
                Delivery::new("s", format!("a{i}")),
                Delivery::new("s", format!("b{i}")),
            );
            let (t1, t2) = (Token::new(), Token::new());
            insert_claims(&pool, &[(&a, t1, lease), (&b, t2, lease)])
                .await
                .unwrap();
            let ids = (format!("a{i}"), format!("b{i}"));
            let keys = [("s", ids.0.as_str(), t1), ("s", ids.1.as_str(), t2)];
            let done = update_done(&pool, COMPLETE_MANY, &keys).await.unwrap();
            assert_eq!(done.len(), 2);
            let done = update_done(&pool, PROCESSED_MANY, &keys).await.unwrap();
            assert_eq!(done.len(), 2);
        }
        let prepared = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
                )
                .bind(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
            }
        };
        assert_eq!(
            prepared(CLAIM_MANY).await,
            1,
            "the check sees sqlx's statements"
        );
        assert_eq!(prepared(COMPLETE_MANY).await, 0, "planned for each call");
        assert_eq!(prepared(PROCESSED_MANY).await, 0, "planned for each call");
    }

    /// Each kind's batch statement runs (not the write-by-write fallback, which would
    /// answer the same, only slower), and a mixed batch answers each write.
    #[tokio::test]
    async fn batch_statements_run_and_a_mixed_batch_answers_each_write() {
        let pool = fresh_pool().await;
        let lease = Duration::from_secs(30);
        let (a, b) = (Delivery::new("s", "a"), Delivery::new("s", "b"));
        let (t1, t2, t3) = (Token::new(), Token::new(), Token::new());
        // The same key twice in one statement: one token goes in.
        let inserted = insert_claims(&pool, &[(&a, t1, lease), (&b, t2, lease), (&b, t3, lease)])
            .await
            .expect("one statement");
        let row = |id: &str, t: Token| ("s".to_owned(), id.to_owned(), t.as_uuid());
        assert_eq!(inserted, HashSet::from([row("a", t1), row("b", t2)]));
        let done = update_done(&pool, COMPLETE_MANY, &[("s", "a", t1), ("s", "b", t3)])
            .await
            .expect("one statement");
        assert_eq!(done, HashSet::from([row("a", t1)]));
        let c = Delivery::new("s", "c");
        let queued = insert_accepts(&pool, &[&c, &c])
            .await
            .expect("one statement");
        assert_eq!(queued, HashSet::from([("s".to_owned(), "c".to_owned())]));
        let t4 = Token::new();
        let claimed = Backend::claim(&Pg::new(pool.clone()), 1, lease, t4, 8).await;
        assert_eq!(claimed.unwrap().len(), 1, "the worker's claim of c");

        let answers = write_batch(
            &pool,
            vec![
                Write::Claim(Delivery::new("s", "d"), Token::new(), lease),
                Write::Claim(Delivery::new("s", "b"), Token::new(), lease), // held by t2
                Write::Complete("s".into(), "b".into(), t2),
                Write::Accept(Delivery::new("s", "e")),
                Write::Accept(Delivery::new("s", "e")),
                // The inbox's row `c`, claimed by a worker under t4, and a stale token.
                Write::Processed("s".into(), "c".into(), t4),
                Write::Processed("s".into(), "c".into(), Token::new()),
            ],
        )
        .await;
        assert!(matches!(answers[0], Ok(Written::Claim(Claim::New(_)))));
        assert!(matches!(
            answers[1],
            Ok(Written::Claim(Claim::InFlight { .. }) | Written::Claim(Claim::Done))
        ));
        assert!(matches!(answers[2], Ok(Written::Complete(true))));
        assert!(matches!(answers[3], Ok(Written::Accept(Accepted::New))));
        assert!(matches!(
            answers[4],
            Ok(Written::Accept(Accepted::Duplicate))
        ));
        assert!(matches!(answers[5], Ok(Written::Complete(true))));
        assert!(matches!(answers[6], Ok(Written::Complete(false))));
        let processed: bool = sqlx::query_scalar(
            "SELECT processed_at IS NOT NULL FROM webhook_events WHERE event_id = 'c'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(processed);
    }

    /// The processed count the triggers log is folded once it grows, and stays exact
    /// through bulk changes (5 000 rows processed, half requeued in one statement).
    #[tokio::test]
    async fn counts_fold_the_log_and_stay_exact_through_bulk_changes() {
        let pool = fresh_pool().await;
        let pg = Pg::new(pool.clone());
        sqlx::query(
            "INSERT INTO webhook_events (source, event_id, attempts, next_attempt_at, processed_at)
             SELECT 's', 'e' || g, 1, now(), now() FROM generate_series(1, 5000) g",
        )
        .execute(&pool)
        .await
        .unwrap();
        let log_rows = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_counts")
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        assert!(log_rows().await > 5000, "one +1 a row");
        assert_eq!(pg.counts().await.unwrap().processed, 5000);
        assert_eq!(log_rows().await, 1, "folded by the count");
        // A prune folds too, and a log of one row folds into the same one row.
        Backend::prune(&pg, Duration::from_secs(3600), false)
            .await
            .unwrap();
        assert_eq!(log_rows().await, 1);
        assert_eq!(pg.counts().await.unwrap().processed, 5000);
        // Any statement, the crate's or not: half requeued at once, then some pruned.
        let bulk = |sql: &'static str| {
            let pool = pool.clone();
            async move { sqlx::query(sql).execute(&pool).await.unwrap() }
        };
        bulk(
            "UPDATE webhook_events SET processed_at = NULL WHERE substr(event_id, 2)::int % 2 = 0",
        )
        .await;
        assert_eq!(pg.counts().await.unwrap().processed, 2500);
        bulk("DELETE FROM webhook_events WHERE substr(event_id, 2)::int <= 2000").await;
        assert_eq!(pg.counts().await.unwrap().processed, 1500);
        assert_eq!(pg.counts().await.unwrap().queued, 1500);
    }

    /// The listings read their partial index in its order, not the history (20 000
    /// processed rows here), in the plan a first page gets and in the generic plan a
    /// prepared statement settles on; and rows tied in time (to the microsecond, which
    /// the cursor keeps) page by their key, each once.
    #[tokio::test]
    async fn listings_read_their_partial_index_and_page_through_ties() {
        let pool = fresh_pool().await;
        sqlx::raw_sql(
            "INSERT INTO webhook_events (source, event_id, attempts, next_attempt_at, processed_at)
             SELECT 's', 'p' || g, 1, now(), now() FROM generate_series(1, 20000) g;
             INSERT INTO webhook_events
                 (source, event_id, attempts, next_attempt_at, dead_at, processing_error)
             SELECT 's', 'd' || g, 3, now(), '2026-01-01T00:00:00.987653Z', 'boom'
             FROM generate_series(1, 5) g;
             INSERT INTO webhook_events
                 (source, event_id, received_at, attempts, next_attempt_at, processing_error)
             SELECT 's', 'f' || g, '2026-01-01T00:00:00.000001Z', 1, now() + interval '1 hour', 'late'
             FROM generate_series(1, 3) g;
             INSERT INTO webhook_events (source, event_id, attempts, next_attempt_at)
             SELECT 's', 'q' || g, 0, now() FROM generate_series(1, 100) g;
             ANALYZE webhook_events;",
        )
        .execute(&pool)
        .await
        .unwrap();
        let statements = [
            (LIST_DEAD_NEWEST, "webhook_events_dead"),
            (LIST_DEAD_OLDEST, "webhook_events_dead"),
            (LIST_FAILING_NEWEST, "webhook_events_failing"),
            (LIST_FAILING_OLDEST, "webhook_events_failing"),
        ];
        let mut conn = pool.acquire().await.unwrap();
        for (i, (sql, index)) in statements.into_iter().enumerate() {
            let custom: Vec<String> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
                    .bind(None::<i64>)
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(51_i64)
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "PREPARE list_{i} (int8, text, text, int8) AS {sql}; \
                 SET plan_cache_mode = force_generic_plan"
            )))
            .execute(&mut *conn)
            .await
            .unwrap();
            let generic: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "EXPLAIN EXECUTE list_{i} (1767225600000000, 's', 'd3', 51)"
            )))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
            for plan in [custom, generic] {
                let plan = plan.join("\n");
                assert!(
                    plan.contains(&format!("Index Scan using {index}"))
                        || plan.contains(&format!("Index Scan Backward using {index}")),
                    "{plan}"
                );
                assert!(!plan.contains("Sort"), "read in the index's order: {plan}");
            }
        }
        drop(conn);

        let inbox = crate::inbox::Inbox::postgres(&crate::store::PgStore::from_migrated_pool(pool));
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
    }

    /// A role that may not `TRUNCATE` the log still folds it (by deleting its rows).
    #[tokio::test]
    async fn a_role_without_truncate_still_folds_the_log() {
        let pool = fresh_pool().await;
        let role = format!("tower_webhook_app_{}", uuid::Uuid::new_v4().simple());
        for sql in [
            format!("CREATE ROLE {role} LOGIN"),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_events, webhook_counts TO {role}"
            ),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .unwrap();
        }
        let options = pool.connect_options().as_ref().clone().username(&role);
        let app = PgPool::connect_with(options).await.unwrap();
        for _ in 0..2 {
            sqlx::query("INSERT INTO webhook_counts (delta) VALUES (3)")
                .execute(&app)
                .await
                .unwrap();
        }
        sqlx::raw_sql(FOLD_COUNTS).execute(&app).await.unwrap();
        let log: Vec<i64> = sqlx::query_scalar("SELECT delta FROM webhook_counts")
            .fetch_all(&app)
            .await
            .unwrap();
        assert_eq!(log, [6], "the backfill's 0 and two 3s, folded");
        app.close().await;
        let drop = format!("DROP OWNED BY {role}; DROP ROLE {role}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&pool)
            .await
            .unwrap();
    }
}

//! The inbox: accept, and the worker's claims, renewals and outcomes (see the
//! [state diagram](super::super)).

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use tokio::sync::Notify;

use super::super::shared;
use super::super::{claimed, store_error, Outcome, CRASHED};
use super::group_commit::{Write, Written};
use super::kept::Runs as _;
use super::outcome::finish_one;
use super::{Pg, PLANNED_EACH_TIME};
use crate::inbox::backend::{Backend, Claimed, HeldRow};
use crate::inbox::worker::due::Dues;
use crate::inbox::worker::ClaimDue;
use crate::inbox::Pause;
use crate::inbox::StoredEvent;
use crate::inbox::{Accepted, Counts, DeadRows, EventSummary, Listing, Requeue, Requeued};
use crate::store::{Delivery, StoreFuture, Token};

/// The processor `$11`'s due routes, claimed, with their events' livemode and bodies
/// (each read by its key: a subquery a row, which no generic plan made on a small table
/// turns into a scan of the table; the body's row, with its key id and nonce, by a
/// lateral subquery kept a subquery by `OFFSET 0`, for the same reason).
/// `due` is `MATERIALIZED`, so it runs once: as a subquery joined to the `UPDATE`, a plan
/// with it inside a nested loop ran it again for each row of the loop, each run skipping
/// the rows the runs before had locked, and a claim of one row took two.
/// `SKIP LOCKED`: concurrent workers (in any replica) each take different rows; the rows
/// the claiming worker holds (`$9`, `$10`: running, or their outcome not yet written) are
/// left, whatever their lease says. A due
/// row whose every attempt ended without an outcome (each crashed its worker) is
/// marked dead in the same statement instead of claimed again. The attempt's start is
/// kept for its record; a trigger records the attempt before it as crashed when it never
/// finished (the migration `webhook_events_history`).
/// Under a per-object cap of n, a row is claimed while fewer than n of its object's other
/// unfinished rows run or came before it (in arrival order: rows no accept numbered, from
/// before, first by time and key): counted up to n and no further, so an object
/// with a backlog of thousands costs a claim n rows of it, not its whole backlog. Its
/// "queued" test is a `coalesce` so that it does not imply `webhook_routes_due`'s predicate:
/// that index, made on an empty table, says it is empty until the first vacuum, and the
/// planner would scan all of it for every candidate (1.2 s a claim at 20 000 queued).
/// Routes of one object count per processor: one processor's backlog never holds
/// another's turn. The event's trace context (feature `otel`), and whether the route is
/// still due at its event's accept time (`first_run`), by one more lateral lookup by key,
/// only for an event that has one.
pub(super) const CLAIM_DUE: &str = "
WITH due AS MATERIALIZED (
    SELECT source, event_id, processor FROM webhook_routes
    WHERE processor = $11 AND next_attempt_at IS NOT NULL AND next_attempt_at <= now()
      AND processed_at IS NULL AND dead_at IS NULL
      AND (locked_until IS NULL OR locked_until <= clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM webhook_pauses p
          WHERE p.processor IN ('', webhook_routes.processor)
            AND p.source IN ('', webhook_routes.source)
            AND p.event_type IN ('', coalesce(webhook_routes.event_type, '')))
      AND ($6::int4 IS NULL OR object_id IS NULL OR (
          SELECT count(*) FROM (SELECT 1 FROM webhook_routes o
          WHERE o.processor = webhook_routes.processor
            AND o.object_id = webhook_routes.object_id AND o.source = webhook_routes.source
            AND o.event_id <> webhook_routes.event_id
            AND o.processed_at IS NULL AND o.dead_at IS NULL
            AND coalesce(o.next_attempt_at, '-infinity') <> '-infinity'
            AND (o.locked_until > clock_timestamp()
                OR (coalesce(o.arrival, 0), o.received_at, o.event_id)
                < (coalesce(webhook_routes.arrival, 0), webhook_routes.received_at,
                   webhook_routes.event_id))
          LIMIT $6) earlier) < $6)
      AND NOT (source = ANY($7::text[])) AND NOT (coalesce(event_type, '') = ANY($8::text[]))
      AND (source, event_id) NOT IN (SELECT * FROM unnest($9::text[], $10::text[]))
    ORDER BY next_attempt_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhook_routes w
    SET attempts = w.attempts + (w.attempts < $4)::int,
        dead_at = CASE WHEN w.attempts >= $4 THEN now() END,
        processing_error = CASE WHEN w.attempts >= $4
            THEN coalesce(w.processing_error || '; then ', '') || $5 ELSE w.processing_error END,
        locked_until = CASE WHEN w.attempts < $4
            THEN clock_timestamp() + make_interval(secs => $1) END,
        lock_token = CASE WHEN w.attempts < $4 THEN $2 END,
        attempt_started_at = CASE WHEN w.attempts < $4 THEN clock_timestamp() END
    FROM due
    WHERE w.source = due.source AND w.event_id = due.event_id AND w.processor = due.processor
    RETURNING w.source, w.event_id, w.event_type, w.object_id, w.attempts::int8 AS attempts,
        w.dead_at IS NOT NULL AS buried, w.next_attempt_at
)
SELECT c.source, c.event_id, c.event_type, c.object_id,
    (SELECT e.livemode FROM webhook_events e
     WHERE e.source = c.source AND e.event_id = c.event_id) AS livemode,
    b.body, b.key_id, b.body_nonce,
    (SELECT e.body_state FROM webhook_events e
     WHERE e.source = c.source AND e.event_id = c.event_id) AS body_state,
    c.attempts, c.buried, t.traceparent, t.tracestate, coalesce(t.as_accepted, false) AS as_accepted
FROM claimed c
LEFT JOIN LATERAL (SELECT b.body, b.key_id, b.body_nonce FROM webhook_bodies b
    WHERE b.source = c.source AND b.event_id = c.event_id OFFSET 0) b ON true
LEFT JOIN LATERAL (SELECT e.traceparent, e.tracestate,
        e.next_attempt_at = c.next_attempt_at AS as_accepted
    FROM webhook_events e
    WHERE e.source = c.source AND e.event_id = c.event_id AND e.traceparent IS NOT NULL
    OFFSET 0) t ON true";

/// Claimed rows a worker hands back unprocessed (its claim was answered too late to run
/// them safely): due again at once, the attempt uncounted.
const GIVE_BACK: &str = "
UPDATE webhook_routes w SET attempts = w.attempts - 1, locked_until = NULL, lock_token = NULL
FROM unnest($1::text[], $2::text[]) AS input(source, event_id)
WHERE w.source = input.source AND w.event_id = input.event_id AND w.processor = $4
  AND w.lock_token = $3 AND w.processed_at IS NULL AND w.dead_at IS NULL";

const RENEW_ROW: &str = "
UPDATE webhook_routes SET locked_until = clock_timestamp() + make_interval(secs => $4)
WHERE source = $1 AND event_id = $2 AND processor = $5 AND lock_token = $3
  AND processed_at IS NULL";

/// Records the attempt the statement `$body` finished (its rows in `done`, with their
/// attempt number and start) as `$outcome` with `$error`, in the same statement; a row
/// without a start (claimed before the history) records nothing.
/// With `cap:` (the placeholder of `MAX_ATTEMPT_RECORDS - 1`), the event's older attempts
/// past the newest that many are deleted too: a row snoozed or failing again and again
/// keeps a bounded history (processed and dead end a run of attempts, so they need no
/// cap). The answer is how many rows the finish changed.
macro_rules! recorded {
    ($body:literal, $outcome:literal, $error:literal) => {
        concat!(
            "
WITH done AS (", $body, "
), recorded AS (
    INSERT INTO webhook_attempts
        (source, event_id, processor, attempt, started_at, finished_at, outcome, error)
    SELECT source, event_id, processor, attempt, attempt_started_at,
        greatest(clock_timestamp(), attempt_started_at), '", $outcome, "', ", $error, "
    FROM done WHERE attempt_started_at IS NOT NULL
)"
        )
    };
    ($body:literal, $outcome:literal, $error:literal, cap: $cap:literal) => {
        concat!(
            recorded!(@capped $body, $outcome, $error, $cap),
            "
SELECT count(*) FROM done"
        )
    };
    // With `due:` (the placeholder of the seconds until the row falls due again), the
    // route's processor's workers in every process are told when (the notification's
    // payload: `<processor> <seconds>`; `done` is one route).
    ($body:literal, $outcome:literal, $error:literal, cap: $cap:literal, due: $after:literal) => {
        concat!(
            recorded!(@capped $body, $outcome, $error, $cap),
            "
SELECT count(*), CASE WHEN count(*) > 0
    THEN pg_notify('webhook_events', min(processor) || ' ' || ", $after, "::text) END
FROM done"
        )
    };
    (@capped $body:literal, $outcome:literal, $error:literal, $cap:literal) => {
        concat!(
            recorded!($body, $outcome, $error),
            ", capped AS (
    DELETE FROM webhook_attempts WHERE ctid IN (
        SELECT a.ctid FROM webhook_attempts a, done
        WHERE a.source = done.source AND a.event_id = done.event_id
          AND a.processor = done.processor
        ORDER BY a.started_at DESC OFFSET ", $cap, "::int8)
)"
        )
    };
    ($body:literal, $outcome:literal, $error:literal, end) => {
        concat!(recorded!($body, $outcome, $error), "
SELECT count(*) FROM done")
    };
}

/// The row processed; idempotent under its token like a claim's completion. Its attempt
/// is no row of `webhook_attempts`: the row's own `attempt_started_at` and `processed_at`
/// are its record (read back as one by `ATTEMPTS`; a requeue copies it into the table),
/// so the drain's outcomes write nothing more than before. The time is the statement's
/// (`clock_timestamp()`): in a transactional processor's transaction, `now()` would be
/// when the processor started.
pub(super) const PROCESSED: &str = "
UPDATE webhook_routes SET processed_at = coalesce(processed_at, clock_timestamp()),
    processing_error = NULL, locked_until = NULL
WHERE source = $1 AND event_id = $2 AND processor = $4 AND lock_token = $3";

/// The end of an attempt that did not succeed, if `$3` still holds the row.
/// The error `$4` is dropped when the event lost its body meanwhile (erased, expired),
/// unless the last placeholder says it is the crate's own text (P11): the event's row is
/// read `FOR KEY SHARE`, so an erase holding it (`FOR UPDATE`) is waited for and seen,
/// and one after this commits reads the error this wrote. The attempt's record keeps
/// what the route kept.
pub(super) const RETRY: &str = recorded!(
    "
    UPDATE webhook_routes SET next_attempt_at = now() + make_interval(secs => $5),
        processing_error = CASE WHEN $8 OR (SELECT e.body_state FROM webhook_events e
            WHERE e.source = $1 AND e.event_id = $2 FOR KEY SHARE) IS NULL THEN $4 END,
        locked_until = NULL, lock_token = NULL
    WHERE source = $1 AND event_id = $2 AND processor = $7 AND lock_token = $3
      AND processed_at IS NULL
    RETURNING source, event_id, processor, attempts AS attempt, attempt_started_at,
        processing_error AS kept",
    "failed",
    "kept",
    cap: "$6",
    due: "$5"
);

/// As [`RETRY`], the error kept only as it says (`$6`).
pub(super) const DEAD: &str = recorded!(
    "
    UPDATE webhook_routes SET dead_at = now(),
        processing_error = CASE WHEN $6 OR (SELECT e.body_state FROM webhook_events e
            WHERE e.source = $1 AND e.event_id = $2 FOR KEY SHARE) IS NULL THEN $4 END,
        locked_until = NULL, lock_token = NULL
    WHERE source = $1 AND event_id = $2 AND processor = $5 AND lock_token = $3
      AND processed_at IS NULL
    RETURNING source, event_id, processor, attempts AS attempt, attempt_started_at,
        processing_error AS kept",
    "dead",
    "kept",
    end
);

/// Snoozed by the processor: due again after `$4` seconds, the attempt uncounted (its
/// record keeps the number it ran as).
pub(super) const LATER: &str = recorded!(
    "
    UPDATE webhook_routes SET next_attempt_at = now() + make_interval(secs => $4),
        attempts = attempts - 1, locked_until = NULL, lock_token = NULL
    WHERE source = $1 AND event_id = $2 AND processor = $6 AND lock_token = $3
      AND processed_at IS NULL
    RETURNING source, event_id, processor, attempts + 1 AS attempt, attempt_started_at",
    "snoozed",
    "NULL",
    cap: "$5",
    due: "$4"
);

pub(super) const ABANDON: &str = recorded!(
    "
    UPDATE webhook_routes SET processing_error = $4, locked_until = NULL, lock_token = NULL
    WHERE source = $1 AND event_id = $2 AND processor = $6 AND lock_token = $3
      AND processed_at IS NULL
    RETURNING source, event_id, processor, attempts AS attempt, attempt_started_at",
    "abandoned",
    "$4",
    cap: "$5"
);

/// The matching routes queued again, those of events whose body is gone for a recorded
/// reason (expired, erased) left out and counted apart (they could only end dead again).
const REQUEUE: &str = "
WITH matching AS (
    SELECT r.source, r.event_id, r.processor,
        EXISTS (SELECT 1 FROM webhook_events e WHERE e.source = r.source
            AND e.event_id = r.event_id AND e.body_state IS NOT NULL) AS without_body
    FROM webhook_routes r
    WHERE r.next_attempt_at IS NOT NULL
      AND (r.locked_until IS NULL OR r.locked_until <= now())
      AND ($1::text IS NULL OR (r.source = $1 AND r.event_id = $2))
      AND (NOT $3 OR r.dead_at IS NOT NULL)
      AND ($4::text IS NULL OR r.event_type = $4)
      AND ($5::int8 IS NULL OR r.received_at >= to_timestamp($5 / 1000.0))
      AND ($6::int8 IS NULL OR r.received_at < to_timestamp($6 / 1000.0))
      AND ($7::text IS NULL OR r.processor = $7)
), requeued AS (
    UPDATE webhook_routes w
    SET next_attempt_at = now(), attempts = 0, processed_at = NULL, dead_at = NULL,
        processing_error = NULL, locked_until = NULL, lock_token = NULL
    FROM matching m
    WHERE NOT m.without_body AND w.source = m.source AND w.event_id = m.event_id
      AND w.processor = m.processor
      AND w.next_attempt_at IS NOT NULL
      AND (w.locked_until IS NULL OR w.locked_until <= now())
    RETURNING 1)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM matching WHERE without_body),
    pg_notify('webhook_events', '')";

/// Wakes the workers of the processor `$1` in every process: an outcome ended a route its
/// object's later routes waited for (their turn under a per-object cap is free), due now.
pub(super) const NOTIFY: &str = "SELECT pg_notify('webhook_events', $1 || ' 0')";

/// The index a per-object cap reads: a processor's unfinished routes of an object
/// (running, or before the one to claim). Made by the first worker with a cap, not by a
/// migration: an index every accept and every outcome maintain would cost those who use
/// no cap (BENCHMARKS.md). The processor and object id alone: an object has few
/// unfinished routes. Its predicate leaves out `next_attempt_at` (the claim tests it
/// apart, see `CLAIM_DUE`). Made concurrently, beside the writes instead of blocking them.
const OBJECT_INDEX: &str = "
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_routes_by_object
    ON webhook_routes (processor, object_id)
    WHERE processed_at IS NULL AND dead_at IS NULL AND object_id IS NOT NULL";

/// An operator's pause (`$1` source, `$2` type, `$3` processor, `''`: any); a second one
/// changes nothing.
const PAUSE: &str = "
INSERT INTO webhook_pauses (source, event_type, processor) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING";

/// A resume, and a wake-up for every replica's workers.
const RESUME: &str = "
WITH resumed AS (
    DELETE FROM webhook_pauses WHERE source = $1 AND event_type = $2 AND processor = $3
    RETURNING 1)
SELECT count(*), pg_notify('webhook_events', '') FROM resumed";

const PAUSES: &str = "
SELECT processor, source, event_type, (extract(epoch FROM paused_at) * 1000)::int8
FROM webhook_pauses ORDER BY processor, source, event_type";

impl Backend for Pg {
    fn accept(&self, d: Delivery) -> StoreFuture<Accepted> {
        let this = self.clone();
        Box::pin(async move { this.accept(d).await })
    }

    fn claim(&self, processor: Arc<str>, due: ClaimDue) -> StoreFuture<Vec<Claimed>> {
        let pool = self.pool.clone();
        let max_attempts = i32::try_from(due.max_attempts).unwrap_or(i32::MAX);
        let per_object = due.per_object.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let held: (Vec<String>, Vec<String>) = due.skip.held.iter().cloned().unzip();
        let keys = self.keys.clone();
        let sized = self.sized.clone();
        let kept = self.kept.clone();
        Box::pin(async move {
            let sql = sized.text(&pool, CLAIM_DUE).await;
            let query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(due.lease.as_secs_f64())
                .bind(due.token.as_uuid())
                .bind(i64::try_from(due.limit).unwrap_or(i64::MAX))
                .bind(max_attempts)
                .bind(CRASHED)
                .bind(per_object)
                .bind(due.skip.sources)
                .bind(due.skip.types)
                .bind(held.0)
                .bind(held.1)
                .bind(&*processor);
            // On a kept connection: a lent one's two checks were a claim's round trips
            // besides its own (the drain 1.11× kept, BENCHMARKS.md).
            let rows = kept.fetch_all(query).await.and_then(|rows| {
                rows.iter()
                    .map(sqlx::FromRow::from_row)
                    .collect::<Result<Vec<_>, _>>()
            });
            let rows = rows.map_err(|e| store_error("inbox claim", e))?;
            Ok(claimed(rows, &keys))
        })
    }

    fn give_back(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
        token: Token,
    ) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let (sources, ids): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
            let done = sqlx::query(GIVE_BACK)
                .persistent(PLANNED_EACH_TIME)
                .bind(sources)
                .bind(ids)
                .bind(token.as_uuid())
                .bind(&*processor)
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox give back", e))?;
            Ok(done.rows_affected())
        })
    }

    fn renew(&self, row: HeldRow, lease: Duration) -> StoreFuture<bool> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let done = sqlx::query(RENEW_ROW)
                .bind(row.source)
                .bind(row.id)
                .bind(row.token.as_uuid())
                .bind(lease.as_secs_f64())
                .bind(&*row.processor)
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox renew", e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn finish(
        &self,
        HeldRow {
            source,
            id,
            processor,
            token,
            wakes,
        }: HeldRow,
        outcome: Outcome,
    ) -> StoreFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            match outcome {
                // The common outcome, gathered with others into one statement (which
                // notifies when one of them `wakes`).
                Outcome::Processed => match this
                    .write(Write::Processed(source, id, token, wakes, processor))
                    .await?
                {
                    Written::Complete(held) => Ok(held),
                    _ => unreachable!("an outcome's answer"),
                },
                outcome => {
                    let ends = matches!(outcome, Outcome::Dead(_));
                    let key = (source.as_str(), id.as_str(), &*processor);
                    let held = finish_one(&this.pool, key, token, outcome).await?;
                    if held && ends && wakes {
                        // Rare (dead rows): a statement of its own.
                        let _ = sqlx::query(NOTIFY)
                            .bind(&*processor)
                            .execute(&this.pool)
                            .await;
                    }
                    Ok(held)
                }
            }
        })
    }

    fn requeue(&self, which: &Requeue) -> StoreFuture<Requeued> {
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
                .bind(which.processor)
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox requeue", e))?;
            let err = |e| store_error("inbox requeue", e);
            let (requeued, without_body): (i64, i64) =
                (done.try_get(0).map_err(err)?, done.try_get(1).map_err(err)?);
            Ok(Requeued {
                requeued: requeued.unsigned_abs(),
                without_body: without_body.unsigned_abs(),
            })
        })
    }

    fn erase(&self, keys: Vec<(String, String)>) -> StoreFuture<u64> {
        super::erasure::erase(&self.pool, keys)
    }

    #[cfg(feature = "seal")]
    fn by_subject(
        &self,
        digests: Vec<Vec<u8>>,
        limit: usize,
    ) -> StoreFuture<Vec<(String, String)>> {
        super::erasure::by_subject(&self.pool, digests, limit)
    }

    fn expire_bodies(&self, retention: Duration, batch: usize) -> StoreFuture<Option<u64>> {
        super::expiry::expire(&self.pool, retention, batch)
    }

    fn pause(
        &self,
        (processor, source, event_type): crate::inbox::pause::Rule,
        pause: bool,
    ) -> StoreFuture<bool> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let changed = if pause {
                let done = sqlx::query(PAUSE).bind(source).bind(event_type);
                done.bind(processor)
                    .execute(&pool)
                    .await
                    .map(|d| d.rows_affected())
            } else {
                let done = sqlx::query_scalar::<_, i64>(RESUME)
                    .bind(source)
                    .bind(event_type)
                    .bind(processor);
                done.fetch_one(&pool).await.map(i64::unsigned_abs)
            };
            Ok(changed.map_err(|e| store_error("inbox pause", e))? > 0)
        })
    }

    fn object_index(&self) -> StoreFuture<()> {
        shared::object_index(&self.pool, OBJECT_INDEX)
    }

    fn pauses(&self) -> StoreFuture<Vec<Pause>> {
        shared::pauses(&self.pool, PAUSES)
    }

    fn prune(&self, older_than: Duration, dead: Option<&DeadRows>) -> StoreFuture<u64> {
        super::prune::prune(&self.pool, older_than, dead)
    }

    fn counts(&self, processor: Arc<str>) -> StoreFuture<Counts> {
        super::listing::counts(&self.pool, processor)
    }

    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        super::listing::list(&self.pool, listing, &self.keys)
    }

    fn processed_per_minute(&self, minutes: u32) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
        super::listing::processed_per_minute(&self.pool, minutes)
    }

    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        super::listing::event(&self.pool, source, id, &self.keys)
    }

    fn next_due(&self, processor: Arc<str>) -> StoreFuture<Option<Duration>> {
        super::wake::next_due(&self.pool, processor)
    }

    fn listen(&self, wake: Arc<Notify>, due: Dues) -> Option<tokio::task::JoinHandle<()>> {
        Some(super::wake::listen(self.pool.clone(), wake, due))
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

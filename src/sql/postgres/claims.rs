//! `DedupeLayer`'s claims of an event key: claim, renew, complete, release, prune; and
//! a key marked done inside the caller's transaction (`Once::run_in`, `TxDedupeLayer`).

use std::time::Duration;

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;
use sqlx::PgConnection;

use super::super::shared::{changed, not_claimed};
use super::super::store_error;
use super::super::{KeyOp, Keyed};
use super::group_commit::{Write, Written};
use super::{bind_claim, Pg};
use crate::inbox::Accepted;
use crate::store::{Claim, Delivery, StoreError, Token};

/// A first-seen key: one round trip. `DO NOTHING` takes no lock on a conflicting row,
/// so a duplicate writes nothing and costs the server no commit flush. The row keeps the
/// event's type, object id and livemode, never its body (`bind_claim`).
pub(super) const CLAIM: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, attempts, locked_until, lock_token, kind)
VALUES ($1, $2, $3, $4, $5, 1, clock_timestamp() + make_interval(secs => $6), $7, $8)
ON CONFLICT (source, event_id) DO NOTHING
RETURNING lock_token";

/// A row that exists: take it over if it was released or its lease ran out (the `UPDATE`
/// re-checks that under the row lock, so one of several racers wins), and say why not
/// otherwise — in the same round trip.
pub(super) const TAKE_OVER: &str = "
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
pub(super) const COMPLETE: &str = "
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

/// The inbox's kept events of source `$1` (no signed time: pruned by name only) whose
/// every route finished (processed, or deleted dead) more than `$2` seconds ago: what
/// `PRUNE_ONCE` deletes of claims, for events whose state is their routes' (a trigger
/// takes routes, body and history).
const PRUNE_KEPT_EVENTS: &str = "
DELETE FROM webhook_events e
WHERE e.kind = 'kept' AND e.source = $1 AND e.next_attempt_at IS NOT NULL
  AND e.received_at < now() - make_interval(secs => $2)
  AND NOT EXISTS (SELECT 1 FROM webhook_routes r
      WHERE r.source = e.source AND r.event_id = e.event_id
        AND (r.processed_at IS NULL OR r.processed_at >= now() - make_interval(secs => $2)))";

/// The key's row, done, inside the caller's transaction — or a claim whose lease ran out
/// (or that was released) taken over. A concurrent transaction inserting the same key
/// waits on the unique index, then sees the committed row (already) or nothing (it runs).
/// No body, as `CLAIM`.
const DONE_IN: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, object_id, livemode, attempts, processed_at, lock_token, kind)
VALUES ($1, $2, $3, $4, $5, 1, now(), $6, $7)
ON CONFLICT (source, event_id) DO UPDATE SET
    processed_at = now(), locked_until = NULL, lock_token = excluded.lock_token,
    attempts = webhook_events.attempts + 1
WHERE webhook_events.processed_at IS NULL AND webhook_events.next_attempt_at IS NULL
  AND (webhook_events.locked_until IS NULL OR webhook_events.locked_until <= clock_timestamp())
RETURNING 1";

/// Why a claim took nothing: done (or the inbox's: a duplicate to `DedupeLayer`), or
/// claimed by a live attempt (for how much longer).
pub(super) const STATE: &str = "
SELECT processed_at IS NOT NULL OR next_attempt_at IS NOT NULL,
       (EXTRACT(EPOCH FROM (locked_until - clock_timestamp())) * 1000)::float8
FROM webhook_events WHERE source = $1 AND event_id = $2";

/// How much longer a claim is held, from the milliseconds `STATE` reads (`None`: its lease
/// ran out, or it was released).
pub(super) fn remaining(ms: Option<f64>) -> Option<Duration> {
    ms.filter(|ms| *ms > 0.0)
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
}

impl Pg {
    /// Answers a dedupe store's [`KeyOp`]: claims and completions through the group
    /// commit (they are the hot path), the rest straight to the pool.
    pub(crate) async fn key(&self, op: KeyOp) -> Result<Keyed, StoreError> {
        let pool = &self.pool;
        Ok(match op {
            KeyOp::Claim(d, token, lease) => {
                match self.write(Write::Claim(d, token, lease)).await? {
                    Written::Claim(claim) => Keyed::Claim(claim),
                    _ => unreachable!("a claim's answer"),
                }
            }
            KeyOp::Complete(d, token) => {
                let write = Write::Complete(d.source().into(), d.id().into(), token);
                match self.write(write).await? {
                    Written::Complete(done) => Keyed::Held(done),
                    _ => unreachable!("a completion's answer"),
                }
            }
            KeyOp::Renew(d, token, lease) => {
                let renew = sqlx::query_scalar(RENEW).bind(d.source()).bind(d.id());
                let renew = renew.bind(token.as_uuid()).bind(lease.as_secs_f64());
                let held = renew.fetch_one(pool).await;
                Keyed::Held(held.map_err(|e| store_error("postgres renew", e))?)
            }
            KeyOp::Release(d, token) => {
                let release = sqlx::query(RELEASE).bind(d.source()).bind(d.id());
                release
                    .bind(token.as_uuid())
                    .execute(pool)
                    .await
                    .map_err(|e| store_error("postgres release", e))?;
                Keyed::Held(true)
            }
            KeyOp::Prune(older_than) => {
                let query = sqlx::query(PRUNE).bind(older_than.as_secs_f64());
                Keyed::Count(self.pruned(query).await?)
            }
            KeyOp::PruneOnce(namespace, older_than) => {
                let secs = older_than.as_secs_f64();
                let query = sqlx::query(PRUNE_ONCE).bind(namespace.as_str());
                let keys = self.pruned(query.bind(secs)).await?;
                let query = sqlx::query(PRUNE_KEPT_EVENTS).bind(namespace.as_str());
                Keyed::Count(keys + self.pruned(query.bind(secs)).await?)
            }
        })
    }

    /// Queues a verified event in the inbox.
    pub(crate) async fn accept(&self, d: Delivery) -> Result<Accepted, StoreError> {
        match self.write(Write::Accept(d)).await? {
            Written::Accept(accepted) => Ok(accepted),
            _ => unreachable!("an accept's answer"),
        }
    }

    /// Runs a prune: how many rows it deleted.
    async fn pruned(&self, query: Query<'_, Postgres, PgArguments>) -> Result<u64, StoreError> {
        changed(query, &self.pool)
            .await
            .map_err(|e| store_error("postgres prune", e))
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
    let inserted = bind_claim(sqlx::query(DONE_IN), d)
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
    Ok(
        not_claimed(done, remaining(remaining_ms)).unwrap_or(Claim::InFlight {
            retry_after: Duration::from_secs(1),
        }),
    )
}

//! The writer's statements on the inbox's routes: an accept (the event, its body and its
//! routes), a worker's claim and outcomes, requeues and prunes, each in the batch's
//! transaction; and the attempts a batch finished.

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite as Db, SqliteArguments, SqliteConnection};

use super::super::sealed::crate_text;
use super::super::{store_error, ClaimedRow, Outcome, ABANDONED, CRASHED, MAX_ATTEMPT_RECORDS};
use super::prune::{PRUNE_DEAD, PRUNE_EVENTS, PRUNE_OLD_TOMBSTONES};
use super::queue::{
    ABANDON, ACCEPT, ACCEPT_BODIES, ACCEPT_ROUTES, BURY_CRASHED, CAP_ATTEMPTS, CLAIMED_BODIES,
    CLAIM_DUE, DEAD, GIVE_BACK, LATER, PROCESSED, RECORD_ATTEMPTS, RENEW_ROW, RETRY,
};
use super::{bind_delivery, ms};
use crate::inbox::backend::HeldRow;
use crate::inbox::worker::ClaimDue;
use crate::inbox::{Accepted, DeadRows};
use crate::store::{Delivery, StoreError, Token};

/// An attempt a batch finished, recorded in `webhook_attempts` before the batch commits.
pub(super) struct Finished<'a> {
    source: &'a str,
    id: &'a str,
    processor: &'a str,
    attempt: i64,
    started: i64,
    finished: i64,
    outcome: &'static str,
    error: Option<&'a str>,
}

/// Binds a held route's key, the claim's token and its processor as `?1`…`?4`.
fn held<'q>(sql: &'static str, row: &'q HeldRow) -> Query<'q, Db, SqliteArguments> {
    sqlx::query(sql)
        .bind(row.source.as_str())
        .bind(row.id.as_str())
        .bind(row.token.to_string())
        .bind(&*row.processor)
}

/// The batch's finished attempts (but the processed ones, which their routes record) in
/// `webhook_attempts` ([`RECORD_ATTEMPTS`]), and the history of each route whose attempt
/// did not end its run cut to the newest [`MAX_ATTEMPT_RECORDS`].
pub(super) async fn record(
    conn: &mut SqliteConnection,
    attempts: &[Finished<'_>],
) -> Result<(), StoreError> {
    if attempts.is_empty() {
        return Ok(());
    }
    let err = |e| store_error("inbox attempts", e);
    let rows: Vec<_> = attempts
        .iter()
        .map(|a| {
            let (source, id, outcome) = (a.source, a.id, a.outcome);
            let at = (a.attempt, a.started, a.finished);
            let own = a.error.is_some_and(crate_text);
            (
                source,
                id,
                at.0,
                at.1,
                at.2,
                outcome,
                a.error,
                a.processor,
                own,
            )
        })
        .collect();
    let json = serde_json::to_string(&rows).expect("strings and numbers");
    sqlx::query(RECORD_ATTEMPTS)
        .bind(json)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let kept = i64::try_from(MAX_ATTEMPT_RECORDS).unwrap_or(i64::MAX);
    for a in attempts.iter().filter(|a| a.outcome != "dead") {
        sqlx::query(CAP_ATTEMPTS)
            .bind(a.source)
            .bind(a.id)
            .bind(kept)
            .bind(a.processor)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// An accept at `now`, numbered `arrival`: the event (or the `DedupeLayer` claim it
/// adopts), in the batch's transaction. When that changed the row, the delivery joins
/// `queued`, whose bodies and routes [`write_queued`] writes before the batch's next
/// write of another kind (or its end).
pub(super) async fn accept<'a>(
    conn: &mut SqliteConnection,
    now: i64,
    d: &'a Delivery,
    arrival: i64,
    queued: &mut Vec<&'a Delivery>,
) -> Result<Accepted, StoreError> {
    let audit = d.audit();
    let done = bind_delivery(sqlx::query(ACCEPT), d)
        .bind(now)
        .bind(d.kind())
        .bind(audit.headers)
        .bind(arrival)
        .bind(d.trace().traceparent())
        .bind(d.trace().tracestate())
        .execute(&mut *conn)
        .await
        .map_err(|e| store_error("inbox accept", e))?;
    if done.rows_affected() != 1 {
        return Ok(Accepted::Duplicate);
    }
    queued.push(d);
    Ok(Accepted::New)
}

/// The bodies and routes of the events a run of accepts queued, two statements whatever
/// its length ([`ACCEPT_BODIES`], [`ACCEPT_ROUTES`]: a statement per accept would cost a
/// round trip to SQLite's thread each); `queued` is left empty. Every byte string of the
/// run (keys, bodies, headers, ciphertexts, nonces, digests) is bound once, end to end,
/// as one blob, and where each is as another: none is encoded for SQLite to decode.
pub(super) async fn write_queued(
    conn: &mut SqliteConnection,
    queued: &mut Vec<&Delivery>,
) -> Result<(), StoreError> {
    if queued.is_empty() {
        return Ok(());
    }
    let err = |e| store_error("inbox accept", e);
    let size: usize = queued.iter().map(|d| d.size() + 128).sum(); // 128: nonces, a digest
    let mut bytes = Vec::with_capacity(size);
    let mut entries = Vec::with_capacity(queued.len() * ENTRY);
    let mut routes = Vec::new();
    for d in queued.drain(..) {
        let audit = d.audit();
        let sealed = d.sealed();
        let sealed_headers = sealed.and_then(|s| s.headers.as_ref());
        let subject = sealed.and_then(|s| s.subject.as_ref());
        for part in [
            Some(d.source().as_bytes()),
            Some(d.id().as_bytes()),
            sealed.map(|s| s.key_id.as_bytes()),
            audit.body,
            audit.headers.map(str::as_bytes),
            sealed.map(|s| s.body_nonce.as_slice()),
            sealed_headers.map(|(h, _)| h.as_slice()),
            sealed_headers.map(|(_, n)| n.as_slice()),
            subject.map(|(s, _, _)| s.as_slice()),
            subject.map(|(_, n, _)| n.as_slice()),
            subject.map(|(_, _, d)| d.as_slice()),
        ] {
            // Where it starts (from 1), 0 for none, and its length.
            let (start, len) = part.map_or((0, 0), |part| {
                bytes.extend_from_slice(part);
                (bytes.len() - part.len() + 1, part.len())
            });
            number(&mut entries, start);
            number(&mut entries, len);
        }
        if !d.routes().is_empty() {
            let processors: Vec<&str> = d.routes().iter().map(|p| &**p).collect();
            routes.push((d.source(), d.id(), processors));
        }
    }
    sqlx::query(ACCEPT_BODIES)
        .bind(entries)
        .bind(bytes)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    if !routes.is_empty() {
        let routes = serde_json::to_string(&routes).expect("strings");
        sqlx::query(ACCEPT_ROUTES)
            .bind(routes)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// A record of [`ACCEPT_BODIES`]' `?1`: 22 numbers of [`DIGITS`] digits.
const ENTRY: usize = 22 * DIGITS;
const DIGITS: usize = 10;

/// `n` as [`DIGITS`] decimal digits, zeros first, at the end of `entries`. A batch's
/// bytes are bounded far below 10^10 (the writer's batches hold a few MiB at most).
fn number(entries: &mut Vec<u8>, mut n: usize) {
    // By hand: `format!`'s padded path cost ~530 instructions a number (callgrind).
    let mut digits = [b'0'; DIGITS];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + u8::try_from(n % 10).expect("a digit");
        n /= 10;
    }
    debug_assert_eq!(n, 0, "a number of at most {DIGITS} digits");
    entries.extend_from_slice(&digits);
}

/// A claimed route as [`CLAIM_DUE`] returns it: the event's livemode and body are read
/// after it ([`CLAIMED_BODIES`]).
#[derive(sqlx::FromRow)]
struct ClaimedRoute {
    source: String,
    event_id: String,
    event_type: Option<String>,
    object_id: Option<String>,
    attempts: i64,
    buried: bool,
    next_attempt_at: Option<i64>,
}

/// A claimed route's event as [`CLAIMED_BODIES`] reads it: key, livemode, body, its key
/// id and nonce, why the body is gone, and its trace context and accept time.
#[derive(sqlx::FromRow, Default)]
struct ClaimedEvent {
    source: String,
    event_id: String,
    livemode: Option<bool>,
    body: Option<Vec<u8>>,
    key_id: Option<String>,
    body_nonce: Option<Vec<u8>>,
    body_state: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    next_attempt_at: Option<i64>,
}

/// A worker's claim at `now`: the routes it took (with their events' livemode and body)
/// and those it buried (marked dead here: every attempt crashed).
pub(super) async fn claim_due(
    conn: &mut SqliteConnection,
    now: i64,
    processor: &str,
    due: &ClaimDue,
) -> Result<Vec<ClaimedRow>, StoreError> {
    let err = |e| store_error("inbox claim", e);
    let json = |keys: &[String]| serde_json::to_string(keys).expect("strings");
    let routes: Vec<ClaimedRoute> = sqlx::query_as(CLAIM_DUE)
        .bind(now)
        .bind(ms(due.lease))
        .bind(due.token.to_string())
        .bind(i64::try_from(due.limit).unwrap_or(i64::MAX))
        .bind(due.max_attempts)
        .bind(due.per_object)
        .bind(json(&due.skip.sources))
        .bind(json(&due.skip.types))
        .bind(serde_json::to_string(&due.skip.held).expect("strings"))
        .bind(processor)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    for route in routes.iter().filter(|route| route.buried) {
        sqlx::query(BURY_CRASHED)
            .bind(&route.source)
            .bind(&route.event_id)
            .bind(now)
            .bind(CRASHED)
            .bind(processor)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    let keys: Vec<(&str, &str)> = routes
        .iter()
        .filter(|route| !route.buried)
        .map(|route| (route.source.as_str(), route.event_id.as_str()))
        .collect();
    let mut events = std::collections::HashMap::new();
    if !keys.is_empty() {
        let keys = serde_json::to_string(&keys).expect("strings");
        let read: Vec<ClaimedEvent> = sqlx::query_as(CLAIMED_BODIES)
            .bind(keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
        events.extend(read.into_iter().map(|mut e| {
            (
                (
                    std::mem::take(&mut e.source),
                    std::mem::take(&mut e.event_id),
                ),
                e,
            )
        }));
    }
    Ok(routes
        .into_iter()
        .map(|r| {
            let key = (r.source, r.event_id);
            let e = events.remove(&key).unwrap_or_default();
            ClaimedRow {
                source: key.0,
                event_id: key.1,
                event_type: r.event_type,
                object_id: r.object_id,
                livemode: e.livemode,
                body: e.body,
                key_id: e.key_id,
                body_nonce: e.body_nonce,
                body_state: e.body_state,
                attempts: r.attempts,
                buried: r.buried,
                as_accepted: e.next_attempt_at.is_some() && e.next_attempt_at == r.next_attempt_at,
                traceparent: e.traceparent,
                tracestate: e.tracestate,
            }
        })
        .collect())
}

/// Claimed routes handed back under `token`: how many were.
pub(super) async fn give_back(
    conn: &mut SqliteConnection,
    processor: &str,
    keys: &[(String, String)],
    token: Token,
) -> Result<u64, StoreError> {
    let mut n = 0;
    for (source, id) in keys {
        let done = sqlx::query(GIVE_BACK)
            .bind(source)
            .bind(id)
            .bind(token.to_string())
            .bind(processor)
            .execute(&mut *conn)
            .await
            .map_err(|e| store_error("inbox give back", e))?;
        n += done.rows_affected();
    }
    Ok(n)
}

/// A held route's lease renewed until `until`: whether it was still held.
pub(super) async fn renew(
    conn: &mut SqliteConnection,
    row: &HeldRow,
    until: i64,
) -> Result<bool, StoreError> {
    let done = held(RENEW_ROW, row)
        .bind(until)
        .execute(&mut *conn)
        .await
        .map_err(|e| store_error("inbox renew", e))?;
    Ok(done.rows_affected() == 1)
}

/// A held route's outcome at `now` (whether it was still held); the attempt it ended, if
/// its record is a row of `webhook_attempts`, goes in `attempts`.
pub(super) async fn finish<'a>(
    conn: &mut SqliteConnection,
    now: i64,
    row: &'a HeldRow,
    outcome: &'a Outcome,
    attempts: &mut Vec<Finished<'a>>,
) -> Result<bool, StoreError> {
    let err = |e| store_error("inbox finish", e);
    // Each returns the attempt's number and start: the route was held.
    let key = |sql| {
        sqlx::query_as::<_, (i64, Option<i64>)>(sql)
            .bind(row.source.as_str())
            .bind(row.id.as_str())
            .bind(row.token.to_string())
            .bind(&*row.processor)
    };
    let (query, name, error) = match outcome {
        Outcome::Processed => {
            // Its record is the route's own columns: nothing more to write.
            let done = held(PROCESSED, row)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            return Ok(done.rows_affected() == 1);
        }
        Outcome::Retry(error, after) => (
            key(RETRY)
                .bind(now.saturating_add(ms(*after)))
                .bind(error.as_str())
                .bind(crate_text(error)),
            "failed",
            Some(error.as_str()),
        ),
        Outcome::Dead(error) => (
            key(DEAD)
                .bind(now)
                .bind(error.as_str())
                .bind(crate_text(error)),
            "dead",
            Some(error.as_str()),
        ),
        Outcome::Later(after) => (
            key(LATER).bind(now.saturating_add(ms(*after))),
            "snoozed",
            None,
        ),
        Outcome::Abandoned => (key(ABANDON).bind(ABANDONED), "abandoned", Some(ABANDONED)),
    };
    let ended = query.fetch_optional(&mut *conn).await.map_err(err)?;
    if let Some((attempt, Some(started))) = ended {
        attempts.push(Finished {
            source: &row.source,
            id: &row.id,
            processor: &row.processor,
            attempt,
            started,
            finished: now.max(started),
            outcome: name,
            error,
        });
    }
    Ok(ended.is_some())
}

/// The inbox's prune at `now`: the events whose routes all finished before `before`
/// (`None`), or the dead routes named, each left a tombstone. How many went.
pub(super) async fn prune(
    conn: &mut SqliteConnection,
    now: i64,
    before: i64,
    dead: Option<&DeadRows>,
) -> Result<u64, StoreError> {
    let err = |e| store_error("inbox prune", e);
    let Some(rows) = dead else {
        let mut n = 0;
        for sql in [PRUNE_EVENTS, PRUNE_OLD_TOMBSTONES] {
            let done = sqlx::query(sql)
                .bind(before)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            n += done.rows_affected();
        }
        return Ok(n);
    };
    let done = sqlx::query(PRUNE_DEAD)
        .bind(before)
        .bind(rows.source.as_deref())
        .bind(rows.event_type.as_deref())
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(done.rows_affected())
}

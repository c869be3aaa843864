//! The `webhook_events` table and its state machine, written down once per dialect:
//! every statement that touches the table is in [`postgres`] or [`sqlite`], and the
//! stores, the inbox and the transactional layer call them.
//!
//! One row per `(source, event_id)`. `kind` says whose key it is: `'event'` (a delivery:
//! `DedupeLayer`, the inbox, the transactional layer), `'kept'` (a claim of an event whose
//! scheme signs no time, kept until pruned by name: only the key stops its replay) or
//! `'once'` (a business key of [`Once`](crate::once::Once), kept until pruned by name). A row belongs to the inbox
//! when `next_attempt_at` is set; otherwise it is a claim.
//!
//! ```text
//! claims (DedupeLayer, Once::run)             next_attempt_at IS NULL
//!
//!   (none) ──claim──► CLAIMED ──complete──► DONE ──prune (retention)──► (none)
//!             ▲        │  ▲ renew           processed_at set, token kept
//!             │        │  └─┘               (a lost acknowledgement completes again)
//!             │   release, or the lease
//!             │   runs out (EXPIRED)
//!             └── claim ◄── RELEASED ──prune (old, never finished)──► (none)
//!
//!   in a transaction (TxDedupeLayer, Once::run_in): (none) or RELEASED/EXPIRED
//!   ──► DONE, visible when the transaction commits.
//!
//! the inbox                                    next_attempt_at IS NOT NULL
//!
//!   (none) ──accept──► QUEUED ──claim (due)──► PROCESSING ──Processed──► PROCESSED
//!   an unfinished claim ──accept──┘ ▲ ▲          │  ▲ renew               │
//!   (adopted, its lock dropped)     │ └─give back┤  └─┘                   │ prune
//!                                   │  Retry     │ (answered too late:    │
//!                                   ├── (later) ◄┤  uncounted)            ▼
//!                                   │  lease out │                      (none)
//!                                   │ (counted)  ├──Dead, or every attempt
//!                                   │            │  crashed──► DEAD ──prune_dead──► DELETED
//!                                   └────────── requeue (by id, type, window, dead)
//!
//!   DELETED: the key a deleted dead row leaves (a done claim without a token), so its
//!   delivery posted again is a duplicate; pruned as a processed row after the retention.
//! ```
//!
//! | state | columns |
//! |---|---|
//! | CLAIMED | `locked_until` > now, `lock_token` = the attempt's |
//! | RELEASED / EXPIRED | `processed_at` NULL, `locked_until` NULL or ≤ now |
//! | DONE / PROCESSED | `processed_at` set |
//! | QUEUED | `next_attempt_at` set, not locked, not processed or dead; due once `next_attempt_at` ≤ now |
//! | PROCESSING | `next_attempt_at` set, `locked_until` > now |
//! | DEAD | `dead_at` set |
//! | DELETED | `next_attempt_at` NULL, `processed_at` set (when deleted), no token, no body |
//!
//! An accept numbers its row in arrival order (`arrival`: SQLite's writer counts, in
//! `webhook_arrivals`; PostgreSQL's batch takes a number of a sequence): the per-object
//! cap ranks an object's rows by it, not by `received_at`, which a batch's rows share.
//!
//! `webhook_counts` counts PROCESSED inbox rows: triggers on `webhook_events` (the
//! migrations) add to it with every change into or out of that state, in the same
//! transaction, so `counts` never reads the history. SQLite keeps one counter row;
//! PostgreSQL a log of +1/-1 rows that `counts` and the inbox's prune fold into one (a
//! counter row changed a million times in one transaction, by a requeue, walks its own
//! versions each time, and concurrent workers would queue on it).
//!
//! `webhook_attempts` keeps the inbox's history: one row per attempt that ended, written
//! by the statement (PostgreSQL: a CTE beside the row's update) or the transaction
//! (SQLite: one insert per writer batch) that records the outcome, so a row's state and
//! its history never disagree. The claim sets `attempt_started_at`. The attempt that
//! processed the row is no row there: `attempt_started_at` and `processed_at` are its
//! record, read back beside the table's, and a trigger copies it into the table when a
//! requeue clears them — so the drain (claims and "processed") writes no more rows than
//! before. An attempt that never ended (its token still on the row when the next claim
//! takes it) is recorded as crashed by a trigger, whose `WHEN` costs the claims of other
//! rows nothing. Another trigger deletes an event's attempts with its row, whichever
//! prune deletes it. The accept stores the delivery's request
//! headers (`headers`, as [`crate::inbox::headers`] keeps them) in the row itself.
//!
//! One row, one owner: an adopted claim row is the inbox's. The claim's renewal and
//! completion then answer held and done without writing (its handler — the inbox's
//! accept, behind `DedupeLayer` — stored the event), its release changes nothing, and a
//! claim of an inbox row answers done (a redelivery of a stored event: 204). So
//! `DedupeLayer` in front of `accept_service` on the same store processes each event once,
//! the worker claiming it at once. A source moved from `DedupeLayer` to the inbox while
//! one of its handlers still runs elsewhere may see that event processed beside it: finish
//! the move (drain the old replicas) first.
//!
//! Every transition that belongs to an attempt names its fencing token: an attempt whose
//! lease ran out and was taken over changes nothing. PostgreSQL's times are the server's
//! (`clock_timestamp()` for leases, so a statement that waited on a lock still grants a
//! whole one); SQLite's are milliseconds from the process's clock, read once the writer
//! holds the write lock (the same guarantee).
//!
//! Writes go through a group commit (`batch`). PostgreSQL gathers claims, completions and
//! accepts into one statement per kind (renewals and the worker's statements use the
//! pool: the server takes them concurrently). SQLite has one writer per file, so every
//! write on the table of this process goes through one writer on one connection, a batch
//! per transaction, the writes that keep or end a running lease (renewals, completions,
//! releases, a worker's claim and outcomes) before new claims and accepts — a renewal
//! waits for the batch in flight, never behind a storm.
//!
//! Two modules, not a `Dialect` trait behind one generic store: sqlx's per-database
//! bounds (executors, encodings, `RETURNING` and `SKIP LOCKED` differences) would be
//! spelled out on every method, for two implementations that share no SQL text.

mod batch;
pub(crate) mod invalid; // the events their schema refused (issue 36)
mod keys; // what a dedupe store asks its dialect
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod processors; // fan-out's registry and backfill: the rows both dialects read
#[cfg(feature = "seal")]
pub(crate) mod rekey; // rekey's rows, and each opened and sealed again between read and write
pub(crate) mod sealed; // opening what the inbox sealed: every read goes through it
mod shared;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
mod stored; // one event whole: its row, body, routes and history

use std::time::{Duration, SystemTime};

use crate::event::{Event, Stored};
use crate::inbox::backend::Claimed;
use crate::inbox::listing::from_micros;
use crate::inbox::{BodyState, Counts, EventSummary, State};
use crate::metrics::Unreadable;
use crate::store::{StoreError, StoreErrorKind};

pub(crate) use keys::{KeyOp, Keyed};

/// A failed statement as a [`StoreError`] of `context`, of the kind its cause says:
/// [`Unavailable`](StoreErrorKind::Unavailable) when the database could not be used now
/// (no connection, the pool exhausted or closed, a timeout; PostgreSQL's connection,
/// resource, operator and transaction-rollback classes; SQLite busy, locked, out of memory,
/// I/O or disk full), [`InvalidInput`](StoreErrorKind::InvalidInput) for options that do
/// not parse and values PostgreSQL refuses (data exceptions, an index row too large),
/// [`Other`](StoreErrorKind::Other) for the rest (a refused statement, a row
/// that does not decode).
pub(crate) fn store_error(context: &'static str, e: sqlx::Error) -> StoreError {
    let kind = error_kind(&e);
    StoreError::new(context, e).with_kind(kind)
}

/// A failed migration as a [`StoreError`] of `context`: a statement's failure of the kind
/// [`store_error`] gives it, the rest (a migration missing, changed or dirty)
/// [`Other`](StoreErrorKind::Other).
pub(crate) fn migrate_error(context: &'static str, e: sqlx::migrate::MigrateError) -> StoreError {
    use sqlx::migrate::MigrateError;
    let kind = match &e {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => error_kind(e),
        _ => StoreErrorKind::Other,
    };
    StoreError::new(context, e).with_kind(kind)
}

/// The kind [`store_error`] gives `e`.
pub(crate) fn error_kind(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            StoreErrorKind::InvalidInput
        }
        sqlx::Error::Database(db) if transient(&**db) => StoreErrorKind::Unavailable,
        sqlx::Error::Database(db) if refused_value(&**db) => StoreErrorKind::InvalidInput,
        _ => StoreErrorKind::Other,
    }
}

/// Whether PostgreSQL refused a value it was given (a data exception: a NUL in text, say;
/// an index row too large: a key too long): the same input fails again.
fn refused_value(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code().starts_with("22") || pg.code() == "54000";
    }
    let _ = db;
    false
}

/// Whether a database's own error says "not now" rather than "not this".
fn transient(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Connection exceptions, transaction rollback (serialization failure, deadlock),
        // insufficient resources, operator intervention (shutdown, statement timeout),
        // lock not available.
        let code = pg.code();
        return ["08", "40", "53", "57"]
            .iter()
            .any(|class| code.starts_with(class))
            || code == "55P03";
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // The primary result code: BUSY, LOCKED, NOMEM, IOERR, FULL.
        let primary = db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .map(|c| c & 0xff);
        return matches!(primary, Some(5 | 6 | 7 | 10 | 13));
    }
    false
}

/// How an attempt ended (the worker's, written once for every queue).
pub(crate) use crate::inbox::Outcome;

/// A claimed row as both databases return it (the SQL names and casts the columns).
#[derive(sqlx::FromRow)]
struct ClaimedRow {
    source: String,
    event_id: String,
    event_type: Option<String>,
    object_id: Option<String>,
    livemode: Option<bool>,
    /// NULL when the event has no body row (gone: `body_state` says why, if it does).
    body: Option<Vec<u8>>,
    /// The key the body is sealed under (NULL: in clear), and its nonce.
    key_id: Option<String>,
    body_nonce: Option<Vec<u8>>,
    /// Why the event's body is gone (`expired`, `erased`).
    body_state: Option<String>,
    attempts: i64,
    /// Marked dead by the claim instead of claimed (every attempt crashed).
    buried: bool,
    /// The accept's trace context (`otel`: NULL without it, or without a layer).
    traceparent: Option<String>,
    tracestate: Option<String>,
    /// Whether the route is still as its event's accept queued it: due at the event's
    /// accept time (a requeue, backfill or snooze moves it: `first_run`).
    as_accepted: bool,
}

impl ClaimedRow {
    /// The stored event, its body opened with `ring`. A route whose event has no body, or
    /// one that does not open, is never run with an empty one (P2 of
    /// `docs/design/payload-protection.md`): it comes back refused, with the dead reason,
    /// for the worker to end it at once.
    fn into_claimed(self, ring: &sealed::Ring) -> Claimed {
        let r = self;
        let (body, refused) = match r.body {
            Some(body) => {
                let key = r.key_id.as_deref();
                let opened = sealed::open_body(
                    ring,
                    &r.source,
                    &r.event_id,
                    key,
                    r.body_nonce.as_deref(),
                    body,
                );
                match opened {
                    Ok(body) => (body, None),
                    Err(reason) => (Vec::new(), Some(reason)),
                }
            }
            None => {
                let state = BodyState::gone(r.body_state.as_deref());
                let why = match state {
                    BodyState::Expired => Unreadable::Expired,
                    BodyState::Erased => Unreadable::Erased,
                    _ => Unreadable::Missing, // `gone` answers these three only
                };
                let reason = state.dead_reason().map(|reason| (why, reason.to_owned()));
                (Vec::new(), reason)
            }
        };
        Claimed {
            event: Event::stored(Stored {
                source: r.source,
                id: r.event_id,
                event_type: r.event_type,
                object_id: r.object_id,
                livemode: r.livemode,
                timestamp: None, // not a column
                body: body.into(),
            }),
            attempt: u32::try_from(r.attempts).unwrap_or(u32::MAX),
            refused,
            trace: (
                crate::span::TraceContext::stored(r.traceparent, r.tracestate),
                first_run(r.attempts, r.as_accepted),
            ),
        }
    }
}

/// Whether a claimed route's run is its first since the accept, from what the row holds
/// (no flag to keep): its first attempt (a crash's takeover counts one more, a hand-back
/// of an unrun claim none), still due at its event's accept time — the accept queues each
/// route due then, and a requeue, replay, backfill or snooze makes it due at its own time
/// (a requeue in the very millisecond of the accept would pass for the first run: harmless).
fn first_run(attempts: i64, as_accepted: bool) -> bool {
    attempts == 1 && as_accepted
}

/// [`Counts`] as both databases return them (the lag in milliseconds).
#[derive(sqlx::FromRow)]
struct CountsRow {
    queued: i64,
    processing: i64,
    processed: i64,
    dead: i64,
    paused: i64,
    oldest_due_ms: Option<i64>,
}

impl From<CountsRow> for Counts {
    fn from(r: CountsRow) -> Self {
        Counts {
            queued: r.queued.unsigned_abs(),
            processing: r.processing.unsigned_abs(),
            processed: r.processed.unsigned_abs(),
            dead: r.dead.unsigned_abs(),
            paused: r.paused.unsigned_abs(),
            invalid: 0, // per event, not per route: `Inbox::counts` reads it
            oldest_due: r
                .oldest_due_ms
                .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        }
    }
}

/// A listed row as both databases return it (the SQL names and casts the columns): times
/// in microseconds since the epoch, and whether a worker holds the row now.
#[derive(sqlx::FromRow)]
struct ListedRow {
    source: String,
    event_id: String,
    processor: String,
    event_type: Option<String>,
    object_id: Option<String>,
    attempts: i64,
    received_us: i64,
    next_attempt_us: Option<i64>,
    processed_us: Option<i64>,
    dead_us: Option<i64>,
    locked: bool,
    processing_error: Option<String>,
}

impl ListedRow {
    /// The row, its last error opened with `ring` (a sealed one: §3 of the plan).
    fn opened(mut self, ring: &sealed::Ring) -> Self {
        if let Some(text) = self.processing_error.take() {
            let (source, id) = (&self.source, &self.event_id);
            let opened = sealed::open_error(ring, source, id, &self.processor, text);
            self.processing_error = Some(opened);
        }
        self
    }
}

impl From<ListedRow> for EventSummary {
    fn from(r: ListedRow) -> Self {
        // The states of the diagram above, by their columns (dead and processed exclude
        // each other: each is set only on a row its attempt holds, and requeue clears both).
        let state = if r.dead_us.is_some() {
            State::Dead
        } else if r.processed_us.is_some() {
            State::Processed
        } else if r.locked {
            State::Processing
        } else {
            State::Queued
        };
        let pending = matches!(state, State::Queued | State::Processing);
        EventSummary {
            source: r.source,
            id: r.event_id,
            processor: r.processor,
            event_type: r.event_type,
            object_id: r.object_id,
            state,
            attempts: u32::try_from(r.attempts).unwrap_or(u32::MAX),
            received_at: from_micros(r.received_us),
            next_attempt_at: r.next_attempt_us.filter(|_| pending).map(from_micros),
            dead_at: r.dead_us.map(from_micros),
            last_error: r.processing_error,
        }
    }
}

/// The most attempt records a route keeps: a failing, snoozed or abandoned attempt
/// deletes its route's oldest past this many as it adds its own (a processor that snoozes
/// an event every second for days would otherwise grow it without end); per route, so one
/// processor's snoozes never evict another's history (fan-out's T15). Processed and dead
/// attempts end a run, and add theirs without a check (a processed one is its row's own
/// columns until a requeue): the drain's statements pay nothing for the cap.
/// [`Inbox::event`](crate::inbox::Inbox::event) reads the newest this many of each route.
pub(crate) const MAX_ATTEMPT_RECORDS: usize = 100;

/// Each of the last `minutes` minutes' start (milliseconds since the epoch, the last the
/// current minute's, `current_ms`) and how many rows were processed in it, oldest first,
/// from the minutes the database counted (by their starts).
pub(crate) fn per_minute(
    current_ms: i64,
    minutes: u32,
    counted: Vec<(i64, i64)>,
) -> Vec<(SystemTime, u64)> {
    let counted: std::collections::HashMap<i64, i64> = counted.into_iter().collect();
    (0..i64::from(minutes))
        .rev()
        .map(|ago| {
            let start = current_ms.saturating_sub(ago * 60_000);
            let n = counted.get(&start).copied().unwrap_or(0).unsigned_abs();
            (from_micros(start.saturating_mul(1000)), n)
        })
        .collect()
}

/// What a row stopped past the shutdown's grace period says as its error.
const ABANDONED: &str = "stopped mid-attempt: the worker shut down past its grace period";

/// What a row whose last attempt crashed says as its error when it goes dead (after the
/// error of the attempt before, if one failed).
const CRASHED: &str =
    "the last attempt ended without an outcome (the worker crashed or was stopped)";

/// A claim's rows as events, their bodies opened with `ring` (the rows it buried left
/// out).
fn claimed(rows: Vec<ClaimedRow>, ring: &sealed::Ring) -> Vec<Claimed> {
    rows.into_iter()
        .filter(|row| !row.buried)
        .map(|row| row.into_claimed(ring))
        .collect()
}

/// How many times a claim retries when the row it conflicted with was pruned between its
/// two statements.
const CLAIM_TRIES: usize = crate::store::CLAIM_TRIES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_without_a_database_answer_have_the_kind_of_their_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for (e, kind) in [
            (sqlx::Error::Io(refused), StoreErrorKind::Unavailable),
            (sqlx::Error::PoolTimedOut, StoreErrorKind::Unavailable),
            (sqlx::Error::PoolClosed, StoreErrorKind::Unavailable),
            (
                sqlx::Error::Configuration("not a URL".into()),
                StoreErrorKind::InvalidInput,
            ),
            (sqlx::Error::RowNotFound, StoreErrorKind::Other),
            (
                sqlx::Error::ColumnNotFound("state".into()),
                StoreErrorKind::Other,
            ),
        ] {
            let text = e.to_string();
            assert_eq!(store_error("op", e).kind(), kind, "{text}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_busy_is_unavailable_and_a_refused_statement_is_other() {
        use sqlx::{ConnectOptions as _, Connection as _};
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-kinds-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .busy_timeout(Duration::ZERO);
        let mut holder = options.connect().await.unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut holder)
            .await
            .unwrap();
        let tx = holder.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let mut other = options.connect().await.unwrap();

        let busy = sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut other)
            .await
            .unwrap_err();
        assert_eq!(
            store_error("insert", busy).kind(),
            StoreErrorKind::Unavailable
        );
        let refused = sqlx::query("INSERT INTO no_such_table VALUES (1)")
            .execute(&mut other)
            .await
            .unwrap_err();
        assert_eq!(store_error("insert", refused).kind(), StoreErrorKind::Other);

        drop(tx);
        drop((holder, other));
        std::fs::remove_file(&path).unwrap();
    }
}

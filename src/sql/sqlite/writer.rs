//! The one writer: each batch of operations in one transaction (see
//! [`super::super::batch`]), every statement of the table run from here.

use std::sync::Arc;
use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite as Db, SqliteArguments, SqlitePool};

use super::super::store_error;
use super::claims::{claim_one, COMPLETE, INBOX_HAS, PRUNE, PRUNE_ONCE, RELEASE, RENEW};
use super::processors;
use super::prune::PRUNE_KEPT;
use super::queue::{PAUSE, REQUEUE, REQUEUE_WITHOUT_BODY, RESUME, TAKE_ARRIVALS};
use super::routes::{self, record, Finished};
use super::{epoch_ms, ms, Clock, Done, Op};
use crate::store::{Delivery, StoreError, StoreErrorKind, Token};

/// The writer's own connection, opened with the pool's options and the table's busy
/// timeout: the pool's connections (reads) never make the writer wait for a connection —
/// only for another process's lock on the file, up to the busy timeout, after which its
/// writes answer 503.
pub(super) type WriterConnection = Arc<tokio::sync::Mutex<Option<sqlx::SqliteConnection>>>;

/// Runs one batch of writes in one transaction (one commit, one fsync), each with its own
/// statements and answer, at one time read once the write lock is held. If the
/// transaction fails, every write in it gets the error (503): SQLite's statements here
/// fail together — the file locked past the busy timeout, the disk full — never for one
/// write's values, and retrying them one by one would hold each caller through another
/// busy timeout.
pub(super) async fn write_batch(
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
            Err(e) => return all_failed(super::super::error_kind(&e), e.to_string()),
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
pub(super) async fn write_in_one_transaction(
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
    let mut arrival = arrivals(&mut tx, ops).await?;
    let mut results = Vec::with_capacity(ops.len());
    let mut attempts = Vec::new();
    let mut queued = Vec::new();
    for op in ops {
        // A run of accepts writes its bodies and routes before any other write reads them.
        if !matches!(op, Op::Accept(_)) {
            routes::write_queued(&mut tx, &mut queued).await?;
        }
        let pending = (&mut attempts, &mut arrival, &mut queued);
        results.push(Ok(write_one(&mut tx, now, op, pending).await?));
    }
    routes::write_queued(&mut tx, &mut queued).await?;
    record(&mut tx, &attempts).await?;
    tx.commit()
        .await
        .map_err(|e| store_error("sqlite commit", e))?;
    Ok(results)
}

/// The first of the numbers the batch's accepts take, in the order they came (one
/// statement for the batch: `received_at` is its one time, so this is their order).
async fn arrivals(conn: &mut sqlx::SqliteConnection, ops: &[Op]) -> Result<i64, StoreError> {
    let n = ops.iter().filter(|op| matches!(op, Op::Accept(_))).count();
    if n == 0 {
        return Ok(0);
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let last: i64 = sqlx::query_scalar(TAKE_ARRIVALS)
        .bind(n)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| store_error("inbox accept", e))?;
    Ok(last - n + 1)
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

/// The writes a batch leaves for later in its transaction: the attempts finished, the
/// next accept's number, the accepts whose bodies and routes are not written yet.
type Pending<'p, 'a> = (
    &'p mut Vec<Finished<'a>>,
    &'p mut i64,
    &'p mut Vec<&'a Delivery>,
);

/// One write's statements on `conn`, at `now`; the attempts it finished go in `attempts`,
/// an accept takes the number `arrival` holds (the next one left there) and, when it
/// queued its event, joins `queued`.
async fn write_one<'a>(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    op: &'a Op,
    (attempts, arrival, queued): Pending<'_, 'a>,
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
            let accepted = routes::accept(conn, now, d, *arrival, queued).await?;
            *arrival += 1;
            Done::Accept(accepted)
        }
        Op::ClaimDue(processor, due) => {
            Done::Claimed(routes::claim_due(conn, now, processor, due).await?)
        }
        Op::GiveBack(processor, keys, token) => {
            Done::Count(routes::give_back(conn, processor, keys, *token).await?)
        }
        Op::RenewRow(row, lease) => {
            Done::Held(routes::renew(conn, row, now.saturating_add(ms(*lease))).await?)
        }
        Op::Finish(row, outcome) => {
            Done::Held(routes::finish(conn, now, row, outcome, attempts).await?)
        }
        Op::Pause((processor, source, event_type), pause) => {
            let query = match pause {
                true => sqlx::query(PAUSE).bind(source).bind(event_type).bind(now),
                false => sqlx::query(RESUME).bind(source).bind(event_type),
            };
            let query = query.bind(processor);
            let done = query
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("inbox pause", e))?;
            Done::Count(changed(done))
        }
        Op::Requeue(which) => {
            let (source, id) = which.id.clone().unzip();
            let matching = |sql: &'static str| {
                sqlx::query(sql)
                    .bind(now)
                    .bind(source.clone())
                    .bind(id.clone())
                    .bind(which.dead_only)
                    .bind(which.event_type.clone())
                    .bind(which.received_from)
                    .bind(which.received_before)
                    .bind(which.processor.clone())
            };
            let err = |e| store_error("inbox requeue", e);
            let left = matching(REQUEUE_WITHOUT_BODY)
                .fetch_one(&mut *conn)
                .await
                .map_err(err)?;
            let done = matching(REQUEUE).execute(&mut *conn).await.map_err(err)?;
            let left: i64 = sqlx::Row::try_get(&left, 0).map_err(err)?;
            Done::Requeued(crate::inbox::Requeued {
                requeued: changed(done),
                without_body: left.unsigned_abs(),
            })
        }
        Op::ExpireBodies(retention, batch) => {
            let cutoff = now.saturating_sub(ms(*retention));
            Done::Expired(super::expiry::expire(conn, cutoff, *batch).await?)
        }
        Op::Erase(keys) => Done::Count(super::erasure::erase(conn, now, keys).await?),
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
            let before = now.saturating_sub(ms(*older_than));
            let mut n = 0;
            for sql in [PRUNE_ONCE, PRUNE_KEPT] {
                let done = sqlx::query(sql)
                    .bind(namespace.as_str())
                    .bind(before)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| store_error("sqlite prune", e))?;
                n += changed(done);
            }
            Done::Count(n)
        }
        Op::PruneRows(older_than, dead) => {
            let before = now.saturating_sub(ms(*older_than));
            Done::Count(routes::prune(conn, now, before, dead.as_ref()).await?)
        }
        Op::Trust(url) => super::trusted::trust(conn, now, url).await?,
        Op::Register(rows) => processors::register(conn, now, rows).await?,
        Op::Backfill(processor, keys) => {
            processors::backfill_routes(conn, now, processor, keys).await?
        }
        Op::DropProcessor(name) => processors::drop_processor(conn, name).await?,
        #[cfg(feature = "seal")]
        Op::Rekey(rewrites) => Done::Count(super::rekey::rewrite(conn, rewrites).await?),
    })
}

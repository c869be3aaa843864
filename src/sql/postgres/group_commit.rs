//! The writer's batches: many claims, completions, accepts or "processed" outcomes, each
//! kind in one statement (see [`super::super::batch`]).

use std::collections::HashSet;
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPool, Postgres};
use sqlx::query::Query;
use sqlx::Row;

use super::super::batch::{Lane, MAX_BATCH};
use super::super::shared::not_claimed;
use super::super::{store_error, Outcome, CLAIM_TRIES};
use super::accept::accept_many;
use super::claims::{remaining, CLAIM, COMPLETE, TAKE_OVER};
use super::kept::Runs;
use super::outcome::finish_one;
use super::queue::NOTIFY;
use super::{bind_claim, PLANNED_EACH_TIME};
use crate::inbox::Accepted;
use crate::store::{Claim, Delivery, StoreError, Token};

/// A write PostgreSQL's group commit gathers.
pub(super) enum Write {
    Claim(Delivery, Token, Duration),
    Complete(String, String, Token),
    Accept(Delivery),
    /// The inbox worker's: the row processed, if the token still holds it; waking the
    /// workers of every process when its object's later events wait for it.
    Processed(String, String, Token, bool, std::sync::Arc<str>),
}

/// Its outcome.
pub(super) enum Written {
    Claim(Claim),
    /// A completion or a processed row: `false` when fenced out.
    Complete(bool),
    Accept(Accepted),
}

impl Write {
    /// What it adds to its batch's statement: an accept's body and headers (a claim
    /// sends no body).
    pub(super) fn size(&self) -> usize {
        match self {
            Write::Accept(d) => d.size(),
            Write::Claim(..) | Write::Complete(..) | Write::Processed(..) => 0,
        }
    }

    /// A completion or an outcome ends a running lease; claims and accepts are the front
    /// door's.
    pub(super) fn lane(&self) -> Lane {
        match self {
            Write::Complete(..) | Write::Processed(..) => Lane::Urgent,
            Write::Claim(..) | Write::Accept(_) => Lane::Front,
        }
    }
}

/// Many inbox routes processed in one statement (as `PROCESSED`, each route its attempt's
/// record; the processor `$5`): the worker's outcomes, gathered by the group commit. A row whose object's
/// later events wait for it (`$4`) wakes its processor's workers in every process (one
/// notification per processor: PostgreSQL folds a transaction's identical ones).
pub(super) const PROCESSED_MANY: &str = "
WITH done AS (
    UPDATE webhook_routes w
    SET processed_at = coalesce(w.processed_at, now()), processing_error = NULL,
        locked_until = NULL
    FROM unnest($1::text[], $2::text[], $3::uuid[], $4::bool[], $5::text[])
        AS input(source, event_id, token, wakes, processor)
    WHERE w.source = input.source AND w.event_id = input.event_id
      AND w.processor = input.processor AND w.lock_token = input.token
    RETURNING w.source, w.event_id, w.lock_token, input.wakes, w.processor
)
SELECT source, event_id, lock_token,
    CASE WHEN wakes THEN pg_notify('webhook_events', processor || ' 0')::text END
FROM done";

/// A batch's new keys and completions in one statement, one commit: the claims as
/// `$1`…`$8`, in key order (two batches lock shared keys in the same order: no deadlock),
/// the tokens that went in returned; the completions as `$9`…`$11`, the rows their tokens
/// still held returned, marked done (the done row keeps its token, as `COMPLETE`). Each
/// row returned says which it answers (`true`: a key that went in). No body, as `CLAIM`;
/// an empty list of either kind costs nothing.
pub(super) const CLAIM_AND_COMPLETE_MANY: &str = "
WITH claimed AS (
    INSERT INTO webhook_events
        (source, event_id, event_type, object_id, livemode, attempts, locked_until, lock_token, kind)
    SELECT source, event_id, event_type, object_id, livemode, 1,
           clock_timestamp() + make_interval(secs => lease), token, kind
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[],
                $6::float8[], $7::uuid[], $8::text[])
        AS input(source, event_id, event_type, object_id, livemode, lease, token, kind)
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING source, event_id, lock_token
), done AS (
    UPDATE webhook_events w
    SET processed_at = coalesce(w.processed_at, now()), processing_error = NULL,
        locked_until = NULL
    FROM unnest($9::text[], $10::text[], $11::uuid[]) AS input(source, event_id, token)
    WHERE w.source = input.source AND w.event_id = input.event_id
      AND w.lock_token = input.token AND w.next_attempt_at IS NULL
    RETURNING w.source, w.event_id, w.lock_token
)
SELECT true, source, event_id, lock_token FROM claimed
UNION ALL SELECT false, source, event_id, lock_token FROM done";

/// A delivery's columns, as arrays for `unnest`.
#[derive(Default)]
pub(super) struct Columns<'a> {
    source: Vec<&'a str>,
    event_id: Vec<&'a str>,
    event_type: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    livemode: Vec<Option<bool>>,
    body: Vec<Option<&'a [u8]>>,
}

impl<'a> Columns<'a> {
    pub(super) fn of(deliveries: impl IntoIterator<Item = &'a Delivery>) -> Self {
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

    /// The five columns a claim row keeps, as `$1`…`$5`: never the body.
    pub(super) fn bind_claim(
        self,
        query: Query<'a, Postgres, PgArguments>,
    ) -> Query<'a, Postgres, PgArguments> {
        query
            .bind(self.source)
            .bind(self.event_id)
            .bind(self.event_type)
            .bind(self.object_id)
            .bind(self.livemode)
    }

    /// The five, and the bodies as `$6` (the inbox's accepts).
    pub(super) fn bind(
        mut self,
        query: Query<'a, Postgres, PgArguments>,
    ) -> Query<'a, Postgres, PgArguments> {
        let body = std::mem::take(&mut self.body);
        self.bind_claim(query).bind(body)
    }
}

// A batch's accepts are numbered in arrival order below its number × 1024
// (`accept::ACCEPT_MANY`).
const _: () = assert!(MAX_BATCH <= 1024);

type Claiming<'a> = (&'a Delivery, Token, Duration);
type Completing<'a> = (&'a str, &'a str, Token);

/// Runs one batch: each kind of write in one statement of its own, the three at once (one
/// statement for all three measured at half the throughput: its plan is rebuilt for every
/// batch). A statement the server refused (a value one write carries, such as a NUL in an
/// id, or a deadlock) is retried write by write, so one bad write answers alone; a server
/// that cannot be reached answers every write of the kind with the error at once (503),
/// rather than each after its own timeout. No write is ever granted by a failed
/// statement.
pub(super) async fn write_batch(
    db: &impl Runs,
    writes: Vec<Write>,
) -> Vec<Result<Written, StoreError>> {
    let (mut claims, mut completes, mut accepts) = (Vec::new(), Vec::new(), Vec::new());
    let mut processed = Vec::new();
    for (i, write) in writes.iter().enumerate() {
        match write {
            Write::Claim(d, token, lease) => claims.push((i, (d, *token, *lease))),
            Write::Complete(source, id, token) => {
                completes.push((i, (source.as_str(), id.as_str(), *token)));
            }
            Write::Accept(d) => accepts.push((i, d)),
            Write::Processed(source, id, token, wakes, processor) => {
                let key = (source.as_str(), id.as_str(), *token);
                processed.push((i, (key, *wakes, &**processor)));
            }
        }
    }
    let ((claimed, completed), accepted, recorded) = tokio::join!(
        claim_and_complete(
            db,
            claims.iter().map(|c| c.1).collect(),
            completes.iter().map(|c| c.1).collect(),
        ),
        accept_many(db, accepts.iter().map(|c| c.1).collect()),
        processed_many(db, processed.iter().map(|c| c.1).collect()),
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
pub(super) fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        // Connection exceptions, insufficient resources, operator intervention.
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57")),
        _ => true,
    }
}

/// Every write of a kind answered with the statement's error.
pub(super) fn all_failed<T>(
    n: usize,
    context: &'static str,
    e: &sqlx::Error,
) -> Vec<Result<T, StoreError>> {
    let why = e.to_string();
    let kind = super::super::error_kind(e);
    (0..n)
        .map(|_| Err(StoreError::new(context, why.clone()).with_kind(kind)))
        .collect()
}

/// A batch's claims and completions, in one statement when there are two or more; a
/// claim not inserted (or the statement refused) goes the single path, which also takes
/// over, and a completion not matched the single statement, which also tells a row the
/// inbox adopted.
async fn claim_and_complete(
    db: &impl Runs,
    claims: Vec<Claiming<'_>>,
    completes: Vec<Completing<'_>>,
) -> (
    Vec<Result<Claim, StoreError>>,
    Vec<Result<bool, StoreError>>,
) {
    let (inserted, done) = match claims.len() + completes.len() {
        0 | 1 => (HashSet::new(), HashSet::new()),
        _ => match claim_and_complete_rows(db, &claims, &completes).await {
            Ok(rows) => rows,
            Err(e) if unavailable(&e) => {
                return (
                    all_failed(claims.len(), "postgres claim", &e),
                    all_failed(completes.len(), "postgres complete", &e),
                )
            }
            Err(_) => (HashSet::new(), HashSet::new()),
        },
    };
    tokio::join!(
        finish_claims(db.pool(), claims, inserted),
        finish_completes(db.pool(), completes, done),
    )
}

/// `CLAIM_AND_COMPLETE_MANY`: the keys and tokens that went in, and those marked done.
pub(super) async fn claim_and_complete_rows(
    db: &impl Runs,
    claims: &[Claiming<'_>],
    completes: &[Completing<'_>],
) -> Result<(HashSet<DoneKey>, HashSet<DoneKey>), sqlx::Error> {
    let mut claims = claims.to_vec();
    claims.sort_by_key(|(d, ..)| (d.source(), d.id()));
    let mut completes = completes.to_vec();
    completes.sort_by_key(|&(source, id, _)| (source, id));
    let query = Columns::of(claims.iter().map(|c| c.0))
        .bind_claim(sqlx::query(CLAIM_AND_COMPLETE_MANY))
        .bind(claims.iter().map(|c| c.2.as_secs_f64()).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.1.as_uuid()).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.0.kind()).collect::<Vec<_>>())
        .bind(completes.iter().map(|c| c.0).collect::<Vec<_>>())
        .bind(completes.iter().map(|c| c.1).collect::<Vec<_>>())
        .bind(completes.iter().map(|c| c.2.as_uuid()).collect::<Vec<_>>());
    let rows = db.fetch_all(query).await?;
    let (mut inserted, mut done) = (HashSet::new(), HashSet::new());
    for row in rows {
        let key = (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
        match row.try_get::<bool, _>(0)? {
            true => inserted.insert(key),
            false => done.insert(key),
        };
    }
    Ok((inserted, done))
}

/// Each claim's answer, from the keys and tokens its batch's statement inserted (none: no
/// statement, or it failed): one not inserted goes the single path.
async fn finish_claims(
    pool: &PgPool,
    claims: Vec<Claiming<'_>>,
    mut inserted: HashSet<DoneKey>,
) -> Vec<Result<Claim, StoreError>> {
    let mut results = Vec::with_capacity(claims.len());
    for (d, token, lease) in claims {
        // Each row that went in answers one claim: the key's and the token's (two claims
        // of one key under one token are both in the batch, and only one is new).
        let key = (d.source().to_owned(), d.id().to_owned(), token.as_uuid());
        let new = inserted.remove(&key);
        results.push(match new {
            true => Ok(Claim::New(token)),
            // Not new (or the statement failed): the single path, which also takes over.
            false => claim_one(pool, d, token, lease).await,
        });
    }
    results
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
        let inserted = bind_claim(sqlx::query(CLAIM), d)
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
        let held = remaining(row.try_get(2).map_err(err)?);
        if let Some(claim) = not_claimed(row.try_get(1).map_err(err)?, held) {
            return Ok(claim);
        }
    }
    Ok(Claim::InFlight {
        retry_after: Duration::from_secs(1),
    })
}

/// Each completion's answer, from the rows its batch's statement marked done: one not
/// matched goes the single statement.
async fn finish_completes(
    pool: &PgPool,
    completes: Vec<Completing<'_>>,
    done: HashSet<DoneKey>,
) -> Vec<Result<bool, StoreError>> {
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

/// A row a batch statement inserted or marked done: its key and token.
type DoneKey = (String, String, uuid::Uuid);

fn done_key(source: &str, id: &str, token: Token) -> DoneKey {
    (source.to_owned(), id.to_owned(), token.as_uuid())
}

/// The inbox worker's outcomes "processed" in one statement; a row not matched was fenced
/// out. A statement the server refused is retried row by row, as a batch's completions.
/// Each row with whether it wakes the workers of every process (see `Write::Processed`).
async fn processed_many(
    db: &impl Runs,
    rows: Vec<(Completing<'_>, bool, &str)>,
) -> Vec<Result<bool, StoreError>> {
    if rows.is_empty() {
        return Vec::new();
    }
    let wakes: Vec<bool> = rows.iter().map(|r| r.1).collect();
    let processors: Vec<&str> = rows.iter().map(|r| r.2).collect();
    let rows: Vec<Completing<'_>> = rows.into_iter().map(|r| r.0).collect();
    match update_processed(db, &rows, &wakes, &processors).await {
        Ok(done) => rows
            .iter()
            .map(|&(source, id, token)| Ok(done.contains(&done_key(source, id, token))))
            .collect(),
        Err(e) if unavailable(&e) => all_failed(rows.len(), "inbox finish", &e),
        Err(_) => {
            let mut results = Vec::with_capacity(rows.len());
            let mut woken = std::collections::BTreeSet::new();
            for (((source, id, token), wakes), processor) in
                rows.into_iter().zip(wakes).zip(processors)
            {
                let outcome = Outcome::Processed;
                let held = finish_one(db.pool(), (source, id, processor), token, outcome).await;
                if wakes && matches!(held, Ok(true)) {
                    woken.insert(processor);
                }
                results.push(held);
            }
            for processor in woken {
                let _ = sqlx::query(NOTIFY).bind(processor).execute(db.pool()).await;
            }
            results
        }
    }
}

/// Marks processed, in one statement (`PROCESSED_MANY`), the routes `token` still holds,
/// each with whether it `wakes` its processor's workers: the keys and tokens that matched.
pub(super) async fn update_processed(
    db: &impl Runs,
    rows: &[Completing<'_>],
    wakes: &[bool],
    processors: &[&str],
) -> Result<HashSet<DoneKey>, sqlx::Error> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| (rows[i].0, rows[i].1));
    let query = sqlx::query(PROCESSED_MANY)
        .persistent(PLANNED_EACH_TIME)
        .bind(order.iter().map(|&i| rows[i].0).collect::<Vec<_>>())
        .bind(order.iter().map(|&i| rows[i].1).collect::<Vec<_>>())
        .bind(
            order
                .iter()
                .map(|&i| rows[i].2.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(order.iter().map(|&i| wakes[i]).collect::<Vec<_>>())
        .bind(order.iter().map(|&i| processors[i]).collect::<Vec<_>>());
    let rows = db.fetch_all(query).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect()
}

//! What both dialects run the same way, written once over sqlx's database types: the
//! dialects hand over their statements (and what they bind first), these bind the rest,
//! run them and read the answer.

use std::time::Duration;

use sqlx::query::{Query, QueryAs};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::{store_error, ListedRow};
use crate::inbox::listing::Rows;
use crate::inbox::{EventSummary, Listing, Pause};
use crate::store::{Claim, Delivery, StoreFuture};

/// How many rows a statement changed, whichever database ran it.
pub(crate) trait Changed {
    fn changed(&self) -> u64;
}

#[cfg(feature = "postgres")]
impl Changed for sqlx::postgres::PgQueryResult {
    fn changed(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl Changed for sqlx::sqlite::SqliteQueryResult {
    fn changed(&self) -> u64 {
        self.rows_affected()
    }
}

/// Runs a statement on `on`: how many rows it changed (a statement on one row's key:
/// 1, or 0 when the row is not there or another token holds it).
pub(crate) async fn changed<'q, 'c, DB, E>(
    query: Query<'q, DB, DB::Arguments>,
    on: E,
) -> Result<u64, sqlx::Error>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: Changed,
    E: Executor<'c, Database = DB>,
{
    Ok(query.execute(on).await?.changed())
}

/// Binds a delivery's key and the columns a claim row keeps beside it as the first five
/// parameters: source, event id, type, object id, livemode. Never the body: a
/// `DedupeLayer`/`TxDedupeLayer` claim row keeps none (nothing reads it; payload
/// protection, issue 34 step 7), so no claim sends it to the database.
pub(crate) fn bind_claim<'q, DB>(
    query: Query<'q, DB, DB::Arguments>,
    d: &'q Delivery,
) -> Query<'q, DB, DB::Arguments>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    Option<bool>: Encode<'q, DB> + Type<DB>,
{
    let audit = d.audit();
    query
        .bind(d.source())
        .bind(d.id())
        .bind(audit.event_type)
        .bind(audit.object_id)
        .bind(audit.livemode)
}

/// [`bind_claim`]'s five, and the body sixth (SQLite's inbox accept).
#[cfg(feature = "sqlite")]
pub(crate) fn bind_delivery<'q, DB>(
    query: Query<'q, DB, DB::Arguments>,
    d: &'q Delivery,
) -> Query<'q, DB, DB::Arguments>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    Option<bool>: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
{
    bind_claim(query, d).bind(d.audit().body)
}

/// The dialect's `advance` (the ordering guard, [`crate::latest`]) on its connection
/// type `$conn`, running its `ADVANCE` statement.
macro_rules! advance {
    ($conn:ty) => {
        /// Moves `(namespace, object)`'s time to `at_ms` unless a newer one was applied;
        /// `true` when it moved (or was first seen).
        pub(crate) async fn advance(
            conn: &mut $conn,
            namespace: &str,
            object: &str,
            at_ms: i64,
        ) -> Result<bool, sqlx::Error> {
            let query = sqlx::query(ADVANCE)
                .bind(namespace)
                .bind(object)
                .bind(at_ms);
            Ok($crate::sql::shared::changed(query, conn).await? == 1)
        }
    };
}
pub(crate) use advance;

/// Why a claim took nothing, from the row it conflicted with: done (or the inbox's: a
/// duplicate to `DedupeLayer`), or held by a live attempt for `remaining` more; `None` when
/// neither (its lease ran out).
pub(super) fn not_claimed(done: bool, remaining: Option<Duration>) -> Option<Claim> {
    if done {
        return Some(Claim::Done);
    }
    remaining.map(|retry_after| Claim::InFlight { retry_after })
}

/// Makes the per-object index with the dialect's statement, if it is missing.
pub(super) fn object_index<DB>(pool: &Pool<DB>, sql: &'static str) -> StoreFuture<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let pool = pool.clone();
    Box::pin(async move {
        let made = sqlx::raw_sql(sql).execute(&pool).await;
        made.map(drop)
            .map_err(|e| store_error("inbox object index", e))
    })
}

/// `webhook_pauses`' rows as the dialect's statement reads them (processor, source, type,
/// milliseconds since the epoch), as pauses.
pub(super) fn pauses<DB>(pool: &Pool<DB>, sql: &'static str) -> StoreFuture<Vec<Pause>>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    (String, String, String, i64): for<'r> FromRow<'r, DB::Row>,
{
    let pool = pool.clone();
    Box::pin(async move {
        let rows = sqlx::query_as::<DB, (String, String, String, i64)>(sql)
            .fetch_all(&pool)
            .await;
        rows.map(|rows| {
            rows.into_iter()
                .map(crate::inbox::pause::from_row)
                .collect()
        })
        .map_err(|e| store_error("inbox pauses", e))
    })
}

/// Which of a dialect's eight listing statements (as [`listing_statements!`] makes them)
/// reads `listing`: its rows, in its order, of every processor or of one.
pub(super) fn listing_statement(listing: &Listing, statements: [&'static str; 8]) -> &'static str {
    let rows = match (listing.rows, listing.oldest_first) {
        (Rows::Dead, false) => 0,
        (Rows::Dead, true) => 1,
        (Rows::Failing, false) => 2,
        (Rows::Failing, true) => 3,
    };
    statements[rows + if listing.processor.is_some() { 4 } else { 0 }]
}

/// A page of failing or dead rows (one more than asked: whether a next page exists):
/// `query`, the listing's statement with what the dialect binds first, bound to the
/// position it continues after (its time in microseconds, as `at` makes it the
/// dialect's, its source and id; all `NULL` for the first page), the limit, and the
/// processor: the listing's when it has one, else the position's.
pub(super) fn list<DB>(
    pool: &Pool<DB>,
    query: QueryAs<'static, DB, ListedRow, DB::Arguments>,
    listing: &Listing,
    at: fn(i64) -> i64,
    ring: &super::sealed::Ring,
) -> StoreFuture<Vec<EventSummary>>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    ListedRow: for<'r> FromRow<'r, DB::Row>,
    Option<i64>: Encode<'static, DB> + Type<DB>,
    Option<String>: Encode<'static, DB> + Type<DB>,
    i64: Encode<'static, DB> + Type<DB>,
{
    let pool = pool.clone();
    let ring = ring.clone();
    let (at_us, source, id, after) = match &listing.after {
        Some(c) => (
            Some(c.at_us),
            Some(c.source.clone()),
            Some(c.id.clone()),
            Some(c.processor.clone()),
        ),
        None => (None, None, None, None),
    };
    let processor = listing.processor.clone().or(after);
    let limit = i64::try_from(listing.limit + 1).unwrap_or(i64::MAX);
    Box::pin(async move {
        let rows = query
            .bind(at_us.map(at))
            .bind(source)
            .bind(id)
            .bind(limit)
            .bind(processor)
            .fetch_all(&pool)
            .await;
        rows.map(|rows| {
            let opened = rows.into_iter().map(|row| row.opened(&ring));
            opened.map(EventSummary::from).collect()
        })
        .map_err(|e| store_error("inbox list", e))
    })
}

/// SQLite's listing statements: `LISTINGS`, eight in [`listing_statement`]'s order, each
/// a range of its partial index read in the index's order from a position: one row-value
/// comparison on the index's columns, so a page reads its own rows, not the ones before
/// it. Every processor's routes on `webhook_routes_dead` and `webhook_routes_failing` (the
/// time, the key, then the processor: `$processor` is the cursor's); one processor's
/// (`$processor` is its name) on `webhook_routes_dead_by` and `webhook_routes_failing_by`
/// (the processor, then the time and the key). And `ROUTES`, one event's routes by its
/// key. The dialect gives the columns it reads (times as microseconds since the epoch,
/// and whether a worker holds the row now), the position a newest-first page continues
/// before and an oldest-first one after (time, source and id; each before or after every
/// row when not bound: the first page), the limit's and the processor's placeholders and
/// the key's condition.
#[cfg(feature = "sqlite")] // PostgreSQL writes its own (`postgres/listing.rs`)
macro_rules! listing_statements {
    (from: $from:literal, columns: $columns:literal,
        newest: $newest:literal, oldest: $oldest:literal, limit: $limit:literal,
        processor: $p:literal, key: $key:literal) => {
        /// The listings: dead newest and oldest first, failing newest and oldest first,
        /// of every processor, then of one.
        pub(super) const LISTINGS: [&str; 8] = [
            $crate::sql::shared::listing_statements!(@all $from, $columns, $limit, $p, DEAD,
                "dead_at", "<", $newest, " DESC"),
            $crate::sql::shared::listing_statements!(@all $from, $columns, $limit, $p, DEAD,
                "dead_at", ">", $oldest, ""),
            $crate::sql::shared::listing_statements!(@all $from, $columns, $limit, $p, FAILING,
                "received_at", "<", $newest, " DESC"),
            $crate::sql::shared::listing_statements!(@all $from, $columns, $limit, $p, FAILING,
                "received_at", ">", $oldest, ""),
            $crate::sql::shared::listing_statements!(@by $from, $columns, $limit, $p, DEAD,
                "dead_at", "<", $newest, " DESC"),
            $crate::sql::shared::listing_statements!(@by $from, $columns, $limit, $p, DEAD,
                "dead_at", ">", $oldest, ""),
            $crate::sql::shared::listing_statements!(@by $from, $columns, $limit, $p, FAILING,
                "received_at", "<", $newest, " DESC"),
            $crate::sql::shared::listing_statements!(@by $from, $columns, $limit, $p, FAILING,
                "received_at", ">", $oldest, ""),
        ];

        /// One event's routes by its key, by processor name (tombstones left out).
        const ROUTES: &str = concat!(
            "SELECT ", $columns, "
FROM ", $from, "
WHERE ", $key, " AND next_attempt_at IS NOT NULL
ORDER BY processor"
        );
    };
    (@all $from:literal, $columns:literal, $limit:literal, $p:literal, $rows:ident,
        $time:literal, $cmp:literal, $position:literal, $desc:literal) => {
        concat!(
            "SELECT ", $columns, "
FROM ", $from, "
WHERE ", $crate::sql::shared::listing_statements!(@rows $rows), "
  AND (", $time, ", source, event_id, processor) ", $cmp, "
      (", $position, ", coalesce(", $p, ", ''))
ORDER BY ", $time, $desc, ", source", $desc, ", event_id", $desc, ", processor", $desc, "
LIMIT ", $limit
        )
    };
    (@by $from:literal, $columns:literal, $limit:literal, $p:literal, $rows:ident,
        $time:literal, $cmp:literal, $position:literal, $desc:literal) => {
        concat!(
            "SELECT ", $columns, "
FROM ", $from, "
WHERE processor = ", $p, " AND ", $crate::sql::shared::listing_statements!(@rows $rows), "
  AND (", $time, ", source, event_id) ", $cmp, "
      (", $position, ")
ORDER BY ", $time, $desc, ", source", $desc, ", event_id", $desc, "
LIMIT ", $limit
        )
    };
    (@rows DEAD) => {
        "dead_at IS NOT NULL AND next_attempt_at IS NOT NULL"
    };
    (@rows FAILING) => {
        "next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
  AND processing_error IS NOT NULL"
    };
}
#[cfg(feature = "sqlite")]
pub(crate) use listing_statements;

/// For the dialects' listing tests, on the rows they write (dead `d1`…`d5` and failing
/// `f1`…`f3`, each set tied in time): every listing pages through its rows, each once, in
/// its order (ties by their key).
#[cfg(test)]
pub(super) async fn assert_pages_through_ties(inbox: &crate::inbox::Inbox) {
    let all = |listing| crate::inbox::listing::ids_page_by_page(inbox, listing);
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

/// The registry's two reads, the same on both dialects (`REGISTERED`, `BACKFILL_PAGE` the
/// dialect's statements, in scope where it expands, as `backfill`, `RegistryRow` and
/// `CandidateRow`), inside the dialect's `impl Registry`; `$persistent`: whether the
/// backfill page's plan is kept (PostgreSQL plans each window apart).
macro_rules! registry_reads {
    ($persistent:expr) => {
        fn registered(&self) -> StoreFuture<Vec<RegisteredProcessor>> {
            let pool = self.pool.clone();
            Box::pin(async move {
                let rows = sqlx::query_as::<_, RegistryRow>(REGISTERED)
                    .fetch_all(&pool)
                    .await
                    .map_err(|e| store_error("inbox registry", e))?;
                rows.into_iter().map(backfill::registered).collect()
            })
        }

        fn backfill_page(
            &self,
            processor: Arc<str>,
            window: Backfill,
            after: Option<Position>,
            limit: usize,
        ) -> StoreFuture<Vec<Candidate>> {
            let pool = self.pool.clone();
            let keys = self.keys.clone();
            Box::pin(async move {
                let (at, source, id) = match after {
                    Some(p) => (Some(p.at), Some(p.source), Some(p.id)),
                    None => (None, None, None),
                };
                let rows = sqlx::query_as::<_, CandidateRow>(BACKFILL_PAGE)
                    .bind(&*processor)
                    .bind(window.received_from)
                    .bind(window.received_before)
                    .bind(at)
                    .bind(source)
                    .bind(id)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .persistent($persistent)
                    .fetch_all(&pool)
                    .await
                    .map_err(|e| store_error("inbox backfill", e))?;
                Ok(rows.into_iter().map(|row| row.opened(&keys)).collect())
            })
        }
    };
}
pub(crate) use registry_reads;

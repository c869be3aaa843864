//! `webhook_invalid` (issue 36): the events their type's schema refused, with their
//! errors, the same statements in both dialects (`$n` parameters: SQLite reads them as
//! positions too).

use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};

use super::shared::Changed;
use super::store_error;
use crate::inbox::invalid::Invalids;
use crate::store::StoreFuture;

const MARK: &str = "
INSERT INTO webhook_invalid (source, event_id, errors) VALUES ($1, $2, $3)
ON CONFLICT (source, event_id) DO NOTHING";
#[cfg_attr(not(feature = "schemas"), allow(dead_code))]
const REMARK: &str = "UPDATE webhook_invalid SET errors = $3 WHERE source = $1 AND event_id = $2";
const UNMARK: &str = "DELETE FROM webhook_invalid WHERE source = $1 AND event_id = $2";
const ERRORS: &str = "SELECT errors FROM webhook_invalid WHERE source = $1 AND event_id = $2";
/// Marks whose event is stored: a mark left by an accept that did not finish is not one.
const COUNT: &str = "
SELECT count(*) FROM webhook_invalid AS i
JOIN webhook_events AS e ON e.source = i.source AND e.event_id = i.event_id";
const PAGE: &str = "
SELECT i.source, i.event_id FROM webhook_invalid AS i
JOIN webhook_events AS e ON e.source = i.source AND e.event_id = i.event_id
WHERE (i.source, i.event_id) > ($1, $2)
ORDER BY i.source, i.event_id
LIMIT $3";

/// The statements over one pool, whichever database.
#[derive(Debug)]
pub(crate) struct Marks<DB: Database>(pub(crate) Pool<DB>);

impl<DB: Database> Clone for Marks<DB> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<DB> Invalids for Marks<DB>
where
    DB: Database,
    for<'a> DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::QueryResult: Changed,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String, String): sqlx::FromRow<'r, DB::Row>,
{
    fn mark(&self, source: String, id: String, errors: String) -> StoreFuture<bool> {
        let pool = self.0.clone();
        Box::pin(async move {
            let q = sqlx::query::<DB>(MARK).bind(source).bind(id).bind(errors);
            let done = q.execute(&pool).await;
            Ok(done.map_err(|e| store_error("inbox invalid", e))?.changed() > 0)
        })
    }

    fn remark(&self, source: String, id: String, errors: String) -> StoreFuture<()> {
        let pool = self.0.clone();
        Box::pin(async move {
            let q = sqlx::query::<DB>(REMARK).bind(source).bind(id).bind(errors);
            q.execute(&pool)
                .await
                .map_err(|e| store_error("inbox invalid", e))?;
            Ok(())
        })
    }

    fn unmark(&self, source: String, id: String) -> StoreFuture<()> {
        let pool = self.0.clone();
        Box::pin(async move {
            let q = sqlx::query::<DB>(UNMARK).bind(source).bind(id);
            q.execute(&pool)
                .await
                .map_err(|e| store_error("inbox invalid", e))?;
            Ok(())
        })
    }

    fn errors(&self, source: String, id: String) -> StoreFuture<Option<String>> {
        let pool = self.0.clone();
        Box::pin(async move {
            let q = sqlx::query_as::<DB, (String,)>(ERRORS)
                .bind(source)
                .bind(id);
            let row = q.fetch_optional(&pool).await;
            Ok(row
                .map_err(|e| store_error("inbox invalid", e))?
                .map(|(e,)| e))
        })
    }

    fn count(&self) -> StoreFuture<u64> {
        let pool = self.0.clone();
        Box::pin(async move {
            let q = sqlx::query_as::<DB, (i64,)>(COUNT);
            let (n,) = q
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox invalid", e))?;
            Ok(n.unsigned_abs())
        })
    }

    fn page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> StoreFuture<Vec<(String, String)>> {
        let pool = self.0.clone();
        Box::pin(async move {
            let (source, id) = after.unwrap_or_default();
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let q = sqlx::query_as::<DB, (String, String)>(PAGE)
                .bind(source)
                .bind(id);
            let rows = q.bind(limit).fetch_all(&pool).await;
            rows.map_err(|e| store_error("inbox invalid", e))
        })
    }
}

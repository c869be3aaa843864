//! Fan-out's processor operations on PostgreSQL: the registry (`webhook_processors`),
//! backfill and dropping a processor, each on the pool (none is on the drain's path).

use std::sync::Arc;

use super::super::processors::{CandidateRow, RegistryRow};
use super::super::store_error;
use super::{Pg, PLANNED_EACH_TIME};
use crate::inbox::backfill::{self, Backfill, Candidate, Position, Registration, Registry};
use crate::inbox::RegisteredProcessor;
use crate::store::StoreFuture;

/// The processors' rows (`$1` names, `$2` types, `$3` has a predicate): inserted, or their
/// filter updated (the first registration's time kept; an unchanged row not written).
const REGISTER: &str = "
INSERT INTO webhook_processors (name, types, has_predicate)
SELECT * FROM unnest($1::text[], $2::text[], $3::bool[])
ON CONFLICT (name) DO UPDATE SET types = excluded.types, has_predicate = excluded.has_predicate
WHERE (webhook_processors.types, webhook_processors.has_predicate)
    IS DISTINCT FROM (excluded.types, excluded.has_predicate)";

const REGISTERED: &str = "
SELECT name, types, has_predicate, (extract(epoch FROM registered_at) * 1000)::int8
FROM webhook_processors ORDER BY name";

/// Up to `$7` inbox events with a body, received in `$2..$3` (milliseconds; NULL: open),
/// after the position `$4` (microseconds), `$5`, `$6` (NULL: the first page), without a
/// route of the processor `$1`, nor invalid (issue 36: a requeue routes those, once
/// valid): a range of `webhook_events_inbox` in its order. Times are
/// whole microseconds both ways (`extract` is exact since PostgreSQL 14), so a page
/// continues exactly after the last event of the one before.
const BACKFILL_PAGE: &str = "
SELECT (extract(epoch FROM e.received_at) * 1000000)::int8 AS at, e.source, e.event_id,
    e.event_type, e.object_id, e.livemode, b.body, b.key_id, b.body_nonce
FROM webhook_events e
JOIN webhook_bodies b ON b.source = e.source AND b.event_id = e.event_id
WHERE e.next_attempt_at IS NOT NULL
  AND e.received_at >= coalesce('epoch'::timestamptz + $2::int8 * interval '1 millisecond',
      '-infinity')
  AND e.received_at < coalesce('epoch'::timestamptz + $3::int8 * interval '1 millisecond',
      'infinity')
  AND (e.received_at, e.source, e.event_id)
      > (coalesce('epoch'::timestamptz + $4::int8 * interval '1 microsecond', '-infinity'),
         coalesce($5::text, ''), coalesce($6::text, ''))
  AND NOT EXISTS (SELECT 1 FROM webhook_routes r
      WHERE r.source = e.source AND r.event_id = e.event_id AND r.processor = $1)
  AND NOT EXISTS (SELECT 1 FROM webhook_invalid AS i
      WHERE i.source = e.source AND i.event_id = e.event_id)
ORDER BY e.received_at, e.source, e.event_id
LIMIT $7";

/// A route of processor `$3`, due now, for each event of `$1`, `$2` still in the inbox
/// with its body (expired or erased since the page was read: none):
/// its immutable columns copied from the event, its arrival and receipt time the event's
/// own (its order among its object's routes); how many, and workers in every process
/// woken.
const BACKFILL_ROUTES: &str = "
WITH made AS (
    INSERT INTO webhook_routes
        (source, event_id, processor, event_type, object_id, arrival, received_at, attempts,
         next_attempt_at)
    SELECT e.source, e.event_id, $3, e.event_type, e.object_id, e.arrival, e.received_at, 0,
        now()
    FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
    JOIN webhook_events e ON e.source = k.source AND e.event_id = k.event_id
    WHERE e.next_attempt_at IS NOT NULL AND e.body_state IS NULL
    ON CONFLICT (source, event_id, processor) DO NOTHING
    RETURNING 1
)
SELECT count(*), pg_notify('webhook_events', '') FROM made";

/// Every processor that may have routes: the first of each in the unfinished routes' and
/// the dead routes' indexes (a skip scan, one index probe a processor), those the counts'
/// log names (processed routes), and the registered ones.
const ROUTE_PROCESSORS: &str = "
WITH RECURSIVE due(name) AS (
    SELECT min(processor) FROM webhook_routes
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
    UNION ALL
    SELECT (SELECT min(processor) FROM webhook_routes
        WHERE processor > due.name
          AND next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL)
    FROM due WHERE due.name IS NOT NULL
), dead(name) AS (
    SELECT min(processor) FROM webhook_routes WHERE dead_at IS NOT NULL
    UNION ALL
    SELECT (SELECT min(processor) FROM webhook_routes
        WHERE processor > dead.name AND dead_at IS NOT NULL)
    FROM dead WHERE dead.name IS NOT NULL
)
SELECT name FROM due WHERE name IS NOT NULL
UNION SELECT name FROM dead WHERE name IS NOT NULL
UNION SELECT processor FROM webhook_counts
UNION SELECT name FROM webhook_processors";

/// A processor dropped (`$1`): its routes first (their triggers take their history and
/// log them out of the counts), then its counts' log, pauses and registry row.
const DROP_PROCESSOR: [&str; 4] = [
    "DELETE FROM webhook_routes WHERE processor = $1",
    "DELETE FROM webhook_counts WHERE processor = $1",
    "DELETE FROM webhook_pauses WHERE processor = $1",
    "DELETE FROM webhook_processors WHERE name = $1",
];

impl Registry for Pg {
    fn register(&self, processors: Vec<Registration>) -> StoreFuture<()> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut columns = (Vec::new(), Vec::new(), Vec::new());
            for (name, types, has_predicate) in processors {
                columns.0.push(name);
                columns.1.push(types);
                columns.2.push(has_predicate);
            }
            sqlx::query(REGISTER)
                .bind(columns.0)
                .bind(columns.1)
                .bind(columns.2)
                .execute(&pool)
                .await
                .map_err(|e| store_error("inbox register processors", e))?;
            Ok(())
        })
    }

    super::super::shared::registry_reads!(PLANNED_EACH_TIME);

    fn backfill_routes(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
    ) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let (sources, ids): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
            let made: i64 = sqlx::query_scalar(BACKFILL_ROUTES)
                .bind(sources)
                .bind(ids)
                .bind(&*processor)
                .persistent(PLANNED_EACH_TIME) // joins a list of keys (T11)
                .fetch_one(&pool)
                .await
                .map_err(|e| store_error("inbox backfill", e))?;
            Ok(made.unsigned_abs())
        })
    }

    fn route_processors(&self) -> StoreFuture<Vec<String>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let names = sqlx::query_scalar::<_, String>(ROUTE_PROCESSORS)
                .fetch_all(&pool)
                .await;
            names.map_err(|e| store_error("inbox processors", e))
        })
    }

    fn drop_processor(&self, name: String) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let err = |e| store_error("inbox drop processor", e);
            let mut tx = pool.begin().await.map_err(err)?;
            let mut routes = None;
            for sql in DROP_PROCESSOR {
                let done = sqlx::query(sql)
                    .bind(&name)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                routes.get_or_insert(done.rows_affected());
            }
            tx.commit().await.map_err(err)?;
            Ok(routes.unwrap_or(0))
        })
    }
}

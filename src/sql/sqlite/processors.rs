//! Fan-out's processor operations on SQLite: the registry (`webhook_processors`),
//! backfill and dropping a processor. Reads on the pool; writes through the one writer,
//! each in its batch's transaction.

use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;

use super::super::processors::{keys_json, CandidateRow, RegistryRow};
use super::super::store_error;
use super::{Done, Op, Sqlite};
use crate::inbox::backfill::{self, Backfill, Candidate, Position, Registration, Registry};
use crate::inbox::RegisteredProcessor;
use crate::store::{StoreError, StoreFuture};

/// A processor's row (`?1` name, `?2` types, `?3` has a predicate, `?4` now): inserted,
/// or its filter updated (its first registration's time kept; an unchanged row not
/// written).
const REGISTER: &str = "
INSERT INTO webhook_processors (name, types, has_predicate, registered_at)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (name) DO UPDATE SET types = excluded.types, has_predicate = excluded.has_predicate
WHERE webhook_processors.types IS NOT excluded.types
   OR webhook_processors.has_predicate IS NOT excluded.has_predicate";

const REGISTERED: &str = "
SELECT name, types, has_predicate, registered_at FROM webhook_processors ORDER BY name";

/// Up to `?7` inbox events with a body, received in `?2..?3` (milliseconds; NULL: open),
/// after the position `?4`, `?5`, `?6` (NULL: the first page), without a route of the
/// processor `?1`, nor invalid (issue 36: a requeue routes those, once valid): a range of
/// `webhook_events_inbox` in its order.
const BACKFILL_PAGE: &str = "
SELECT e.received_at AS at, e.source, e.event_id, e.event_type, e.object_id, e.livemode,
    b.body, b.key_id, b.body_nonce
FROM webhook_events AS e INDEXED BY webhook_events_inbox
JOIN webhook_bodies AS b ON b.source = e.source AND b.event_id = e.event_id
WHERE e.next_attempt_at IS NOT NULL
  AND e.received_at >= coalesce(?2, -9223372036854775807)
  AND e.received_at < coalesce(?3, 9223372036854775807)
  AND (e.received_at, e.source, e.event_id)
      > (coalesce(?4, -9223372036854775807), coalesce(?5, ''), coalesce(?6, ''))
  AND NOT EXISTS (SELECT 1 FROM webhook_routes AS r
      WHERE r.source = e.source AND r.event_id = e.event_id AND r.processor = ?1)
  AND NOT EXISTS (SELECT 1 FROM webhook_invalid AS i
      WHERE i.source = e.source AND i.event_id = e.event_id)
ORDER BY e.received_at, e.source, e.event_id
LIMIT ?7";

/// A route of processor `?2`, due at `?3`, for each event of `?1` (a JSON array of
/// `[source, id]`) still in the inbox with its body (expired or erased since the page was
/// read: none): its immutable columns copied from the event, its
/// arrival and receipt time the event's own (its order among its object's routes).
const BACKFILL_ROUTES: &str = "
INSERT INTO webhook_routes
    (source, event_id, processor, event_type, object_id, arrival, received_at, attempts,
     next_attempt_at)
SELECT e.source, e.event_id, ?2, e.event_type, e.object_id, e.arrival, e.received_at, 0, ?3
FROM json_each(?1) AS k CROSS JOIN webhook_events AS e
WHERE e.source = k.value ->> 0 AND e.event_id = k.value ->> 1 AND e.next_attempt_at IS NOT NULL
  AND e.body_state IS NULL
ON CONFLICT (source, event_id, processor) DO NOTHING";

/// Every processor registered, or whose routes were ever processed (the counter's rows,
/// made by the trigger `webhook_route_counts_changed`): routes are only made for a
/// registered processor.
const ROUTE_PROCESSORS: &str = "
SELECT processor FROM webhook_route_counts UNION SELECT name FROM webhook_processors";

/// A processor dropped (`?1`): its routes first (their triggers take their history and
/// count them out), then its counter, pauses and registry row.
const DROP_PROCESSOR: [&str; 4] = [
    "DELETE FROM webhook_routes WHERE processor = ?1",
    "DELETE FROM webhook_route_counts WHERE processor = ?1",
    "DELETE FROM webhook_pauses WHERE processor = ?1",
    "DELETE FROM webhook_processors WHERE name = ?1",
];

/// The writer's part: registers the processors at `now`.
pub(super) async fn register(
    conn: &mut SqliteConnection,
    now: i64,
    processors: &[Registration],
) -> Result<Done, StoreError> {
    for (name, types, has_predicate) in processors {
        sqlx::query(REGISTER)
            .bind(name)
            .bind(types)
            .bind(has_predicate)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(|e| store_error("inbox register processors", e))?;
    }
    Ok(Done::Count(0))
}

/// The writer's part: the routes of a backfill's page, due at `now`.
pub(super) async fn backfill_routes(
    conn: &mut SqliteConnection,
    now: i64,
    processor: &str,
    keys: &[(String, String)],
) -> Result<Done, StoreError> {
    let done = sqlx::query(BACKFILL_ROUTES)
        .bind(keys_json(keys))
        .bind(processor)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(|e| store_error("inbox backfill", e))?;
    Ok(Done::Count(done.rows_affected()))
}

/// The writer's part: a processor dropped, in the batch's transaction.
pub(super) async fn drop_processor(
    conn: &mut SqliteConnection,
    name: &str,
) -> Result<Done, StoreError> {
    let mut routes = None;
    for sql in DROP_PROCESSOR {
        let done = sqlx::query(sql)
            .bind(name)
            .execute(&mut *conn)
            .await
            .map_err(|e| store_error("inbox drop processor", e))?;
        routes.get_or_insert(done.rows_affected());
    }
    Ok(Done::Count(routes.unwrap_or(0)))
}

impl Registry for Sqlite {
    fn register(&self, processors: Vec<Registration>) -> StoreFuture<()> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::Register(processors)).await.map(drop) })
    }

    super::super::shared::registry_reads!(true);

    fn backfill_routes(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
    ) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::Backfill(processor, keys)).await })
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
        let this = self.clone();
        Box::pin(async move { this.count(Op::DropProcessor(name)).await })
    }
}

//! Rekey on SQLite (`Inbox::rekey`, issue 34 step 3): its reads on the pool, its writes
//! through the one writer, a batch one operation (`Op::Rekey`) in its batch's
//! transaction. The statements are this dialect's; the walks and the batch's writes over
//! them are `sql::rekey`'s, shared with PostgreSQL.

use sqlx::query::QueryAs;
use sqlx::sqlite::{SqliteArguments, SqliteConnection};

use super::super::rekey::{self, rekey_walks, BodyRow, Rewrites, RouteKey, TextRow};
use super::super::store_error;
use super::{Op, Sqlite};
use crate::inbox::rekey::Rekeying;
use crate::store::{StoreError, StoreFuture};

/// Up to `?3` keys of body rows in clear after (`?1`, `?2`): one range of the covering
/// index (P5: `key_id` comes after `body` in the record, so reading it from the table
/// would walk each body's overflow pages).
const CLEAR_BODIES: &str = "
SELECT key_id, source, event_id FROM webhook_bodies INDEXED BY webhook_bodies_key
WHERE key_id IS NULL AND (source, event_id) > (?1, ?2)
ORDER BY key_id, source, event_id
LIMIT ?3";

/// Up to `?5` keys of body rows sealed under a key other than `?1`, after (`?2`, `?3`,
/// `?4`): the two ranges of the covering index either side of the current key, so the
/// current key's rows (most of them, after a first rekey) are never walked.
const STALE_BODIES: &str = "
SELECT key_id, source, event_id FROM (
    SELECT key_id, source, event_id FROM webhook_bodies INDEXED BY webhook_bodies_key
    WHERE key_id < ?1 AND (key_id, source, event_id) > (?2, ?3, ?4)
    ORDER BY key_id, source, event_id LIMIT ?5)
UNION ALL
SELECT key_id, source, event_id FROM (
    SELECT key_id, source, event_id FROM webhook_bodies INDEXED BY webhook_bodies_key
    WHERE key_id > ?1 AND (key_id, source, event_id) > (?2, ?3, ?4)
    ORDER BY key_id, source, event_id LIMIT ?5)
ORDER BY 1, 2, 3
LIMIT ?5";

/// The body rows `?1` (a JSON array of `[source, id]`) names, whole.
const BODIES: &str = "
SELECT b.source, b.event_id, b.key_id, b.body_nonce, b.body, b.headers, b.sealed_headers,
    b.headers_nonce, b.sealed_subject, b.subject_nonce
FROM json_each(?1) AS k CROSS JOIN webhook_bodies AS b
WHERE b.source = k.value ->> 0 AND b.event_id = k.value ->> 1";

/// Up to `?5` routes after (`?1`, `?2`, `?3`) whose error, or an attempt's, does not start
/// with `?4` (the current key's sealed prefix): the routes' primary key in order, each
/// one's attempts by `webhook_attempts_route`. No index has the texts: a run reads every
/// route once.
const STALE_ROUTES: &str = "
SELECT r.source, r.event_id, r.processor FROM webhook_routes AS r
WHERE (r.source, r.event_id, r.processor) > (?1, ?2, ?3)
  AND ((r.processing_error IS NOT NULL AND substr(r.processing_error, 1, length(?4)) <> ?4)
    OR EXISTS (SELECT 1 FROM webhook_attempts AS a
        WHERE a.source = r.source AND a.event_id = r.event_id AND a.processor = r.processor
          AND a.error IS NOT NULL AND substr(a.error, 1, length(?4)) <> ?4))
ORDER BY r.source, r.event_id, r.processor
LIMIT ?5";

/// The error texts of the routes `?1` (a JSON array of `[source, id, processor]`) that
/// do not start with `?2`: each route's own, and each of its attempts'.
const ERROR_TEXTS: &str = "
SELECT r.source, r.event_id, r.processor, r.processing_error
FROM json_each(?1) AS k CROSS JOIN webhook_routes AS r
WHERE r.source = k.value ->> 0 AND r.event_id = k.value ->> 1 AND r.processor = k.value ->> 2
  AND r.processing_error IS NOT NULL AND substr(r.processing_error, 1, length(?2)) <> ?2
UNION ALL
SELECT a.source, a.event_id, a.processor, a.error
FROM json_each(?1) AS k CROSS JOIN webhook_attempts AS a
WHERE a.source = k.value ->> 0 AND a.event_id = k.value ->> 1 AND a.processor = k.value ->> 2
  AND a.error IS NOT NULL AND substr(a.error, 1, length(?2)) <> ?2";

/// A body row sealed again (`?3`…`?10`), if its key id and nonce are still `?11`, `?12`
/// (compare-and-set); its clear headers, if it had them, gone.
const REWRITE_BODY: &str = "
UPDATE webhook_bodies
SET key_id = ?3, body_nonce = ?4, body = ?5, headers = NULL, sealed_headers = ?6,
    headers_nonce = ?7, sealed_subject = ?8, subject_nonce = ?9, subject_digest = ?10
WHERE source = ?1 AND event_id = ?2 AND key_id IS ?11 AND body_nonce IS ?12";

/// A route's error text `?4` sealed again as `?5`, wherever the route (`?1`…`?3`) and its
/// attempts still hold it (compare-and-set on the text).
const REWRITE_ERROR: [&str; 2] = [
    "UPDATE webhook_routes SET processing_error = ?5
     WHERE source = ?1 AND event_id = ?2 AND processor = ?3 AND processing_error = ?4",
    "UPDATE webhook_attempts SET error = ?5
     WHERE source = ?1 AND event_id = ?2 AND processor = ?3 AND error = ?4",
];

/// The writer's part: a batch of rekey's rewrites, in the batch's transaction; how many
/// values changed.
pub(super) async fn rewrite(
    conn: &mut SqliteConnection,
    rewrites: &Rewrites,
) -> Result<u64, StoreError> {
    rekey::rewrite::<sqlx::Sqlite>(conn, rewrites, REWRITE_BODY, REWRITE_ERROR).await
}

/// Binds the routes' keys to [`ERROR_TEXTS`] as one JSON array.
fn bind_routes<'q>(
    query: QueryAs<'q, sqlx::Sqlite, TextRow, SqliteArguments>,
    routes: &'q [RouteKey],
) -> QueryAs<'q, sqlx::Sqlite, TextRow, SqliteArguments> {
    query.bind(serde_json::to_string(routes).expect("strings"))
}

impl Rekeying for Sqlite {
    rekey_walks!(bind_routes);

    fn bodies(&self, keys: Vec<(String, String)>) -> StoreFuture<Vec<BodyRow>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            sqlx::query_as(BODIES)
                .bind(serde_json::to_string(&keys).expect("strings"))
                .fetch_all(&pool)
                .await
                .map_err(|e| store_error("inbox rekey", e))
        })
    }

    fn rewrite(&self, rewrites: Rewrites) -> StoreFuture<u64> {
        let this = self.clone();
        Box::pin(async move { this.count(Op::Rekey(rewrites)).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::{Key, KeyRing};
    use crate::sql::rekey::{reseal_body, Resealed};
    use crate::store::SqliteStore;

    #[tokio::test]
    async fn a_body_changed_between_read_and_write_is_not_overwritten_and_reads_are_covering() {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-unit-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = SqliteStore::open(&path).await.unwrap();
        let pool = store.pool();
        let run = |sql: &'static str| sqlx::query(sql).execute(pool);
        run("INSERT INTO webhook_bodies (source, event_id, body) VALUES
             ('s', 'e1', 'one'), ('s', 'e2', 'two'), ('s', 'e3', 'three')")
        .await
        .unwrap();
        let sql = store.sql();
        let keys = sql.clear_bodies((String::new(), String::new()), 10).await;
        let keys = keys
            .unwrap()
            .into_iter()
            .map(|(_, s, id)| (s, id))
            .collect();
        let ring = KeyRing::new([Key::new("k1", [1; 32]).unwrap()]).unwrap();
        let rewrites: Vec<_> = (sql.bodies(keys).await.unwrap().into_iter())
            .map(|row| match reseal_body(&ring, row).unwrap() {
                Resealed::Rewrite(rewrite) => rewrite,
                _ => panic!("a clear body is sealed"),
            })
            .collect();
        assert_eq!(rewrites.len(), 3);
        // Between the read and the write: e1 sealed by another replica's rekey, e2 erased.
        run(
            "UPDATE webhook_bodies SET key_id = 'k1', body_nonce = x'00', body = 'theirs'
             WHERE event_id = 'e1'",
        )
        .await
        .unwrap();
        run("DELETE FROM webhook_bodies WHERE event_id = 'e2'")
            .await
            .unwrap();
        assert_eq!(sql.rewrite(Rewrites::Bodies(rewrites)).await.unwrap(), 1);
        let rows: Vec<(String, Option<String>, Vec<u8>)> =
            sqlx::query_as("SELECT event_id, key_id, body FROM webhook_bodies ORDER BY event_id")
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(
            rows[0],
            ("e1".into(), Some("k1".into()), b"theirs".to_vec())
        );
        assert_eq!(
            (rows[1].0.as_str(), rows[1].1.as_deref()),
            ("e3", Some("k1"))
        );
        assert_ne!(rows[1].2, b"three", "e3, unchanged since read, is sealed");

        // P5: both walks read the covering index alone, never a body's pages.
        let mut conn = pool.acquire().await.unwrap();
        for (sql, n) in [(CLEAR_BODIES, 3), (STALE_BODIES, 5)] {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            for _ in 0..n {
                query = query.bind("");
            }
            let steps: Vec<String> = query
                .fetch_all(&mut *conn)
                .await
                .unwrap()
                .iter()
                .map(|row| sqlx::Row::get(row, 3))
                .collect();
            let reads: Vec<_> = steps
                .iter()
                .filter(|s| s.contains("webhook_bodies"))
                .collect();
            assert!(
                !reads.is_empty()
                    && reads
                        .iter()
                        .all(|s| s.contains("COVERING INDEX webhook_bodies_key")),
                "{steps:?}"
            );
        }
        drop(conn);
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}

//! Rekey on PostgreSQL (`Inbox::rekey`, issue 34 step 3): its reads and its batches'
//! writes on the pool, a batch one transaction (none is on the drain's path). The
//! statements are this dialect's; the walks and the batch's writes over them are
//! `sql::rekey`'s, shared with SQLite.

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::QueryAs;

use super::super::rekey::{rekey_walks, rewrite, BodyRow, Rewrites, RouteKey, TextRow};
use super::super::store_error;
use super::{Pg, PLANNED_EACH_TIME};
use crate::inbox::rekey::Rekeying;
use crate::store::StoreFuture;

/// Up to `$3` keys of body rows in clear after (`$1`, `$2`): an index-only scan of
/// `webhook_bodies_key` (P5), never the bodies' pages.
const CLEAR_BODIES: &str = "
SELECT key_id, source, event_id FROM webhook_bodies
WHERE key_id IS NULL AND (source, event_id) > ($1, $2)
ORDER BY key_id, source, event_id
LIMIT $3";

/// Up to `$5` keys of body rows sealed under a key other than `$1`, after (`$2`, `$3`,
/// `$4`): the two ranges of `webhook_bodies_key` either side of the current key, so the
/// current key's rows (most of them, after a first rekey) are never walked.
const STALE_BODIES: &str = "
(SELECT key_id, source, event_id FROM webhook_bodies
 WHERE key_id < $1 AND (key_id, source, event_id) > ($2, $3, $4)
 ORDER BY key_id, source, event_id LIMIT $5)
UNION ALL
(SELECT key_id, source, event_id FROM webhook_bodies
 WHERE key_id > $1 AND (key_id, source, event_id) > ($2, $3, $4)
 ORDER BY key_id, source, event_id LIMIT $5)
ORDER BY 1, 2, 3
LIMIT $5";

/// The body rows `$1`, `$2` name, whole.
const BODIES: &str = "
SELECT b.source, b.event_id, b.key_id, b.body_nonce, b.body, b.headers, b.sealed_headers,
    b.headers_nonce, b.sealed_subject, b.subject_nonce
FROM unnest($1::text[], $2::text[]) AS k(source, event_id)
JOIN webhook_bodies b ON b.source = k.source AND b.event_id = k.event_id";

/// Up to `$5` routes after (`$1`, `$2`, `$3`) whose error, or an attempt's, does not start
/// with `$4` (the current key's sealed prefix): the routes' primary key in order, each
/// one's attempts by `webhook_attempts_route`. No index has the texts: a run reads every
/// route once.
const STALE_ROUTES: &str = "
SELECT r.source, r.event_id, r.processor FROM webhook_routes r
WHERE (r.source, r.event_id, r.processor) > ($1, $2, $3)
  AND ((r.processing_error IS NOT NULL AND NOT starts_with(r.processing_error, $4))
    OR EXISTS (SELECT 1 FROM webhook_attempts a
        WHERE a.source = r.source AND a.event_id = r.event_id AND a.processor = r.processor
          AND a.error IS NOT NULL AND NOT starts_with(a.error, $4)))
ORDER BY r.source, r.event_id, r.processor
LIMIT $5";

/// The error texts of the routes `$1`…`$3` that do not start with `$4`: each route's
/// own, and each of its attempts'.
const ERROR_TEXTS: &str = "
WITH k AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS k(s, e, p))
SELECT r.source, r.event_id, r.processor, r.processing_error
FROM k JOIN webhook_routes r ON r.source = k.s AND r.event_id = k.e AND r.processor = k.p
WHERE r.processing_error IS NOT NULL AND NOT starts_with(r.processing_error, $4)
UNION ALL
SELECT a.source, a.event_id, a.processor, a.error
FROM k JOIN webhook_attempts a ON a.source = k.s AND a.event_id = k.e AND a.processor = k.p
WHERE a.error IS NOT NULL AND NOT starts_with(a.error, $4)";

/// A body row sealed again (`$3`…`$10`), if its key id and nonce are still `$11`, `$12`
/// (compare-and-set); its clear headers, if it had them, gone.
const REWRITE_BODY: &str = "
UPDATE webhook_bodies
SET key_id = $3, body_nonce = $4, body = $5, headers = NULL, sealed_headers = $6,
    headers_nonce = $7, sealed_subject = $8, subject_nonce = $9, subject_digest = $10
WHERE source = $1 AND event_id = $2
  AND key_id IS NOT DISTINCT FROM $11 AND body_nonce IS NOT DISTINCT FROM $12";

/// A route's error text `$4` sealed again as `$5`, wherever the route (`$1`…`$3`) and its
/// attempts still hold it (compare-and-set on the text).
const REWRITE_ERROR: [&str; 2] = [
    "UPDATE webhook_routes SET processing_error = $5
     WHERE source = $1 AND event_id = $2 AND processor = $3 AND processing_error = $4",
    "UPDATE webhook_attempts SET error = $5
     WHERE source = $1 AND event_id = $2 AND processor = $3 AND error = $4",
];

/// Binds the routes' keys to [`ERROR_TEXTS`] as three arrays (a plan for each list).
fn bind_routes<'q>(
    query: QueryAs<'q, Postgres, TextRow, PgArguments>,
    routes: &'q [RouteKey],
) -> QueryAs<'q, Postgres, TextRow, PgArguments> {
    let mut keys = (Vec::new(), Vec::new(), Vec::new());
    for (source, id, processor) in routes {
        keys.0.push(source.as_str());
        keys.1.push(id.as_str());
        keys.2.push(processor.as_str());
    }
    let query = query.bind(keys.0).bind(keys.1).bind(keys.2);
    query.persistent(PLANNED_EACH_TIME) // joins a list of keys
}

impl Rekeying for Pg {
    rekey_walks!(bind_routes);

    fn bodies(&self, keys: Vec<(String, String)>) -> StoreFuture<Vec<BodyRow>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let (sources, ids): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
            sqlx::query_as(BODIES)
                .bind(sources)
                .bind(ids)
                .persistent(PLANNED_EACH_TIME) // joins a list of keys
                .fetch_all(&pool)
                .await
                .map_err(|e| store_error("inbox rekey", e))
        })
    }

    fn rewrite(&self, rewrites: Rewrites) -> StoreFuture<u64> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let err = |e| store_error("inbox rekey", e);
            let mut tx = pool.begin().await.map_err(err)?;
            let n = rewrite::<Postgres>(&mut tx, &rewrites, REWRITE_BODY, REWRITE_ERROR).await?;
            tx.commit().await.map_err(err)?;
            Ok(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::{Key, KeyRing};
    use crate::sql::rekey::{reseal_body, Resealed};

    /// A migrated database of its own on the local server.
    async fn fresh() -> Pg {
        Pg::new(super::super::tests::fresh_pool().await)
    }

    #[tokio::test]
    async fn the_walks_read_the_index_alone_and_a_row_changed_since_read_is_not_overwritten() {
        let pg = fresh().await;
        let pool = pg.pool.clone();
        sqlx::raw_sql(
            "INSERT INTO webhook_bodies (source, event_id, body, key_id, body_nonce)
             SELECT 's', 'e' || g, convert_to(repeat('x', 2000), 'UTF8'),
                 CASE WHEN g % 10 = 0 THEN NULL WHEN g % 10 < 5 THEN 'k1' ELSE 'k2' END,
                 CASE WHEN g % 10 = 0 THEN NULL ELSE '\\x00'::bytea END
             FROM generate_series(1, 20000) g",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("VACUUM ANALYZE webhook_bodies")
            .execute(&pool)
            .await
            .unwrap();
        // P5: each walk is an index-only scan of webhook_bodies_key (the two ranges either
        // side of the current key for the stale one), never the bodies' pages.
        let explain = |sql: &str| format!("EXPLAIN {sql}");
        let clear: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain(CLEAR_BODIES)))
            .bind("")
            .bind("")
            .bind(100_i64)
            .fetch_all(&pool)
            .await
            .unwrap();
        let stale: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain(STALE_BODIES)))
            .bind("k2")
            .bind("")
            .bind("")
            .bind("")
            .bind(100_i64)
            .fetch_all(&pool)
            .await
            .unwrap();
        for (plan, scans) in [(clear.join("\n"), 1), (stale.join("\n"), 2)] {
            let only = plan
                .matches("Index Only Scan using webhook_bodies_key")
                .count();
            assert_eq!(only, scans, "{plan}");
            assert!(!plan.contains("Seq Scan"), "{plan}");
        }

        // Compare-and-set: read three rows in clear, then one is sealed by another
        // replica and one erased before the write; only the third is written.
        let keys = pg
            .clear_bodies((String::new(), String::new()), 3)
            .await
            .unwrap();
        let keys: Vec<(String, String)> = keys.into_iter().map(|(_, s, id)| (s, id)).collect();
        let ring = KeyRing::new([Key::new("k3", [3; 32]).unwrap()]).unwrap();
        let rewrites: Vec<_> = (pg.bodies(keys.clone()).await.unwrap().into_iter())
            .map(|row| match reseal_body(&ring, row).unwrap() {
                Resealed::Rewrite(rewrite) => rewrite,
                _ => panic!("a clear body is sealed"),
            })
            .collect();
        assert_eq!(rewrites.len(), 3);
        sqlx::query("UPDATE webhook_bodies SET key_id = 'k3', body_nonce = '\\x01', body = 'theirs' WHERE event_id = $1")
            .bind(&keys[0].1)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM webhook_bodies WHERE event_id = $1")
            .bind(&keys[1].1)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(pg.rewrite(Rewrites::Bodies(rewrites)).await.unwrap(), 1);
        let theirs: Vec<u8> =
            sqlx::query_scalar("SELECT body FROM webhook_bodies WHERE event_id = $1")
                .bind(&keys[0].1)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(theirs, b"theirs");
        let third: Option<String> =
            sqlx::query_scalar("SELECT key_id FROM webhook_bodies WHERE event_id = $1")
                .bind(&keys[2].1)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(third.as_deref(), Some("k3"));
    }
}

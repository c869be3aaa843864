//! The dialect's statements against PostgreSQL itself.

use std::collections::HashSet;
use std::time::Duration;

use super::super::shared::assert_pages_through_ties;
use super::accept::{accept_many, insert_accepts, ACCEPT_MANY};
use super::group_commit::{
    claim_and_complete_rows, update_processed, write_batch, CLAIM_AND_COMPLETE_MANY, PROCESSED_MANY,
};
use super::listing::{FOLD_COUNTS, LISTINGS};
use super::*;
use crate::inbox::backend::Backend;
use crate::inbox::worker::ClaimDue;
use crate::inbox::Accepted;
use crate::store::{Claim, Delivery, Token};

/// A migrated database of its own on the local server (as the integration tests'):
/// the batch statements are checked against PostgreSQL itself.
pub(super) async fn fresh_pool() -> PgPool {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let admin = PgPool::connect(&url).await.expect("PostgreSQL is running");
    let name = format!("tower_webhook_unit_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let base = &url[..url.rfind('/').expect("a database in the URL")];
    let store = crate::store::PgStore::connect(&format!("{base}/{name}"))
        .await
        .unwrap();
    store.pool().clone()
}

/// Inbox routes of `default` held by a worker's claim under `token`, as a claim leaves
/// them (the event without a body).
async fn held_routes(pool: &PgPool, ids: &[&str], token: Token) {
    sqlx::query(
        "WITH events AS (
             INSERT INTO webhook_events (source, event_id, next_attempt_at)
             SELECT 's', id, now() FROM unnest($1::text[]) id)
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at,
              locked_until, lock_token, attempt_started_at)
         SELECT 's', id, 'default', now(), 1, now(), now() + interval '1 minute', $2, now()
         FROM unnest($1::text[]) id",
    )
    .bind(ids)
    .bind(token.as_uuid())
    .execute(pool)
    .await
    .unwrap();
}

/// Routes `evt_<from>`…`evt_<to>` of `default`, due a second ago (no event rows).
async fn due_routes(pool: &PgPool, (from, to): (i32, i32)) {
    sqlx::query(
        "INSERT INTO webhook_routes (source, event_id, processor, received_at, next_attempt_at)
         SELECT 's', 'evt_' || i, $1, now(), now() - interval '1 second'
         FROM generate_series($2, $3) i",
    )
    .bind(DEFAULT_PROCESSOR)
    .bind(from)
    .bind(to)
    .execute(pool)
    .await
    .unwrap();
}

/// A fresh database's pool of one connection: its session's prepared statements are all
/// of the pool's (`pg_prepared_statements`).
async fn one_connection() -> PgPool {
    let options = fresh_pool().await.connect_options().as_ref().clone();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap()
}

/// The worker's outcomes, a key-list join, are never kept as a prepared statement (whose
/// generic plan, made while the table was small, would scan the whole table for every
/// batch after it grew); the front door's batch statement is, its plan made over as the
/// table doubles (`a_plan_made_on_a_small_table_is_made_over_once_the_table_doubles`).
#[tokio::test]
async fn key_list_joins_are_planned_for_each_call_not_kept_prepared() {
    let pool = one_connection().await;
    let lease = Duration::from_secs(30);
    for i in 0..8 {
        let (a, b) = (
            Delivery::new("s", format!("a{i}")),
            Delivery::new("s", format!("b{i}")),
        );
        let (t1, t2) = (Token::new(), Token::new());
        let (inserted, _) = claim_and_complete_rows(&pool, &[(&a, t1, lease)], &[])
            .await
            .unwrap();
        assert_eq!(inserted.len(), 1);
        let ids = (format!("a{i}"), format!("b{i}"));
        let keys = [("s", ids.0.as_str(), t1)];
        let (inserted, done) = claim_and_complete_rows(&pool, &[(&b, t2, lease)], &keys)
            .await
            .unwrap();
        assert_eq!((inserted.len(), done.len()), (1, 1));
        let ids = (format!("c{i}"), format!("d{i}"));
        held_routes(&pool, &[&ids.0, &ids.1], t1).await;
        let keys = [("s", ids.0.as_str(), t1), ("s", ids.1.as_str(), t1)];
        let wakes = [false, true];
        let routes = [DEFAULT_PROCESSOR; 2];
        let done = update_processed(&pool, &keys, &wakes, &routes).await;
        assert_eq!(done.unwrap().len(), 2);
    }
    let prepared = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
            )
            .bind(sql)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(prepared(CLAIM_AND_COMPLETE_MANY).await, 1, "kept");
    assert_eq!(prepared(PROCESSED_MANY).await, 0, "planned for each call");
}

/// The worker's claim is kept prepared, one statement (and plan) per doubling of its
/// tables: a table that doubled since its plan was made gets a new one, made at its size
/// now, rather than a plan made on an empty inbox kept through a storm.
#[tokio::test]
async fn the_claim_is_planned_again_when_its_table_doubles() {
    let pool = one_connection().await;
    let store = crate::store::PgStore::from_migrated_pool(pool.clone());
    let backend = store.sql();
    let claims = || async {
        for _ in 0..8 {
            let due = ClaimDue::plain(4, Duration::from_secs(30), Token::new());
            backend.claim(DEFAULT_PROCESSOR.into(), due).await.unwrap();
        }
        sqlx::query_scalar::<_, String>(
            "SELECT statement FROM pg_prepared_statements WHERE starts_with(statement, $1)
             ORDER BY prepare_time",
        )
        .bind(super::queue::CLAIM_DUE)
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let empty = claims().await;
    assert_eq!(empty.len(), 1, "one statement, kept prepared");
    assert!(empty[0].starts_with(super::queue::CLAIM_DUE));
    // Queued routes (not due for an hour) of `source`, `n` of them.
    let grow = |source: &'static str, n: i32| {
        sqlx::query(
            "INSERT INTO webhook_routes (source, event_id, processor, received_at, next_attempt_at)
             SELECT $1, 'evt_' || i, $2, now(), now() + interval '1 hour'
             FROM generate_series(1, $3) i",
        )
        .bind(source)
        .bind(DEFAULT_PROCESSOR)
        .bind(n)
        .execute(&pool)
    };
    // The routes grow from empty to 4 000 rows.
    grow("s", 4000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // sizes are read once a second
    let grown = claims().await;
    assert_eq!(grown.len(), 2, "a statement of its own for the grown table");
    assert_ne!(grown[1], grown[0]);
    // Grown again, but not read again within the second: the same statement.
    grow("t", 8000).await.unwrap();
    assert_eq!(claims().await, grown, "read at most once a second");
}

/// The plan `pool`'s one connection would run now for its kept statement that starts
/// with `statement`, given `args` (SQL literals), as JSON text.
async fn kept_plan(pool: &PgPool, statement: &str, args: &str) -> String {
    let name: String = sqlx::query_scalar(
        "SELECT name FROM pg_prepared_statements WHERE starts_with(statement, $1)",
    )
    .bind(statement)
    .fetch_one(pool)
    .await
    .unwrap();
    let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE {name}({args})");
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .persistent(false)
        .fetch_one(pool)
        .await
        .unwrap();
    plan.to_string()
}

/// A prepared statement's plan made while its table was small is made over once the table
/// doubled, by the store's `ANALYZE`: here `DedupeLayer`'s completion, its plan a
/// sequential scan made on a table of 8 rows and kept at 40 000 (autovacuum off: its own
/// ANALYZE would come a minute or more later), an index scan after the next write.
#[tokio::test]
async fn a_plan_made_on_a_small_table_is_made_over_once_the_table_doubles() {
    use crate::store::DedupeStore;
    let pool = one_connection().await;
    sqlx::query("ALTER TABLE webhook_events SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .unwrap();
    let store = crate::store::PgStore::from_migrated_pool(pool.clone());
    let lease = Duration::from_secs(30);
    let claim_and_complete = |id: String| {
        let store = store.clone();
        async move {
            let d = Delivery::new("s", id);
            let Claim::New(token) = store.claim(d.clone(), Token::new(), lease).await.unwrap()
            else {
                panic!("a new key");
            };
            let done = store.complete(d, token).await.unwrap();
            assert_eq!(done, crate::store::Completed::Done);
        }
    };
    for i in 0..8 {
        claim_and_complete(format!("small_{i}")).await;
    }
    // The completion's plan, as its connection would run it now.
    let args = format!("'s', 'none', '{}'", uuid::Uuid::nil());
    let plan = || kept_plan(&pool, super::claims::COMPLETE, &args);
    assert!(plan().await.contains("Seq Scan"), "made on the small table");
    sqlx::query(
        "INSERT INTO webhook_events (source, event_id, attempts, kind, received_at)
         SELECT 's', 'big_' || i, 1, 'event', now() FROM generate_series(1, 40000) i",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(plan().await.contains("Seq Scan"), "kept as the table grew");
    tokio::time::sleep(Duration::from_millis(1100)).await; // sizes are read once a second
    claim_and_complete("after".to_owned()).await;
    let mut over = false;
    for _ in 0..100 {
        if !plan().await.contains("Seq Scan") {
            over = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plan = plan().await;
    assert!(over && plan.contains("Index Scan"), "made over: {plan}");
}

/// The worker's claim on a backlog of analyzed routes takes the due ones through their
/// index, not by sorting all of them: the pauses' table, never analyzed on a new
/// database (planned as ten pages of pauses, which the claim's anti-join then expects
/// nearly every route to meet), is analyzed at the store's first read of the sizes.
#[tokio::test]
async fn the_claim_reads_a_backlog_through_its_index_once_the_routes_are_analyzed() {
    let pool = one_connection().await;
    let never: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'webhook_pauses'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(never < 0.0, "a new database's pauses were never analyzed");
    due_routes(&pool, (1, 20000)).await;
    // As autovacuum would, a minute into a storm.
    sqlx::query("ANALYZE webhook_routes")
        .execute(&pool)
        .await
        .unwrap();
    let store = crate::store::PgStore::from_migrated_pool(pool.clone());
    let due = ClaimDue::plain(4, Duration::from_secs(30), Token::new());
    let claimed = store
        .sql()
        .claim(DEFAULT_PROCESSOR.into(), due)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    let mut analyzed = false;
    for _ in 0..100 {
        let reltuples: f32 =
            sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'webhook_pauses'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if reltuples >= 0.0 {
            analyzed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(analyzed, "the pauses' table analyzed at the first read");
    let args = format!(
        "30.0, '{}', 4, 30, 'crashed', NULL, '{{}}', '{{}}', '{{}}', '{{}}', '{DEFAULT_PROCESSOR}'",
        uuid::Uuid::nil()
    );
    let plan = kept_plan(&pool, super::queue::CLAIM_DUE, &args).await;
    assert!(
        plan.contains("webhook_routes_due") && !plan.contains("\"Sort\""),
        "the due routes through their index, unsorted: {plan}"
    );
}

/// Each kind's batch statement runs (not the write-by-write fallback, which would
/// answer the same, only slower), and a mixed batch answers each write.
#[tokio::test]
async fn batch_statements_run_and_a_mixed_batch_answers_each_write() {
    let pool = fresh_pool().await;
    let lease = Duration::from_secs(30);
    let (a, b) = (Delivery::new("s", "a"), Delivery::new("s", "b"));
    let (t1, t2, t3) = (Token::new(), Token::new(), Token::new());
    // The same key twice in one statement: one token goes in.
    let claims = [(&a, t1, lease), (&b, t2, lease), (&b, t3, lease)];
    let (inserted, _) = claim_and_complete_rows(&pool, &claims, &[])
        .await
        .expect("one statement");
    let row = |id: &str, t: Token| ("s".to_owned(), id.to_owned(), t.as_uuid());
    assert_eq!(inserted, HashSet::from([row("a", t1), row("b", t2)]));
    let completes = [("s", "a", t1), ("s", "b", t3)];
    let (_, done) = claim_and_complete_rows(&pool, &[], &completes)
        .await
        .expect("one statement");
    assert_eq!(done, HashSet::from([row("a", t1)]));
    // Both kinds in one statement: f goes in, b (held by t2) does not; b's completion
    // under t2 matches, a's under another token does not.
    let (f, t5) = (Delivery::new("s", "f"), Token::new());
    let (inserted, done) = claim_and_complete_rows(
        &pool,
        &[(&f, t5, lease), (&b, Token::new(), lease)],
        &[("s", "b", t2), ("s", "a", Token::new())],
    )
    .await
    .expect("one statement");
    assert_eq!(inserted, HashSet::from([row("f", t5)]));
    assert_eq!(done, HashSet::from([row("b", t2)]));
    let c = Delivery::new("s", "c").with_routes(vec![DEFAULT_PROCESSOR.into()]);
    let queued = insert_accepts(&pool, &[&c, &c], ACCEPT_MANY)
        .await
        .expect("one statement");
    assert_eq!(queued, HashSet::from([("s".to_owned(), "c".to_owned())]));
    let t4 = Token::new();
    let pg = Pg::new(pool.clone());
    let route: std::sync::Arc<str> = DEFAULT_PROCESSOR.into();
    let claimed = Backend::claim(&pg, route.clone(), ClaimDue::plain(1, lease, t4)).await;
    assert_eq!(claimed.unwrap().len(), 1, "the worker's claim of c");

    let answers = write_batch(
        &pool,
        vec![
            Write::Claim(Delivery::new("s", "d"), Token::new(), lease),
            Write::Claim(Delivery::new("s", "b"), Token::new(), lease), // done by t2
            Write::Complete("s".into(), "f".into(), t5),
            Write::Accept(Delivery::new("s", "e")),
            Write::Accept(Delivery::new("s", "e")),
            // The inbox's row `c`, claimed by a worker under t4, and a stale token.
            Write::Processed("s".into(), "c".into(), t4, false, route.clone()),
            Write::Processed("s".into(), "c".into(), Token::new(), true, route),
        ],
    )
    .await;
    assert!(matches!(answers[0], Ok(Written::Claim(Claim::New(_)))));
    assert!(matches!(
        answers[1],
        Ok(Written::Claim(Claim::InFlight { .. }) | Written::Claim(Claim::Done))
    ));
    assert!(matches!(answers[2], Ok(Written::Complete(true))));
    assert!(matches!(answers[3], Ok(Written::Accept(Accepted::New))));
    assert!(matches!(
        answers[4],
        Ok(Written::Accept(Accepted::Duplicate))
    ));
    assert!(matches!(answers[5], Ok(Written::Complete(true))));
    assert!(matches!(answers[6], Ok(Written::Complete(false))));
    let processed: bool = sqlx::query_scalar(
        "SELECT processed_at IS NOT NULL FROM webhook_routes WHERE event_id = 'c'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(processed);
}

/// The processed count the triggers log is folded once it grows, and stays exact
/// through bulk changes (5 000 rows processed, half requeued in one statement).
/// A batch inserts bodies and routes without `ON CONFLICT` (every event it queues is new):
/// a route and a body left by hand for a key (its event deleted outside the crate) fail
/// the batch, and its accepts one by one still queue every event, the leftovers kept.
#[tokio::test]
async fn a_batch_meeting_rows_left_by_hand_queues_each_accept_alone() {
    let pool = fresh_pool().await;
    sqlx::raw_sql(
        "INSERT INTO webhook_routes (source, event_id, processor, received_at, attempts,
             next_attempt_at) VALUES ('s', 'left', 'default', now(), 0, now());
         INSERT INTO webhook_bodies (source, event_id, body) VALUES ('s', 'left', 'old');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let route = || vec![DEFAULT_PROCESSOR.into()];
    let (left, fresh) = (
        Delivery::new("s", "left").with_routes(route()),
        Delivery::new("s", "fresh").with_routes(route()),
    );
    let failed = insert_accepts(&pool, &[&left, &fresh], ACCEPT_MANY).await;
    assert!(
        failed.is_err(),
        "the batch's plain insert meets the leftovers"
    );
    let answers = accept_many(&pool, vec![&left, &fresh]).await;
    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, [Accepted::New, Accepted::New]);
    let (events, routes, old): (i64, i64, Vec<u8>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_events), (SELECT count(*) FROM webhook_routes),
             (SELECT body FROM webhook_bodies WHERE event_id = 'left')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((events, routes, &old[..]), (2, 2, &b"old"[..]));
}

#[tokio::test]
async fn counts_fold_the_log_and_stay_exact_through_bulk_changes() {
    let pool = fresh_pool().await;
    let pg = Pg::new(pool.clone());
    sqlx::query(
        "INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at, processed_at)
         SELECT 's', 'e' || g, 'default', now(), 1, now(), now() FROM generate_series(1, 5000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let log_rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_counts")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert!(log_rows().await > 5000, "one +1 a row");
    assert_eq!(
        pg.counts(DEFAULT_PROCESSOR.into()).await.unwrap().processed,
        5000
    );
    assert_eq!(log_rows().await, 1, "folded by the count");
    // A prune folds too, and a log of one row folds into the same one row.
    Backend::prune(&pg, Duration::from_secs(3600), None)
        .await
        .unwrap();
    assert_eq!(log_rows().await, 1);
    assert_eq!(
        pg.counts(DEFAULT_PROCESSOR.into()).await.unwrap().processed,
        5000
    );
    // Any statement, the crate's or not: half requeued at once, then some pruned.
    let bulk = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query(sql).execute(&pool).await.unwrap() }
    };
    bulk("UPDATE webhook_routes SET processed_at = NULL WHERE substr(event_id, 2)::int % 2 = 0")
        .await;
    assert_eq!(
        pg.counts(DEFAULT_PROCESSOR.into()).await.unwrap().processed,
        2500
    );
    bulk("DELETE FROM webhook_routes WHERE substr(event_id, 2)::int <= 2000").await;
    assert_eq!(
        pg.counts(DEFAULT_PROCESSOR.into()).await.unwrap().processed,
        1500
    );
    assert_eq!(
        pg.counts(DEFAULT_PROCESSOR.into()).await.unwrap().queued,
        1500
    );
}

/// The listings read their partial index in its order, not the history (20 000
/// processed rows here), in the plan a first page gets and in the generic plan a
/// prepared statement settles on; and rows tied in time (to the microsecond, which
/// the cursor keeps) page by their key, each once.
#[tokio::test]
async fn listings_read_their_partial_index_and_page_through_ties() {
    let pool = fresh_pool().await;
    sqlx::raw_sql(
        "INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at, processed_at)
         SELECT 's', 'p' || g, 'default', now(), 1, now(), now()
         FROM generate_series(1, 20000) g;
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at, dead_at,
              processing_error)
         SELECT 's', 'd' || g, 'default', now(), 3, now(), '2026-01-01T00:00:00.987653Z', 'boom'
         FROM generate_series(1, 5) g;
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at,
              processing_error)
         SELECT 's', 'f' || g, 'default', '2026-01-01T00:00:00.000001Z', 1,
             now() + interval '1 hour', 'late'
         FROM generate_series(1, 3) g;
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at)
         SELECT 's', 'q' || g, 'default', now(), 0, now() FROM generate_series(1, 100) g;
         ANALYZE webhook_routes;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let indexes = [
        "webhook_routes_dead",
        "webhook_routes_dead",
        "webhook_routes_failing",
        "webhook_routes_failing",
        "webhook_routes_dead_by",
        "webhook_routes_dead_by",
        "webhook_routes_failing_by",
        "webhook_routes_failing_by",
    ];
    for (i, (sql, index)) in LISTINGS.into_iter().zip(indexes).enumerate() {
        // Every processor's (no position: no processor), then `default`'s alone.
        let processor = (i >= 4).then_some("default");
        let custom: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .bind(None::<i64>)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(51_i64)
            .bind(processor)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PREPARE list_{i} (int8, text, text, int8, text) AS {sql}; \
             SET plan_cache_mode = force_generic_plan"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        let generic: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN EXECUTE list_{i} (1767225600000000, 's', 'd3', 51, 'default')"
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        for plan in [custom, generic] {
            let plan = plan.join("\n");
            assert!(
                plan.contains(&format!("Index Scan using {index}"))
                    || plan.contains(&format!("Index Scan Backward using {index}")),
                "{plan}"
            );
            assert!(!plan.contains("Sort"), "read in the index's order: {plan}");
        }
    }
    drop(conn);

    let inbox = crate::inbox::Inbox::postgres(&crate::store::PgStore::from_migrated_pool(pool));
    assert_pages_through_ties(&inbox).await;
}

/// A role that may not `TRUNCATE` the log still folds it (by deleting its rows).
#[tokio::test]
async fn a_role_without_truncate_still_folds_the_log() {
    let pool = fresh_pool().await;
    let role = format!("tower_webhook_app_{}", uuid::Uuid::new_v4().simple());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_events, webhook_counts TO {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let options = pool.connect_options().as_ref().clone().username(&role);
    let app = PgPool::connect_with(options).await.unwrap();
    for _ in 0..2 {
        sqlx::query("INSERT INTO webhook_counts (delta) VALUES (3)")
            .execute(&app)
            .await
            .unwrap();
    }
    sqlx::raw_sql(FOLD_COUNTS).execute(&app).await.unwrap();
    let log: Vec<i64> = sqlx::query_scalar("SELECT delta FROM webhook_counts")
        .fetch_all(&app)
        .await
        .unwrap();
    assert_eq!(log, [6], "the backfill's 0 and two 3s, folded");
    app.close().await;
    let drop = format!("DROP OWNED BY {role}; DROP ROLE {role}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&pool)
        .await
        .unwrap();
}

/// The per-object index is made on demand (concurrently), once.
#[tokio::test]
async fn the_object_index_is_made_on_demand() {
    let pool = fresh_pool().await;
    let exists = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'webhook_routes_by_object'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    assert_eq!(exists().await, 0, "no migration makes it");
    let pg = Pg::new(pool.clone());
    pg.object_index().await.unwrap();
    pg.object_index().await.unwrap(); // again: nothing to do
    assert_eq!(exists().await, 1);
}

/// A capped claim reads an object's routes from the object index, not from a scan of every
/// queued route — also while `webhook_routes_due` still says it is empty, as it does from
/// the migration (made on an empty table) until the first vacuum: the planner would
/// otherwise scan that "empty" index for each candidate (1.2 s a claim at 20 000 queued).
#[tokio::test]
async fn a_capped_claim_reads_the_object_index_while_the_due_index_looks_empty() {
    let pool = fresh_pool().await;
    sqlx::raw_sql(
        "ALTER TABLE webhook_routes SET (autovacuum_enabled = false);
         INSERT INTO webhook_routes
             (source, event_id, processor, object_id, received_at, next_attempt_at)
         SELECT 's', 'evt_' || i, 'default', 'o_' || i, now(), now() - interval '1 hour'
         FROM generate_series(1, 5000) i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let pg = Pg::new(pool.clone());
    pg.object_index().await.unwrap();
    let stats: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'webhook_routes_due'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        stats <= 0.0,
        "the due index's stats are its migration's ({stats})"
    );
    let explain = format!("EXPLAIN {}", super::queue::CLAIM_DUE);
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(60.0_f64)
        .bind(Token::new().as_uuid())
        .bind(64_i64)
        .bind(8_i32)
        .bind("crashed")
        .bind(Some(1_i32))
        .bind(Vec::<String>::new())
        .bind(Vec::<String>::new())
        .bind(vec!["s".to_owned()])
        .bind(vec!["evt_1".to_owned()])
        .bind(DEFAULT_PROCESSOR)
        .fetch_all(&pool)
        .await
        .unwrap();
    let object = plan
        .iter()
        .position(|l| l.contains("webhook_routes_by_object"));
    assert!(object.is_some(), "the object index is read: {plan:#?}");
    let subplan = plan.iter().position(|l| l.contains("SubPlan")).unwrap();
    assert!(
        !plan[subplan..]
            .iter()
            .any(|l| l.contains("webhook_routes_due")),
        "the object's rows are not read from the due index: {plan:#?}"
    );
}

/// An inbox route processed whose object's later events wait for it (`wakes`) notifies the
/// channel every replica's workers listen on, for its processor's; one that does not wake
/// notifies nothing.
#[tokio::test]
async fn a_processed_row_that_frees_its_objects_turn_notifies_the_workers() {
    let pool = fresh_pool().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen(CHANNEL).await.unwrap();
    let (t1, t2) = (Token::new(), Token::new());
    held_routes(&pool, &["a"], t1).await;
    held_routes(&pool, &["b"], t2).await;
    let heard = async |listener: &mut sqlx::postgres::PgListener| {
        let wait = tokio::time::timeout(Duration::from_millis(500), listener.recv());
        wait.await
            .ok()
            .map(|told| told.unwrap().payload().to_owned())
    };
    let (quiet, wakes) = ([("s", "a", t1)], [("s", "b", t2)]);
    let route = [DEFAULT_PROCESSOR];
    let done = update_processed(&pool, &quiet, &[false], &route).await;
    assert_eq!(done.unwrap().len(), 1);
    assert_eq!(
        heard(&mut listener).await,
        None,
        "nothing freed: no notification"
    );
    let done = update_processed(&pool, &wakes, &[true], &route).await;
    assert_eq!(done.unwrap().len(), 1);
    assert_eq!(
        heard(&mut listener).await.as_deref(),
        Some("default 0"),
        "its object's turn freed: its processor's workers told it is due now"
    );
}

/// A claim takes at most its limit, whatever plan the server picks. The plan the model
/// suite met (statistics of one row, the routes then grown): the routes scanned, the
/// claim's candidates the inner side of a nested loop, run again for each route; each run
/// skipped the rows the runs before had locked and took the next, and a claim of one took
/// two (a worker holding one processor for them panicked).
#[tokio::test]
async fn a_claim_takes_no_more_than_its_limit_whatever_the_plan() {
    let options = fresh_pool()
        .await
        .connect_options()
        .as_ref()
        .clone()
        .options([
            ("enable_hashjoin", "off"),
            ("enable_mergejoin", "off"),
            ("enable_material", "off"),
            ("enable_indexscan", "off"),
            ("enable_bitmapscan", "off"),
        ]);
    let pool = PgPool::connect_with(options).await.unwrap();
    due_routes(&pool, (1, 1)).await;
    sqlx::query("ANALYZE webhook_routes")
        .execute(&pool)
        .await
        .unwrap();
    due_routes(&pool, (2, 4)).await;
    let pg = Pg::new(pool.clone());
    let due = ClaimDue::plain(1, Duration::from_secs(30), Token::new());
    let rows = pg.claim(DEFAULT_PROCESSOR.into(), due).await.unwrap();
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_routes WHERE lock_token IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((rows.len(), leased), (1, 1), "one row claimed and leased");
}

/// The worker's claims run on the writer's kept connections, not lent ones: with every
/// connection the pool may lend held elsewhere, a claim still answers (lent, it waited
/// out the pool's acquire timeout and failed).
#[tokio::test]
async fn a_claim_runs_on_a_kept_connection_while_the_pool_is_all_lent() {
    let options = fresh_pool().await.connect_options().as_ref().clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3) // keeps one
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(options)
        .await
        .unwrap();
    due_routes(&pool, (1, 2)).await;
    let pg = Pg::new(pool.clone());
    let claim = || {
        let due = ClaimDue::plain(1, Duration::from_secs(30), Token::new());
        pg.claim(DEFAULT_PROCESSOR.into(), due)
    };
    // The first keeps its connection (and reads the tables' sizes, good for a second).
    assert_eq!(claim().await.unwrap().len(), 1);
    let mut lent = Vec::new();
    for _ in 0..3 {
        lent.push(pool.acquire().await.unwrap());
    }
    assert_eq!(pool.size(), 3, "every connection the pool may open is lent");
    let second = claim().await.expect("a claim on the kept connection");
    assert_eq!(second.len(), 1);
}

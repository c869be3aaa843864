//! The dialect's statements against SQLite itself.

use std::path::PathBuf;

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite as Db, SqliteArguments};
use sqlx::Row;

use super::super::shared::assert_pages_through_ties;
use super::listing::{LISTINGS, LISTING_INDEXES};
use super::writer::write_in_one_transaction;
use super::*;
use crate::inbox::backend::Backend;
use crate::store::SqliteStore;

/// A migrated database in a file of its own, the file removed when it is dropped.
struct Fresh {
    store: SqliteStore,
    path: PathBuf,
}

impl Fresh {
    async fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "tower-webhook-unit-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let store = SqliteStore::open(&path).await.unwrap();
        Self { store, path }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The steps of SQLite's plan for `sql`, with what `bind` binds.
///
/// On one connection that has read the schema first: `EXPLAIN QUERY PLAN` plans with the
/// schema its connection last read, and never checks it is current, so on a connection
/// idle since before an index was made (the pool opens a second one when the first is
/// not back yet, as under load) it plans without the index.
async fn plan(
    pool: &SqlitePool,
    sql: &str,
    bind: impl FnOnce(Query<'_, Db, SqliteArguments>) -> Query<'_, Db, SqliteArguments>,
) -> Vec<String> {
    let mut conn = pool.acquire().await.unwrap();
    let read = sqlx::query("SELECT count(*) FROM sqlite_master");
    read.fetch_one(&mut *conn).await.unwrap();
    let explain = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
    // Not kept prepared: a kept one would keep its plan past a later index too.
    bind(explain.persistent(false))
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String, _>("detail"))
        .collect()
}

/// The listings read their partial index in its order, not the history (20 000
/// processed routes here), and routes tied in time page by their key, each once.
#[tokio::test]
async fn listings_read_their_partial_index_and_page_through_ties() {
    let Fresh { store, .. } = &Fresh::new().await;
    sqlx::raw_sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at)
         SELECT 's', 'p' || i, 'default', 1000, 1, 1000 FROM n;
         UPDATE webhook_routes SET processed_at = 2000 WHERE event_id LIKE 'p%';
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5)
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at, dead_at,
              processing_error)
         SELECT 's', 'd' || i, 'default', 1000, 3, 1000, 5000, 'boom' FROM n;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3)
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at,
              processing_error)
         SELECT 's', 'f' || i, 'default', 3000, 1, 9000, 'late' FROM n;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at)
         SELECT 's', 'q' || i, 'default', 4000, 0, 4000 FROM n;
         ANALYZE;",
    )
    .execute(store.pool())
    .await
    .unwrap();
    for (i, (sql, index)) in LISTINGS.into_iter().zip(LISTING_INDEXES).enumerate() {
        for after in [None, Some(5000_i64)] {
            // Every processor's (the position's processor), then `default`'s alone.
            let processor = if i < 4 {
                after.map(|_| "default")
            } else {
                Some("default")
            };
            let plan = plan(store.pool(), sql, |query| {
                let query = query.bind(10_000_i64).bind(after);
                let key = (after.map(|_| "s"), after.map(|_| "d3"));
                query.bind(key.0).bind(key.1).bind(51_i64).bind(processor)
            })
            .await
            .join("\n");
            assert!(plan.contains(&format!("USING INDEX {index}")), "{plan}");
            assert!(
                !plan.contains("TEMP B-TREE"),
                "read in the index's order: {plan}"
            );
        }
    }

    let inbox = crate::inbox::Inbox::sqlite(store);
    let counts = inbox.counts().await.unwrap();
    assert_eq!(
        counts.processed, 20_000,
        "routes processed are counted, the processor's counter made by the first"
    );
    assert_pages_through_ties(&inbox).await;
}

/// A clock that reads `secs` after the epoch.
fn at(secs: u64) -> Clock {
    Arc::new(move || UNIX_EPOCH + Duration::from_secs(secs))
}

/// The batch goes as one transaction, not through the write-by-write fallback.
#[tokio::test]
async fn a_mixed_batch_is_one_transaction_with_each_write_answered() {
    let Fresh { store, .. } = &Fresh::new().await;
    let mut conn = store.pool().acquire().await.unwrap();
    let (t1, t2) = (Token::new(), Token::new());
    let lease = Duration::from_secs(30);
    let writes = vec![
        Op::Claim(Delivery::new("s", "a"), t1, lease),
        Op::Claim(Delivery::new("s", "a"), t2, lease),
        Op::Accept(Delivery::new("s", "c")),
        Op::Accept(Delivery::new("s", "c")),
    ];
    let answers = write_in_one_transaction(&mut conn, &at(1), &writes)
        .await
        .expect("one transaction");
    assert!(matches!(answers[0], Ok(Done::Claim(Claim::New(_)))));
    assert!(matches!(
        answers[1],
        Ok(Done::Claim(Claim::InFlight { .. }))
    ));
    assert!(matches!(answers[2], Ok(Done::Accept(Accepted::New))));
    assert!(matches!(answers[3], Ok(Done::Accept(Accepted::Duplicate))));
    let writes = vec![
        Op::Complete("s".into(), "a".into(), t1),
        Op::Complete("s".into(), "a".into(), t2),
    ];
    let answers = write_in_one_transaction(&mut conn, &at(2), &writes)
        .await
        .expect("one transaction");
    assert!(matches!(answers[0], Ok(Done::Held(true))));
    assert!(matches!(answers[1], Ok(Done::Held(false))));
}

/// A claim handed back under its token is due again with its attempt uncounted; a
/// hand-back under another token changes nothing.
#[tokio::test]
async fn rows_handed_back_are_due_again_uncounted_and_fenced_on_the_token() {
    let Fresh { store, .. } = &Fresh::new().await;
    let sql = store.sql().clone();
    let inbox = crate::inbox::Inbox::sqlite(store);
    let verifier = crate::Verifier::new(
        crate::Scheme::standard(),
        ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )
    .unwrap()
    .with_source("s");
    inbox.ingest(&verifier, Some("evt_1"), "{}").await.unwrap();
    let lease = Duration::from_secs(60);
    let claim = |token| sql.claim_due(1, lease, token);
    let token = Token::new();
    let rows = claim(token).await;
    assert_eq!(rows.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1]);
    let key = || vec![("s".to_owned(), "evt_1".to_owned())];
    assert_eq!(
        Backend::give_back(&sql, PROCESSOR.into(), key(), Token::new())
            .await
            .unwrap(),
        0
    );
    assert!(claim(Token::new()).await.is_empty(), "still held");
    let given = Backend::give_back(&sql, PROCESSOR.into(), key(), token).await;
    assert_eq!(given.unwrap(), 1);
    let again = claim(Token::new()).await;
    assert_eq!(again.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1]);
}

/// The per-object index is made on demand, once, and a claim with a cap uses it.
#[tokio::test]
async fn the_object_index_is_made_on_demand_and_a_capped_claim_reads_it() {
    let Fresh { store, .. } = &Fresh::new().await;
    let exists = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE name = 'webhook_routes_by_object'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        n
    };
    assert_eq!(exists().await, 0, "no migration makes it");
    let sql = store.sql().clone();
    sql.object_index().await.unwrap();
    sql.object_index().await.unwrap(); // again: nothing to do
    assert_eq!(exists().await, 1);
    let plan = plan(store.pool(), super::queue::CLAIM_DUE, |query| {
        let query = query.bind(0_i64).bind(1000_i64).bind("t").bind(10_i64);
        let query = query
            .bind(8_i64)
            .bind(1_i64)
            .bind("[]")
            .bind("[]")
            .bind("[]");
        query.bind(PROCESSOR)
    })
    .await;
    assert!(
        plan.iter()
            .any(|step| step.contains("webhook_routes_by_object")),
        "{plan:?}"
    );
}

/// Body expiry reads the processed routes' index from the bookmark and every table by
/// its key, on 20 000 processed events: no statement of a batch scans a table.
#[tokio::test]
async fn body_expiry_reads_the_processed_index_and_each_table_by_its_key() {
    let Fresh { store, .. } = &Fresh::new().await;
    sqlx::raw_sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
         INSERT INTO webhook_events (source, event_id, received_at, next_attempt_at)
         SELECT 's', 'e' || i, 1000, 1000 FROM n;
         INSERT INTO webhook_bodies (source, event_id, body, headers)
         SELECT source, event_id, zeroblob(500), 'x-a: b' FROM webhook_events;
         INSERT INTO webhook_routes
             (source, event_id, processor, received_at, attempts, next_attempt_at, processed_at)
         SELECT source, event_id, 'default', 1000, 1, 1000, 2000 + rowid FROM webhook_events;
         INSERT INTO webhook_attempts
             (source, event_id, processor, attempt, started_at, finished_at, outcome, error)
         SELECT source, event_id, 'default', 1, 1500, 1500, 'failed', 'quoted'
         FROM webhook_events;
         ANALYZE;",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let keys = serde_json::to_string(&[("s", "e1"), ("s", "e2")]).unwrap();
    let mut plans = vec![
        plan(store.pool(), super::expiry::WINDOW_END, |q| {
            q.bind(2000_i64).bind(5000_i64).bind(100_i64)
        })
        .await,
        plan(store.pool(), super::expiry::EXPIRING, |q| {
            q.bind(2000_i64).bind(2100_i64).bind(5000_i64)
        })
        .await,
    ];
    for sql in super::expiry::EXPIRE {
        plans.push(plan(store.pool(), sql, |q| q.bind(keys.as_str())).await);
    }
    for (i, steps) in plans.iter().enumerate() {
        let plan = steps.join("\n");
        assert!(plan.contains("SEARCH"), "statement {i}: {plan}");
        for step in steps.iter().filter(|s| s.starts_with("SCAN")) {
            assert!(step.contains("json_each"), "statement {i} scans: {plan}");
        }
        if i < 2 {
            assert!(
                plan.contains("webhook_routes_processed_at"),
                "statement {i}: {plan}"
            );
        }
    }
}

/// A verified event of `body`, keyed `id` (its body's `id` field).
fn event(body: &'static [u8]) -> crate::Event {
    crate::Event::new(crate::event::Parts {
        source: "s".into(),
        metrics: crate::metrics::Source::new("s"),
        header_id: None,
        header_type: None,
        id_field: Some("id"),
        type_field: "type",
        unsigned_id: false,
        content_digest: None,
        timestamp: None,
        kept: true,
        body: bytes::Bytes::from_static(body),
        secret_index: 0,
        scheme: Arc::new(crate::Scheme::standard()),
    })
}

/// A run of accepts stores each byte string as the column always held it: the text
/// columns text, the others blobs, byte for byte, NULL where there is none (in clear, a
/// sealed one, one without an event or headers, and an empty body in one batch).
#[tokio::test]
async fn a_run_of_accepts_stores_each_column_byte_for_byte_and_typed() {
    let Fresh { store, .. } = &Fresh::new().await;
    let mut conn = store.pool().acquire().await.unwrap();
    let clear = Delivery::from_event(&event(br#"{"id":"a","type":"t"}"#))
        .with_headers(Some("user-agent: é\nx-b: 1\n".into()));
    let sealed = Delivery::from_event(&event(br#"{"id":"b"}"#))
        .with_headers(Some("x: y\n".into()))
        .with_sealed(crate::store::SealedBody {
            key_id: "k1".into(),
            body: vec![0, 1, 2],
            body_nonce: vec![3; 24],
            headers: Some((vec![4, 0, 5], vec![6; 24])),
            subject: Some((vec![7], vec![8; 24], vec![9; 32])),
        });
    let bare = Delivery::new("s", "c");
    let empty = Delivery::from_event(&event(b""));
    let writes: Vec<Op> = [clear, sealed, bare, empty].map(Op::Accept).into();
    write_in_one_transaction(&mut conn, &at(1), &writes)
        .await
        .expect("one transaction");
    let rows = sqlx::query(
        "SELECT event_id, quote(source), quote(body), quote(headers), quote(key_id),
             quote(body_nonce), quote(sealed_headers), quote(headers_nonce),
             quote(sealed_subject), quote(subject_nonce), quote(subject_digest)
         FROM webhook_bodies ORDER BY event_id",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| (0..11).map(|i| row.get::<String, _>(i)).collect())
        .collect();
    let hex = |b: &[u8]| format!("X'{}'", hex::encode_upper(b));
    let expected = [
        vec![
            "a".into(),
            "'s'".into(),
            hex(br#"{"id":"a","type":"t"}"#),
            "'user-agent: é\nx-b: 1\n'".into(),
        ]
        .into_iter()
        .chain(std::iter::repeat_n("NULL".to_owned(), 7))
        .collect::<Vec<String>>(),
        vec![
            "b".into(),
            "'s'".into(),
            hex(&[0, 1, 2]),
            "NULL".into(),
            "'k1'".into(),
            hex(&[3; 24]),
            hex(&[4, 0, 5]),
            hex(&[6; 24]),
            hex(&[7]),
            hex(&[8; 24]),
            hex(&[9; 32]),
        ],
        ["c", "'s'"]
            .map(String::from)
            .into_iter()
            .chain(std::iter::repeat_n("NULL".to_owned(), 9))
            .collect(),
    ];
    assert_eq!(rows[..3], expected);
    // The empty body is a blob of no bytes, not NULL.
    assert_eq!(rows[3][2], "X''");
}

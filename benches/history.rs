//! Cost flat in retained history: each hot operation's latency on a table that already
//! holds N processed rows (a week of a busy endpoint and more), as a ratio to the same
//! operation on an empty table, measured in the same run, on both dialects.
//!
//! ```sh
//! bash .ci/services                                  # PostgreSQL, if it is not running
//! cargo bench --all-features --bench history         # N = 0, 1 000 000
//! HISTORY_ROWS=0,1000000,10000000 cargo bench --all-features --bench history
//! ```
//!
//! The table is filled with raw SQL first (processed inbox rows and done dedupe keys,
//! received a day ago), then analysed; then, 200 times each: a dedupe claim + complete, an
//! inbox accept, `counts` (with the lag), and a worker draining 200 queued rows (claim +
//! finish, per row), and one `prune` pass that deletes nothing (the rows are younger
//! than the retention) — the medians are printed with their ratio to N = 0.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tower_webhook::inbox::{Attempt, Inbox, Worker};
use tower_webhook::store::{Claim, DedupeStore, Delivery, PgStore, Retention, SqliteStore, Token};
use tower_webhook::{Event, Scheme, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SAMPLES: usize = 200;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn event(id: &str) -> Event {
    let body = format!(r#"{{"id":"{id}","type":"bench.event","data":{{"object":{{"id":"o"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, SystemTime::now(), body.as_bytes())
        .unwrap();
    Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .verify(&headers, body.into())
        .unwrap()
}

/// The medians of each operation, in a fixed order.
struct Figures(Vec<(&'static str, Duration)>);

async fn measure(store: Arc<dyn DedupeStore>, inbox: Inbox, run: &str) -> Figures {
    let mut figures = Vec::new();
    let mut samples = Vec::new();
    for i in 0..SAMPLES {
        let d = Delivery::new("bench", format!("{run}_claim_{i}"));
        let started = Instant::now();
        let Claim::New(token) = store
            .claim(d.clone(), Token::new(), Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("a fresh key")
        };
        store.complete(d, token).await.unwrap();
        samples.push(started.elapsed());
    }
    figures.push(("dedupe claim + complete", median(samples)));

    let mut samples = Vec::new();
    for i in 0..SAMPLES {
        let e = event(&format!("{run}_accept_{i}"));
        let started = Instant::now();
        inbox.accept(&e).await.unwrap();
        samples.push(started.elapsed());
    }
    figures.push(("inbox accept", median(samples)));

    let mut samples = Vec::new();
    for _ in 0..SAMPLES {
        let started = Instant::now();
        let counts = inbox.counts().await.unwrap();
        samples.push(started.elapsed());
        assert!(counts.queued >= SAMPLES as u64);
    }
    figures.push(("counts (with the lag)", median(samples)));

    // The accepted rows are due: one worker drains them, one claim per row.
    let done = Arc::new(AtomicUsize::new(0));
    let seen = done.clone();
    let started = Instant::now();
    let worker = Worker::new(&inbox, move |_: Event, _: Attempt| {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(())
        }
    })
    .with_concurrency(1)
    .unwrap()
    .with_poll_interval(Duration::from_millis(1))
    .unwrap()
    .spawn();
    while done.load(Ordering::SeqCst) < SAMPLES {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = started.elapsed();
    worker.shutdown().await;
    figures.push(("worker: per row (claim + finish)", drained / SAMPLES as u32));

    let started = Instant::now();
    store.prune(Retention::default()).await.unwrap();
    inbox.prune(Retention::default()).await.unwrap();
    figures.push(("prune pass (nothing old)", started.elapsed()));
    Figures(figures)
}

/// After the fill: the count is right (nine rows in ten are the inbox's, all processed),
/// and the first `counts` has folded what the fill logged (as a scrape or a prune does in
/// service), so the samples see the steady state. How long that first one took is said.
async fn filled(inbox: &Inbox, rows: i64, dialect: &str) {
    let started = Instant::now();
    let counts = inbox.counts().await.unwrap();
    eprintln!(
        "{dialect}, {rows} rows: first counts after the fill {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(counts.processed, (rows - rows / 10) as u64, "{counts:?}");
}

const FILL_PG: &str = "
INSERT INTO webhook_events
    (source, event_id, event_type, body, received_at, attempts, next_attempt_at, processed_at, kind)
SELECT 'history', 'evt_' || g, 'bench.event', '\\x7b7d'::bytea, now() - interval '1 day', 1,
       CASE WHEN g % 10 = 0 THEN NULL ELSE now() - interval '1 day' END,
       now() - interval '1 day', 'event'
FROM generate_series(1, $1) g";

const FILL_SQLITE: &str = "
WITH RECURSIVE g(n) AS (SELECT 1 WHERE ?1 > 0 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
INSERT INTO webhook_events
    (source, event_id, event_type, body, received_at, attempts, next_attempt_at, processed_at, kind)
SELECT 'history', 'evt_' || n, 'bench.event', CASE WHEN n % 10 = 0 THEN x'7b7d' END, ?2,
       CASE WHEN n % 10 = 0 THEN 1 ELSE 0 END,
       CASE WHEN n % 10 = 0 THEN NULL ELSE ?2 END, CASE WHEN n % 10 = 0 THEN ?2 END, 'event'
FROM g";

/// SQLite keeps an inbox event's body and state apart (fan-out's schema): each filled
/// inbox event's body and its processed route.
const FILL_SQLITE_ROUTES: [&str; 2] = [
    "INSERT INTO webhook_bodies (source, event_id, body)
     SELECT source, event_id, x'7b7d' FROM webhook_events
     WHERE source = 'history' AND next_attempt_at IS NOT NULL",
    "INSERT INTO webhook_routes
         (source, event_id, processor, event_type, received_at, attempts, next_attempt_at,
          processed_at)
     SELECT source, event_id, 'default', event_type, received_at, 1, next_attempt_at,
         next_attempt_at
     FROM webhook_events WHERE source = 'history' AND next_attempt_at IS NOT NULL",
];

async fn postgres(rows: i64, admin_url: &str) -> Figures {
    let admin = sqlx::PgPool::connect(admin_url).await.unwrap();
    let name = format!("tower_webhook_history_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let base = &admin_url[..admin_url.rfind('/').unwrap()];
    let store = PgStore::connect(&format!("{base}/{name}")).await.unwrap();
    sqlx::query(FILL_PG)
        .bind(rows)
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE webhook_events")
        .execute(store.pool())
        .await
        .unwrap();
    let inbox = Inbox::postgres(&store);
    filled(&inbox, rows, "PostgreSQL").await;
    let figures = measure(Arc::new(store.clone()), inbox, &format!("pg{rows}")).await;
    store.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    figures
}

async fn sqlite(rows: i64) -> Figures {
    let path =
        std::env::temp_dir().join(format!("tower-webhook-history-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = SqliteStore::open(&path).await.unwrap();
    let day_ago = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 24 * 3600 * 1000;
    sqlx::query(FILL_SQLITE)
        .bind(rows)
        .bind(day_ago)
        .execute(store.pool())
        .await
        .unwrap();
    for fill in FILL_SQLITE_ROUTES {
        sqlx::query(fill).execute(store.pool()).await.unwrap();
    }
    sqlx::query("ANALYZE").execute(store.pool()).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    filled(&inbox, rows, "SQLite").await;
    let figures = measure(Arc::new(store.clone()), inbox, &format!("sqlite{rows}")).await;
    store.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    figures
}

fn print(dialect: &str, sizes: &[i64], runs: &[Figures]) {
    println!("\n{dialect}: median per operation, and ÷ the empty table's");
    print!("| operation |");
    for n in sizes {
        print!(" {n} rows |");
    }
    println!();
    println!("|---|{}", "---|".repeat(sizes.len()));
    for (row, (name, empty)) in runs[0].0.iter().enumerate() {
        print!("| {name} |");
        for run in runs {
            let d = run.0[row].1;
            print!(
                " {:.2} ms ({:.2}×) |",
                d.as_secs_f64() * 1e3,
                d.as_secs_f64() / empty.as_secs_f64()
            );
        }
        println!();
    }
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments of its own.
    let sizes: Vec<i64> = std::env::var("HISTORY_ROWS")
        .unwrap_or_else(|_| "0,1000000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("HISTORY_ROWS: numbers"))
        .collect();
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut pg = Vec::new();
        let mut lite = Vec::new();
        for &n in &sizes {
            eprintln!("filling {n} rows (PostgreSQL, SQLite)…");
            pg.push(postgres(n, &admin_url).await);
            lite.push(sqlite(n).await);
        }
        print("PostgreSQL", &sizes, &pg);
        print("SQLite", &sizes, &lite);
    });
}

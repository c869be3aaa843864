//! HTTP load test over loopback: a bare axum handler, then + `VerifyWebhookLayer`, then +
//! `DedupeLayer` on each store (and PostgreSQL's transactional form), then the inbox's
//! accept service (store, answer 204), under a realistic mix of deliveries — 70 % new
//! events, 25 % duplicates delivered later, 5 % duplicates delivered at the same time as
//! the original — and a bare sqlx `INSERT … ON CONFLICT DO NOTHING` loop as the database's
//! floor. Prints requests per second, p50 and p99 latency, and checks that with dedupe
//! every event was handled exactly once (for the inbox: stored once).
//!
//! ```text
//! cargo run --release --example loadtest -- [--events N] [--concurrency C]
//!     [--stores memory,sqlite,postgres,postgres-tx,redis,inbox-sqlite,inbox-postgres] [--json]
//! ```
//!
//! Bounded: at most 100 000 events and 256 clients (more are refused), and each scenario
//! stops after 120 s. PostgreSQL and Redis come from `DATABASE_URL` and `REDIS_URL`
//! (default: the local servers); the run uses a database and a key prefix of its own and
//! removes them afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::routing::{post, post_service};
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_webhook::dedupe::TxDedupeLayer;
use tower_webhook::inbox::Inbox;
use tower_webhook::store::{DedupeStore, MemoryStore, PgStore, RedisStore, SqliteStore};
use tower_webhook::{DedupeLayer, Event, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MAX_EVENTS: u64 = 100_000;
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

/// Handler calls per event id.
type Calls = Arc<Mutex<HashMap<String, u32>>>;

/// The scenarios `--stores` can name, in the order they run by default.
const STORES: [&str; 7] = [
    "memory",
    "sqlite",
    "postgres",
    "postgres-tx",
    "redis",
    "inbox-sqlite",
    "inbox-postgres",
];

/// HTTP load test over loopback: the middleware's cost, and exactly once on every store.
#[derive(Parser)]
#[command(
    long_about = "HTTP load test over loopback: a bare axum handler, then + VerifyWebhookLayer, \
        then + DedupeLayer on each store (and PostgreSQL's transactional form), then the \
        inbox's accept service, under a realistic mix of deliveries (70 % new events, 25 % \
        duplicates delivered later, 5 % duplicates delivered at the same time as the \
        original), and a bare sqlx INSERT ... ON CONFLICT DO NOTHING loop as the database's \
        floor. Prints requests per second, p50 and p99 latency, and checks that with dedupe \
        every event was handled exactly once (for the inbox: stored once). Each scenario \
        stops after 120 s. PostgreSQL and Redis come from DATABASE_URL and REDIS_URL \
        (default: the local servers); the run uses a database and a key prefix of its own \
        and removes them afterwards."
)]
struct Args {
    /// Distinct events to deliver; duplicates come on top (30 % of all deliveries).
    #[arg(long, value_name = "N", default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_EVENTS))]
    events: u64,
    /// Concurrent keep-alive clients.
    #[arg(long, value_name = "C", default_value_t = 32,
        value_parser = clap::value_parser!(u64).range(1..=256))]
    concurrency: u64,
    /// The scenarios to run after the bare and verify ones, comma-separated, in order: a
    /// store for DedupeLayer, postgres-tx for TxDedupeLayer, inbox-* for the inbox.
    #[arg(long, value_name = "STORE,…", value_delimiter = ',',
        default_value = "memory,sqlite,postgres,postgres-tx,redis,inbox-sqlite,inbox-postgres",
        value_parser = clap::builder::PossibleValuesParser::new(STORES))]
    stores: Vec<String>,
    /// Print the reports as a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

struct Options {
    events: usize,
    concurrency: usize,
    stores: Vec<String>,
    json: bool,
}

fn options() -> Options {
    let args = Args::parse();
    Options {
        // Within MAX_EVENTS and 256: clap checked the ranges.
        events: args.events as usize,
        concurrency: args.concurrency as usize,
        stores: args.stores,
        json: args.json,
    }
}

/// One delivery to send: which event, and its signed request parts.
struct Delivery {
    id: String,
    headers: HeaderMap,
    body: Bytes,
}

/// The mix: every event once; about 25 % of deliveries are later duplicates, about 5 %
/// are sent right beside the original, so concurrent workers race them.
fn deliveries(events: usize) -> Vec<Delivery> {
    let now = SystemTime::now();
    let make = |i: usize| {
        let id = format!("evt_load_{i}");
        let body = Bytes::from(format!(
            r#"{{"id":"{id}","type":"payment_intent.succeeded","livemode":false,"data":{{"object":{{"id":"pi_{i}"}}}}}}"#
        ));
        let headers = Scheme::standard().sign([SECRET], &id, now, &body).unwrap();
        Delivery { id, headers, body }
    };
    let mut out = Vec::with_capacity(events * 10 / 7 + 1);
    let mut later = Vec::new();
    for i in 0..events {
        out.push(make(i));
        // Deterministic spread: of every 14 events, 5 get a later duplicate (25 % of all
        // deliveries) and 1 a concurrent one (5 %).
        match i % 14 {
            0 => out.push(make(i)),
            1..=5 => later.push(make(i)),
            _ => {}
        }
        if i % 7 == 6 {
            out.append(&mut later);
        }
    }
    out.append(&mut later);
    out
}

/// What stands in front of the handler.
enum Mode {
    Bare,
    Verify,
    Dedupe(Arc<dyn DedupeStore>),
    PgTx(TxDedupeLayer),
    /// No handler: the inbox stores the event and answers 204.
    Inbox(Inbox),
}

fn app(calls: Calls, mode: Mode) -> Router {
    let verify = || VerifyWebhookLayer::new(Verifier::new(Scheme::standard(), [SECRET]).unwrap());
    let handler = move |event: Option<Event>, body: Bytes| {
        let calls = calls.clone();
        async move {
            let id = match event {
                Some(e) => e.id().unwrap_or_default().to_owned(),
                // The bare handler reads the id itself (no verification).
                None => serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["id"].as_str().map(String::from))
                    .unwrap_or_default(),
            };
            *calls.lock().unwrap().entry(id).or_default() += 1;
            StatusCode::NO_CONTENT
        }
    };
    let route = match mode {
        Mode::Bare => post(handler),
        Mode::Verify => post(handler).layer(verify()),
        Mode::Dedupe(store) => post(handler).layer(
            ServiceBuilder::new()
                .layer(verify())
                .layer(DedupeLayer::from_arc(store)),
        ),
        Mode::PgTx(layer) => {
            post(handler).layer(ServiceBuilder::new().layer(verify()).layer(layer))
        }
        Mode::Inbox(inbox) => post_service(inbox.accept_service()).layer(verify()),
    };
    Router::new().route("/webhooks", route)
}

#[derive(Debug, Clone, serde::Serialize)]
struct Report {
    scenario: String,
    deliveries: usize,
    seconds: f64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    handled: u64,
    double_effects: u64,
    lost: u64,
    statuses: HashMap<u16, usize>,
}

async fn run(
    name: &str,
    router: Router,
    calls: Calls,
    work: &Arc<[Delivery]>,
    events: usize,
    concurrency: usize,
) -> Report {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build_http::<Full<Bytes>>();

    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, next, work) =
                (client.clone(), url.clone(), next.clone(), work.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= work.len() || started.elapsed() > SCENARIO_LIMIT {
                        return seen;
                    }
                    let d = &work[i];
                    let mut request = Request::post(&url).body(Full::new(d.body.clone())).unwrap();
                    *request.headers_mut() = d.headers.clone();
                    let sent = Instant::now();
                    let status = match client.request(request).await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let _ = response.into_body().collect().await;
                            status
                        }
                        Err(_) => 0,
                    };
                    seen.push((sent.elapsed(), status));
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(work.len());
    let mut statuses = HashMap::new();
    for worker in workers {
        for (latency, status) in worker.await.unwrap() {
            latencies.push(latency);
            *statuses.entry(status).or_default() += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    server.abort();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let calls = calls.lock().unwrap();
    let handled = calls.values().map(|&n| u64::from(n)).sum();
    let double_effects = calls
        .values()
        .map(|&n| u64::from(n.saturating_sub(1)))
        .sum();
    let lost = (events - calls.len().min(events)) as u64;
    Report {
        scenario: name.to_owned(),
        deliveries: latencies.len(),
        seconds,
        rps: latencies.len() as f64 / seconds,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        handled,
        double_effects,
        lost,
        statuses,
    }
}

/// The database's floor: `concurrency` workers inserting one row per delivery.
async fn bare_insert(pool: &sqlx::PgPool, work: &[Delivery], concurrency: usize) -> Report {
    sqlx::query("CREATE TABLE IF NOT EXISTS loadtest_baseline (source TEXT, event_id TEXT, PRIMARY KEY (source, event_id))")
        .execute(pool).await.unwrap();
    let ids: Arc<Vec<String>> = Arc::new(work.iter().map(|d| d.id.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency).map(|_| {
        let (pool, ids, next) = (pool.clone(), ids.clone(), next.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ids.len() || started.elapsed() > SCENARIO_LIMIT { return latencies; }
                let sent = Instant::now();
                sqlx::query("INSERT INTO loadtest_baseline (source, event_id) VALUES ('load', $1) ON CONFLICT DO NOTHING")
                    .bind(&ids[i]).execute(&pool).await.unwrap();
                latencies.push(sent.elapsed());
            }
        })
    }).collect();
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await.unwrap());
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64()
            * 1000.0
    };
    Report {
        scenario: "sqlx INSERT ON CONFLICT loop (no HTTP)".into(),
        deliveries: latencies.len(),
        seconds,
        rps: latencies.len() as f64 / seconds,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        handled: 0,
        double_effects: 0,
        lost: 0,
        statuses: HashMap::new(),
    }
}

/// A new database `db` beside the one `admin_url` names, and a pool of `size` on it.
async fn fresh_pg_pool(
    admin_url: &str,
    db: &str,
    size: usize,
) -> Result<sqlx::PgPool, Box<dyn std::error::Error>> {
    let admin = sqlx::PgPool::connect(admin_url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&admin)
        .await?;
    admin.close().await;
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url, |(base, _)| base);
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(size as u32)
        .connect(&format!("{base}/{db}"))
        .await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = options();
    let work: Arc<[Delivery]> = deliveries(o.events).into();
    let mut reports = Vec::new();
    let fresh = || Calls::default();

    // Warm-up, not reported: the first scenario would otherwise pay for cold caches and
    // the client's first connections.
    let calls = fresh();
    run(
        "warm-up",
        app(calls.clone(), Mode::Bare),
        calls,
        &work,
        o.events,
        o.concurrency,
    )
    .await;

    let calls = fresh();
    reports.push(
        run(
            "bare axum handler",
            app(calls.clone(), Mode::Bare),
            calls,
            &work,
            o.events,
            o.concurrency,
        )
        .await,
    );
    let calls = fresh();
    reports.push(
        run(
            "+ verify",
            app(calls.clone(), Mode::Verify),
            calls,
            &work,
            o.events,
            o.concurrency,
        )
        .await,
    );

    let pg_admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pg_db = format!("tower_webhook_loadtest_{}", std::process::id());
    let mut pg_databases = Vec::new();
    for store_name in &o.stores {
        let mode = match store_name.as_str() {
            "memory" => Mode::Dedupe(Arc::new(MemoryStore::new())),
            "sqlite" => {
                let path = std::env::temp_dir().join(format!("{pg_db}.db"));
                Mode::Dedupe(Arc::new(SqliteStore::open(path).await?))
            }
            "postgres" | "postgres-tx" => {
                let db = format!("{pg_db}_{}", store_name.replace('-', "_"));
                let pool = fresh_pg_pool(&pg_admin_url, &db, o.concurrency).await?;
                pg_databases.push(db);
                if store_name == "postgres" {
                    reports.push(bare_insert(&pool, &work, o.concurrency).await);
                    Mode::Dedupe(Arc::new(PgStore::from_pool(pool).await?))
                } else {
                    Mode::PgTx(TxDedupeLayer::new(pool).await?)
                }
            }
            "inbox-sqlite" => {
                let path = std::env::temp_dir().join(format!("{pg_db}_inbox.db"));
                Mode::Inbox(Inbox::sqlite(&SqliteStore::open(path).await?))
            }
            "inbox-postgres" => {
                let db = format!("{pg_db}_inbox");
                let pool = fresh_pg_pool(&pg_admin_url, &db, o.concurrency).await?;
                pg_databases.push(db);
                Mode::Inbox(Inbox::postgres(&PgStore::from_pool(pool).await?))
            }
            "redis" => {
                let url =
                    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
                Mode::Dedupe(Arc::new(
                    RedisStore::connect(&url)
                        .await?
                        .with_prefix(&format!("{pg_db}:")),
                ))
            }
            other => return Err(format!("unknown store {other}").into()),
        };
        let calls = fresh();
        let inbox = match &mode {
            Mode::Inbox(inbox) => Some(inbox.clone()),
            _ => None,
        };
        let name = match store_name.strip_prefix("inbox-") {
            Some(db) => format!("+ verify + inbox accept ({db})"),
            None => format!("+ verify + dedupe ({store_name})"),
        };
        let app = app(calls.clone(), mode);
        let mut report = run(&name, app, calls, &work, o.events, o.concurrency).await;
        if let Some(inbox) = inbox {
            // No handler ran: count what was stored (once per event, by the unique key).
            let stored = inbox.counts().await?.queued;
            report.handled = stored;
            report.lost = (o.events as u64).saturating_sub(stored);
        }
        reports.push(report);
    }
    if !pg_databases.is_empty() {
        let admin = sqlx::PgPool::connect(&pg_admin_url).await?;
        for db in pg_databases {
            let drop = format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)");
            sqlx::query(sqlx::AssertSqlSafe(drop))
                .execute(&admin)
                .await?;
        }
    }
    for file in [format!("{pg_db}.db"), format!("{pg_db}_inbox.db")] {
        let _ = std::fs::remove_file(std::env::temp_dir().join(file));
    }

    if o.json {
        println!("{}", serde_json::to_string(&reports)?);
        return Ok(());
    }
    let bare = reports[0].rps;
    println!(
        "{} events, {} deliveries, {} concurrent clients, loopback\n",
        o.events,
        work.len(),
        o.concurrency
    );
    println!(
        "| scenario | req/s | ÷ bare | p50 ms | p99 ms | handler runs | double effects | lost |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &reports {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            r.scenario,
            r.rps,
            r.rps / bare,
            r.p50_ms,
            r.p99_ms,
            r.handled,
            r.double_effects,
            r.lost
        );
    }
    Ok(())
}

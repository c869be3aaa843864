//! A provider's worst day, played against a real receiver and worker over loopback.
//!
//! ```text
//! cargo run --release --example demo -- [--events N] [--database-url postgres://…]
//!     [--nats nats://…] [--outage-secs S] [--json] [--seed N]
//! ```
//!
//! (`--events` from 1 to 100 000, `--outage-secs` at most 60; `--help` lists every flag.)
//!
//! N events (default 10 000; one in five a `charge.refunded`, the others
//! `payment_intent.succeeded`) are each delivered 1–5 times, shuffled, by 32 concurrent
//! senders; some carry event times days old; forged and stale deliveries are mixed in.
//! Each event fans out to three processors, a worker each: `ledger` (every type) fails
//! transiently on one attempt in ten, `billing` takes only `payment_intent.*`, `email`
//! fails transiently on one attempt in five. A quarter of the way through, the
//! store is cut off for S seconds (default 3: PostgreSQL through a proxy that drops every
//! connection, SQLite by another process holding its write lock past the busy timeout),
//! so deliveries get 503 and are retried, and the workers' claims and outcomes fail; and
//! halfway through, the workers are killed mid-event and new ones started. The receiver is
//! `VerifyWebhookLayer` + the
//! inbox's accept service on the embedded SQLite store (or PostgreSQL) — or, with
//! `--nats`, `VerifyWebhookLayer` + `DedupeLayer` on that store + JetStream's accept, a
//! JetStream worker per processor, and NATS is what the outage cuts off. `ledger`
//! sets its object's state through the ordering guard (four events per object, arriving
//! in any order); every processor records its business effect through `Once` (a namespace
//! each) in a ledger keyed by (event, processor). At the end both are checked: every
//! (event, processor) its filter takes has its effect exactly once — no double effects,
//! none lost, no run for a type the filter excludes — and every object in its newest
//! event's state, none moved back by a late one.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::routing::post_service;
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{
    Attempt, Counts, Inbox, ProcessorSpec, RetryPolicy, Worker, WorkerHandle,
};
use tower_webhook::latest::{self, Order};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::{DedupeStore, PgStore, SqliteStore, StoreError};
use tower_webhook::{DedupeLayer, Event, Scheme, Verifier, VerifyWebhookLayer};

mod support;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MAX_EVENTS: u64 = 100_000;

/// A provider's worst day, played against a real receiver and worker over loopback.
#[derive(Parser)]
#[command(
    long_about = "A provider's worst day, played against a real receiver and worker over \
        loopback. Each event is delivered 1–5 times, shuffled, by 32 concurrent senders, with \
        forged and stale deliveries mixed in. Each event fans out to three processors, a \
        worker each: ledger (every type, fails one attempt in ten), billing \
        (payment_intent.* only) and email (fails one attempt in five). A quarter of the way \
        through, the store (with --nats, NATS) is cut off for --outage-secs, so deliveries \
        get 503 and are retried; halfway through, the workers are killed mid-event and new \
        ones started. The receiver is VerifyWebhookLayer + the \
        inbox's accept service on the embedded SQLite store (or PostgreSQL), or with --nats \
        VerifyWebhookLayer + DedupeLayer on that store + JetStream's accept. At the end it \
        checks that every (event, processor) its filter takes had its effect exactly once, \
        that no processor ran a type its filter excludes, and that no object's state was \
        moved back by a late event, and fails otherwise."
)]
struct Args {
    /// Events to deliver (each 1–5 times).
    #[arg(long, value_name = "N", default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_EVENTS))]
    events: u64,
    /// Deduplicate and queue in PostgreSQL (in a schema of the run's own, dropped at the
    /// end) instead of the embedded SQLite store.
    #[arg(long, value_name = "postgres://…")]
    database_url: Option<String>,
    /// Hand the events to NATS JetStream (deduplicated in the store in front); the outage
    /// cuts NATS off instead of the store.
    #[arg(long, value_name = "nats://…")]
    nats: Option<String>,
    /// How long the outage lasts, in seconds (0: none).
    #[arg(long, value_name = "S", default_value_t = 3,
        value_parser = clap::value_parser!(u64).range(..=60))]
    outage_secs: u64,
    /// Print the table as one JSON object instead, and no progress bar.
    #[arg(long)]
    json: bool,
    /// Seed of the day's shuffle, late events, forged and stale deliveries.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

struct Options {
    events: usize,
    database_url: Option<String>,
    nats: Option<String>,
    json: bool,
    seed: u64,
    outage: Duration,
}

fn options() -> Options {
    let args = Args::parse();
    Options {
        // At most MAX_EVENTS: clap checked the range.
        events: args.events as usize,
        database_url: args.database_url,
        nats: args.nats,
        json: args.json,
        seed: args.seed,
        outage: Duration::from_secs(args.outage_secs),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Genuine,
    Forged,
    Stale,
}

struct Delivery {
    kind: Kind,
    headers: HeaderMap,
    body: Bytes,
}

/// The day's deliveries: every event 1–5 times, some about objects days old, plus forged
/// and stale ones; shuffled. And per object, the id of its newest event: the state the
/// object must end in, whatever order the events arrive in.
fn worst_day(
    events: usize,
    source: &str,
    rng: &mut fastrand::Rng,
) -> (Vec<Delivery>, HashMap<String, (u64, String)>) {
    let now = SystemTime::now();
    let mut out = Vec::new();
    let mut newest: HashMap<String, (u64, String)> = HashMap::new();
    for i in 0..events {
        let id = format!("evt_{source}_{i}");
        // One event in twenty describes something that happened days ago: a late event.
        let days_ago = if rng.u32(0..20) == 0 {
            rng.u64(1..4)
        } else {
            0
        };
        // Four events per object, each with its own time: delivered shuffled, half of
        // them arrive after a newer one of their object.
        let created = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .saturating_sub(days_ago * 86_400 + i as u64);
        let object = i / 4;
        let event_type = event_type(i);
        let body = Bytes::from(format!(
            r#"{{"type":"{event_type}","created":{created},"livemode":true,"data":{{"object":{{"id":"pi_{object}"}}}}}}"#
        ));
        let latest = newest.entry(format!("pi_{object}")).or_default();
        if created > latest.0 {
            *latest = (created, id.clone());
        }
        for _ in 0..rng.usize(1..=5) {
            let headers = Scheme::standard().sign([SECRET], &id, now, &body).unwrap();
            out.push(Delivery {
                kind: Kind::Genuine,
                headers,
                body: body.clone(),
            });
        }
        if rng.u32(0..50) == 0 {
            let headers = Scheme::standard()
                .sign(["whsec_YXR0YWNrZXJzLWd1ZXNzLTAxMjM0NTY3"], &id, now, &body)
                .unwrap();
            out.push(Delivery {
                kind: Kind::Forged,
                headers,
                body: body.clone(),
            });
        }
        if rng.u32(0..50) == 0 {
            let replayed_at = now - Duration::from_secs(3600);
            let headers = Scheme::standard()
                .sign([SECRET], &id, replayed_at, &body)
                .unwrap();
            out.push(Delivery {
                kind: Kind::Stale,
                headers,
                body,
            });
        }
    }
    rng.shuffle(&mut out);
    (out, newest)
}

/// Event `i`'s type: one in five a refund, which `billing`'s filter excludes.
fn event_type(i: usize) -> &'static str {
    if i % 5 == 4 {
        "charge.refunded"
    } else {
        "payment_intent.succeeded"
    }
}

/// The day's processors: name, type globs (none: every type), and the share of attempts
/// that fail transiently (one in so many; 0: none).
const PROCESSORS: [(&str, &[&str], u32); 3] = [
    ("ledger", &[], 10),
    ("billing", &["payment_intent.*"], 0),
    ("email", &[], 5),
];

/// [`PROCESSORS`] as the inbox (or stream) routes by them.
fn processor_specs() -> Result<Vec<ProcessorSpec>, tower_webhook::ConfigError> {
    PROCESSORS
        .iter()
        .map(|(name, types, _)| {
            let spec = ProcessorSpec::new(*name)?;
            match types.is_empty() {
                true => Ok(spec),
                false => spec.with_types(types.iter().copied()),
            }
        })
        .collect()
}

#[derive(Default, serde::Serialize)]
struct Table {
    sent: usize,
    /// Events stored: `ledger`'s routes (it takes every type), not the sum over the
    /// processors, which counts an event once per processor that takes it.
    accepted: u64,
    duplicates: u64,
    rejected: usize,
    /// Events `ledger` processed.
    processed: u64,
    /// Routes whose every attempt failed, in any processor: each is a failure of the day,
    /// with its last error printed.
    dead: u64,
    /// Over every processor.
    double_effects: u64,
    /// Over every processor.
    lost: u64,
    moved_back: u64,
    /// How long the store was cut off, and how many deliveries it turned away meanwhile
    /// (503 or a broken connection: the provider retried them).
    outage_seconds: f64,
    unavailable: usize,
    seconds: f64,
    deliveries_per_second: f64,
    /// Each processor's row.
    processors: BTreeMap<&'static str, ProcessorRow>,
}

/// One processor's part of the day.
#[derive(Default, serde::Serialize)]
struct ProcessorRow {
    /// Routes its filter should have made: one per event of a type it takes.
    expected: u64,
    processed: u64,
    dead: u64,
    double_effects: u64,
    lost: u64,
    /// Runs for an event of a type its filter excludes (always 0).
    excluded_runs: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = options();
    let mut rng = fastrand::Rng::with_seed(o.seed);
    let source_tag = format!("{}", std::process::id());

    // The store: embedded SQLite by default, PostgreSQL when given.
    let sqlite_path = std::env::temp_dir().join(format!("tower-webhook-demo-{source_tag}.db"));
    let schema = format!("tower_webhook_demo_{source_tag}");
    // With NATS, the outage cuts NATS off, not the store.
    let store_outage = if o.nats.is_some() {
        Duration::ZERO
    } else {
        o.outage
    };
    let (inbox, store, db, mut backend, mut outage): (
        Inbox,
        Arc<dyn DedupeStore>,
        Db,
        String,
        Outage,
    ) = match &o.database_url {
        Some(url) => {
            let (pool, proxy) = own_schema(url, &schema, store_outage).await?;
            let store = PgStore::from_pool(pool).await?;
            let db = Db::Pg(store.pool().clone());
            (
                Inbox::postgres(&store),
                Arc::new(store),
                db,
                "PostgreSQL".into(),
                proxy.map_or(Outage::None, |p| Outage::Proxy(Arc::new(p))),
            )
        }
        None => {
            // 2 s leases: the floor of four busy timeouts allows them.
            let store = SqliteStore::open(&sqlite_path)
                .await?
                .with_busy_timeout(Duration::from_millis(500));
            let db = Db::Sqlite(store.pool().clone());
            let name = format!("SQLite ({})", sqlite_path.display());
            let outage = Outage::WriteLock(sqlite_path.clone());
            (Inbox::sqlite(&store), Arc::new(store), db, name, outage)
        }
    };
    let queue = match &o.nats {
        None => Queue::Sql(inbox.with_processors(processor_specs()?)?),
        Some(url) => {
            let stream = format!("demo_{source_tag}");
            let (jetstream, proxy) = own_stream(url, &stream, processor_specs()?).await?;
            backend = format!("NATS JetStream, deduplicated in {backend}");
            outage = Outage::Proxy(Arc::new(proxy));
            Queue::Nats(jetstream)
        }
    };
    db.create_state_table().await?;

    // The business: `ledger` sets each event's object's state in the database, through
    // the ordering guard; every processor's effect goes through `Once` (a namespace each)
    // into the ledger, keyed by (event, processor).
    type Ledger = HashMap<(String, &'static str), u64>;
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let excluded: Arc<Mutex<HashMap<&'static str, u64>>> = Arc::default();
    let mut once_drains = Vec::new();
    let mut processors = Vec::new();
    for (spec, (name, _, fails)) in processor_specs()?.into_iter().zip(PROCESSORS) {
        let once = Once::from_arc(store.clone(), &format!("demo-effect-{source_tag}-{name}"));
        once_drains.push(once.drain());
        let (ledger, excluded, db, tag) = (
            ledger.clone(),
            excluded.clone(),
            db.clone(),
            source_tag.clone(),
        );
        let filter = spec.clone();
        let processor = move |event: Event, attempt: Attempt| {
            let (ledger, once, db) = (ledger.clone(), once.clone(), db.clone());
            if !filter.matches_type(event.event_type()) {
                *excluded.lock().unwrap().entry(name).or_default() += 1;
            }
            let object = format!("demo-{tag}/{}", event.object_id().unwrap_or_default());
            async move {
                let id = event.id().unwrap_or_default().to_owned();
                // Transient trouble on one attempt in `fails` (deterministic per event,
                // processor and attempt).
                let roll = hash(&id) ^ hash(name) ^ u64::from(attempt.number());
                if fails > 0 && fastrand::Rng::with_seed(roll).u32(0..fails) == 0 {
                    return Err(format!("{name}: the provider's API timed out"));
                }
                tokio::time::sleep(Duration::from_micros(200)).await; // the work itself
                if name == "ledger" {
                    let body: serde_json::Value = event.json().map_err(|e| e.to_string())?;
                    let created = body["created"].as_u64().ok_or("no created")?;
                    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(created);
                    db.apply(event.source(), &object, at, &id)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                let effect = once.run(&id, {
                    let id = id.clone();
                    move |_| async move {
                        *ledger.lock().unwrap().entry((id, name)).or_default() += 1;
                        Ok::<_, String>(())
                    }
                });
                match effect.await {
                    // Another attempt holds the key (a killed worker's, or one whose
                    // claim's answer the outage swallowed): retry once it has let go.
                    Ok(Ran::InProgress { .. }) => Err("the effect is in progress elsewhere".into()),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        processors.push((spec, Arc::new(processor)));
    }
    // Store errors under the storm (SQLite's one writer) count as attempts too: leave room
    // beyond the injected failures.
    let retry = RetryPolicy::default()
        .with_max_attempts(20)?
        .with_backoff(Duration::from_millis(50), Duration::from_millis(500))?;
    // A worker per processor.
    let start_workers = |queue: &Queue| -> Vec<WorkerHandle> {
        let lease = Duration::from_secs(2);
        let (concurrency, poll) = (8, Duration::from_millis(100));
        let mut workers = Vec::new();
        for (spec, p) in &processors {
            let p = p.clone();
            let processor = move |e: Event, a: Attempt| p(e, a);
            let name = spec.name();
            let worker = match queue {
                Queue::Sql(inbox) => Worker::processor(inbox, name, processor)
                    .expect("a configured processor")
                    .with_retry(retry)
                    .with_concurrency(concurrency)
                    .and_then(|w| w.with_lease(lease))
                    .and_then(|w| w.with_poll_interval(poll))
                    .expect("a valid worker")
                    .spawn(),
                Queue::Nats(jetstream) => {
                    let claims = support::processors::SharedStore(store.clone());
                    JetStreamWorker::processor(jetstream, name, claims, processor)
                        .expect("a configured processor")
                        .with_retry(retry)
                        .with_concurrency(concurrency)
                        .and_then(|w| w.with_lease(lease))
                        .and_then(|w| w.with_poll_interval(poll))
                        .expect("a valid worker")
                        .spawn()
                }
            };
            workers.push(worker);
        }
        workers
    };

    // The receiver.
    let verifier = Verifier::new(Scheme::standard(), [SECRET])?;
    let verify = VerifyWebhookLayer::new(verifier);
    let dedupe = DedupeLayer::from_arc(store.clone());
    let drain = dedupe.drain(); // the accepts still running when the server stops
    let route = match &queue {
        Queue::Sql(inbox) => post_service(inbox.accept_service()).layer(verify),
        // JetStream drops duplicates within its window; the store catches the rest.
        Queue::Nats(jetstream) => post_service(jetstream.accept_service())
            .layer(tower::ServiceBuilder::new().layer(verify).layer(dedupe)),
    };
    let app = Router::new().route("/webhooks", route);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks", listener.local_addr()?);
    let server = support::serve(listener, app);

    let (deliveries, newest) = worst_day(o.events, &source_tag, &mut rng);
    let deliveries: Arc<[Delivery]> = deliveries.into();
    let total = deliveries.len();
    if !o.json {
        eprintln!(
            "a provider's worst day: {} events, {total} deliveries, on {backend}",
            o.events
        );
    }

    let started = Instant::now();
    let mut workers = start_workers(&queue);
    let next = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Deliveries past the first quarter wait until the outage is in place, so it always
    // meets traffic (SQLite's lock is taken between two of the writer's batches).
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(o.outage.is_zero());
    let mut cut_tx = Some(cut_tx);
    let senders: Vec<_> = (0..32)
        .map(|_| {
            let (client, url, next, deliveries, mut cut) = (
                client.clone(),
                url.clone(),
                next.clone(),
                deliveries.clone(),
                cut_rx.clone(),
            );
            let (rejected, acknowledged, unavailable) =
                (rejected.clone(), acknowledged.clone(), unavailable.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(d) = deliveries.get(i) else { return };
                    if i >= deliveries.len() / 4 {
                        let _ = cut.wait_for(|cut| *cut).await;
                    }
                    // A provider retries what was not acknowledged.
                    // Providers retry for days; here, for up to ~10 s per delivery.
                    for _ in 0..200 {
                        let mut request =
                            Request::post(&url).body(Full::new(d.body.clone())).unwrap();
                        *request.headers_mut() = d.headers.clone();
                        let status = client.request(request).await.map(|r| r.status());
                        match status {
                            Ok(s) if s.is_success() => {
                                assert!(
                                    d.kind == Kind::Genuine,
                                    "a forged or stale delivery was accepted"
                                );
                                acknowledged.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Ok(StatusCode::BAD_REQUEST) => {
                                assert!(d.kind != Kind::Genuine, "a genuine delivery was refused");
                                rejected.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Ok(StatusCode::SERVICE_UNAVAILABLE) | Err(_) => {
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            _ => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                }
            })
        })
        .collect();

    // A quarter of the way through, the store is cut off for a while. Halfway through,
    // the workers die mid-event; new ones take over. Then the queue drains (retries, and
    // the killed workers' routes after their lease).
    let mut killed = false;
    let mut cut_off: Option<tokio::task::JoinHandle<Result<(), sqlx::Error>>> = None;
    let counts = loop {
        let sent = next.load(Ordering::Relaxed).min(total);
        if cut_off.is_none() && !o.outage.is_zero() && sent >= total / 4 {
            let (outage, length, cut) = (outage.clone(), o.outage, cut_tx.take());
            cut_off = Some(tokio::spawn(async move {
                let cut = cut.expect("one outage");
                let ran = outage.run(length, &cut).await;
                let _ = cut.send(true); // let the senders go, even if it failed
                ran
            }));
        }
        if !killed && sent >= total / 2 {
            for worker in workers.drain(..) {
                worker.abort();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            workers = start_workers(&queue);
            killed = true;
        }
        // Asked before the counts: once no sender runs, drained counts are final.
        let sending = senders.iter().any(|s| !s.is_finished());
        let Ok(counts) = queue.counts_by_processor().await else {
            // The store is cut off: ask again later.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if !o.json {
            progress(sent, total, counts["ledger"].processed, o.events, killed);
        }
        let drained = counts.values().all(|c| c.queued + c.processing == 0);
        if (!sending && drained) || started.elapsed() > Duration::from_secs(300) {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for s in senders {
        s.await?;
    }
    if let Some(cut_off) = cut_off {
        cut_off.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Shut down as a deploy does: stop accepting, let running work finish (at most 30 s).
    server.shut_down().await?;
    for worker in workers {
        worker.shutdown().await;
    }
    let _ = drain.wait(Duration::from_secs(30)).await;
    for once_drain in once_drains {
        let _ = once_drain.wait(Duration::from_secs(30)).await;
    }
    if !o.json {
        eprintln!();
    }

    let state = db.state(&format!("demo-{source_tag}/")).await?;
    if counts.values().any(|c| c.dead > 0) {
        for (id, processor, attempts, error) in db.dead().await? {
            eprintln!("dead: {id} ({processor}) after {attempts} attempts: {error}");
        }
    }
    let _ = std::fs::remove_file(&sqlite_path);
    if let Queue::Nats(jetstream) = queue {
        jetstream.delete().await?;
    }
    if let Db::Pg(pool) = &db {
        let drop = format!("DROP SCHEMA {schema} CASCADE");
        sqlx::query(sqlx::AssertSqlSafe(drop)).execute(pool).await?;
    }
    let ledger = ledger.lock().unwrap();
    let excluded = excluded.lock().unwrap();
    let mut rows = BTreeMap::new();
    for (spec, (name, _, _)) in processor_specs()?.into_iter().zip(PROCESSORS) {
        let takes: Vec<String> = (0..o.events)
            .filter(|&i| spec.matches_type(Some(event_type(i))))
            .map(|i| format!("evt_{source_tag}_{i}"))
            .collect();
        let c = counts.get(name).copied().unwrap_or_default();
        let row = ProcessorRow {
            expected: takes.len() as u64,
            processed: c.processed,
            dead: c.dead,
            double_effects: ledger
                .iter()
                .filter(|((_, p), _)| *p == name)
                .map(|(_, n)| n.saturating_sub(1))
                .sum(),
            lost: takes
                .into_iter()
                .filter(|id| !ledger.contains_key(&(id.clone(), name)))
                .count() as u64,
            excluded_runs: excluded.get(name).copied().unwrap_or_default(),
        };
        rows.insert(name, row);
    }
    // `ledger` takes every type: its routes are the events (the sum would count each
    // event once per processor).
    let events = counts["ledger"];
    let accepted = events.queued + events.processing + events.processed + events.dead;
    let table = Table {
        sent: total,
        accepted,
        duplicates: (acknowledged.load(Ordering::Relaxed) as u64).saturating_sub(accepted),
        rejected: rejected.load(Ordering::Relaxed),
        processed: events.processed,
        dead: rows.values().map(|r| r.dead).sum(),
        double_effects: rows.values().map(|r| r.double_effects).sum(),
        lost: rows.values().map(|r| r.lost).sum(),
        moved_back: newest
            .iter()
            .filter(|(object, (_, id))| state.get(*object) != Some(id))
            .count() as u64,
        outage_seconds: o.outage.as_secs_f64(),
        unavailable: unavailable.load(Ordering::Relaxed),
        seconds,
        deliveries_per_second: total as f64 / seconds,
        processors: rows,
    };
    if o.json {
        println!("{}", serde_json::to_string(&table)?);
    } else {
        println!();
        println!("| sent | accepted | duplicates answered | rejected | store outage | turned away (retried) | processed | dead | double effects | lost | state moved back | deliveries/s |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {} | {} | {} | {} | {:.0} s | {} | {} | {} | {} | {} | {} | {:.0} |",
            table.sent,
            table.accepted,
            table.duplicates,
            table.rejected,
            table.outage_seconds,
            table.unavailable,
            table.processed,
            table.dead,
            table.double_effects,
            table.lost,
            table.moved_back,
            table.deliveries_per_second
        );
        println!();
        println!("| processor | takes | routes expected | processed | dead | double effects | lost | runs for an excluded type |");
        println!("|---|---|---|---|---|---|---|---|");
        for (name, types, _) in PROCESSORS {
            let row = &table.processors[name];
            let takes = match types.is_empty() {
                true => "every type".to_owned(),
                false => types.join(", "),
            };
            println!(
                "| {name} | {takes} | {} | {} | {} | {} | {} | {} |",
                row.expected,
                row.processed,
                row.dead,
                row.double_effects,
                row.lost,
                row.excluded_runs
            );
        }
    }
    if table.double_effects != 0 || table.lost != 0 {
        return Err("exactly-once was broken".into());
    }
    if table.processors.values().any(|r| r.excluded_runs != 0) {
        return Err("a processor ran an event its filter excludes".into());
    }
    if table.moved_back != 0 {
        return Err("a late event moved an object's state back".into());
    }
    Ok(())
}

/// A pool whose tables live in a schema of this run's own, created here: runs against one
/// database never see each other's rows (the schema is dropped at the end). With an
/// outage to play, it connects through a proxy that can cut the database off (a hop that
/// costs throughput on two cores, so only then).
async fn own_schema(
    url: &str,
    schema: &str,
    outage: Duration,
) -> Result<(sqlx::PgPool, Option<support::proxy::Proxy>), Box<dyn std::error::Error>> {
    use std::str::FromStr;
    let admin = sqlx::PgPool::connect(url).await?;
    let create = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&admin)
        .await?;
    admin.close().await;
    let mut options = sqlx::postgres::PgConnectOptions::from_str(url)?;
    let mut proxy = None;
    if !outage.is_zero() {
        let upstream = format!("{}:{}", options.get_host(), options.get_port());
        let started = support::proxy::Proxy::start(upstream).await?;
        options = options.host("127.0.0.1").port(started.addr().port());
        proxy = Some(started);
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options.options([("search_path", schema)]))
        .await?;
    Ok((pool, proxy))
}

/// Where accepted events wait for the worker.
enum Queue {
    /// The inbox, in the store's database.
    Sql(Inbox),
    /// A JetStream stream of this run's own.
    Nats(JetStream),
}

impl Queue {
    async fn counts_by_processor(&self) -> Result<BTreeMap<String, Counts>, StoreError> {
        match self {
            Queue::Sql(inbox) => inbox.counts_by_processor().await,
            Queue::Nats(jetstream) => jetstream.counts_by_processor().await,
        }
    }
}

/// A stream of this run's own on the NATS at `url`, reached through a proxy that can cut
/// NATS off.
async fn own_stream(
    url: &str,
    name: &str,
    processors: Vec<ProcessorSpec>,
) -> Result<(JetStream, support::proxy::Proxy), Box<dyn std::error::Error>> {
    let upstream = url.trim_start_matches("nats://").to_owned();
    let proxy = support::proxy::Proxy::start(upstream).await?;
    let client = async_nats::connect(format!("nats://{}", proxy.addr())).await?;
    let jetstream = JetStream::builder(client, name)
        .with_publish_timeout(Duration::from_secs(1))
        .with_processors(processors)?
        .build()
        .await?;
    Ok((jetstream, proxy))
}

/// How the run cuts its store off.
#[derive(Clone)]
enum Outage {
    /// None asked for (`--outage-secs 0`).
    None,
    /// Every connection to PostgreSQL reset, new ones too.
    Proxy(Arc<support::proxy::Proxy>),
    /// Another connection holds SQLite's write lock past twice the store's busy timeout
    /// (5 s), as a backup or a long migration would: writes fail meanwhile.
    WriteLock(std::path::PathBuf),
}

impl Outage {
    /// Cuts the store off for `length`, telling `cut` once it is.
    async fn run(
        self,
        length: Duration,
        cut: &tokio::sync::watch::Sender<bool>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Outage::None => {}
            Outage::Proxy(proxy) => {
                proxy.cut();
                let _ = cut.send(true);
                tokio::time::sleep(length).await;
                proxy.restore();
            }
            Outage::WriteLock(path) => {
                use sqlx::Connection;
                // No busy timeout of its own: the receiver's one writer commits batch
                // after batch, and SQLite's backing-off busy handler would keep missing
                // the gaps between them. Ask again at once until the lock is ours.
                let mut lock = sqlx::SqliteConnection::connect_with(
                    &sqlx::sqlite::SqliteConnectOptions::new()
                        .filename(path)
                        .busy_timeout(Duration::ZERO),
                )
                .await?;
                while sqlx::query("BEGIN EXCLUSIVE")
                    .execute(&mut lock)
                    .await
                    .is_err()
                {
                    tokio::task::yield_now().await;
                }
                let _ = cut.send(true);
                // The store's one writer waits up to the busy timeout (5 s) for the lock,
                // then fails its batch (503); the batch queued behind it waits in turn. Two
                // busy timeouts and `length`: deliveries are turned away for `length`.
                tokio::time::sleep(Duration::from_secs(10) + length).await;
                sqlx::query("ROLLBACK").execute(&mut lock).await?;
            }
        }
        Ok(())
    }
}

/// Where the objects' state lives: the store's own database.
#[derive(Clone)]
enum Db {
    Sqlite(sqlx::SqlitePool),
    Pg(sqlx::PgPool),
}

impl Db {
    async fn create_state_table(&self) -> Result<(), sqlx::Error> {
        const SQL: &str = "CREATE TABLE IF NOT EXISTS demo_state (object TEXT PRIMARY KEY, event_id TEXT NOT NULL)";
        match self {
            Db::Sqlite(pool) => sqlx::query(SQL).execute(pool).await.map(|_| ()),
            Db::Pg(pool) => sqlx::query(SQL).execute(pool).await.map(|_| ()),
        }
    }

    /// Sets `object`'s state to `event`'s, unless a newer event of it (from `source`) was
    /// applied.
    async fn apply(
        &self,
        source: &str,
        object: &str,
        at: SystemTime,
        event: &str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        /// The same steps on either pool: guard, write if newest, commit.
        macro_rules! apply_in {
            ($pool:expr) => {{
                // BEGIN on a task of its own: the worker killed mid-BEGIN would otherwise
                // leave a pooled connection inside a transaction (sqlx#4393).
                let pool = $pool.clone();
                let mut tx = tokio::spawn(async move { pool.begin().await }).await??;
                if latest::advance(&mut *tx, source, object, at).await? == Order::Newest {
                    sqlx::query(UPSERT)
                        .bind(object)
                        .bind(event)
                        .execute(&mut *tx)
                        .await?;
                }
                Ok(tx.commit().await?)
            }};
        }
        const UPSERT: &str = "INSERT INTO demo_state VALUES ($1, $2)
            ON CONFLICT (object) DO UPDATE SET event_id = excluded.event_id";
        match self {
            Db::Sqlite(pool) => apply_in!(pool),
            Db::Pg(pool) => apply_in!(pool),
        }
    }

    /// The dead routes: event id, processor, attempts and last error.
    async fn dead(&self) -> Result<Vec<(String, String, i64, String)>, sqlx::Error> {
        const SQL: &str = "SELECT event_id, processor, CAST(attempts AS BIGINT),
            coalesce(processing_error, '')
            FROM webhook_routes WHERE dead_at IS NOT NULL ORDER BY event_id, processor";
        match self {
            Db::Sqlite(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
            Db::Pg(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
        }
    }

    /// Every object's state under `prefix`, by the object's own id.
    async fn state(&self, prefix: &str) -> Result<HashMap<String, String>, sqlx::Error> {
        let rows: Vec<(String, String)> = match self {
            Db::Sqlite(pool) => {
                sqlx::query_as("SELECT object, event_id FROM demo_state")
                    .fetch_all(pool)
                    .await?
            }
            Db::Pg(pool) => {
                sqlx::query_as("SELECT object, event_id FROM demo_state")
                    .fetch_all(pool)
                    .await?
            }
        };
        Ok(rows
            .into_iter()
            .filter_map(|(object, id)| Some((object.strip_prefix(prefix)?.to_owned(), id)))
            .collect())
    }
}

/// One line, redrawn: a bar of the day's work (deliveries sent, then events processed).
fn progress(sent: usize, total: usize, processed: u64, events: usize, killed: bool) {
    const WIDTH: usize = 30;
    let done = (sent as f64 / total as f64 + processed as f64 / events as f64) / 2.0;
    let filled = ((done * WIDTH as f64) as usize).min(WIDTH);
    eprint!(
        "\r  [{}{}] {:>3.0}%  sent {sent:>6}/{total}  processed {processed:>6}/{events}{}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        done * 100.0,
        if killed {
            "  (workers killed, restarted)"
        } else {
            ""
        }
    );
    let _ = std::io::stderr().flush();
}

fn hash(s: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(s)
}

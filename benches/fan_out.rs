//! `Inbox::accept` with one processor and with three (issue 33's bar: three ≥ 0.9 × one),
//! on SQLite and PostgreSQL, in one run. Each iteration accepts 32 new events at once (as
//! 32 connections would: the stores batch them), each case on a fresh store.
//!
//! Needs PostgreSQL (`.ci/services`); `DATABASE_URL` defaults to the local server.
//! `cargo bench --all-features --bench fan_out`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::future::join_all;
use tower_webhook::inbox::{Inbox, ProcessorSpec};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Accepts at once, per iteration.
const AT_ONCE: usize = 32;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// `n` verified events with fresh ids and a 1 KiB body.
fn events(verifier: &Verifier, n: usize) -> Vec<Event> {
    let pad = "x".repeat(900);
    (0..n)
        .map(|_| {
            let id = format!("evt_{}", NEXT.fetch_add(1, Ordering::Relaxed));
            let body = format!(
                r#"{{"type":"invoice.paid","data":{{"object":{{"id":"in_{id}","pad":"{pad}"}}}}}}"#
            );
            let headers = Scheme::standard()
                .sign([SECRET], &id, SystemTime::now(), body.as_bytes())
                .unwrap();
            verifier.verify(&headers, Bytes::from(body)).unwrap()
        })
        .collect()
}

fn specs(n: usize) -> Vec<ProcessorSpec> {
    ["a", "b", "c"][..n]
        .iter()
        .map(|name| ProcessorSpec::new(*name).unwrap())
        .collect()
}

/// A fresh PostgreSQL database: its name (to drop at the end) and URL.
async fn fresh_pg(base: &str) -> (String, String) {
    let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
        .await
        .unwrap();
    let name = format!("tw_bench_fan_out_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let name = format!("{name}_{}", std::process::id());
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .unwrap();
    }
    admin.close().await;
    let url = format!("{base}/{name}");
    (name, url)
}

/// Drops the databases `fresh_pg` made (`WITH (FORCE)`: the benchmarked stores' pools may
/// still hold connections), so that no `tw_bench_fan_out_*` database outlives the run.
async fn drop_pg(base: &str, names: &[String]) {
    let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
        .await
        .unwrap();
    for name in names {
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .unwrap();
    }
    admin.close().await;
}

fn fan_out(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let verifier = Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .with_source("bench");
    let dir = std::env::temp_dir().join(format!("tw-bench-fan-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut databases = Vec::new();
    let mut group = c.benchmark_group("inbox-accept");
    group.throughput(Throughput::Elements(AT_ONCE as u64));
    for dialect in ["sqlite", "postgres"] {
        for processors in [1, 3] {
            let inbox = rt.block_on(async {
                let inbox = match dialect {
                    "sqlite" => {
                        let path = dir.join(format!("{processors}.db"));
                        Inbox::sqlite(&SqliteStore::open(path).await.unwrap())
                    }
                    _ => {
                        let (name, url) = fresh_pg(&base).await;
                        databases.push(name);
                        Inbox::postgres(&PgStore::connect(&url).await.unwrap())
                    }
                };
                inbox.with_processors(specs(processors)).unwrap()
            });
            let name = format!("{dialect}/{processors}-processor");
            group.bench_function(name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let inbox = inbox.clone();
                    let events: Vec<Vec<Event>> =
                        (0..iters).map(|_| events(&verifier, AT_ONCE)).collect();
                    async move {
                        let start = Instant::now();
                        for batch in events {
                            for accepted in join_all(batch.iter().map(|e| inbox.accept(e))).await {
                                accepted.unwrap();
                            }
                        }
                        start.elapsed()
                    }
                })
            });
        }
    }
    group.finish();
    rt.block_on(drop_pg(&base, &databases));
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .sample_size(20);
    targets = fan_out
}
criterion_main!(benches);

//! Claim + complete of one new event id, per store, beside a bare sqlx
//! `INSERT … ON CONFLICT DO NOTHING` on the same PostgreSQL (the floor for a SQL dedupe).
//!
//! Needs PostgreSQL and Redis (`.ci/services` starts them); `DATABASE_URL` and `REDIS_URL`
//! default to the local servers. `cargo bench --bench stores`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower_webhook::store::{
    Claim, DedupeStore, Delivery, MemoryStore, PgStore, RedisStore, SqliteStore, Token,
};

static NEXT: AtomicU64 = AtomicU64::new(0);

fn next_id() -> String {
    format!(
        "evt_bench_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn claim_and_complete(store: &dyn DedupeStore) {
    let delivery = Delivery::new("bench", next_id());
    let Ok(Claim::New(token)) = store
        .claim(delivery.clone(), Token::new(), Duration::from_secs(60))
        .await
    else {
        panic!("a fresh id is new")
    };
    store.complete(delivery, token).await.unwrap();
}

fn stores(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let sqlite_path =
        std::env::temp_dir().join(format!("tower-webhook-bench-{}.db", std::process::id()));

    let (memory, sqlite, pg, redis, pool) = rt.block_on(async {
        let pg = PgStore::connect(&database_url).await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS bench_baseline (source TEXT, event_id TEXT, PRIMARY KEY (source, event_id))")
            .execute(pg.pool())
            .await
            .unwrap();
        let pool = pg.pool().clone();
        (
            // Room for every id the bench makes: a full store refuses claims by design.
            MemoryStore::with_capacity(usize::MAX),
            SqliteStore::open(&sqlite_path).await.unwrap(),
            pg,
            RedisStore::connect(&redis_url).await.unwrap().with_prefix("tower-webhook-bench:"),
            pool,
        )
    });

    let mut group = c.benchmark_group("store");
    group.bench_function("postgres/bare-insert-on-conflict", |b| {
        b.to_async(&rt).iter(|| async {
            sqlx::query("INSERT INTO bench_baseline (source, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind("bench")
                .bind(next_id())
                .execute(&pool)
                .await
                .unwrap();
        })
    });
    group.bench_function("postgres/claim+complete", |b| {
        b.to_async(&rt).iter(|| claim_and_complete(&pg))
    });
    group.bench_function("memory/claim+complete", |b| {
        b.to_async(&rt).iter(|| claim_and_complete(&memory))
    });
    group.bench_function("sqlite/claim+complete", |b| {
        b.to_async(&rt).iter(|| claim_and_complete(&sqlite))
    });
    group.bench_function("redis/claim+complete", |b| {
        b.to_async(&rt).iter(|| claim_and_complete(&redis))
    });
    group.finish();

    rt.block_on(async {
        sqlx::query("DELETE FROM webhook_events WHERE source = 'bench'")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DROP TABLE bench_baseline")
            .execute(&pool)
            .await
            .unwrap();
    });
    let _ = std::fs::remove_file(sqlite_path);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(20);
    targets = stores
}
criterion_main!(benches);

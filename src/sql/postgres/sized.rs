//! The tables' sizes, read at most about once a second, and what follows from them: a
//! table whose page count passed a power of two is analyzed, and the worker's claim is a
//! statement of its own per doubling of its tables.
//!
//! A connection keeps the generic plan it made at a prepared statement's sixth run. One
//! made while a table was small (a new database: its statistics say empty until
//! autovacuum's first ANALYZE, a minute or more into a storm) reads the table by a
//! sequential scan, kept as the table grows:
//! - the worker's claim, made on an empty inbox, joined the claimed rows back to the routes
//!   and looked up each one's event by sequential scans: 75–400 ms a claim in a storm
//!   (`auto_explain`), the worker at a few hundred events a second (issue 38);
//! - a `DedupeLayer` completion made on a table of 5 rows read all of a table of 200 000:
//!   44 ms instead of 0.05 (`EXPLAIN ANALYZE EXECUTE`).
//!
//! `ANALYZE` of a table makes every connection's plans on it over, with its statistics
//! now. A table is analyzed each time its page count's bit length grows (a read in this
//! process saw it smaller): at most once a doubling, where autovacuum analyzes a large
//! table at each tenth grown. The claim's text also names the sizes: planned for every
//! claim instead, the worker paid the planning on every claim (a third of its drain at 8
//! processors, BENCHMARKS.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// How often the sizes are read again, at most.
const EVERY: Duration = Duration::from_secs(1);

/// The tables read, in the order of [`SIZES`]'s columns, and their `ANALYZE`; then the
/// pauses', which every claim reads and which never grows much.
const TABLES: [&str; 5] = [
    "ANALYZE webhook_routes",
    "ANALYZE webhook_events",
    "ANALYZE webhook_bodies",
    "ANALYZE webhook_attempts",
    "ANALYZE webhook_pauses",
];

/// The tables' sizes in pages, by their files' length (no scan), and which of them were
/// never analyzed (bit `i` for [`TABLES`]' `i`th).
const SIZES: &str = "
SELECT pg_relation_size('webhook_routes') / current_setting('block_size')::int8,
    pg_relation_size('webhook_events') / current_setting('block_size')::int8,
    pg_relation_size('webhook_bodies') / current_setting('block_size')::int8,
    pg_relation_size('webhook_attempts') / current_setting('block_size')::int8,
    (SELECT coalesce(sum(1 << (t.i - 1)::int), 0)::int8 FROM unnest(ARRAY['webhook_routes',
        'webhook_events', 'webhook_bodies', 'webhook_attempts', 'webhook_pauses'])
        WITH ORDINALITY AS t(name, i)
     JOIN pg_class c ON c.oid = to_regclass(t.name) WHERE c.reltuples < 0)";

/// The sizes' doublings last read, and when: shared by the clones of one store.
#[derive(Debug, Clone)]
pub(super) struct Sized {
    /// Each table's size in pages as its bit length, 16 bits each, [`TABLES`]' first in
    /// the highest.
    doublings: Arc<AtomicU64>,
    /// Milliseconds after `since` of the last read, plus one (0: never).
    read_at: Arc<AtomicU64>,
    since: Instant,
}

impl Sized {
    pub(super) fn new() -> Self {
        Self {
            doublings: Arc::new(AtomicU64::new(0)),
            read_at: Arc::new(AtomicU64::new(0)),
            since: Instant::now(),
        }
    }

    /// Reads the sizes on a task of its own when the last read is older than a second: for
    /// the writes, which do not wait for it.
    pub(super) fn observe(&self, pool: &PgPool) {
        if let Some(first) = self.due() {
            let (this, pool) = (self.clone(), pool.clone());
            tokio::spawn(async move { this.read(&pool, first).await });
        }
    }

    /// `sql` with the sizes' doublings of routes, events and bodies appended as a comment,
    /// read again first when the last read is older than a second (one that fails keeps
    /// the last: a missing table fails the claim itself).
    pub(super) async fn text(&self, pool: &PgPool, sql: &str) -> String {
        if let Some(first) = self.due() {
            self.read(pool, first).await;
        }
        let all = self.doublings.load(Ordering::Relaxed);
        let field = |i: usize| field(all, i);
        format!("{sql}\n-- sized {} {} {}", field(0), field(1), field(2))
    }

    /// Whether this caller reads the sizes now (`Some(first read)`): only the one that
    /// moves the time does, the others use the last sizes.
    fn due(&self) -> Option<bool> {
        let now = u64::try_from(self.since.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.read_at.load(Ordering::Relaxed);
        let every = u64::try_from(EVERY.as_millis()).unwrap_or(u64::MAX);
        let stale = last == 0 || now.saturating_sub(last) >= every;
        let ours = stale
            && self
                .read_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        ours.then_some(last == 0)
    }

    /// Reads the sizes, and analyzes each table that doubled since the last read; at the
    /// first, each one never analyzed instead (the others' statistics are as old as the
    /// plans made on them). A table never analyzed is planned as ten pages of rows: the
    /// empty pauses' table so planned made every claim on analyzed routes sort all the due
    /// routes (seen at 100 ms a claim at 60 000 queued, `auto_explain`).
    async fn read(&self, pool: &PgPool, first: bool) {
        let sizes = sqlx::query_as::<_, (i64, i64, i64, i64, i64)>(SIZES)
            .fetch_one(pool)
            .await;
        let (routes, events, bodies, attempts, never) = match sizes {
            Ok(sizes) => sizes,
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::debug!(target: "tower_webhook", "the tables' sizes were not read: {_error}");
                return;
            }
        };
        let now = [routes, events, bodies, attempts]
            .iter()
            .enumerate()
            .fold(0, |all, (i, pages)| all | bits(*pages) << (48 - 16 * i));
        let before = self.doublings.swap(now, Ordering::Relaxed);
        for (i, analyze) in TABLES.into_iter().enumerate() {
            let due = match first {
                true => never & (1 << i) != 0,
                false => i < 4 && field(now, i) > field(before, i),
            };
            if due {
                // Not awaited: a large table's sample takes a while, and no plan waits.
                let pool = pool.clone();
                tokio::spawn(async move {
                    let _analyzed = sqlx::query(analyze).persistent(false).execute(&pool).await;
                    #[cfg(feature = "tracing")]
                    if let Err(_error) = _analyzed {
                        tracing::warn!(target: "tower_webhook", "{analyze} failed: {_error}");
                    }
                });
            }
        }
    }
}

/// Table `i`'s bit length in `all`.
fn field(all: u64, i: usize) -> u64 {
    (all >> (48 - 16 * i)) & 0xffff
}

/// A page count's bit length: the same for every count up to the next power of two.
fn bits(pages: i64) -> u64 {
    u64::from(64 - u64::try_from(pages).unwrap_or(0).leading_zeros())
}

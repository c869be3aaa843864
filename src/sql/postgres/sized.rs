//! The worker's claim as a prepared statement whose plan was made at about the tables'
//! size now: its text names the size (each doubling of `webhook_routes` or
//! `webhook_events`, read at most once a second), so a table that doubled since gets a
//! statement, and a plan, of its own.
//!
//! A connection keeps the generic plan it made at a prepared statement's sixth run. One
//! made on an empty inbox joins the claimed rows back to the routes, and looks up each
//! one's event, by sequential scans; kept as a storm fills the tables, every claim read
//! them whole (75–400 ms a claim, `auto_explain`) until autovacuum's ANALYZE made the plan
//! over, minutes later. Planned for each claim instead, the worker paid the planning on
//! every claim: a third of its drain at 8 processors (issue 38, BENCHMARKS.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// How often the sizes are read again, at most.
const EVERY: Duration = Duration::from_secs(1);

/// The sizes' doublings last read, and when: shared by the clones of one store.
#[derive(Debug, Clone)]
pub(super) struct Sized {
    /// `routes << 32 | events`: each table's size in pages, as its bit length.
    doublings: Arc<AtomicU64>,
    /// Milliseconds after `since` of the last read (0: never).
    read_at: Arc<AtomicU64>,
    since: Instant,
}

/// Both tables' sizes in pages, by the file's length (no lock, no scan).
const SIZES: &str = "
SELECT pg_relation_size('webhook_routes') / current_setting('block_size')::int8,
    pg_relation_size('webhook_events') / current_setting('block_size')::int8";

impl Sized {
    pub(super) fn new() -> Self {
        Self {
            doublings: Arc::new(AtomicU64::new(0)),
            read_at: Arc::new(AtomicU64::new(0)),
            since: Instant::now(),
        }
    }

    /// `sql` with the sizes' doublings appended as a comment (read again first if the last
    /// read is older than a second; one that fails keeps the last).
    pub(super) async fn text(&self, pool: &PgPool, sql: &str) -> String {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.read_at.load(Ordering::Relaxed);
        if last == 0 || now.saturating_sub(last) >= EVERY.as_millis() as u64 {
            self.read_at.store(now, Ordering::Relaxed);
            if let Ok((routes, events)) =
                sqlx::query_as::<_, (i64, i64)>(SIZES).fetch_one(pool).await
            {
                let bits =
                    |pages: i64| u64::from(64 - u64::try_from(pages).unwrap_or(0).leading_zeros());
                self.doublings
                    .store(bits(routes) << 32 | bits(events), Ordering::Relaxed);
            }
        }
        let doublings = self.doublings.load(Ordering::Relaxed);
        format!(
            "{sql}\n-- sized {} {}",
            doublings >> 32,
            doublings & 0xffff_ffff
        )
    }
}

//! The worker's claim as a prepared statement whose plan was made at about the tables'
//! size now: its text names the size of `webhook_routes`, `webhook_events` and
//! `webhook_bodies` (each page count's bit length, read at most about once a second), so a
//! table whose page count passed a power of two since gets a statement, and a plan, of its
//! own: a plan in use is at most one doubling old.
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
    /// `routes << 42 | events << 21 | bodies`: each table's size in pages, as its bit
    /// length.
    doublings: Arc<AtomicU64>,
    /// Milliseconds after `since` of the last read, plus one (0: never).
    read_at: Arc<AtomicU64>,
    since: Instant,
}

/// The tables' sizes in pages, by their files' length (no scan).
const SIZES: &str = "
SELECT pg_relation_size('webhook_routes') / current_setting('block_size')::int8,
    pg_relation_size('webhook_events') / current_setting('block_size')::int8,
    pg_relation_size('webhook_bodies') / current_setting('block_size')::int8";

impl Sized {
    pub(super) fn new() -> Self {
        Self {
            doublings: Arc::new(AtomicU64::new(0)),
            read_at: Arc::new(AtomicU64::new(0)),
            since: Instant::now(),
        }
    }

    /// `sql` with the sizes' doublings appended as a comment, read again first by the one
    /// claim that finds the last read older than a second (one that fails keeps the last:
    /// a missing table fails the claim itself).
    pub(super) async fn text(&self, pool: &PgPool, sql: &str) -> String {
        let now = u64::try_from(self.since.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.read_at.load(Ordering::Relaxed);
        let every = u64::try_from(EVERY.as_millis()).unwrap_or(u64::MAX);
        let stale = last == 0 || now.saturating_sub(last) >= every;
        // Only the claim that moves the time reads: the others use the last sizes.
        let ours = stale
            && self
                .read_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if ours {
            let sizes = sqlx::query_as::<_, (i64, i64, i64)>(SIZES)
                .fetch_one(pool)
                .await;
            match sizes {
                Ok((routes, events, bodies)) => {
                    let all = bits(routes) << 42 | bits(events) << 21 | bits(bodies);
                    self.doublings.store(all, Ordering::Relaxed);
                }
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::debug!(target: "tower_webhook", "inbox claim: the tables' sizes were not read: {_error}");
                }
            }
        }
        let all = self.doublings.load(Ordering::Relaxed);
        let field = |shift: u32| (all >> shift) & 0x1f_ffff;
        format!("{sql}\n-- sized {} {} {}", field(42), field(21), field(0))
    }
}

/// A page count's bit length: the same for every count up to the next power of two.
fn bits(pages: i64) -> u64 {
    u64::from(64 - u64::try_from(pages).unwrap_or(0).leading_zeros())
}

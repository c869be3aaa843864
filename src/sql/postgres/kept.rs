//! The group commit's own connections, kept between its batches as each client of the
//! bare loop (pgbench) keeps its own; the inbox worker's claims run on them too.
//!
//! A connection the pool lends costs two round trips beside its statement: sqlx checks
//! it with one when it is lent and another when it is given back. Under load a batch is
//! one statement of about a millisecond, and the check when lent is on its path; a kept
//! connection needs neither, and its backend stays the same one, warm. (Measured, issue
//! 38: `DedupeLayer` on PostgreSQL 1.20× in the same rounds, 0.79–0.86× pgbench lent and
//! 0.94–1.11× kept; the inbox's accept 1.42–1.66×.)
//!
//! Kept connections are taken out of the pool (`detach`): the pool opens others in their
//! place, and closing it does not wait for them. Before a statement, the kept ones are
//! looked over: one older than the pool's `max_lifetime` (counted from when it was
//! kept) or idle past its `idle_timeout` is closed, one made on another tokio runtime (the
//! writer starts again on the next) is dropped, and one idle past [`CHECK_AFTER`], or
//! beside one that just failed for want of the server, is checked first. One whose
//! statement failed for want of the server (not for a value it was sent) is dropped. Once
//! the pool is closed, the next write drops them all; till then (or till the store is
//! dropped) their backends stay connected. The pool's `before_acquire` and
//! `after_release` hooks do not run for them.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow, PgSeverity, Postgres};
use sqlx::query::Query;
use sqlx::Connection;

use super::group_commit::unavailable;

/// At most this many connections kept (idle or in use): one for the front door's batch in
/// flight, one for a batch beside it, one for the worker's outcomes or a claim — and never
/// more than a third of the pool's `max_connections` (a pool of two keeps none), so the
/// connections a store opens stay near what its pool was sized for. A statement past them
/// borrows one from the pool, as before.
const KEPT: usize = 3;

/// A kept connection idle this long is checked before its next statement: the server may
/// have ended it meanwhile (a restart, an idle timeout). One in steady use never is.
pub(super) const CHECK_AFTER: Duration = Duration::from_secs(1);

/// Where a batch's statements run: the writer's kept connections, or a pool as it is
/// (the statements' own tests, which read the pool's prepared statements).
pub(super) trait Runs: Sync {
    /// The pool: what a batch's rarer statements (a write retried alone) borrow from.
    fn pool(&self) -> &PgPool;

    /// Runs `query`, every row.
    fn fetch_all<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> impl Future<Output = Result<Vec<PgRow>, sqlx::Error>> + Send;
}

impl Runs for PgPool {
    fn pool(&self) -> &PgPool {
        self
    }

    fn fetch_all<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> impl Future<Output = Result<Vec<PgRow>, sqlx::Error>> + Send {
        query.fetch_all(self)
    }
}

/// The writer's kept connections, over the pool they came from.
pub(super) struct Kept {
    pool: PgPool,
    idle: Mutex<Vec<Idle>>,
    /// How many are kept, idle or in use.
    count: AtomicUsize,
}

/// A kept connection and its times.
struct Idle {
    conn: PgConnection,
    /// The runtime its socket is registered with.
    runtime: tokio::runtime::Id,
    opened: Instant,
    /// Since when it is idle; `None`: to be checked before its next statement.
    since: Option<Instant>,
}

impl Kept {
    pub(super) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            idle: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept connection: an idle one still usable, else a new one out of the pool while
    /// fewer than [`KEPT`] are; `None` past that.
    async fn take(&self) -> Result<Option<Mine<'_>>, sqlx::Error> {
        let (closed, runtime) = (
            self.pool.is_closed(),
            tokio::runtime::Handle::current().id(),
        );
        let options = self.pool.options();
        let past = |i: &Idle| {
            let older =
                |max: Option<Duration>, since: Instant| max.is_some_and(|m| since.elapsed() >= m);
            older(options.get_max_lifetime(), i.opened)
                || i.since
                    .is_some_and(|since| older(options.get_idle_timeout(), since))
        };
        let gone: Vec<Idle> = self
            .idle()
            .extract_if(.., |i| closed || i.runtime != runtime || past(i))
            .collect();
        for idle in gone {
            // Closed politely where it can be: one of an ended runtime's is only dropped.
            let polite = !closed && idle.runtime == runtime;
            let conn = Mine::new(self, idle).retire();
            if polite {
                tokio::spawn(async move { drop(conn.close().await) });
            }
        }
        if closed {
            return Err(sqlx::Error::PoolClosed);
        }
        loop {
            let Some(idle) = self.idle().pop() else { break };
            let fresh = idle
                .since
                .is_some_and(|since| since.elapsed() < CHECK_AFTER);
            let mut mine = Mine::new(self, idle);
            if !fresh {
                let conn = &mut mine.idle.as_mut().expect("just put").conn;
                let check = tokio::time::timeout(options.get_acquire_timeout(), conn.ping());
                if !matches!(check.await, Ok(Ok(()))) {
                    continue; // ended by the server, or not answering: dropped (`Mine`)
                }
            }
            return Ok(Some(mine));
        }
        let most = KEPT.min(options.get_max_connections() as usize / 3);
        if self.count.fetch_add(1, Relaxed) >= most {
            self.count.fetch_sub(1, Relaxed);
            return Ok(None);
        }
        // Counted before it is opened, so concurrent takes never pass `most`; a failed
        // acquire is uncounted by `Mine`'s drop.
        let mut mine = Mine {
            kept: self,
            idle: None,
        };
        mine.idle = Some(Idle {
            conn: self.pool.acquire().await?.detach(),
            runtime,
            opened: Instant::now(),
            since: None,
        });
        Ok(Some(mine))
    }

    /// The idle ones, to be checked before their next statement: one beside them just
    /// failed for want of the server (a restart ends them all at once).
    fn suspect_all(&self) {
        for idle in self.idle().iter_mut() {
            idle.since = None;
        }
    }
}

impl Runs for Kept {
    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn fetch_all<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        let Some(mut mine) = self.take().await? else {
            let mut lent: PoolConnection<Postgres> = self.pool.acquire().await?;
            return query.fetch_all(&mut *lent).await;
        };
        let idle = mine.idle.as_mut().expect("taken");
        let rows = query.fetch_all(&mut idle.conn).await;
        match &rows {
            Err(e) if lost(e) => self.suspect_all(), // and this one dropped with `mine`
            _ => mine.give_back(),
        }
        rows
    }
}

/// Whether a failed statement leaves its connection unusable: the server out of reach,
/// or an error that ended its session (`FATAL`, `PANIC`) whatever its code.
fn lost(e: &sqlx::Error) -> bool {
    let fatal = |db: &sqlx::postgres::PgDatabaseError| {
        matches!(db.severity(), PgSeverity::Fatal | PgSeverity::Panic)
    };
    unavailable(e)
        || matches!(e, sqlx::Error::Database(db)
            if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some_and(fatal))
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("count", &self.count.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// One of the kept connections, counted, out of the idle list: back in it by `give_back`,
/// else (a failed statement, an acquire that failed, a dropped batch) closed and uncounted
/// when dropped.
struct Mine<'a> {
    kept: &'a Kept,
    idle: Option<Idle>,
}

impl<'a> Mine<'a> {
    /// An idle one, counted since it was kept.
    fn new(kept: &'a Kept, idle: Idle) -> Self {
        Self {
            kept,
            idle: Some(idle),
        }
    }

    fn give_back(mut self) {
        if self.kept.pool.is_closed() {
            return; // dropped, uncounted
        }
        if let Some(mut idle) = self.idle.take() {
            idle.since = Some(Instant::now());
            self.kept.idle().push(idle);
            std::mem::forget(self); // still counted: kept
        }
    }

    /// The connection, no longer kept.
    fn retire(mut self) -> PgConnection {
        self.idle.take().expect("a connection").conn // uncounted as `self` drops
    }
}

impl Drop for Mine<'_> {
    fn drop(&mut self) {
        self.kept.count.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;
    use crate::sql::postgres::tests::fresh_pool;

    /// The backend `kept` runs its next statement on.
    async fn backend(kept: &Kept) -> Result<i32, sqlx::Error> {
        let rows = kept
            .fetch_all(sqlx::query("SELECT pg_backend_pid()"))
            .await?;
        Ok(rows[0].get(0))
    }

    /// Ends backend `pid` from another connection, and waits until it is gone.
    async fn end_backend(admin: &PgPool, pid: i32) {
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(admin)
            .await
            .unwrap();
        assert!(ended, "backend {pid} ended");
        assert!(gone(admin, pid).await, "backend {pid} still there");
    }

    /// Whether backend `pid` is gone within two seconds.
    async fn gone(admin: &PgPool, pid: i32) -> bool {
        for _ in 0..200 {
            let alive: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                    .bind(pid)
                    .fetch_one(admin)
                    .await
                    .unwrap();
            if !alive {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn batches_run_on_the_same_kept_backends_never_more_than_kept() {
        let pool = fresh_pool().await;
        let kept = Kept::new(pool.clone());
        let first = backend(&kept).await.unwrap();
        for _ in 0..5 {
            assert_eq!(backend(&kept).await.unwrap(), first, "the same connection");
        }
        // Five at once: three kept, two lent by the pool as before; every one answered.
        let slow = || kept.fetch_all(sqlx::query("SELECT pg_backend_pid(), pg_sleep(0.2)"));
        let answers = tokio::join!(slow(), slow(), slow(), slow(), slow());
        let answers = [answers.0, answers.1, answers.2, answers.3, answers.4];
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(kept.count.load(Relaxed), KEPT);
        assert_eq!(kept.idle().len(), KEPT, "the kept ones back, idle");
        // Out of the pool: it opened others in their place, and it still lends them.
        assert!(pool.size() as usize <= pool.options().get_max_connections() as usize);
        sqlx::query("SELECT 1").execute(&pool).await.unwrap();
    }

    #[tokio::test]
    async fn a_pool_of_two_keeps_none_and_a_pool_of_six_two() {
        let options = fresh_pool().await.connect_options().as_ref().clone();
        for (size, most) in [(2, 0), (6, 2)] {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(size)
                .connect_with(options.clone())
                .await
                .unwrap();
            let kept = Kept::new(pool.clone());
            let slow = || kept.fetch_all(sqlx::query("SELECT pg_sleep(0.1)"));
            let answers = tokio::join!(slow(), slow(), slow());
            assert!(answers.0.is_ok() && answers.1.is_ok() && answers.2.is_ok());
            assert_eq!(kept.count.load(Relaxed), most, "a pool of {size}");
        }
    }

    #[tokio::test]
    async fn a_kept_connection_ended_while_idle_is_replaced_before_its_next_statement() {
        let pool = fresh_pool().await;
        let kept = Kept::new(pool.clone());
        let first = backend(&kept).await.unwrap();
        end_backend(&pool, first).await;
        tokio::time::sleep(CHECK_AFTER + Duration::from_millis(100)).await;
        let next = backend(&kept)
            .await
            .expect("checked, found ended, replaced");
        assert_ne!(next, first);
        assert_eq!(kept.count.load(Relaxed), 1, "the ended one uncounted");
    }

    #[tokio::test]
    async fn one_ended_in_steady_use_fails_its_own_statement_and_the_next_gets_another() {
        let pool = fresh_pool().await;
        let kept = Kept::new(pool.clone());
        let first = backend(&kept).await.unwrap();
        end_backend(&pool, first).await;
        // Used within `CHECK_AFTER`: not checked, so its statement fails (a 503 to the
        // writes of that batch), and the connection is not kept.
        let failed = backend(&kept).await.expect_err("its backend is gone");
        assert!(unavailable(&failed), "{failed}");
        assert_eq!(kept.count.load(Relaxed), 0);
        let next = backend(&kept).await.unwrap();
        assert_ne!(next, first);
    }

    #[tokio::test]
    async fn closing_the_pool_does_not_wait_for_kept_ones_which_close_at_the_next_write() {
        let pool = fresh_pool().await;
        let admin = PgPool::connect_with(pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        let kept = Kept::new(pool.clone());
        let pid = backend(&kept).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), pool.close())
            .await
            .expect("the pool closes without waiting for the kept connection");
        let refused = backend(&kept).await.expect_err("the pool is closed");
        assert!(matches!(refused, sqlx::Error::PoolClosed), "{refused}");
        assert_eq!(kept.count.load(Relaxed), 0);
        assert!(
            gone(&admin, pid).await,
            "the kept backend {pid} outlived the closed pool"
        );
    }

    #[tokio::test]
    async fn when_one_fails_for_want_of_the_server_the_others_are_checked_before_use() {
        let pool = fresh_pool().await;
        let kept = Kept::new(pool.clone());
        let slow = || kept.fetch_all(sqlx::query("SELECT pg_backend_pid(), pg_sleep(0.1)"));
        let (a, b) = tokio::join!(slow(), slow());
        let pids: Vec<i32> = [a, b].into_iter().map(|r| r.unwrap()[0].get(0)).collect();
        assert_ne!(pids[0], pids[1], "two kept");
        // A restart, as the writer sees it: every kept backend ended at once, all fresh.
        for pid in &pids {
            end_backend(&pool, *pid).await;
        }
        backend(&kept)
            .await
            .expect_err("the first statement meets the ended backend");
        let next = backend(&kept)
            .await
            .expect("the other one checked, dropped, replaced");
        assert!(!pids.contains(&next));
        assert_eq!(kept.count.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn a_kept_connection_idle_past_the_pools_idle_timeout_is_closed() {
        let pool = fresh_pool().await;
        let options = pool.connect_options().as_ref().clone();
        let short = sqlx::postgres::PgPoolOptions::new()
            .idle_timeout(Duration::from_millis(300))
            .connect_with(options)
            .await
            .unwrap();
        let kept = Kept::new(short);
        let first = backend(&kept).await.unwrap();
        assert_eq!(backend(&kept).await.unwrap(), first, "kept while in use");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let next = backend(&kept).await.unwrap();
        assert_ne!(next, first, "the idle one closed, another kept");
        assert!(gone(&pool, first).await, "its backend ended");
        assert_eq!(kept.count.load(Relaxed), 1);
    }

    /// The writer starts again on the next runtime when its own ends (`batch`): the kept
    /// connections of the ended one, whose sockets it drove, are not used again.
    #[test]
    fn kept_connections_of_an_ended_runtime_are_dropped_not_used() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        let (kept, pool, pid) = first.block_on(async {
            // A pool that opens no connection but the one kept: the pool's own idle ones
            // of an ended runtime are sqlx's to check.
            let options = fresh_pool().await.connect_options().as_ref().clone();
            let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy_with(options);
            let kept = Kept::new(pool.clone());
            let pid = backend(&kept).await.unwrap();
            (kept, pool, pid)
        });
        drop(first);
        runtime().block_on(async {
            let next = backend(&kept)
                .await
                .expect("a new kept connection, at once");
            assert_ne!(next, pid);
            assert_eq!(kept.count.load(Relaxed), 1);
            drop(pool);
        });
    }
}

//! [`Drain`]: at shutdown, wait (with a bound) for the work that [`DedupeLayer`],
//! [`TxDedupeLayer`] and [`Once`] run on tasks of their own, and stop and release what is
//! not done by then.
//!
//! Those run a handler (an action) on a task of its own, so a client that hangs up, or a
//! `TimeoutLayer` that fires, does not stop work that has started. Nothing else awaits
//! that task: `axum::serve(..).with_graceful_shutdown(..)` returns once its connections
//! are closed, and a process that exits then stops the handler midway — after the lease,
//! the provider's retry runs it again. Ask the layer for its drain before serving, and
//! wait on it after `serve` returns:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use axum::{routing::post, Router};
//! # use tower_webhook::{store::MemoryStore, DedupeLayer};
//! # async fn run(listener: tokio::net::TcpListener) -> std::io::Result<()> {
//! let dedupe = DedupeLayer::new(MemoryStore::new());
//! let drain = dedupe.drain(); // every clone of the layer, and its services, share it
//! let app: Router = Router::new().route("/webhooks", post(|| async { "handled" }).layer(dedupe));
//! axum::serve(listener, app)
//!     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! // The handlers whose clients hung up may still run: let them finish, for at most 30 s.
//! let drained = drain.wait(Duration::from_secs(30)).await;
//! eprintln!("{} finished, {} stopped and released", drained.finished(), drained.released());
//! # Ok(())
//! # }
//! ```
//!
//! What the bound means for the guarantee:
//!
//! - work that ends within the bound ends as it would have without a shutdown: a success
//!   is recorded as done (a redelivery gets 204, or `Ran::Already`), a failure releases
//!   its claim;
//! - work still running at the bound is **stopped** (its future dropped at the await point
//!   it has reached) and its claim **released** (one round trip, awaited for at most 1 s
//!   more), so the provider's next retry runs it again at once rather than after the
//!   lease. Like a crash, a stopped run may have done part of its effect: choose a bound
//!   longer than your slowest handler and shorter than your platform's kill timeout
//!   (Kubernetes's `terminationGracePeriodSeconds` defaults to 30 s), and give effects
//!   outside your database an [`IdempotencyKey`](crate::once::IdempotencyKey). Under
//!   [`TxDedupeLayer`] a stopped run's transaction rolls back, its writes with it;
//! - once `wait` returns the drain is over for good: later deliveries get 503 with
//!   `Retry-After` and later `Once::run` calls fail with
//!   [`OnceErrorKind::Stopped`](crate::once::OnceErrorKind::Stopped), neither running
//!   anything.
//!
//! [`DedupeLayer`]: crate::DedupeLayer
//! [`Once`]: crate::Once
#![cfg_attr(
    feature = "postgres",
    doc = "[`TxDedupeLayer`]: crate::dedupe::TxDedupeLayer"
)]
#![cfg_attr(not(feature = "postgres"), doc = "[`TxDedupeLayer`]: crate#features")]

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

/// How long the releases of the work stopped at the bound are awaited.
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// The work one layer (or one `Once`) runs on tasks of its own, to await at shutdown.
/// See the [module docs](self). Cloning shares it.
#[derive(Clone)]
#[must_use]
pub struct Drain {
    inner: Arc<Inner>,
}

struct Inner {
    tracker: TaskTracker,
    stop: CancellationToken,
    finished: AtomicUsize,
    released: AtomicUsize,
    unreleased: AtomicUsize,
}

/// What [`Drain::wait`] saw: how the work that ran during the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Drained {
    finished: usize,
    released: usize,
    unreleased: usize,
}

impl Drained {
    /// Runs that ended on their own within the bound (their outcome recorded).
    pub fn finished(&self) -> usize {
        self.finished
    }

    /// Runs stopped at the bound whose claim the store heard released: their retry runs
    /// at once.
    pub fn released(&self) -> usize {
        self.released
    }

    /// Runs stopped at the bound whose release the store did not answer in time (or
    /// that did not stop in time): their claim frees itself when its lease runs out.
    pub fn unreleased(&self) -> usize {
        self.unreleased
    }
}

/// A tracked run stopped by the drain: whether its claim was released.
#[derive(Debug)]
pub(crate) struct Stopped {
    pub(crate) released: bool,
}

impl Drain {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                tracker: TaskTracker::new(),
                stop: CancellationToken::new(),
                finished: AtomicUsize::new(0),
                released: AtomicUsize::new(0),
                unreleased: AtomicUsize::new(0),
            }),
        }
    }

    /// Waits until every run has ended, for at most `bound`; then stops the rest and
    /// releases their claims (awaited for at most 1 s more), and refuses new work from
    /// then on. See the [module docs](self) for what that means for the guarantee.
    pub async fn wait(&self, bound: Duration) -> Drained {
        let inner = &self.inner;
        let before = inner.counts();
        inner.tracker.close();
        let ended = tokio::time::timeout(bound, inner.tracker.wait()).await;
        inner.stop.cancel();
        if ended.is_err() {
            let _ = tokio::time::timeout(RELEASE_WAIT, inner.tracker.wait()).await;
        }
        let after = inner.counts();
        Drained {
            finished: after.0 - before.0,
            released: after.1 - before.1,
            // Still running: stopped, but its release is not known to have landed.
            unreleased: after.2 - before.2 + inner.tracker.len(),
        }
    }

    /// Whether `wait` has ended: new work is refused.
    pub(crate) fn is_stopped(&self) -> bool {
        self.inner.stop.is_cancelled()
    }

    /// Resolves when the work must stop (the bound has passed).
    pub(crate) fn stopping(&self) -> WaitForCancellationFutureOwned {
        self.inner.stop.clone().cancelled_owned()
    }

    /// Spawns `work` on `runtime`, tracked, counting how it ends (a panic counts as
    /// finished: its claim was released as it unwound).
    pub(crate) fn spawn_on<T, F>(
        &self,
        runtime: &tokio::runtime::Handle,
        work: F,
    ) -> JoinHandle<Result<T, Stopped>>
    where
        F: Future<Output = Result<T, Stopped>> + Send + 'static,
        T: Send + 'static,
    {
        let inner = self.inner.clone();
        self.inner.tracker.spawn_on(
            async move {
                let mut tally = Tally {
                    inner,
                    stopped: None,
                };
                let output = work.await;
                tally.stopped = output.as_ref().err().map(|s| s.released);
                output
            },
            runtime,
        )
    }
}

impl Inner {
    fn counts(&self) -> (usize, usize, usize) {
        (
            self.finished.load(Ordering::SeqCst),
            self.released.load(Ordering::SeqCst),
            self.unreleased.load(Ordering::SeqCst),
        )
    }
}

/// Counts a run as it ends, a panic included.
struct Tally {
    inner: Arc<Inner>,
    stopped: Option<bool>,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let count = match self.stopped {
            None => &self.inner.finished,
            Some(true) => &self.inner.released,
            Some(false) => &self.inner.unreleased,
        };
        count.fetch_add(1, Ordering::SeqCst);
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("running", &self.inner.tracker.len())
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

//! [`TxDedupeLayer`]: exactly once without leases, for effects in PostgreSQL — the
//! event's row is inserted in the transaction the handler writes in, committed only on a
//! 2xx. See the [module docs](super#in-the-handlers-own-transaction).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use sqlx::{PgPool, Postgres, Transaction};
use tower_layer::Layer;
use tower_service::Service;

use super::PgTx;
use crate::drain::Stopped;
use crate::response::{self, Needs, RejectFn, Rejection, RejectionKind, ResponseBody};
use crate::store::{Claim, Delivery, StoreError, Token};
use crate::{metrics, span, Drain, Event};

/// Applies [`TxDedupe`]. See the [module docs](super#in-the-handlers-own-transaction).
/// Cloning shares the pool and the [`drain`](Self::drain).
#[derive(Clone)]
#[must_use]
pub struct TxDedupeLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    pool: PgPool,
    max_wait: Option<Duration>,
    rejection: Option<Arc<RejectFn<Rejection>>>,
    drain: Drain,
}

impl Config {
    fn reject<B>(&self, rejection: Rejection) -> Response<ResponseBody<B>> {
        response::respond(rejection, self.rejection.as_ref()).map(ResponseBody::fixed)
    }
}

impl TxDedupeLayer {
    /// Uses `pool`, applying the crate's migrations (as [`PgStore`](crate::store::PgStore)
    /// does; the two share the `webhook_events` table).
    ///
    /// # Errors
    ///
    /// When the migrations fail.
    pub async fn new(pool: PgPool) -> Result<Self, StoreError> {
        let store = crate::store::PgStore::from_pool(pool).await?;
        Ok(Self::from_migrated_pool(store.pool().clone()))
    }

    /// Uses `pool` as it is, without migrating: for a database known to be migrated, or
    /// to build the layer before the server is up (requests get 503 until it is).
    pub fn from_migrated_pool(pool: PgPool) -> Self {
        Self {
            config: Arc::new(Config {
                pool,
                max_wait: None,
                rejection: None,
                drain: Drain::new(),
            }),
        }
    }

    /// Bounds how long a duplicate waits for a concurrent attempt of the same event
    /// (default: as long as that attempt's handler runs). Past it the duplicate gets 409 +
    /// `Retry-After` and frees its connection — for slow handlers, so a burst of retries
    /// does not hold the pool. It is the transaction's `lock_timeout` while the event's row
    /// is inserted (the handler's statements run under the session's own); costs two short
    /// statements per request.
    ///
    /// # Errors
    ///
    /// When `wait` is not between 1 ms and 24 days (what PostgreSQL's `lock_timeout`
    /// takes).
    pub fn with_max_wait(mut self, wait: Duration) -> Result<Self, crate::ConfigError> {
        let most = Duration::from_millis(i32::MAX as u64);
        if !(Duration::from_millis(1)..=most).contains(&wait) {
            return Err(crate::ConfigError::duration(
                "a max wait",
                wait,
                "between 1 ms and 24 days",
            ));
        }
        Arc::make_mut(&mut self.config).max_wait = Some(wait);
        Ok(self)
    }

    /// The handlers this layer runs on tasks of their own (shared by its clones and
    /// services): after the server stops, wait for them with [`Drain::wait`]. A handler
    /// stopped at its bound rolls its transaction back, the event's row with it, so the
    /// provider's retry runs it. See [`crate::drain`].
    pub fn drain(&self) -> Drain {
        self.config.drain.clone()
    }

    /// Replaces the responses the middleware gives itself (a duplicate's 204, 409, 503,
    /// the 500s); the [`Rejection`] is still added to the response's extensions. See
    /// [`crate::response`].
    pub fn with_rejection(
        mut self,
        rejection: impl Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).rejection = Some(Arc::new(rejection));
        self
    }
}

impl std::fmt::Debug for TxDedupeLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxDedupeLayer")
            .field("max_wait", &self.config.max_wait)
            .field("custom_rejection", &self.config.rejection.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for TxDedupeLayer {
    type Service = TxDedupe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TxDedupe {
            inner,
            config: self.config.clone(),
        }
    }
}

/// Middleware that runs each event's handler once, inside the event's transaction.
#[derive(Clone)]
#[must_use]
pub struct TxDedupe<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> TxDedupe<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for TxDedupe<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxDedupe")
            .field("inner", &self.inner)
            .field("max_wait", &self.config.max_wait)
            .finish_non_exhaustive()
    }
}

/// Response future of [`TxDedupe`]: boxed, as it is three database round trips around
/// the handler (begin and insert, then commit); one allocation is noise beside them. The
/// work runs on a task of its own: dropping this future does not stop it.
pub type TxFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

/// What `Retry-After` says on a 409 or 503 here: the transaction holds no lease to count
/// down, so a short fixed wait.
const RETRY_AFTER_SECS: u64 = 5;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for TxDedupe<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = TxFuture<Self::Response, S::Error>;

    /// Always ready: the inner service's readiness is taken only once the event's row is
    /// inserted, so duplicates waiting on it never hold a place in the inner service.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let config = self.config.clone();
        let Some(event) = req.extensions().get::<Event>() else {
            let response = config.reject(Rejection::missing_event(Needs::TxDedupe));
            return Box::pin(std::future::ready(Ok(response)));
        };
        // The drain is over (the server is shutting down): start nothing.
        if config.drain.is_stopped() {
            let response = config.reject(Rejection::store_unavailable(RETRY_AFTER_SECS));
            return Box::pin(std::future::ready(Ok(response)));
        }
        let (delivery, source) = (Delivery::from_event(event), event.metrics().clone());
        // A clone, polled ready once the event's row is in (see `poll_ready`).
        let inner = self.inner.clone();
        // Its own task: a dropped request (the client hung up) neither rolls back nor
        // stops a handler that has started; its outcome is committed or rolled back as
        // if the client had waited. In the delivery's span, for the handler's logs.
        // Tracked by the layer's drain; stopped past its bound, the transaction rolls back
        // as `work` is dropped.
        let work = run(inner, req, delivery, source, config.clone());
        let stop = config.drain.stopping();
        let work = async move {
            tokio::select! {
                biased;
                result = work => Ok(result),
                () = stop => Err(Stopped { released: true }),
            }
        };
        let work = span::instrument(span::current(), work);
        let task = config
            .drain
            .spawn_on(&tokio::runtime::Handle::current(), work);
        Box::pin(async move {
            match task.await {
                Ok(Ok(result)) => result,
                // Stopped by the drain: rolled back, the retry runs it.
                Ok(Err(_)) => Ok(config.reject(Rejection::store_unavailable(RETRY_AFTER_SECS))),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down: the transaction rolled back with the task.
                Err(_) => Ok(config.reject(Rejection::store_unavailable(RETRY_AFTER_SECS))),
            }
        })
    }
}

/// One event: begin, insert its row, run the handler in the transaction, commit on 2xx.
async fn run<S, ReqBody, ResBody>(
    mut inner: S,
    mut req: Request<ReqBody>,
    delivery: Delivery,
    source: metrics::Source,
    config: Arc<Config>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let tx = match claim(&config, &delivery, &source).await {
        Ok(tx) => tx,
        Err(answer) => return Ok(config.reject(answer)),
    };
    let shared = PgTx::new(tx);
    req.extensions_mut().insert(shared.clone());
    // Dropped on error or panic: the transaction rolls back with it.
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let success = |r: &Result<S::Response, S::Error>| matches!(r, Ok(r) if r.status().is_success());
    let response = metrics::handled(&source, inner.call(req), success).await?;
    let Some(tx) = shared.into_inner() else {
        // The handler kept the transaction (a task still holds it): never commit work
        // that may still be running.
        let kept = "webhook transaction still in use";
        return Ok(config.reject(Rejection::new(RejectionKind::TransactionKept, kept)));
    };
    if !response.status().is_success() {
        drop(tx); // rolls back
        return Ok(response.map(ResponseBody::inner));
    }
    match commit(tx, &source).await {
        Ok(()) => Ok(response.map(ResponseBody::inner)),
        Err(answer) => Ok(config.reject(answer)),
    }
}

/// Begins the event's transaction and inserts its row: the transaction when the event is
/// new, else the answer (a duplicate, in flight, the store unavailable).
async fn claim(
    config: &Config,
    delivery: &Delivery,
    source: &metrics::Source,
) -> Result<Transaction<'static, Postgres>, Rejection> {
    if let Err(_refused) = crate::store::check_key(delivery.source(), delivery.id()) {
        #[cfg(feature = "tracing")]
        tracing::error!(target: "tower_webhook", "webhook key refused: {_refused}");
        metrics::store_unavailable(source);
        return Err(Rejection::store_refused());
    }
    let mut tx = PgTx::begin(&config.pool)
        .await
        .map_err(|e| unavailable(e, source))?;
    // The bound covers the insert only: the session's own setting comes back after.
    let mut session_lock_timeout = None;
    if let Some(wait) = config.max_wait {
        // OFFSET 0 keeps the subquery apart: the old value is read before the set.
        let previous: String = sqlx::query_scalar(
            "SELECT previous FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) p,
             LATERAL set_config('lock_timeout', $1, true)",
        )
        .bind(format!("{}ms", wait.as_millis()))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| unavailable(e, source))?;
        session_lock_timeout = Some(previous);
    }
    // A concurrent attempt's uncommitted row makes this wait, then conflict (it
    // committed) or insert (it rolled back). A row left unfinished by `PgStore`
    // (released, or its lease ran out) is taken over, so the two forms can share the
    // table (during a switch from one to the other, say).
    match crate::sql::postgres::done_in(&mut tx, delivery, Token::new()).await {
        Ok(Claim::New(_)) => {}
        Ok(Claim::Done) => {
            metrics::duplicate(source);
            return Err(Rejection::duplicate());
        }
        // Waited `max_wait` for a concurrent attempt of this event: still running.
        Err(e) if lock_not_available(&e) => {
            metrics::in_flight(source);
            return Err(Rejection::in_flight(RETRY_AFTER_SECS));
        }
        Err(e) => return Err(unavailable(e, source)),
        Ok(_) => {
            metrics::in_flight(source);
            return Err(Rejection::in_flight(RETRY_AFTER_SECS));
        }
    }
    if let Some(previous) = session_lock_timeout {
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(previous)
            .execute(&mut *tx)
            .await
            .map_err(|e| unavailable(e, source))?;
    }
    Ok(tx)
}

/// Commits the handler's 2xx work with the event's row.
async fn commit(
    mut tx: Transaction<'static, Postgres>,
    source: &metrics::Source,
) -> Result<(), Rejection> {
    // A statement of the handler's failed and it answered 2xx anyway: PostgreSQL would
    // turn the COMMIT into a silent ROLLBACK. Ask first, and never send a 2xx for work
    // that was not recorded.
    if let Err(_error) = sqlx::query("SELECT 1").execute(&mut *tx).await {
        #[cfg(feature = "tracing")]
        tracing::error!(target: "tower_webhook", "the handler answered 2xx in a failed transaction: {_error}");
        let failed = "webhook transaction failed";
        return Err(Rejection::new(RejectionKind::TransactionFailed, failed));
    }
    tx.commit().await.map_err(|e| unavailable(e, source))
}

/// The store's 503 for a failed statement, logged and counted.
fn unavailable(_error: sqlx::Error, source: &metrics::Source) -> Rejection {
    #[cfg(feature = "tracing")]
    tracing::error!(target: "tower_webhook", "webhook transaction failed: {_error}");
    metrics::store_unavailable(source);
    Rejection::store_unavailable(RETRY_AFTER_SECS)
}

/// PostgreSQL's `lock_not_available`: the `lock_timeout` ran out.
fn lock_not_available(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "55P03")
}

//! Exactly once without leases, for effects in PostgreSQL (features `postgres`): the claim
//! row is inserted in a transaction the handler writes in, committed only on a 2xx.
//!
//! [`PgTxDedupeLayer`] begins a transaction, inserts the event's row (done, with its body,
//! type, object id and livemode) with `ON CONFLICT DO NOTHING`, and hands the transaction
//! to the handler as a [`PgTx`] in the request's extensions (an axum extractor with the
//! `axum` feature). On a 2xx it commits; on anything else it rolls back, and the row and
//! the handler's writes vanish together.
//!
//! | the database says | response | handler called? |
//! |---|---|---|
//! | no row: the insert took | the handler's (committed on 2xx) | yes |
//! | a committed row | 204 | no |
//! | a row still being inserted by another attempt | waits on the unique index, then one of the two above | — |
//! | … and it waited longer than [`with_max_wait`](PgTxDedupeLayer::with_max_wait) | 409 + `Retry-After` | no |
//! | a row claimed by a live `PgStore` attempt | 409 + `Retry-After` | no |
//! | unreachable, or the commit failed | 503 + `Retry-After` | — |
//! | the handler answered 2xx but one of its statements failed | 500, rolled back | yes |
//!
//! The handler's effects *in this database* happen exactly once, with no lease to tune and
//! one commit per event. Effects elsewhere (an e-mail, a call to another API) are not
//! covered: a rollback cannot undo them. A slow handler holds its connection and makes
//! concurrent duplicates wait; size the pool for it, or bound the wait.
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use tower::ServiceBuilder;
//! use tower_webhook::pg_tx::{PgTx, PgTxDedupeLayer};
//! use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};
//!
//! async fn fulfil(event: Event, tx: PgTx) -> http::StatusCode {
//!     let mut tx = tx.lock().await;
//!     let order = event.object_id().unwrap_or_default().to_owned();
//!     match sqlx::query("UPDATE orders SET paid = true WHERE payment_id = $1")
//!         .bind(order)
//!         .execute(&mut **tx)
//!         .await
//!     {
//!         Ok(_) => http::StatusCode::NO_CONTENT, // committed with the event's row
//!         Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR, // rolled back; the retry runs
//!     }
//! }
//!
//! # async fn app(pool: sqlx::PgPool) -> Result<Router, Box<dyn std::error::Error>> {
//! let verifier = Verifier::new(Scheme::stripe(), ["whsec_from_the_dashboard_0123"])?;
//! let app: Router = Router::new().route(
//!     "/webhooks",
//!     post(fulfil).layer(
//!         ServiceBuilder::new()
//!             .layer(VerifyWebhookLayer::new(verifier))
//!             .layer(PgTxDedupeLayer::new(pool).await?),
//!     ),
//! );
//! # Ok(app)
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, MutexGuard};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::dedupe::Deduped;
use crate::event::MISSING_EVENT;
use crate::store::{Claim, Delivery, StoreError, Token};
use crate::{metrics, span, Event};

/// The event's transaction, for the handler's own writes. Lock it, use `&mut **guard` as
/// the executor, and let go before answering: the middleware commits it on a 2xx.
#[derive(Clone)]
pub struct PgTx {
    tx: Arc<Mutex<Transaction<'static, Postgres>>>,
}

impl PgTx {
    /// Begins a transaction on `pool`, cancel-safe: the `BEGIN` runs on a task of its own.
    /// sqlx 0.9 counts a transaction only once `BEGIN` has answered, so a future dropped
    /// in between (a worker stopped mid-event) hands the pool a connection stuck inside a
    /// transaction that every later borrower runs in (sqlx#4393). On its own task the
    /// `BEGIN` always finishes, and a transaction nobody waits for any more rolls back.
    pub(crate) async fn begin(
        pool: &PgPool,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let pool = pool.clone();
        match tokio::spawn(async move { pool.begin().await }).await {
            Ok(begun) => begun,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(sqlx::Error::WorkerCrashed), // the runtime is shutting down
        }
    }

    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            tx: Arc::new(Mutex::new(tx)),
        }
    }

    /// The transaction back, unless a clone of `self` is still alive somewhere (work that
    /// may still be running: never commit it).
    pub(crate) fn into_inner(self) -> Option<Transaction<'static, Postgres>> {
        Arc::try_unwrap(self.tx).ok().map(Mutex::into_inner)
    }

    /// Waits for the transaction (only the handler's own tasks compete for it).
    pub async fn lock(&self) -> MutexGuard<'_, Transaction<'static, Postgres>> {
        self.tx.lock().await
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum_core::extract::FromRequestParts<S> for PgTx {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<PgTx>().cloned().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no webhook transaction in the request: add tower_webhook::pg_tx::PgTxDedupeLayer in front of this route",
        ))
    }
}

/// Applies [`PgTxDedupe`]. See the [module docs](self). Cloning shares the pool.
#[derive(Clone, Debug)]
#[must_use]
pub struct PgTxDedupeLayer {
    pool: PgPool,
    max_wait: Option<Duration>,
}

impl PgTxDedupeLayer {
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
            pool,
            max_wait: None,
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
        self.max_wait = Some(wait);
        Ok(self)
    }
}

impl<S> Layer<S> for PgTxDedupeLayer {
    type Service = PgTxDedupe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PgTxDedupe {
            inner,
            pool: self.pool.clone(),
            max_wait: self.max_wait,
        }
    }
}

/// Middleware that runs each event's handler once, inside the event's transaction.
#[derive(Clone, Debug)]
#[must_use]
pub struct PgTxDedupe<S> {
    inner: S,
    pool: PgPool,
    max_wait: Option<Duration>,
}

impl<S> PgTxDedupe<S> {
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

/// Response future of [`PgTxDedupe`]: boxed, as it is three database round trips around
/// the handler (begin and insert, then commit); one allocation is noise beside them. The
/// work runs on a task of its own: dropping this future does not stop it.
pub type PgTxFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

/// What `Retry-After` says on a 409 or 503 here: the transaction holds no lease to count
/// down, so a short fixed wait.
const RETRY_AFTER_SECS: u64 = 5;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PgTxDedupe<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = PgTxFuture<Self::Response, S::Error>;

    /// Always ready: the inner service's readiness is taken only once the event's row is
    /// inserted, so duplicates waiting on it never hold a place in the inner service.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // A clone, polled ready once the event's row is in (see `poll_ready`).
        let mut inner = self.inner.clone();
        let (pool, max_wait) = (self.pool.clone(), self.max_wait);
        let event = req.extensions().get::<Event>();
        let delivery = event.map(|e| (Delivery::from_event(e), e.metrics().clone()));
        // Its own task: a dropped request (the client hung up) neither rolls back nor
        // stops a handler that has started; its outcome is committed or rolled back as
        // if the client had waited. In the delivery's span, for the handler's logs.
        let task = tokio::spawn(span::instrument(span::current(), async move {
            let (delivery, source) = match delivery {
                None => {
                    return Ok(ResponseBody::text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        MISSING_EVENT,
                    ))
                }
                Some(d) => d,
            };
            let unavailable = |_error: sqlx::Error| {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "webhook transaction failed: {_error}");
                metrics::store_unavailable(&source);
                Deduped::StoreUnavailable.response(Some(RETRY_AFTER_SECS))
            };
            let mut tx = match PgTx::begin(&pool).await {
                Ok(tx) => tx,
                Err(e) => return Ok(unavailable(e)),
            };
            // The bound covers the insert only: the session's own setting comes back after.
            let mut session_lock_timeout = None;
            if let Some(wait) = max_wait {
                // OFFSET 0 keeps the subquery apart: the old value is read before the set.
                let set: Result<String, _> = sqlx::query_scalar(
                    "SELECT previous FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) p,
                     LATERAL set_config('lock_timeout', $1, true)",
                )
                .bind(format!("{}ms", wait.as_millis()))
                .fetch_one(&mut *tx)
                .await;
                match set {
                    Ok(previous) => session_lock_timeout = Some(previous),
                    Err(e) => return Ok(unavailable(e)),
                }
            }
            // A concurrent attempt's uncommitted row makes this wait, then conflict (it
            // committed) or insert (it rolled back). A row left unfinished by `PgStore`
            // (released, or its lease ran out) is taken over, so the two forms can share
            // the table (during a switch from one to the other, say).
            match crate::sql::postgres::done_in(&mut tx, &delivery, Token::new()).await {
                // Waited `max_wait` for a concurrent attempt of this event: still running.
                Err(e) if lock_not_available(&e) => {
                    metrics::in_flight(&source);
                    return Ok(Deduped::InFlight.response(Some(RETRY_AFTER_SECS)));
                }
                Err(e) => return Ok(unavailable(e)),
                Ok(Claim::New(_)) => {
                    if let Some(previous) = session_lock_timeout {
                        let reset = sqlx::query("SELECT set_config('lock_timeout', $1, true)")
                            .bind(previous)
                            .execute(&mut *tx)
                            .await;
                        if let Err(e) = reset {
                            return Ok(unavailable(e));
                        }
                    }
                }
                Ok(Claim::Done) => {
                    metrics::duplicate(&source);
                    return Ok(Deduped::Done.response(None));
                }
                Ok(_) => {
                    metrics::in_flight(&source);
                    return Ok(Deduped::InFlight.response(Some(RETRY_AFTER_SECS)));
                }
            }
            let shared = PgTx::new(tx);
            req.extensions_mut().insert(shared.clone());
            // Dropped on error or panic: the transaction rolls back with it.
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let success =
                |r: &Result<S::Response, S::Error>| matches!(r, Ok(r) if r.status().is_success());
            let response = metrics::handled(&source, inner.call(req), success).await?;
            let Some(mut tx) = shared.into_inner() else {
                // The handler kept the transaction (a task still holds it): never commit
                // work that may still be running.
                return Ok(ResponseBody::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "webhook transaction still in use",
                ));
            };
            if !response.status().is_success() {
                drop(tx); // rolls back
                return Ok(response.map(ResponseBody::inner));
            }
            // A statement of the handler's failed and it answered 2xx anyway: PostgreSQL
            // would turn the COMMIT into a silent ROLLBACK. Ask first, and never send a 2xx
            // for work that was not recorded.
            if let Err(_error) = sqlx::query("SELECT 1").execute(&mut *tx).await {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "the handler answered 2xx in a failed transaction: {_error}");
                drop(tx);
                return Ok(ResponseBody::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "webhook transaction failed",
                ));
            }
            match tx.commit().await {
                Ok(()) => Ok(response.map(ResponseBody::inner)),
                Err(e) => Ok(unavailable(e)),
            }
        }));
        Box::pin(async move {
            match task.await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down: the transaction rolled back with the task.
                Err(_) => Ok(Deduped::StoreUnavailable.response(Some(RETRY_AFTER_SECS))),
            }
        })
    }
}

/// PostgreSQL's `lock_not_available`: the `lock_timeout` ran out.
fn lock_not_available(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "55P03")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `future` for `time` (yielding to the runtime between polls), then drops it:
    /// a cancellation at whatever point it had reached. Whether it finished.
    async fn cancel_after<F: Future>(future: F, time: Duration) -> bool {
        let mut future = std::pin::pin!(future);
        let until = std::time::Instant::now() + time;
        loop {
            let ready = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready()));
            if ready.await {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Whether the pool's next connection runs statements inside a transaction: two
    /// statements in a row then share one transaction id.
    async fn in_a_transaction(pool: &PgPool) -> bool {
        let xid = || sqlx::query_scalar::<_, i64>("SELECT txid_current()").fetch_one(pool);
        xid().await.unwrap() == xid().await.unwrap()
    }

    /// A `begin` dropped at any point, one poll after another across its round trip,
    /// leaves its pool's one connection outside any transaction.
    #[tokio::test]
    async fn a_begin_cancelled_anywhere_leaves_no_open_transaction_on_the_pool() {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("PostgreSQL is running");
        assert!(!in_a_transaction(&pool).await);
        // 0 to 4 ms in 20 µs steps, past the round trip: every point of it is hit.
        let mut finished = 0;
        for step in 0..200 {
            let time = Duration::from_micros(20 * step);
            finished += u32::from(cancel_after(PgTx::begin(&pool), time).await);
            assert!(
                !in_a_transaction(&pool).await,
                "a stale transaction after {time:?}"
            );
        }
        assert!(finished > 0, "the sweep reaches past the round trip");
    }
}

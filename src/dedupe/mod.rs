//! Let each event through once: [`DedupeLayer`] claims `(source, event id)` atomically in
//! a [store](crate::store) before the handler runs.
//!
//! | the store says | response | handler called? |
//! |---|---|---|
//! | new (or released, or its lease ran out) | the handler's own | yes |
//! | done | 204 | no |
//! | claimed by a live attempt | 409 + `Retry-After` | no |
//! | store unreachable or failing | 503 + `Retry-After` | no |
//! | store refuses the key as invalid input | 500, no `Retry-After` | no |
//!
//! Once claimed, the handler runs on a task of its own, to its end: a client that hangs
//! up (or a `TimeoutLayer` that fires) drops the response, not the work, so an effect
//! that has started is never repeated by the provider's retry. While it runs, the claim
//! is renewed every third of the lease (fenced on its token), for up to the max run time
//! ([`DedupeLayer::with_max_run`]). After the handler:
//!
//! - a 2xx marks the key done — before the 2xx goes out, retried while the lease lasts,
//!   fenced on the claim's token so a slow attempt whose lease ran out cannot overwrite a
//!   newer one;
//! - a non-2xx, an error or a panic releases the claim so the provider's retry runs;
//! - a crashed process's claim frees itself when its lease runs out: the only way a
//!   handler runs twice here is a crash (or a store outage longer than the lease) in the
//!   middle of it. Effects in PostgreSQL can close that gap with
//!   [`TxDedupeLayer`] (below).
//!
//! That task is nobody's to await: at shutdown, after `serve` returns, wait for it with
//! [`DedupeLayer::drain`] (see [`crate::drain`]), or a process that exits mid-handler has
//! the handler run again after the lease.
//!
//! When a handler's claim could not be kept (taken over after its lease ran out, or "done"
//! not heard by the store), its response carries [`ClaimLost`].
//!
//! The handler's future must be `Send + 'static` (it is spawned on the Tokio runtime, as
//! axum's, hyper's and tonic's are).
//!
//! Put it behind `VerifyWebhookLayer`: the key comes from the verified
//! [`Event`](crate::Event) (a missing one is a 500 that names the fix), or from
//! [`DedupeLayer::with_key`] (no key is a 400).
//!
//! When the middleware answered by itself, the reason rides in the response's extensions
//! as a [`Rejection`](crate::response::Rejection) (kind `Duplicate`, `InFlight`,
//! `StoreUnavailable`, `MissingEvent` or `NoKey`), and
//! [`DedupeLayer::with_rejection`] replaces the response.
//!
//! # Example
//!
//! ```
//! use std::time::SystemTime;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_webhook::store::MemoryStore;
//! use tower_webhook::{DedupeLayer, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let service = ServiceBuilder::new()
//!     .layer(VerifyWebhookLayer::new(Verifier::new(Scheme::standard(), [secret])?))
//!     .layer(DedupeLayer::new(MemoryStore::new()))
//!     .service(service_fn(|_req: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("handled"))))
//!     }));
//!
//! let body = b"{}";
//! let headers = Scheme::standard().sign([secret], "msg_1", SystemTime::now(), body)?;
//! let delivery = || {
//!     let mut request = Request::post("/").body(Full::new(Bytes::from_static(body))).unwrap();
//!     *request.headers_mut() = headers.clone();
//!     request
//! };
//! assert_eq!(service.clone().oneshot(delivery()).await?.status(), StatusCode::OK);
//! // The provider delivers it again: acknowledged, the handler does not run.
//! assert_eq!(service.oneshot(delivery()).await?.status(), StatusCode::NO_CONTENT);
//! # Ok(())
//! # }
//! ```
//!
//! # In the handler's own transaction
//!
//! Exactly once without leases, for effects in PostgreSQL (feature `postgres`): the
//! event's row is inserted in a transaction the handler writes in, committed only on a
//! 2xx. [`TxDedupeLayer`] begins a transaction, inserts the event's row (done, with its
//! type, object id and livemode; never its body) with `ON CONFLICT DO NOTHING`, and hands
//! the transaction to the handler as a [`PgTx`] in the request's extensions (an axum
//! extractor with the `axum` feature). On a 2xx it commits; on anything else it rolls
//! back, and the row and the handler's writes vanish together.
//!
//! | the database says | response | handler called? |
//! |---|---|---|
//! | no row: the insert took | the handler's (committed on 2xx) | yes |
//! | a committed row | 204 | no |
//! | a row still being inserted by another attempt | waits on the unique index, then one of the two above | — |
//! | … and it waited longer than [`with_max_wait`][TxDedupeLayer::with_max_wait] | 409 + `Retry-After` | no |
//! | a row claimed by a live `PgStore` attempt | 409 + `Retry-After` | no |
//! | unreachable, or the commit failed | 503 + `Retry-After` | — |
//! | the key is one the stores refuse ([`StoreErrorKind::InvalidInput`](crate::store::StoreErrorKind::InvalidInput)) | 500, no `Retry-After` | no |
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
//! use tower_webhook::dedupe::{PgTx, TxDedupeLayer};
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
//!             .layer(TxDedupeLayer::new(pool).await?),
//!     ),
//! );
//! # Ok(app)
//! # }
//! ```
//!
#![cfg_attr(
    feature = "postgres",
    doc = "
[`TxDedupeLayer`]: TxDedupeLayer
[`PgTx`]: PgTx
[TxDedupeLayer::with_max_wait]: TxDedupeLayer::with_max_wait"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "
[`TxDedupeLayer`]: crate#features
[`PgTx`]: crate#features
[TxDedupeLayer::with_max_wait]: crate#features"
)]

mod future;
mod layer;
mod service;
#[cfg(feature = "postgres")]
mod transactional; // or: the claim in the handler's own PostgreSQL transaction
#[cfg(feature = "postgres")]
mod tx;

pub use self::future::ResponseFuture;
pub use self::layer::DedupeLayer;
pub use self::service::Dedupe;
#[cfg(feature = "postgres")]
pub use self::transactional::{TxDedupe, TxDedupeLayer, TxFuture};
#[cfg(feature = "postgres")]
pub use self::tx::PgTx;

/// In the extensions of a handler's response when its claim could not be kept: the
/// handler's work is done, but the key is not (yet) recorded as done under this attempt,
/// so another attempt may run the handler too. Logged at `warn` (feature `tracing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimLost {
    /// The lease ran out while the handler ran — the store was out of reach for longer
    /// than the lease, or the handler ran past the max run time — and another attempt
    /// took the key over.
    TakenOver,
    /// The store could not hear "done" before the lease would end: the key frees itself
    /// when the lease runs out, and a later redelivery runs again.
    Unrecorded,
}

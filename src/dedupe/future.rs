use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::task::JoinHandle;
use tower_service::Service;

use super::layer::Config;
use super::ClaimLost;
use crate::drain::Stopped;
use crate::metrics;
use crate::response::{Rejection, ResponseBody};
use crate::span;
use crate::store::{
    hold, whole_seconds, ClaimGuard, Claimed, Delivery, Held, PendingClaim, StoreErrorKind, Token,
};

/// The handler's result and how its claim ended, from the task that ran it.
type Finished<S, B> = Result<
    (
        Result<<S as Service<Request<B>>>::Response, <S as Service<Request<B>>>::Error>,
        Held,
    ),
    Stopped,
>;

pin_project! {
    /// Response future of [`Dedupe`](super::Dedupe): claims the key, then runs the inner
    /// service's future on a task of its own, which renews the claim while it runs and
    /// completes or releases it after. Dropping this future (the client hung up, a
    /// timeout fired) does not stop that task: work that has started runs to its end and
    /// its outcome is recorded.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        state: State<S, B>,
        config: Option<Arc<Config>>,
    }
}

// The request waits in `Claiming` for one round trip; boxing it would cost an allocation
// per request to save bytes in a future that is never moved after it is polled.
#[allow(clippy::large_enum_variant)]
enum State<S, B>
where
    S: Service<Request<B>>,
{
    Claiming {
        claim: PendingClaim,
        request: Option<Request<B>>,
        inner: Option<S>,
        source: metrics::Source,
    },
    /// Claimed: waiting for a place in the inner service (dropped here, the guard
    /// releases the claim: nothing has started).
    Readying {
        guard: Option<ClaimGuard>,
        request: Option<Request<B>>,
        inner: S,
        source: metrics::Source,
    },
    Running {
        task: JoinHandle<Finished<S, B>>,
    },
    /// The middleware's own answer, before anything was claimed.
    Ready {
        rejection: Rejection,
    },
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(super) fn claim(
        delivery: Delivery,
        request: Request<B>,
        inner: S,
        config: Arc<Config>,
    ) -> Self {
        // The verifier's label; a key of `with_key`'s is labelled with its own source.
        let source = match delivery.event() {
            Some(event) => event.metrics().clone(),
            None => metrics::Source::new(delivery.source()),
        };
        let claim = PendingClaim::new(
            config.store.clone(),
            delivery,
            Token::new(),
            config.lease.length,
        );
        Self {
            state: State::Claiming {
                claim,
                request: Some(request),
                inner: Some(inner),
                source,
            },
            config: Some(config),
        }
    }

    /// A response of the middleware's own, answered without calling the inner service.
    pub(super) fn ready(rejection: Rejection, config: Arc<Config>) -> Self {
        Self {
            state: State::Ready { rejection },
            config: Some(config),
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        loop {
            let next = match this.state {
                State::Ready { rejection } => {
                    let config = this.config.as_ref().expect("answers with a config");
                    return Poll::Ready(Ok(config.reject(*rejection)));
                }
                State::Claiming {
                    claim,
                    request,
                    inner,
                    source,
                } => {
                    let config = this.config.as_ref().expect("claiming has a config");
                    match ready!(Pin::new(claim).poll(cx)) {
                        Claimed::Granted(guard) => State::Readying {
                            guard: Some(guard),
                            request: request.take(),
                            inner: inner.take().expect("claimed once"),
                            source: source.clone(),
                        },
                        Claimed::Done => {
                            metrics::duplicate(source);
                            return Poll::Ready(Ok(config.reject(Rejection::duplicate())));
                        }
                        Claimed::InFlight(retry_after) => {
                            metrics::in_flight(source);
                            let secs = whole_seconds(retry_after).as_secs();
                            return Poll::Ready(Ok(config.reject(Rejection::in_flight(secs))));
                        }
                        Claimed::Failed(error) => {
                            metrics::store_unavailable(source);
                            log_store_error("claim", &error);
                            if error.kind() == StoreErrorKind::InvalidInput {
                                return Poll::Ready(Ok(config.reject(Rejection::store_refused())));
                            }
                            let secs = whole_seconds(config.unavailable_retry_after).as_secs();
                            return Poll::Ready(Ok(
                                config.reject(Rejection::store_unavailable(secs))
                            ));
                        }
                    }
                }
                State::Readying {
                    guard,
                    request,
                    inner,
                    source,
                } => {
                    if let Err(error) = ready!(inner.poll_ready(cx)) {
                        drop(guard.take()); // nothing started: the claim goes back
                        return Poll::Ready(Err(error));
                    }
                    let config = this.config.as_ref().expect("claimed with a config");
                    let guard = guard.take().expect("called once");
                    // The drain is over (the server is shutting down): start nothing.
                    if config.drain.is_stopped() {
                        drop(guard); // released in the background
                        return Poll::Ready(Ok(config.reject(Rejection::store_unavailable(1))));
                    }
                    // Waited so long for a place that the lease may run out before its
                    // first renewal: give the claim back rather than run beside a takeover.
                    if guard.sent().elapsed() >= config.lease.length * 2 / 3 {
                        drop(guard); // released in the background
                        metrics::in_flight(source);
                        let secs = whole_seconds(config.lease.length).as_secs();
                        return Poll::Ready(Ok(config.reject(Rejection::in_flight(secs))));
                    }
                    let future = inner.call(request.take().expect("called once"));
                    let success = |r: &Result<Response<ResBody>, S::Error>| matches!(r, Ok(r) if r.status().is_success());
                    // Counted as it ends, even when nobody waits for its response.
                    let future = metrics::handled(source, future, success);
                    // Its own task: a dropped request does not stop work that started. In
                    // the delivery's span, so the handler's logs carry the event.
                    // Tracked by the layer's drain, which awaits it at shutdown.
                    let work = hold(
                        guard,
                        config.lease,
                        future,
                        success,
                        config.drain.stopping(),
                    );
                    let work = span::instrument(span::current(), work);
                    let task = config
                        .drain
                        .spawn_on(&tokio::runtime::Handle::current(), work);
                    State::Running { task }
                }
                State::Running { task } => {
                    let (result, held) = match ready!(Pin::new(task).poll(cx)) {
                        Ok(Ok(finished)) => finished,
                        // Stopped by the drain past its bound, its claim released: the
                        // retry runs it again.
                        Ok(Err(Stopped { .. })) => {
                            let config = this.config.as_ref().expect("ran with a config");
                            return Poll::Ready(Ok(config.reject(Rejection::store_unavailable(1))));
                        }
                        // The handler panicked (its claim was released as it unwound):
                        // the panic goes on to whoever catches panics outside.
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        // The runtime is shutting down: the lease frees the claim. (Not counted
                        // as the store's: the store did nothing wrong.)
                        Err(_) => {
                            let config = this.config.as_ref().expect("ran with a config");
                            return Poll::Ready(Ok(config.reject(Rejection::store_unavailable(1))));
                        }
                    };
                    let lost = match held {
                        Held::Done | Held::Released => None,
                        Held::Lost => Some(ClaimLost::TakenOver),
                        Held::Unrecorded(error) => {
                            log_store_error("complete", &error);
                            Some(ClaimLost::Unrecorded)
                        }
                    };
                    return Poll::Ready(result.map(|response| {
                        let mut response = response.map(ResponseBody::inner);
                        if let Some(lost) = lost {
                            log_lost(lost);
                            response.extensions_mut().insert(lost);
                        }
                        response
                    }));
                }
            };
            *this.state = next;
        }
    }
}

/// A handler that finished without keeping its claim: said at `warn`.
fn log_lost(_lost: ClaimLost) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tower_webhook",
        reason = ?_lost,
        "a handler finished without keeping its claim; another attempt may run too: \
         keep the store reachable, or raise the max run time"
    );
}

#[allow(unused_variables)]
fn log_store_error(operation: &'static str, error: &crate::store::StoreError) {
    #[cfg(feature = "tracing")]
    tracing::error!(target: "tower_webhook", operation, "webhook store error: {error}: {:?}", std::error::Error::source(error));
}

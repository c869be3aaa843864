use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::layer::Config;
use super::Deduped;
use crate::body::ResponseBody;
use crate::store::{whole_seconds, ClaimGuard, Claimed, Completed, Delivery, PendingClaim, Token};

pin_project! {
    /// Response future of [`Dedupe`](super::Dedupe): claims the key, calls the inner
    /// service on a new claim, then completes or releases the claim.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        config: Option<Arc<Config>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Claiming {
            claim: PendingClaim,
            request: Option<Request<B>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: S::Future,
            guard: Option<ClaimGuard>,
        },
        Finishing {
            finish: tokio::task::JoinHandle<()>,
            result: Option<Result<S::Response, S::Error>>,
        },
        Ready {
            status: StatusCode,
            text: &'static str,
        },
    }
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
        let claim = PendingClaim::new(config.store.clone(), delivery, Token::new(), config.lease);
        Self {
            state: State::Claiming {
                claim,
                request: Some(request),
                inner: Some(inner),
            },
            config: Some(config),
        }
    }

    /// A response of the middleware's own, answered without calling the inner service.
    pub(super) fn ready(status: StatusCode, text: &'static str) -> Self {
        Self {
            state: State::Ready { status, text },
            config: None,
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.state.project() {
                StateProj::Ready { status, text } => {
                    return Poll::Ready(Ok(ResponseBody::text(*status, text)));
                }
                StateProj::Claiming {
                    claim,
                    request,
                    inner,
                } => {
                    let config = this.config.as_ref().expect("claiming has a config");
                    match ready!(Pin::new(claim).poll(cx)) {
                        Claimed::Granted(guard) => {
                            let mut inner = inner.take().expect("claimed once");
                            let future = inner.call(request.take().expect("claimed once"));
                            State::Calling {
                                future,
                                guard: Some(guard),
                            }
                        }
                        Claimed::Done => {
                            return Poll::Ready(Ok(Deduped::Done.response(None)));
                        }
                        Claimed::InFlight(retry_after) => {
                            let secs = whole_seconds(retry_after).as_secs();
                            return Poll::Ready(Ok(Deduped::InFlight.response(Some(secs))));
                        }
                        Claimed::Failed(error) => {
                            log_store_error("claim", &error);
                            let secs = whole_seconds(config.unavailable_retry_after).as_secs();
                            return Poll::Ready(Ok(Deduped::StoreUnavailable.response(Some(secs))));
                        }
                    }
                }
                StateProj::Calling { future, guard } => {
                    let result = ready!(future.poll(cx));
                    let guard = guard.take().expect("called once");
                    let success = matches!(&result, Ok(r) if r.status().is_success());
                    // Spawned, so the store hears the outcome even if this future is
                    // dropped while it waits (the client hung up).
                    let finish = tokio::spawn(if success {
                        finish_complete(guard)
                    } else {
                        finish_release(guard)
                    });
                    State::Finishing {
                        finish,
                        result: Some(result),
                    }
                }
                StateProj::Finishing { finish, result } => {
                    // The task logs its own errors; a panic in it changes nothing here.
                    let _ = ready!(Pin::new(finish).poll(cx));
                    let result = result.take().expect("polled after completion");
                    return Poll::Ready(result.map(|r| r.map(ResponseBody::inner)));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// Tells the store the handler succeeded. The handler's work is done by now, so a store
/// that failed to hear it is asked again (5 tries, 0.1 s to 1.6 s apart): a key left
/// claimed frees itself at the end of the lease, and a later redelivery would run again.
fn finish_complete(guard: ClaimGuard) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let (store, delivery, token) = guard.into_parts();
        let mut outcome = store.complete(delivery.clone(), token).await;
        for attempt in 0..4 {
            if outcome.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
            outcome = store.complete(delivery.clone(), token).await;
        }
        match outcome {
            Ok(Completed::Done) => {}
            Ok(Completed::Fenced) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    target: "tower_webhook",
                    "a handler finished after its claim's lease ran out; \
                     another attempt may have run too: lengthen the lease"
                );
            }
            Err(error) => log_store_error("complete", &error),
        }
    })
}

fn finish_release(guard: ClaimGuard) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let release = guard.release();
    Box::pin(async move {
        if let Err(error) = release.await {
            log_store_error("release", &error);
        }
    })
}

#[allow(unused_variables)]
fn log_store_error(operation: &'static str, error: &crate::store::StoreError) {
    #[cfg(feature = "tracing")]
    tracing::error!(target: "tower_webhook", operation, "webhook store error: {error}: {:?}", std::error::Error::source(error));
}

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{request, Request, Response};
use http_body::Body;
use http_body_util::Full;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::collect::{CollectBody, CollectError};
use super::handshake;
use super::layer::Config;
use super::response::reject;
use crate::error::{VerifyError, VerifyErrorKind};
use crate::response::ResponseBody;
use crate::span::{self, Span};
use crate::{metrics, Verifier};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tenant's verifier, or a certificate's, being looked up.
type LookupFuture = Pin<Box<dyn Future<Output = Result<Verifier, VerifyError>> + Send>>;

/// A PayPal transmission being recorded in the shared store.
#[cfg(feature = "dedupe")]
type AdmitFuture = super::transmission::AdmitFuture;
#[cfg(not(feature = "dedupe"))]
type AdmitFuture = Pin<Box<dyn Future<Output = Result<(), VerifyError>> + Send>>;

/// A handshake the layer answers once an outbound call completes (SNS's confirmation).
pub(super) type AnswerFuture =
    Pin<Box<dyn Future<Output = Result<Response<Bytes>, VerifyError>> + Send>>;

pin_project! {
    /// Response future of [`VerifyWebhook`](super::VerifyWebhook): collects the body under
    /// the limit and the read timeout, verifies it, waits for the inner service to be
    /// ready, then calls it.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<Full<Bytes>>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<S, B>,
        config: Arc<Config>,
        // The delivery's, entered while it is polled (feature `tracing`).
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<Full<Bytes>>>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        Collect {
            #[pin]
            collect: CollectBody<B>,
            #[pin]
            timeout: tokio::time::Sleep,
            parts: Option<request::Parts>,
            inner: Option<S>,
        },
        Lookup {
            future: LookupFuture,
            delivery: Option<(request::Parts, Bytes, S)>,
            // The certificate URL looked up, kept once it verifies a delivery.
            certificate: Option<String>,
        },
        // PayPal: the transmission recorded in the shared store before the handler runs.
        Admit {
            future: AdmitFuture,
            delivery: Option<(Request<Full<Bytes>>, S)>,
        },
        Ready {
            inner: S,
            request: Option<Request<Full<Bytes>>>,
        },
        Call {
            #[pin]
            future: S::Future,
        },
        Reject {
            error: Option<VerifyError>,
        },
        Answer {
            response: Option<Response<Bytes>>,
        },
        Answering {
            future: AnswerFuture,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<Full<Bytes>>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(super) fn collect(
        collect: CollectBody<B>,
        parts: request::Parts,
        inner: S,
        config: Arc<Config>,
        span: Span,
    ) -> Self {
        Self {
            state: State::Collect {
                collect,
                timeout: tokio::time::sleep(config.body_timeout),
                parts: Some(parts),
                inner: Some(inner),
            },
            config,
            span,
        }
    }

    /// A response of the layer's own: a handshake's answer.
    pub(super) fn answer(response: Response<Bytes>, config: Arc<Config>) -> Self {
        Self {
            state: State::Answer {
                response: Some(response),
            },
            config,
            span: span::none(),
        }
    }

    pub(super) fn reject(error: VerifyError, config: Arc<Config>) -> Self {
        Self {
            state: State::Reject { error: Some(error) },
            config,
            span: span::none(),
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = span::enter(this.span);
        poll_state(this.state, this.config, this.span, cx)
    }
}

/// The state machine of [`ResponseFuture`], polled inside the delivery's span.
fn poll_state<S, B, ResBody>(
    mut state: Pin<&mut State<S, B>>,
    config: &Arc<Config>,
    span: &Span,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResponseBody<ResBody>>, S::Error>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    loop {
        match state.as_mut().project() {
            StateProj::Collect {
                collect,
                timeout,
                parts,
                inner,
            } => {
                let collected = match collect.poll(cx) {
                    Poll::Ready(collected) => collected,
                    Poll::Pending => {
                        ready!(timeout.poll(cx));
                        let error = VerifyError::new(
                            VerifyErrorKind::BodyTimeout,
                            "body not received within the read timeout",
                        );
                        return Poll::Ready(Ok(reject(config, error)));
                    }
                };
                let bytes = match collected {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        let error = match err {
                            CollectError::TooLarge => VerifyError::new(
                                VerifyErrorKind::BodyTooLarge,
                                "body is over the limit",
                            ),
                            CollectError::Read => VerifyError::new(
                                VerifyErrorKind::BodyRead,
                                "body could not be read",
                            ),
                        };
                        return Poll::Ready(Ok(reject(config, error)));
                    }
                };
                let parts = parts.take().expect("polled after completion");
                let inner = inner.take().expect("polled after completion");
                let next = match (&config.certificates, &config.tenants) {
                    (Some(certificates), _) => match certificates.url(&parts.headers, &bytes) {
                        Ok(url) => Next::State(Box::new(State::Lookup {
                            future: certificates.verifier(url.clone()),
                            delivery: Some((parts, bytes, inner)),
                            certificate: Some(url),
                        })),
                        Err(error) => Next::Reject(error),
                    },
                    (None, None) => verify(config, &config.verifier, span, parts, bytes, inner),
                    (None, Some(tenants)) => {
                        let tenant = tenants.from().read(&parts.uri, &parts.headers, &bytes);
                        let Some(tenant) = tenant else {
                            let error = VerifyError::new(
                                VerifyErrorKind::UnknownTenant,
                                "the request names no tenant",
                            );
                            return Poll::Ready(Ok(reject(config, error)));
                        };
                        let future = tenants.verifier(tenant);
                        Next::State(Box::new(State::Lookup {
                            future,
                            delivery: Some((parts, bytes, inner)),
                            certificate: None,
                        }))
                    }
                };
                match next {
                    Next::State(next) => state.set(*next),
                    Next::Answer(answer) => {
                        return Poll::Ready(Ok(answer.map(ResponseBody::fixed)))
                    }
                    Next::Reject(error) => return Poll::Ready(Ok(reject(config, error))),
                }
            }
            StateProj::Lookup {
                future,
                delivery,
                certificate,
            } => {
                let verifier = match ready!(future.as_mut().poll(cx)) {
                    Ok(verifier) => verifier,
                    Err(error) => {
                        if let (Some(tenants), Some((parts, bytes, _))) =
                            (&config.tenants, &delivery)
                        {
                            tenants.refused(&error, parts, bytes);
                        }
                        return Poll::Ready(Ok(reject(config, error)));
                    }
                };
                let (parts, bytes, inner) = delivery.take().expect("polled after completion");
                let next = verify(config, &verifier, span, parts, bytes, inner);
                if let (Some(certificates), Some(url)) = (&config.certificates, certificate) {
                    if !matches!(next, Next::Reject(_)) {
                        certificates.trust(url);
                    }
                }
                match next {
                    Next::State(next) => state.set(*next),
                    Next::Answer(answer) => {
                        return Poll::Ready(Ok(answer.map(ResponseBody::fixed)))
                    }
                    Next::Reject(error) => return Poll::Ready(Ok(reject(config, error))),
                }
            }
            StateProj::Admit { future, delivery } => {
                if let Err(error) = ready!(future.as_mut().poll(cx)) {
                    return Poll::Ready(Ok(reject(config, error)));
                }
                let (request, inner) = delivery.take().expect("polled after completion");
                state.set(State::Ready {
                    inner,
                    request: Some(request),
                });
            }
            StateProj::Ready { inner, request } => {
                // Verified: now, and only now, a place in the inner service.
                ready!(inner.poll_ready(cx))?;
                let future = inner.call(request.take().expect("called once"));
                state.set(State::Call { future });
            }
            StateProj::Call { future } => {
                return future.poll(cx).map_ok(|res| res.map(ResponseBody::inner));
            }
            StateProj::Answer { response } => {
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response.map(ResponseBody::fixed)));
            }
            StateProj::Answering { future } => {
                return Poll::Ready(Ok(match ready!(future.as_mut().poll(cx)) {
                    Ok(response) => response.map(ResponseBody::fixed),
                    Err(error) => reject(config, error),
                }));
            }
            StateProj::Reject { error } => {
                let error = error.take().expect("polled after completion");
                return Poll::Ready(Ok(reject(config, error)));
            }
        }
    }
}

/// What follows a collected body.
enum Next<S, B>
where
    S: Service<Request<Full<Bytes>>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    State(Box<State<S, B>>),
    Answer(Response<Bytes>),
    Reject(VerifyError),
}

/// Verifies a collected delivery: a handshake to answer, a rejection, or the request to
/// hand on once the inner service is ready.
fn verify<S, B>(
    config: &Config,
    verifier: &Verifier,
    span: &Span,
    parts: request::Parts,
    bytes: Bytes,
    inner: S,
) -> Next<S, B>
where
    S: Service<Request<Full<Bytes>>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    // With a shared transmission store, it alone remembers PayPal's transmissions (the
    // layer's own verifier already defers; a looked-up certificate's is cloned here).
    #[cfg(feature = "dedupe")]
    let deferring = config
        .transmissions
        .as_ref()
        .and_then(|_| verifier.deferring_transmissions());
    #[cfg(feature = "dedupe")]
    let verifier = deferring.as_ref().unwrap_or(verifier);
    // `Bytes` clones share one buffer: the event and the body are the same bytes.
    let started = metrics::Timer::start();
    let verified =
        verifier.verify_request(&parts.method, &parts.uri, &parts.headers, bytes.clone());
    // Labelled with the layer's source: a tenant's verifier keeps its prototype's label.
    metrics::verification(config.verifier.metrics(), started);
    match verified {
        Ok(event) => {
            metrics::verified(config.verifier.metrics());
            span::verified(span, &event);
            // A set-up handshake is the layer's to answer, not the handler's.
            if let Some(answer) = handshake::after(verifier, &event) {
                return Next::Answer(answer);
            }
            if let Some(future) = handshake::confirm(config, &event) {
                return Next::State(Box::new(State::Answering { future }));
            }
            #[cfg(feature = "dedupe")]
            let admit = config.transmissions.as_ref().and_then(|store| {
                let (id, keep) = verifier.transmission(&parts.headers)?;
                let source = event.source();
                Some(super::transmission::admit(
                    store.clone(),
                    source,
                    id,
                    &bytes,
                    keep,
                ))
            });
            #[cfg(not(feature = "dedupe"))]
            let admit: Option<AdmitFuture> = None;
            let mut request = Request::from_parts(parts, Full::new(bytes));
            request.extensions_mut().insert(event);
            Next::State(Box::new(match admit {
                Some(future) => State::Admit {
                    future,
                    delivery: Some((request, inner)),
                },
                None => State::Ready {
                    inner,
                    request: Some(request),
                },
            }))
        }
        Err(error) => Next::Reject(error),
    }
}

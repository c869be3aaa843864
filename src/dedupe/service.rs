use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Config;
use crate::response::{Needs, Rejection, RejectionKind, ResponseBody};
use crate::store::Delivery;
use crate::Event;

/// Middleware that lets each event through once. See the [module docs](crate::dedupe).
#[derive(Clone)]
#[must_use]
pub struct Dedupe<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Dedupe<S> {
    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Dedupe<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    /// Always ready: the inner service's readiness is taken only once the event is
    /// claimed, so duplicates and in-flight retries never hold a place in it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let delivery = match &self.config.key {
            Some(key) => {
                let (parts, body) = req.into_parts();
                let delivery = key(&parts);
                return self.claim_or(delivery, Request::from_parts(parts, body));
            }
            None => match req.extensions().get::<Event>() {
                None => {
                    let rejection = Rejection::missing_event(Needs::Dedupe);
                    return ResponseFuture::ready(rejection, self.config.clone());
                }
                Some(event) => Some(Delivery::from_event(event)),
            },
        };
        self.claim_or(delivery, req)
    }
}

impl<S> Dedupe<S> {
    /// Claims `delivery`, or answers 400 when there is nothing to deduplicate on.
    fn claim_or<ReqBody, ResBody>(
        &mut self,
        delivery: Option<Delivery>,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    {
        let Some(delivery) = delivery else {
            let rejection = Rejection::new(RejectionKind::NoKey, "no webhook key in the request");
            return ResponseFuture::ready(rejection, self.config.clone());
        };
        // A clone, polled ready in the future once the event is claimed.
        let inner = self.inner.clone();
        ResponseFuture::claim(delivery, req, inner, self.config.clone())
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Dedupe<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedupe")
            .field("inner", &self.inner)
            .field("lease", &self.config.lease.length)
            .finish_non_exhaustive()
    }
}

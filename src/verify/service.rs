use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use super::collect::CollectBody;
use super::future::ResponseFuture;
use super::handshake;
use super::layer::Config;
use super::method;
use crate::error::{VerifyError, VerifyErrorKind};
use crate::response::ResponseBody;
use crate::span;

/// Middleware that verifies webhook deliveries. See the [module docs](crate::verify).
///
/// The inner service receives the same bytes as a [`Full`] body, with the verified
/// [`Event`](crate::Event) in the request's extensions.
#[derive(Clone)]
#[must_use]
pub struct VerifyWebhook<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> VerifyWebhook<S> {
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for VerifyWebhook<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone,
    ReqBody: Body,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    /// Always ready: the inner service's readiness is taken only once a delivery has
    /// been verified, so unauthenticated requests (a body trickling in) never hold a
    /// concurrency slot or a buffer place behind this layer.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Not a delivery at all (a health check's GET): 405 before anything else.
        if let Some(error) = method::refuse(self.config.verifier.scheme(), req.method()) {
            return ResponseFuture::reject(error, self.config.clone());
        }
        if let Some(response) = handshake::before(&self.config, req.method(), req.uri()) {
            return ResponseFuture::answer(response, self.config.clone());
        }
        let max = self.config.max_body;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let too_large =
            declared.is_some_and(|n| n > max as u64) || req.body().size_hint().lower() > max as u64;
        if too_large {
            return ResponseFuture::reject(
                VerifyError::new(
                    VerifyErrorKind::BodyTooLarge,
                    "content-length is over the limit",
                ),
                self.config.clone(),
            );
        }
        // The cheapest rejections first: no byte of the body is read for a request whose
        // headers cannot verify (missing, malformed, a stale timestamp).
        if let Err(error) = self.config.verifier.check_before_body(req.headers()) {
            return ResponseFuture::reject(error, self.config.clone());
        }
        // A tenant named where the body is not needed: refused before it is read.
        if let Some(tenants) = &self.config.tenants {
            let from = tenants.from();
            if !from.needs_body() && from.read(req.uri(), req.headers(), &[]).is_none() {
                return ResponseFuture::reject(
                    VerifyError::new(
                        VerifyErrorKind::UnknownTenant,
                        "the request names no tenant",
                    ),
                    self.config.clone(),
                );
            }
        }
        // A clone, polled ready in the future once the delivery is verified.
        let inner = self.inner.clone();
        let (parts, body) = req.into_parts();
        // Its span from here on: the body, the check, the inner service (spans are for
        // deliveries that got this far; refusals above are logged with their own fields).
        let span = span::delivery(self.config.verifier.source());
        ResponseFuture::collect(
            CollectBody::new(body, max),
            parts,
            inner,
            self.config.clone(),
            span,
        )
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for VerifyWebhook<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyWebhook")
            .field("inner", &self.inner)
            .field("verifier", &self.config.verifier)
            .finish_non_exhaustive()
    }
}

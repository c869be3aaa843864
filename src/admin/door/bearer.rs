//! [`BearerLayer`]: the JSON API's door, `Authorization: Bearer <token>`.

use std::task::{Context, Poll};

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Request};
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::throttle::client;
use super::{retry_after, OperatorDoor};
use crate::admin::AdminError;

/// Lets a request through with the operators' bearer token: [`OperatorDoor::bearer`].
#[derive(Clone, Debug)]
#[must_use]
pub struct BearerLayer {
    door: OperatorDoor,
}

impl BearerLayer {
    pub(super) fn new(door: OperatorDoor) -> Self {
        Self { door }
    }
}

impl<S> Layer<S> for BearerLayer {
    type Service = Bearer<S>;

    fn layer(&self, inner: S) -> Bearer<S> {
        Bearer {
            inner,
            door: self.door.clone(),
        }
    }
}

/// The service of [`BearerLayer`].
#[derive(Clone, Debug)]
#[must_use]
pub struct Bearer<S> {
    inner: S,
    door: OperatorDoor,
}

crate::admin::door::inner_access!(Bearer);

/// The token of `Authorization: Bearer <token>` (the scheme's name in any case), when
/// the header is there at all.
fn presented<B>(request: &Request<B>) -> Option<&[u8]> {
    let value = request.headers().get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
}

impl<S, B> Service<Request<B>> for Bearer<S>
where
    S: Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let client = client(request.extensions());
        if let Err(wait) = self.door.throttle.check(client) {
            let mut response = AdminError::too_many_requests().into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after(wait));
            return ResponseFuture::own(response);
        }
        let refused = match presented(&request) {
            Some(token) if self.door.token.matches(token) => {
                return ResponseFuture::inner(self.inner.call(request))
            }
            Some(_) => {
                self.door.throttle.fail(client); // a guess: counted
                "a wrong operator token"
            }
            // Asked without credentials (a probe, a browser): refused, not counted.
            None => "send the operator token as Authorization: Bearer <token>",
        };
        let mut response = AdminError::unauthorized(refused).into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        ResponseFuture::own(response)
    }
}

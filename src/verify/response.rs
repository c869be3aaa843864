use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::layer::Config;
use crate::VerifyError;

pin_project! {
    /// Response body of [`VerifyWebhook`](super::VerifyWebhook): the inner service's body,
    /// or the short text of a rejection.
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Inner { #[pin] body: B },
        Rejection { body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            inner: Inner::Inner { body },
        }
    }

    fn rejection(body: Bytes) -> Self {
        Self {
            inner: Inner::Rejection {
                body: Full::new(body),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().inner.project() {
            InnerProj::Inner { body } => body.poll_frame(cx),
            InnerProj::Rejection { body } => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Inner { body } => body.is_end_stream(),
            Inner::Rejection { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Inner { body } => body.size_hint(),
            Inner::Rejection { body } => body.size_hint(),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

/// The rejection response: the user's, or a short fixed text; the error rides in the
/// extensions either way, and goes to `tracing`.
pub(super) fn reject<B>(config: &Config, error: VerifyError) -> Response<ResponseBody<B>> {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tower_webhook",
        source = config.verifier.source(),
        kind = ?error.kind(),
        "webhook rejected: {error}"
    );
    let mut response = match &config.rejection {
        Some(f) => f(&error).map(ResponseBody::rejection),
        None => {
            let mut r = Response::new(ResponseBody::rejection(Bytes::from_static(
                error.public_message().as_bytes(),
            )));
            *r.status_mut() = error.status();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
    };
    response.extensions_mut().insert(error);
    response
}

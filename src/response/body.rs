//! [`ResponseBody`]: the body of this crate's middleware responses — the inner service's
//! body, or the middleware's own answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

pin_project! {
    /// Response body of the crate's middleware: the inner service's body, or the
    /// middleware's own answer (see [`crate::response`]).
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Inner { #[pin] body: B },
        Fixed { body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            inner: Inner::Inner { body },
        }
    }

    pub(crate) fn fixed(body: Bytes) -> Self {
        Self {
            inner: Inner::Fixed {
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
            InnerProj::Fixed { body } => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Inner { body } => body.is_end_stream(),
            Inner::Fixed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Inner { body } => body.size_hint(),
            Inner::Fixed { body } => body.size_hint(),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

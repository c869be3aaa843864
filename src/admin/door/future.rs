//! [`ResponseFuture`]: the inner service's answer, or the door's own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::Response;
use pin_project_lite::pin_project;

pin_project! {
    /// Response future of the door's services ([`Bearer`](super::Bearer),
    /// [`SignIn`](super::SignIn)).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner { #[pin] future: F },
        Own { response: Option<Response> },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn inner(future: F) -> Self {
        Self {
            state: State::Inner { future },
        }
    }

    pub(super) fn own(response: Response) -> Self {
        Self {
            state: State::Own {
                response: Some(response),
            },
        }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx),
            StateProj::Own { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

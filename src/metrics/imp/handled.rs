//! A handler's future, its outcome counted as it ends.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::metrics::{self, Handler, Source};

pin_project! {
    /// A handler's future, its outcome counted as it ends (see `metrics::handled`).
    pub(in crate::metrics) struct Handled<F, P> {
        #[pin]
        future: F,
        source: Source,
        succeeded: P,
    }
}

impl<F, P> Handled<F, P> {
    pub(in crate::metrics) fn new(source: Source, future: F, succeeded: P) -> Self {
        Self {
            future,
            source,
            succeeded,
        }
    }
}

impl<F, P> Future for Handled<F, P>
where
    F: Future,
    P: Fn(&F::Output) -> bool,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        // The panic is counted, then goes on unwinding as it would have.
        let polled = catch_unwind(AssertUnwindSafe(|| this.future.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                let outcome = match (this.succeeded)(&output) {
                    true => Handler::Success,
                    false => Handler::Failure,
                };
                metrics::handler(this.source, outcome);
                Poll::Ready(output)
            }
            Err(panic) => {
                metrics::handler(this.source, Handler::Panic);
                resume_unwind(panic)
            }
        }
    }
}

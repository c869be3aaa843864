//! [`CollectBody`]: a request body gathered into one contiguous `Bytes` under a limit.
//!
//! Written here rather than taken from `http_body_util::Collect`: that one keeps every
//! frame until the end and then copies them all into one buffer, so a body is held twice
//! at its peak. Here a body of one frame is kept as it is (no copy), and a body of several
//! is copied frame by frame into one buffer grown with what arrives (never reserved from
//! its `Content-Length`, which a stalled sender need not honour), each frame freed as soon
//! as it is copied: a body costs at most twice what was received, plus one frame.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body;
use pin_project_lite::pin_project;

/// Why a body could not be collected.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CollectError {
    /// More than the limit arrived.
    TooLarge,
    /// The body failed (the connection broke).
    Read,
}

pin_project! {
    /// Collects `body`, failing once more than `limit` bytes arrived. Trailers are ignored.
    pub(super) struct CollectBody<B> {
        #[pin]
        body: B,
        limit: usize,
        // The first frame, kept whole while it is the only one.
        first: Option<Bytes>,
        // The frames copied into one buffer, from the second on.
        joined: BytesMut,
        received: usize,
    }
}

impl<B> CollectBody<B> {
    pub(super) fn new(body: B, limit: usize) -> Self {
        Self {
            body,
            limit,
            first: None,
            joined: BytesMut::new(),
            received: 0,
        }
    }
}

impl<B> Future for CollectBody<B>
where
    B: Body,
{
    type Output = Result<Bytes, CollectError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let Some(frame) = ready!(this.body.as_mut().poll_frame(cx)) else {
                let body = match this.first.take() {
                    Some(first) => first,
                    None => std::mem::take(this.joined).freeze(),
                };
                return Poll::Ready(Ok(body));
            };
            let Ok(mut data) = frame.map_err(|_| CollectError::Read)?.into_data() else {
                continue; // trailers
            };
            let len = data.remaining();
            *this.received = this.received.saturating_add(len);
            if *this.received > *this.limit {
                return Poll::Ready(Err(CollectError::TooLarge));
            }
            if len == 0 {
                continue;
            }
            if this.first.is_none() && this.joined.is_empty() {
                // `Bytes` hands itself over without a copy.
                *this.first = Some(data.copy_to_bytes(len));
                continue;
            }
            if let Some(first) = this.first.take() {
                // A second frame: one buffer, sized from what arrived, never from what the
                // body says is to come — a declared length is a promise a stalled sender
                // need not keep (200 stalled requests declaring 25 MiB held 5 GiB). The
                // buffer then doubles as frames arrive: at most twice what was received.
                this.joined.reserve(first.len() + len);
                this.joined.put(first);
            }
            this.joined.put(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use http_body::{Frame, SizeHint};
    use http_body_util::Full;

    use super::*;

    /// A body of the given frames; `declared`: it says how much is still to come (as a
    /// body with a `Content-Length` does).
    struct Frames {
        frames: VecDeque<Result<Bytes, ()>>,
        declared: bool,
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let next = self.frames.pop_front();
            Poll::Ready(next.map(|f| f.map(Frame::data).map_err(|()| "reset")))
        }

        fn size_hint(&self) -> SizeHint {
            let to_come = self.frames.iter().flatten().map(|f| f.len() as u64).sum();
            if self.declared {
                SizeHint::with_exact(to_come)
            } else {
                SizeHint::new()
            }
        }
    }

    fn frames(parts: &[&'static [u8]], declared: bool) -> Frames {
        Frames {
            frames: parts.iter().map(|p| Ok(Bytes::from_static(p))).collect(),
            declared,
        }
    }

    #[tokio::test]
    async fn one_frame_is_kept_without_a_copy() {
        let body = Bytes::from(b"{\"id\":1}".to_vec());
        let collected = CollectBody::new(Full::new(body.clone()), 100)
            .await
            .unwrap();
        assert_eq!(collected, body);
        assert_eq!(collected.as_ptr(), body.as_ptr(), "the same memory");
    }

    #[tokio::test]
    async fn frames_are_joined_into_one_buffer() {
        let collected = CollectBody::new(frames(&[b"ab", b"", b"cd", b"ef"], true), 100)
            .await
            .unwrap();
        assert_eq!(collected, "abcdef");
        // No size said: still joined, grown as needed.
        let collected = CollectBody::new(frames(&[b"ab", b"cd"], false), 100)
            .await
            .unwrap();
        assert_eq!(collected, "abcd");
        let empty = CollectBody::new(frames(&[], false), 100).await.unwrap();
        assert!(empty.is_empty());
    }

    #[tokio::test]
    async fn more_than_the_limit_is_refused_whatever_the_body_declared() {
        let under = CollectBody::new(frames(&[b"abc", b"de"], true), 5).await;
        assert_eq!(under.unwrap(), "abcde");
        let over = CollectBody::new(frames(&[b"abc", b"def"], false), 5).await;
        assert_eq!(over, Err(CollectError::TooLarge));
        let one_frame_over = CollectBody::new(frames(&[b"abcdef"], false), 5).await;
        assert_eq!(one_frame_over, Err(CollectError::TooLarge));
    }

    #[tokio::test]
    async fn a_failed_body_is_a_read_error() {
        let mut body = frames(&[b"abc"], false);
        body.frames.push_back(Err(()));
        assert_eq!(CollectBody::new(body, 100).await, Err(CollectError::Read));
    }

    /// Two small frames, then nothing: the body says 25 MiB are still to come.
    struct Stalled {
        frames: VecDeque<Bytes>,
    }

    impl Body for Stalled {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.frames.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(Frame::data(frame)))),
                None => Poll::Pending,
            }
        }

        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(25 * 1024 * 1024)
        }
    }

    #[test]
    fn a_stalled_body_holds_what_arrived_not_what_it_declared() {
        let body = Stalled {
            frames: [Bytes::from_static(b"{\"a\""), Bytes::from_static(b":1")].into(),
        };
        let mut collect = Box::pin(CollectBody::new(body, 25 * 1024 * 1024 + 10));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(collect.as_mut().poll(&mut cx).is_pending());
        let held = collect.joined.capacity();
        assert_eq!(collect.joined.len(), 6);
        assert!(held < 1024, "{held} bytes held for 6 received");
    }
}

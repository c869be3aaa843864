//! The messages a processor acknowledged unrun (fan-out): one key each in its bucket
//! `<stream>-passed` (`<stream>-passed-<name>` for another processor than `default`),
//! which its `processed` count is the stream less.
//!
//! A key is named after the message (its stream sequence) and written with the
//! acknowledgement, so a message handed out again finds its key and is counted once:
//! after an acknowledgement that did not land, or after one that landed — NATS 2.9
//! delivers an acknowledged message again, as a first delivery, when the client of the
//! pull that took it went away. A worker that dies between the two can only leave a pass
//! unrecorded. Keys age out with the stream's `max_age`, as their messages do.
//!
//! One write a pass, where a batched counter cost a share of one: a worker passing every
//! event drains at 0.57 of its rate running every event, where it drained at 0.78
//! (`cargo bench --bench jetstream_passes`, BENCHMARKS.md).

use async_nats::jetstream::kv::{self, CreateErrorKind};
use bytes::Bytes;

use crate::store::StoreError;

/// One processor's bucket of passes.
pub(super) struct Passes {
    bucket: kv::Store,
    /// The bucket's stream (`KV_<bucket>`): its message count is the count of passes.
    stream: String,
}

impl Passes {
    pub(super) fn new(bucket: kv::Store, name: &str) -> Self {
        Self {
            bucket,
            stream: format!("KV_{name}"),
        }
    }

    pub(super) fn stream(&self) -> &str {
        &self.stream
    }

    /// Records the pass of the message `key` names; `Ok` when it is recorded, now or before.
    pub(super) async fn record(&self, key: &str) -> Result<(), StoreError> {
        match self.bucket.create(key, Bytes::new()).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(StoreError::new("jetstream pass", e)),
        }
    }
}

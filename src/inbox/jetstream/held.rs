//! Deliveries that were not attempts. JetStream counts every delivery of a message, and a
//! message the processor snoozed ([`Later`](crate::inbox::Later)) comes back as another
//! delivery: how many of a message's deliveries were snoozes is kept in a key-value bucket
//! (`<stream>-held`, by stream sequence — with another processor's name before it:
//! `processors.rs`) and taken off its attempt number.
//!
//! A failed event that runs again in its worker without a delivery (it kept its object's
//! turn) is the other way round: an attempt that was no delivery, taken off the count.
//!
//! The count is read only for a message delivered more than once, and forgotten when the
//! message is acknowledged or dead. When the bucket cannot be written, the snooze still
//! happens and the next delivery counts as an attempt: an attempt too many, never one
//! too few.
//!
//! The bucket also keeps the objects' lines of a per-object cap of 1 (`turn.rs`), under
//! keys of their own (`turn.…`).

use super::JetStream;

/// How many deliveries of the message at `seq` were not attempts, less its attempts that
/// were not deliveries (0 when unknown).
pub(super) async fn count(js: &JetStream, seq: u64) -> i64 {
    match js.inner.held.get(js.lane.held_key(seq)).await {
        Ok(Some(value)) => std::str::from_utf8(&value)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

/// Records that the delivery being handed back is not an attempt: the message at `seq`
/// then has `before + 1` such deliveries. Said before the hand-back, so the next delivery
/// reads it.
pub(super) async fn add(js: &JetStream, seq: u64, before: i64) {
    let _ = set(js, seq, before + 1).await;
}

/// Records the count of the message at `seq` as `now`; `false` when the bucket did not
/// take it.
pub(super) async fn set(js: &JetStream, seq: u64, now: i64) -> bool {
    let key = js.lane.held_key(seq);
    js.inner.held.put(key, now.to_string().into()).await.is_ok()
}

/// Forgets the count of a message that is done (acknowledged or dead).
pub(super) async fn forget(js: &JetStream, seq: u64) {
    let _ = js.inner.held.purge(js.lane.held_key(seq)).await;
}

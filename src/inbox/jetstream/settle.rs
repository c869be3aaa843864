//! How a pulled message ends beside being processed: acknowledged, handed back, or moved
//! to another stream — buried in `<stream>-dead`, parked in `<stream>-paused` — and
//! published back from one.

use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use async_nats::HeaderMap;
use tokio::time::Instant;

use super::{header, JetStream};
use crate::inbox::message::one_line;
use crate::store::{retry_until, StoreError};

/// Acknowledges `message`, confirmed by the server, retried until `until`.
pub(super) async fn acknowledge(message: &Message, until: Instant) -> Result<(), StoreError> {
    retry_until(until, || async {
        message
            .double_ack()
            .await
            .map_err(|e| StoreError::new("jetstream ack", e))
    })
    .await
}

/// Acknowledges unrun `message`, which this processor does not run, and records it in the
/// processor's passes (`passes.rs`) under `key`, both at once and each retried until
/// `until`; the acknowledgement's result. A message that comes again finds its key; a
/// crash between the two can only leave it unrecorded (its processor's `processed` one
/// more), never recorded twice.
pub(super) async fn pass(
    js: &JetStream,
    message: &Message,
    key: &str,
    until: Instant,
) -> Result<(), StoreError> {
    let record = retry_until(until, || js.lane.pass(key));
    let (_recorded, acked) = tokio::join!(record, acknowledge(message, until));
    #[cfg(feature = "tracing")]
    if let (Err(_error), Ok(())) = (&_recorded, &acked) {
        tracing::warn!(target: "tower_webhook", "jetstream worker acknowledged a message unrun but could not record it: its processor's processed count is one more: {_error}");
    }
    acked
}

/// Hands `message` back for redelivery after `after` (at once: `None`), confirmed by the
/// server, retried until `until` (the lease's end: after it, JetStream redelivers it
/// anyway).
pub(super) async fn nak(
    message: &Message,
    after: Option<Duration>,
    until: Instant,
) -> Result<(), StoreError> {
    retry_until(until, || async {
        message
            .double_ack_with(AckKind::Nak(after))
            .await
            .map_err(|e| StoreError::new("jetstream nak", e))
    })
    .await
}

/// How long a message waits to be moved again when the other stream did not take it.
pub(super) const BURY_AGAIN: Duration = Duration::from_secs(5);

/// Publishes `message` to the dead stream with its error, then acknowledges it. When
/// the dead stream does not take it, it is handed back (and buried at its next delivery).
pub(super) async fn bury(
    js: &JetStream,
    message: &Message,
    error: &str,
    attempts: u32,
    until: Instant,
) -> Result<(), StoreError> {
    bury_as(js, message, one_line(error), attempts, until).await
}

/// [`bury`] with `error` as the header's value, as it is.
pub(super) async fn bury_as(
    js: &JetStream,
    message: &Message,
    error: String,
    attempts: u32,
    until: Instant,
) -> Result<(), StoreError> {
    let mut headers = message.headers.clone().unwrap_or_default();
    headers.insert(header::ERROR, error);
    headers.insert(header::ATTEMPTS, attempts.to_string());
    let dead = js.lane.dead_stream(&js.inner.stream);
    let moved = move_out(js, message, &dead, headers, until).await;
    if let Err(_error) = &moved {
        #[cfg(feature = "tracing")]
        tracing::error!(target: "tower_webhook", "jetstream worker could not move a dead event to the dead stream: {_error}");
    }
    moved
}

/// Moves `message` out of the stream into `to` (a stream beside it), with `headers`:
/// published there (confirmed), then acknowledged and deleted from the stream, so the
/// stream's counts no longer hold it — but with fan-out, where the other processors'
/// consumers still read it, only acknowledged. When `to` does not take it, it is handed
/// back for [`BURY_AGAIN`].
pub(super) async fn move_out(
    js: &JetStream,
    message: &Message,
    to: &str,
    mut headers: HeaderMap,
    until: Instant,
) -> Result<(), StoreError> {
    let seq = message.info().map(|info| info.stream_sequence).ok();
    // Named after the message, not its event: two messages of one event (accepted again
    // past the window) both move, and a message moved again after a crash lands once.
    if let (Some(seq), Some(id)) = (seq, headers.get(async_nats::header::NATS_MESSAGE_ID)) {
        let id = format!("{}:{seq}", id.as_str());
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
    }
    if let Err(error) = publish(js, message, (&js.inner.stream, to), headers).await {
        let _ = nak(message, Some(BURY_AGAIN), until).await;
        return Err(error);
    }
    acknowledge(message, until).await?;
    if js.inner.fan_out {
        return Ok(());
    }
    if let (Some(seq), Ok(stream)) = (
        seq,
        js.inner.context.get_stream_no_info(&*js.inner.stream).await,
    ) {
        let _ = stream.delete_message(seq).await;
    }
    Ok(())
}

/// Publishes `message`, read from the stream `from`, to the same subject under `to`,
/// with `headers`; returns once JetStream stored it, `false` when it had it already (a
/// duplicate of its `Nats-Msg-Id`).
pub(super) async fn publish(
    js: &JetStream,
    message: &Message,
    (from, to): (&str, &str),
    headers: HeaderMap,
) -> Result<bool, StoreError> {
    let rest = message
        .subject
        .strip_prefix(from)
        .map_or_else(|| format!(".{}", message.subject), str::to_owned);
    let err = |e: Box<dyn std::error::Error + Send + Sync>| StoreError::new("jetstream publish", e);
    let ack = js
        .inner
        .context
        .publish_with_headers(format!("{to}{rest}"), headers, message.payload.clone())
        .await
        .map_err(|e| err(e.into()))?
        .await
        .map_err(|e| err(e.into()))?;
    Ok(!ack.duplicate)
}

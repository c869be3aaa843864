//! Sealed messages (issue 34, `docs/design/payload-protection.md` §6): with a key ring
//! ([`JetStreamBuilder::with_keys`](super::JetStreamBuilder::with_keys), feature `seal`),
//! [`JetStream::accept`] publishes the body sealed, so the stream's files hold no
//! plaintext, and every read of a message opens it here, in [`event_of`] — the one place
//! the worker's pulls, its lines' catch-up, backfill and unparking go through (P7).
//!
//! - The payload is the XChaCha20-Poly1305 ciphertext of the body (framed, LZ4-compressed
//!   first when that shortens it, its tag appended: [`KeyRing::seal`](crate::seal::KeyRing::seal)),
//!   sealed under the ring's current key with the associated data (source, dedupe id,
//!   [`Column::Message`](crate::seal::Column::Message)); the key's id and the random nonce
//!   travel as the headers `Webhook-Key-Id` and `Webhook-Nonce` (standard base64). The
//!   other headers (source, id, type, object id, livemode, timestamp) and the subject stay
//!   in clear: consumers filter and route on them.
//! - The associated data names no stream, subject or sequence (P8): a message moved to
//!   `<stream>-dead` or `<stream>-paused`, published back when its pause ends, or copied
//!   for a backfill keeps its payload and headers as they are, and every copy still opens.
//! - A message without `Webhook-Key-Id` was published in clear (before keys were
//!   configured) and is read as it is.
//! - A message that does not open — its key is not in the ring (or there is no ring, or
//!   this build has no feature `seal`), or it was altered — is never given to a processor
//!   and never retried: each processor that could run it buries it in its dead stream at
//!   once with the reason, its payload and headers untouched, so the key configured again
//!   opens it there.
//! - A processor's error on a dead message (`Webhook-Error`) may quote the body: with a
//!   ring it is sealed too ([`error`]); the crate's own reasons stay in clear.

use async_nats::jetstream::Message;
use async_nats::HeaderMap;
use bytes::Bytes;
use tokio::time::Instant;

use super::processors::Lane;
use super::settle::{nak, pass, BURY_AGAIN};
use super::{header, JetStream};
use crate::inbox::message::{self, Keys};
pub(super) use crate::inbox::message::{Read, FOREIGN};
use crate::store::StoreError;
use crate::Event;

impl JetStream {
    /// The ring payloads are sealed and opened with.
    pub(super) fn keys(&self) -> Keys<'_> {
        #[cfg(feature = "seal")]
        return self.inner.keys.as_ref();
        #[cfg(not(feature = "seal"))]
        None
    }
}

/// The event a message carries, for the processor: its body opened when it was sealed.
pub(super) fn event_of(js: &JetStream, headers: Option<&HeaderMap>, payload: Bytes) -> Read {
    let Some(headers) = headers else {
        return Read::Foreign;
    };
    let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    message::read(get, payload, js.keys())
}

/// The payload [`JetStream::accept`] publishes for `event`: its body, or with a ring its
/// body sealed, the key id and nonce added to `headers`.
pub(super) fn payload(
    js: &JetStream,
    event: &Event,
    headers: &mut HeaderMap,
) -> Result<Bytes, StoreError> {
    #[cfg(feature = "seal")]
    if let Some(ring) = js.keys() {
        let (payload, key_id, nonce) = message::seal(ring, event, "jetstream seal")?;
        headers.insert(header::KEY_ID, key_id);
        headers.insert(header::NONCE, nonce);
        return Ok(payload);
    }
    let _ = (js, &headers);
    Ok(event.body().clone())
}

/// Whether `lane` could run a message whose body did not open, so it buries it: the
/// message is addressed to it and its type globs take the type header; its predicate,
/// which reads the body, cannot be asked, so a processor with one buries it too. (The
/// type an event is filtered on is the header's already: `event_of` reads it there.)
pub(super) fn may_take(lane: &Lane, headers: Option<&HeaderMap>) -> bool {
    let header = |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    header(header::PROCESSOR).is_none_or(|to| to == lane.name())
        && lane.spec().matches_type(header(header::TYPE))
}

/// Acknowledges unrun a message whose body did not open and that this processor would
/// not run ([`may_take`]), recorded with those it acknowledged unrun; handed back for a
/// while when the acknowledgement fails.
pub(super) async fn passed(js: &JetStream, message: &Message, until: Instant) {
    let seq = message.info().map(|i| i.stream_sequence.to_string());
    let passed = match seq {
        Ok(seq) => pass(js, message, &seq, until).await.is_ok(),
        Err(_) => false,
    };
    if !passed {
        let _ = nak(message, Some(BURY_AGAIN), until).await;
    }
}

/// A processor's error as the dead stream's `Webhook-Error` keeps it: one line, sealed with
/// a ring ([`message::error`]); the crate's own reasons (unreadable, crashed, not an
/// event, a panic) stay in clear.
pub(super) fn error(js: &JetStream, message: &Message, error: &str) -> String {
    let line = message::one_line(error);
    let Some(headers) = message.headers.as_ref() else {
        return line;
    };
    let get = |name| headers.get(name).map_or("", |v| v.as_str());
    let id = (get(header::SOURCE), get(header::ID));
    message::error(js.keys(), id, js.lane.name(), line)
}

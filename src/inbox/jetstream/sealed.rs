//! Sealed messages (issue 34, `docs/design/payload-protection.md` §6): with a key ring
//! ([`JetStreamBuilder::with_keys`](super::JetStreamBuilder::with_keys), feature `seal`),
//! [`JetStream::accept`] publishes the body sealed, so the stream's files hold no
//! plaintext, and every read of a message opens it here, in [`event_of`] — the one place
//! the worker's pulls, its lines' catch-up, backfill and unparking go through (P7).
//!
//! - The payload is the XChaCha20-Poly1305 ciphertext of the body (its tag appended),
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

use std::time::{Duration, SystemTime};

use async_nats::jetstream::Message;
use async_nats::HeaderMap;
use bytes::Bytes;
use tokio::time::Instant;

use super::processors::Lane;
use super::settle::{acknowledge, nak, BURY_AGAIN};
use super::{header, JetStream};
use crate::event::Stored;
use crate::metrics::Unreadable;
use crate::store::StoreError;
use crate::Event;

/// The id of the key a message's payload was sealed under; absent: published in clear.
pub(super) const KEY_ID: &str = "Webhook-Key-Id";
/// The sealed payload's 24-byte nonce, in standard base64.
pub(super) const NONCE: &str = "Webhook-Nonce";

/// What a message read from a stream holds.
pub(super) enum Read {
    /// An event, its body opened (or published in clear).
    Event(Event),
    /// Not a message this crate published: no source or id.
    Foreign,
    /// Sealed, and not opened: never given to a processor.
    Unreadable {
        /// Why, for the dead stream's `Webhook-Error` (crate text, the key id quoted).
        reason: String,
        /// Its kind, for the metrics.
        why: crate::metrics::Unreadable,
        /// The event's source, id and the rest of its headers, with an empty body: for
        /// what reads the headers alone (a pause's rules). Never a processor's.
        about: Event,
    },
}

impl Read {
    /// The event, when the message is one and it opened.
    pub(super) fn event(self) -> Option<Event> {
        match self {
            Read::Event(event) => Some(event),
            Read::Foreign | Read::Unreadable { .. } => None,
        }
    }

    /// What its headers say the event is (source, type, …), opened or not; the body is
    /// empty unless it opened.
    pub(super) fn about(&self) -> Option<&Event> {
        match self {
            Read::Event(event) | Read::Unreadable { about: event, .. } => Some(event),
            Read::Foreign => None,
        }
    }
}

/// Why a message that is not one of this crate's goes dead.
pub(super) const FOREIGN: &str =
    "not a tower-webhook event: no Webhook-Source or Webhook-Id header";

/// The event a message carries, for the processor: its body opened when it was sealed.
pub(super) fn event_of(js: &JetStream, headers: Option<&HeaderMap>, payload: Bytes) -> Read {
    let Some(headers) = headers else {
        return Read::Foreign;
    };
    let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    let (Some(source), Some(id)) = (get(header::SOURCE), get(header::ID)) else {
        return Read::Foreign;
    };
    let stored = |body| {
        Event::stored(Stored {
            source: source.clone(),
            id: id.clone(),
            event_type: get(header::TYPE),
            object_id: get(header::OBJECT_ID),
            livemode: get(header::LIVEMODE).and_then(|l| l.parse().ok()),
            timestamp: get(header::TIMESTAMP)
                .and_then(|t| t.parse().ok())
                .and_then(|secs| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))),
            body,
        })
    };
    let Some(key_id) = headers.get(KEY_ID).map(|k| k.as_str()) else {
        return Read::Event(stored(payload));
    };
    match open(js, (&source, &id), key_id, headers.get(NONCE), &payload) {
        Ok(body) => Read::Event(stored(body.into())),
        Err((why, reason)) => Read::Unreadable {
            reason: format!("the body cannot be opened: {reason}"),
            why,
            about: stored(Bytes::new()),
        },
    }
}

/// Opens a sealed payload with the ring; the reason it did not open, else.
#[cfg(feature = "seal")]
fn open(
    js: &JetStream,
    (source, id): (&str, &str),
    key_id: &str,
    nonce: Option<&async_nats::HeaderValue>,
    payload: &[u8],
) -> Result<Vec<u8>, (Unreadable, String)> {
    use base64::Engine as _;

    let Some(ring) = &js.inner.keys else {
        return Err((Unreadable::UnknownKey, unknown_key(key_id)));
    };
    // A nonce that is not base64 is no nonce: `open_parts` answers `Malformed`.
    let nonce = nonce
        .and_then(|n| {
            base64::engine::general_purpose::STANDARD
                .decode(n.as_str())
                .ok()
        })
        .unwrap_or_default();
    let aad = crate::seal::Aad::new(source, id, crate::seal::Column::Message);
    ring.open_parts(&aad, key_id, &nonce, payload)
        .map_err(|e| (Unreadable::of(e.kind()), e.to_string()))
}

/// Without the feature `seal` nothing opens: the message is a sealed one's, published by
/// a build with keys.
#[cfg(not(feature = "seal"))]
fn open(
    _: &JetStream,
    _: (&str, &str),
    key_id: &str,
    _: Option<&async_nats::HeaderValue>,
    _: &[u8],
) -> Result<Vec<u8>, (Unreadable, String)> {
    Err((Unreadable::UnknownKey, unknown_key(key_id)))
}

/// [`Unreadable`](crate::seal::Unreadable)'s text for an unknown key, for a reader with no
/// ring at all.
fn unknown_key(key_id: &str) -> String {
    // `{:?}`: the id is read from a message, so it is quoted and escaped.
    format!("sealed under key {key_id:?}, which no configured key has")
}

/// The payload [`JetStream::accept`] publishes for `event`: its body, or with a ring its
/// body sealed, the key id and nonce added to `headers`.
pub(super) fn payload(
    js: &JetStream,
    event: &Event,
    headers: &mut HeaderMap,
) -> Result<Bytes, StoreError> {
    #[cfg(feature = "seal")]
    if let Some(ring) = &js.inner.keys {
        use base64::Engine as _;

        let aad = crate::seal::Aad::new(
            event.source(),
            event.dedupe_id(),
            crate::seal::Column::Message,
        );
        let sealed = ring
            .seal(&aad, event.body())
            .map_err(|e| StoreError::new("jetstream seal", e))?;
        headers.insert(KEY_ID, sealed.key_id());
        let nonce = base64::engine::general_purpose::STANDARD.encode(sealed.nonce());
        headers.insert(NONCE, nonce);
        return Ok(sealed.into_ciphertext().into());
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
/// not run ([`may_take`]), counted with those it acknowledged unrun; handed back for a
/// while when the acknowledgement fails.
pub(super) async fn passed(js: &JetStream, message: &Message, until: Instant) {
    if acknowledge(message, until).await.is_ok() {
        js.lane.skip(&js.inner.held);
    } else {
        let _ = nak(message, Some(BURY_AGAIN), until).await;
    }
}

/// A processor's error as the dead stream's `Webhook-Error` keeps it: one line, and with a
/// ring sealed like the SQL stores' error text (`sealed:v1:<key id>:<base64 of nonce ‖
/// ciphertext>`, the associated data the event's source, id and
/// [`Column::Error`](crate::seal::Column::Error) of this processor): a processor's error
/// may quote the body (serde's errors quote the value they refused). The crate's own
/// reasons (unreadable, crashed, not an event, a panic) stay in clear.
pub(super) fn error(js: &JetStream, message: &Message, error: &str) -> String {
    let line = super::settle::one_line(error);
    // The one crate text a processor's outcome carries here (the SQL inbox's list of its
    // own texts, `sql::sealed::crate_text`, holds it too; the rest reach the dead stream
    // by other paths).
    #[cfg(feature = "seal")]
    if line == crate::inbox::process::PANICKED {
        return line;
    }
    #[cfg(feature = "seal")]
    if let (Some(ring), Some(headers)) = (&js.inner.keys, message.headers.as_ref()) {
        use base64::Engine as _;

        let get = |name| headers.get(name).map_or("", |v| v.as_str());
        let processor = js.lane.name();
        let column = crate::seal::Column::Error { processor };
        let aad = crate::seal::Aad::new(get(header::SOURCE), get(header::ID), column);
        return match ring.seal(&aad, line.as_bytes()) {
            Ok(sealed) => {
                let mut parts = sealed.nonce().to_vec();
                parts.extend_from_slice(sealed.ciphertext());
                let parts = base64::engine::general_purpose::STANDARD.encode(parts);
                format!("sealed:v1:{}:{parts}", sealed.key_id())
            }
            // Never the plaintext instead.
            Err(e) => format!("the processor's error could not be sealed: {e}"),
        };
    }
    let _ = (js, message);
    line
}

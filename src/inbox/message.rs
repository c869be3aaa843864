//! An event as a broker's message, written once for both brokers (NATS JetStream,
//! RabbitMQ): the headers it carries, a routing word, the event read back from its
//! headers and payload, and the payload sealed and opened with a key ring (feature
//! `seal`; `docs/design/payload-protection.md` §6).
//!
//! A sealed payload is the XChaCha20-Poly1305 ciphertext of the body (its tag appended),
//! sealed under the ring's current key with the associated data (source, dedupe id,
//! [`Column::Message`](crate::seal::Column::Message)); the key's id and the random nonce
//! travel as the headers `Webhook-Key-Id` and `Webhook-Nonce` (standard base64). The
//! associated data names no queue, stream or subject: a copy moved to a dead, delay or
//! parked queue still opens.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::event::Stored;
use crate::metrics::Unreadable;
use crate::Event;

/// The headers an accepted event carries beside its body.
pub(crate) mod header {
    pub(crate) const SOURCE: &str = "Webhook-Source";
    pub(crate) const ID: &str = "Webhook-Id";
    pub(crate) const TYPE: &str = "Webhook-Type";
    pub(crate) const OBJECT_ID: &str = "Webhook-Object-Id";
    pub(crate) const LIVEMODE: &str = "Webhook-Livemode";
    /// The event's signed timestamp, in Unix seconds, where its scheme has one.
    pub(crate) const TIMESTAMP: &str = "Webhook-Timestamp";
    /// On a dead message: the last attempt's error, and how many attempts there were.
    pub(crate) const ERROR: &str = "Webhook-Error";
    pub(crate) const ATTEMPTS: &str = "Webhook-Attempts";
    /// On a message parked or waiting out a delay: the attempts it had had.
    pub(crate) const PRIOR_ATTEMPTS: &str = "Webhook-Prior-Attempts";
    /// On a parked message published back with fan-out: the processor it is for.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // JetStream's fan-out
    pub(crate) const PROCESSOR: &str = "Webhook-Processor";
    /// On an invalid message: what its schema found (a JSON list of `{path, message}`).
    #[cfg_attr(not(feature = "schemas"), allow(dead_code))]
    pub(crate) const VALIDATION_ERRORS: &str = "Webhook-Validation-Errors";
    /// The id of the key a payload was sealed under; absent: published in clear.
    pub(crate) const KEY_ID: &str = "Webhook-Key-Id";
    /// The sealed payload's 24-byte nonce, in standard base64.
    pub(crate) const NONCE: &str = "Webhook-Nonce";
    /// The accept's span context (feature `otel`), W3C.
    pub(crate) const TRACEPARENT: &str = "traceparent";
    pub(crate) const TRACESTATE: &str = "tracestate";
}

/// Why a message that is not one of this crate's goes dead.
pub(crate) const FOREIGN: &str =
    "not a tower-webhook event: no Webhook-Source or Webhook-Id header";

/// One word of a subject or routing key: no dots, no wildcards, no whitespace, never
/// empty; at most 64 characters.
pub(crate) fn word(s: &str) -> String {
    let word: String = s
        .chars()
        .take(64)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '_',
        })
        .collect();
    if word.is_empty() {
        "_".to_owned()
    } else {
        word
    }
}

/// One line of text, 1024 characters at most, for a dead message's `Webhook-Error`: a
/// processor's error may hold anything.
pub(crate) fn one_line(error: &str) -> String {
    error
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(1024)
        .collect()
}

/// The ring a broker's payloads are sealed and opened with: `None`, in clear (and without
/// the feature `seal`, always in clear: a sealed message opens nowhere).
#[cfg(feature = "seal")]
pub(crate) type Keys<'a> = Option<&'a crate::seal::KeyRing>;
/// The ring a broker's payloads are sealed and opened with: without the feature `seal`,
/// none.
#[cfg(not(feature = "seal"))]
pub(crate) type Keys<'a> = Option<&'a std::convert::Infallible>;

/// What a message read from a broker holds.
pub(crate) enum Read {
    /// An event, its body opened (or published in clear).
    Event(Event),
    /// Not a message this crate published: no source or id.
    Foreign,
    /// Sealed, and not opened: never given to a processor.
    Unreadable {
        /// Why, for the dead message's `Webhook-Error` (crate text, the key id quoted).
        reason: String,
        /// Its kind, for the metrics.
        why: Unreadable,
        /// The event's source, id and the rest of its headers, with an empty body: for
        /// what reads the headers alone (a pause's rules). Never a processor's.
        about: Event,
    },
}

impl Read {
    /// The event, when the message is one and it opened.
    pub(crate) fn event(self) -> Option<Event> {
        match self {
            Read::Event(event) => Some(event),
            Read::Foreign | Read::Unreadable { .. } => None,
        }
    }

    /// What its headers say the event is (source, type, …), opened or not; the body is
    /// empty unless it opened.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // JetStream's pauses
    pub(crate) fn about(&self) -> Option<&Event> {
        match self {
            Read::Event(event) | Read::Unreadable { about: event, .. } => Some(event),
            Read::Foreign => None,
        }
    }
}

/// The event a message carries, `get` reading its headers: its body the payload, opened
/// with `keys` when it was sealed (a `Webhook-Key-Id` header); a message published in
/// clear is read as it is.
pub(crate) fn read(get: impl Fn(&str) -> Option<String>, payload: Bytes, keys: Keys<'_>) -> Read {
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
    let Some(key_id) = get(header::KEY_ID) else {
        return Read::Event(stored(payload));
    };
    let nonce = get(header::NONCE);
    match open(keys, (&source, &id), &key_id, nonce.as_deref(), &payload) {
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
    keys: Keys<'_>,
    (source, id): (&str, &str),
    key_id: &str,
    nonce: Option<&str>,
    payload: &[u8],
) -> Result<Vec<u8>, (Unreadable, String)> {
    use base64::Engine as _;

    let Some(ring) = keys else {
        return Err((Unreadable::UnknownKey, unknown_key(key_id)));
    };
    // A nonce that is not base64 is no nonce: `open_parts` answers `Malformed`.
    let nonce = nonce
        .and_then(|n| base64::engine::general_purpose::STANDARD.decode(n).ok())
        .unwrap_or_default();
    let aad = crate::seal::Aad::new(source, id, crate::seal::Column::Message);
    ring.open_parts(&aad, key_id, &nonce, payload)
        .map_err(|e| (Unreadable::of(e.kind()), e.to_string()))
}

/// Without the feature `seal` nothing opens: the message is a sealed one's, published by
/// a build with keys.
#[cfg(not(feature = "seal"))]
fn open(
    _: Keys<'_>,
    _: (&str, &str),
    key_id: &str,
    _: Option<&str>,
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

/// An event's body as a broker's payload: with a ring, sealed, the key id and the nonce
/// (standard base64) to go in the headers [`header::KEY_ID`] and [`header::NONCE`].
///
/// # Errors
///
/// When the ring cannot seal (`what` names the broker in the error).
#[cfg(feature = "seal")]
pub(crate) fn seal(
    ring: &crate::seal::KeyRing,
    event: &Event,
    what: &'static str,
) -> Result<(Bytes, String, String), crate::store::StoreError> {
    use base64::Engine as _;

    let column = crate::seal::Column::Message;
    let aad = crate::seal::Aad::new(event.source(), event.dedupe_id(), column);
    let sealed = ring
        .seal(&aad, event.body())
        .map_err(|e| crate::store::StoreError::new(what, e))?;
    let key_id = sealed.key_id().to_owned();
    let nonce = base64::engine::general_purpose::STANDARD.encode(sealed.nonce());
    Ok((sealed.into_ciphertext().into(), key_id, nonce))
}

/// A processor's error (one line already) as a dead message's `Webhook-Error` keeps it:
/// with a ring sealed like the SQL stores' error text (`sealed:v1:<key id>:<base64 of
/// nonce ‖ ciphertext>`, the associated data the event's source, id and
/// [`Column::Error`](crate::seal::Column::Error) of `processor`): a processor's error may
/// quote the body (serde's errors quote the value they refused). The crate's own text for
/// a panic stays in clear.
pub(crate) fn error(
    keys: Keys<'_>,
    (source, id): (&str, &str),
    processor: &str,
    line: String,
) -> String {
    // The one crate text a processor's outcome carries (the SQL inbox's list of its own
    // texts, `sql::sealed::crate_text`, holds it too; the rest reach the dead queue by
    // other paths).
    #[cfg(feature = "seal")]
    if let (Some(ring), false) = (keys, line == crate::inbox::process::PANICKED) {
        use base64::Engine as _;

        let column = crate::seal::Column::Error { processor };
        let aad = crate::seal::Aad::new(source, id, column);
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
    let _ = (keys, source, id, processor);
    line
}

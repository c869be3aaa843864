//! Sealing payloads at rest: XChaCha20-Poly1305 under a ring of rotating keys (feature
//! `seal`).
//!
//! The groundwork of payload protection (issue 34; the plan is
//! `docs/design/payload-protection.md`): the stores do not call it yet. What it gives:
//!
//! - [`Key`]: 32 bytes and an id, wiped on drop, never printed.
//! - [`KeyRing`]: the current key seals, every key opens; built from keys or parsed from
//!   the receiver's `WEBHOOK_ENCRYPTION_KEYS` (`id:<base64>,…`). Bad configuration is a
//!   [`ConfigError`](crate::ConfigError) at start, naming the entry, never the key.
//! - [`KeyRing::seal`] → [`Sealed`]: the key id, a random 24-byte nonce, the ciphertext
//!   with its 16-byte tag, to store in their own columns.
//! - [`KeyRing::open`] → the plaintext, or [`Unreadable`]: a key id the ring lacks, or a
//!   tag that does not verify. The inbox turns it into a visible terminal state, never a
//!   deletion and never a retry.
//!
//! # Associated data
//!
//! Every ciphertext is bound to the event and the column it is stored for, by an [`Aad`]:
//! the source, the event id and the [`Column`] (a route's error text also by its
//! processor), each length-prefixed after a version tag, so no choice of strings makes
//! two different triples encode alike (with a separator, source `a|b` and id `c` would
//! meet source `a` and id `b|c`). The associated data is not stored: the reader rebuilds
//! it from the row it read, so a ciphertext copied into another row or column fails its
//! tag.
//!
//! ```
//! use tower_webhook::seal::{Aad, Column, Key, KeyRing, UnreadableKind};
//!
//! let old = KeyRing::new([Key::new("k1", [1; 32])?])?;
//! let aad = Aad::new("github", "delivery-7", Column::Body);
//! let sealed = old.seal(&aad, b"payload")?;
//!
//! // Rotation: the new key first; the old one still opens what it sealed.
//! let rotated = KeyRing::new([Key::new("k2", [2; 32])?, Key::new("k1", [1; 32])?])?;
//! assert_eq!(rotated.open(&aad, &sealed)?, b"payload");
//! assert!(rotated.needs_rekey(sealed.key_id()));
//!
//! // The old key removed before a rekey rewrote the row: unreadable, and it says which.
//! let without_k1 = KeyRing::new([Key::new("k2", [2; 32])?])?;
//! let err = without_k1.open(&aad, &sealed).unwrap_err();
//! assert_eq!(err.kind(), UnreadableKind::UnknownKey);
//! assert_eq!(err.key_id(), "k1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Security
//!
//! Keys are wiped on drop (and each call's cipher copy with them) and never appear in
//! `Debug`, `Display` or an error. What sealing does not cover: plaintext in the process's
//! memory while an event is accepted or processed, the processor's own logs, and the
//! provider's copy.

use std::fmt;

mod frame;
mod key;
mod ring;
#[cfg(test)]
mod tests;

pub use key::{Key, KEY_BYTES, MAX_KEY_ID_BYTES};
pub use ring::KeyRing;

/// The nonce's length: XChaCha20-Poly1305's 192 bits, random per seal.
pub const NONCE_BYTES: usize = 24;

/// The tag's length, appended to each ciphertext. A ciphertext is one byte saying how the
/// payload follows, the payload (as it is, or its length in 4 bytes and its LZ4 block),
/// and this: a payload sealed as it is grows by 17 bytes.
pub const TAG_BYTES: usize = 16;

/// What a ciphertext is stored as: each a distinct part of the associated data, so a
/// ciphertext of one column never opens as another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Column<'a> {
    /// The event's raw body (`webhook_bodies.body`).
    Body,
    /// The event's stored request headers (`webhook_bodies.headers`).
    Headers,
    /// A processor's error text for the event (a route's `processing_error` and its
    /// attempts' `error`): bound to the processor too, so one route's error cannot be
    /// shown as another's.
    Error {
        /// The route's processor.
        processor: &'a str,
    },
    /// The message JetStream stores for the event (body and headers, one payload).
    Message,
    /// The subject the application named at accept (a customer id), sealed so a rekey can
    /// compute its keyed digest under the new key.
    Subject,
}

impl Column<'_> {
    /// The name encoded in the associated data (stable: changing one makes every stored
    /// ciphertext of that column unreadable).
    fn name(&self) -> &'static str {
        match self {
            Column::Body => "body",
            Column::Headers => "headers",
            Column::Error { .. } => "error",
            Column::Message => "message",
            Column::Subject => "subject",
        }
    }
}

/// The associated data of one ciphertext: which event (source, id) and which [`Column`]
/// it belongs to. See [the module docs](self#associated-data) for the encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aad<'a> {
    source: &'a str,
    event_id: &'a str,
    column: Column<'a>,
}

impl<'a> Aad<'a> {
    /// The associated data of event `(source, event_id)`'s `column`.
    #[must_use]
    pub fn new(source: &'a str, event_id: &'a str, column: Column<'a>) -> Self {
        Self {
            source,
            event_id,
            column,
        }
    }

    /// The bytes authenticated: a version tag, then each part as its length (8 bytes,
    /// big-endian) and its bytes: source, event id, column name, and for an error its
    /// processor. Unambiguous: the lengths say where each part ends.
    fn encode(&self) -> Vec<u8> {
        let processor = match self.column {
            Column::Error { processor } => Some(processor),
            _ => None,
        };
        let parts = [
            Some(self.source),
            Some(self.event_id),
            Some(self.column.name()),
            processor,
        ];
        let mut out = Vec::with_capacity(64 + self.source.len() + self.event_id.len());
        // v2: the plaintext is framed (`frame.rs`); a v1 ciphertext does not open as one.
        out.extend_from_slice(b"tower-webhook seal v2");
        for part in parts.into_iter().flatten() {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out
    }
}

/// A sealed payload: the id of the key that sealed it, its nonce, and the ciphertext with
/// its tag appended, each stored in a column of its own. `Debug` prints the key id and
/// the lengths.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    key_id: Box<str>,
    nonce: [u8; NONCE_BYTES],
    ciphertext: Vec<u8>,
}

impl Sealed {
    /// The id of the key that sealed it.
    #[must_use]
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The random nonce it was sealed with.
    #[must_use]
    pub fn nonce(&self) -> &[u8; NONCE_BYTES] {
        &self.nonce
    }

    /// The ciphertext, tag included.
    #[must_use]
    pub fn ciphertext(&self) -> &[u8] {
        &self.ciphertext
    }

    /// The ciphertext, tag included, by value.
    #[must_use]
    pub fn into_ciphertext(self) -> Vec<u8> {
        self.ciphertext
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id)
            .field("ciphertext_len", &self.ciphertext.len())
            .finish_non_exhaustive()
    }
}

/// Why [`KeyRing::seal`] could not seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealError {
    /// The system's random source failed: no nonce, so nothing was sealed.
    Random,
    /// The plaintext is longer than XChaCha20-Poly1305 takes.
    TooLong,
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SealError::Random => "could not seal: the system's random source failed",
            SealError::TooLong => "could not seal: the payload is too long for the cipher",
        })
    }
}

impl std::error::Error for SealError {}

/// A stored ciphertext no configured key opens: the inbox shows it as a terminal state
/// (`unreadable`, with [`key_id`](Self::key_id)), never deletes it and never retries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    kind: UnreadableKind,
    key_id: Box<str>,
}

/// The kinds of [`Unreadable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnreadableKind {
    /// No key of the ring has the stored key id: removed before a rekey reached this
    /// ciphertext, or never configured on this replica.
    UnknownKey,
    /// The key opened nothing: the ciphertext or its nonce was altered, it was moved from
    /// another event or column, or another key was configured under the same id.
    Tampered,
    /// The stored parts cannot be a ciphertext (a nonce not 24 bytes, a ciphertext
    /// shorter than its tag), or the tag verified but what it sealed is not a payload
    /// framed as [`KeyRing::seal`] frames one (a format this build does not know).
    Malformed,
}

impl Unreadable {
    fn new(kind: UnreadableKind, key_id: &str) -> Self {
        Self {
            kind,
            key_id: key_id.into(),
        }
    }

    /// Why it did not open.
    #[must_use]
    pub fn kind(&self) -> UnreadableKind {
        self.kind
    }

    /// The key id stored beside the ciphertext (not secret): the key an operator must
    /// configure again, for [`UnreadableKind::UnknownKey`].
    #[must_use]
    pub fn key_id(&self) -> &str {
        &self.key_id
    }
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}`: a stored id comes from the database, so it is quoted and escaped.
        let id = &self.key_id;
        match self.kind {
            UnreadableKind::UnknownKey => write!(f, "sealed under key {id:?}, which no configured key has"),
            UnreadableKind::Tampered => write!(
                f,
                "sealed under key {id:?} but it does not open: altered, moved from another event or column, or another key under that id"
            ),
            UnreadableKind::Malformed => write!(f, "sealed under key {id:?} but not a ciphertext"),
        }
    }
}

impl std::error::Error for Unreadable {}

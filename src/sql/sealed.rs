//! Opening what the SQL inbox sealed (issue 34, `docs/design/payload-protection.md` §3–§5):
//! one function per kind of stored value, so no read path forgets one. Every read of a
//! body, its headers or an error text goes through here — a claim's bodies
//! ([`open_body`]), one event whole and the listings ([`open_error`]), backfill's
//! candidates.
//!
//! - A body row with a `key_id` is sealed: its body (and its headers, in
//!   `sealed_headers`) opens under that key with the associated data (source, id,
//!   column) rebuilt from the row. Without the key — removed, never configured, no ring,
//!   or a build without the feature `seal` — or altered, it does not open: the reason is
//!   crate text quoting the key id, never a byte of the payload.
//! - An error text is sealed in its own `TEXT` column as `sealed:v1:<key id>:<base64 of
//!   nonce ‖ ciphertext>` (P3): the statements that append `; then <the crate's text>` in
//!   SQL keep working, and the reader opens the leading token and keeps what follows it.
//!   Text without the prefix was stored in clear and is read as it is.

use base64::Engine as _;

use crate::metrics::Unreadable;

/// The keys an inbox opens with: `None` when it has none (or the build has no feature
/// `seal`, where there can be none).
#[cfg(feature = "seal")]
pub(crate) type Ring = Option<crate::seal::KeyRing>;
/// The keys an inbox opens with: none without the feature `seal`.
#[cfg(not(feature = "seal"))]
pub(crate) type Ring = Option<NoKeys>;

/// No key ring: a build without the feature `seal` (uninhabited; `Clone`, not `Copy`, as
/// a ring is).
#[cfg(not(feature = "seal"))]
#[derive(Clone, Debug)]
pub(crate) enum NoKeys {}

/// What a sealed error text starts with.
pub(crate) const ERROR_PREFIX: &str = "sealed:v1:";

/// A body as its row stores it: in clear (`key_id` NULL) or sealed; the plaintext, or
/// why it does not open (the route's dead reason, and its kind for the metrics).
pub(crate) fn open_body(
    ring: &Ring,
    source: &str,
    id: &str,
    key_id: Option<&str>,
    nonce: Option<&[u8]>,
    body: Vec<u8>,
) -> Result<Vec<u8>, (Unreadable, String)> {
    let Some(key_id) = key_id else {
        return Ok(body);
    };
    open(
        ring,
        source,
        id,
        Part::Body,
        key_id,
        nonce.unwrap_or_default(),
        &body,
    )
    .map_err(|(kind, why)| (kind, format!("the body cannot be opened: {why}")))
}

/// Stored headers: the clear text, or the sealed ones opened; `None` when there are none
/// or they do not open (the body, sealed under the same key, says why).
pub(crate) fn open_headers(
    ring: &Ring,
    source: &str,
    id: &str,
    key_id: Option<&str>,
    clear: Option<String>,
    sealed: Option<(&[u8], &[u8])>,
) -> Option<String> {
    match (key_id, sealed) {
        (Some(key_id), Some((nonce, ciphertext))) => {
            let opened = open(ring, source, id, Part::Headers, key_id, nonce, ciphertext).ok()?;
            String::from_utf8(opened).ok()
        }
        _ => clear,
    }
}

/// An error text as stored: in clear as it is, sealed opened (what SQL appended after
/// the sealed token kept as it is); one that does not open reads
/// `[unreadable: <why>]`, so a listing still answers.
pub(crate) fn open_error(
    ring: &Ring,
    source: &str,
    id: &str,
    processor: &str,
    text: String,
) -> String {
    let Some((key_id, sealed, rest)) = parse_error(&text) else {
        return text;
    };
    match open_token(ring, source, id, processor, key_id, sealed) {
        Ok(plain) => format!("{plain}{rest}"),
        Err(why) => format!("[unreadable: {why}]{rest}"),
    }
}

/// A sealed error token's base64 (`nonce ‖ ciphertext`) opened as text; why not, else.
fn open_token(
    ring: &Ring,
    source: &str,
    id: &str,
    processor: &str,
    key_id: &str,
    sealed: &str,
) -> Result<String, String> {
    base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .map_err(|_| format!("sealed under key {key_id:?} but not a ciphertext"))
        .and_then(|bytes| {
            let at = NONCE_BYTES.min(bytes.len());
            let (nonce, ciphertext) = bytes.split_at(at);
            let part = Part::Error(processor);
            open(ring, source, id, part, key_id, nonce, ciphertext).map_err(|(_, why)| why)
        })
        .and_then(|plain| String::from_utf8(plain).map_err(|_| "not text".to_owned()))
}

/// [`open_token`] with a ring: rekey's.
#[cfg(feature = "seal")]
pub(super) fn open_sealed_error(
    ring: &crate::seal::KeyRing,
    source: &str,
    id: &str,
    processor: &str,
    key_id: &str,
    sealed: &str,
) -> Result<String, String> {
    open_token(&Some(ring.clone()), source, id, processor, key_id, sealed)
}

/// A sealed error text's key id, its base64, and what follows it.
pub(super) fn parse_error(text: &str) -> Option<(&str, &str, &str)> {
    let rest = text.strip_prefix(ERROR_PREFIX)?;
    let (key_id, rest) = rest.split_once(':')?;
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=')))
        .unwrap_or(rest.len());
    Some((key_id, &rest[..end], &rest[end..]))
}

/// An error text sealed under the ring's current key, in the `TEXT` encoding
/// [`open_error`] reads. A seal that fails (the system's random source) stores the
/// crate's own text in its place, never the plaintext.
#[cfg(feature = "seal")]
pub(crate) fn seal_error(
    ring: &crate::seal::KeyRing,
    source: &str,
    id: &str,
    processor: &str,
    text: &str,
) -> String {
    try_seal_error(ring, source, id, processor, text).unwrap_or_else(|e| format!("{NOT_STORED}{e}"))
}

/// What an error text that could not be sealed is stored as, before why (crate text).
pub(super) const NOT_STORED: &str = "the processor's error was not stored: ";

/// [`seal_error`], or why it could not seal (rekey keeps the old text then).
#[cfg(feature = "seal")]
pub(super) fn try_seal_error(
    ring: &crate::seal::KeyRing,
    source: &str,
    id: &str,
    processor: &str,
    text: &str,
) -> Result<String, crate::seal::SealError> {
    use crate::seal::{Aad, Column};
    let aad = Aad::new(source, id, Column::Error { processor });
    let sealed = ring.seal(&aad, text.as_bytes())?;
    let mut bytes = Vec::with_capacity(NONCE_BYTES + sealed.ciphertext().len());
    bytes.extend_from_slice(sealed.nonce());
    bytes.extend_from_slice(sealed.ciphertext());
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(format!("{ERROR_PREFIX}{}:{b64}", sealed.key_id()))
}

/// Whether `text` is one of the crate's own error texts, which name no payload and are
/// stored in clear on purpose, so an operator reads why a route died even without its key:
/// a crash, a shutdown, a panic, why a body was never run. The one list: the worker's
/// outcomes ([`Inbox::sealed_outcome`](crate::inbox::Inbox)) and rekey both ask it, and
/// so does an outcome on an event erased or expired meanwhile, which keeps only these
/// (P11).
pub(crate) fn crate_text(text: &str) -> bool {
    use crate::inbox::BodyState;
    text == super::CRASHED
        || text == super::ABANDONED
        || text == crate::inbox::PANICKED
        || text.starts_with("the body cannot be opened: sealed under key ")
        || text.starts_with(NOT_STORED)
        || [BodyState::Expired, BodyState::Erased, BodyState::Missing]
            .into_iter()
            .any(|state| state.dead_reason() == Some(text))
}

/// XChaCha20-Poly1305's nonce length.
const NONCE_BYTES: usize = 24;

/// Which stored value a ciphertext is.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "seal"), allow(dead_code))] // nothing opens without it
enum Part<'a> {
    Body,
    Headers,
    Error(&'a str),
}

/// Opens one stored ciphertext; why not, else.
#[cfg(feature = "seal")]
fn open(
    ring: &Ring,
    source: &str,
    id: &str,
    part: Part<'_>,
    key_id: &str,
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<Vec<u8>, (Unreadable, String)> {
    use crate::seal::{Aad, Column};
    let Some(ring) = ring else {
        return Err((Unreadable::UnknownKey, unknown_key(key_id)));
    };
    let column = match part {
        Part::Body => Column::Body,
        Part::Headers => Column::Headers,
        Part::Error(processor) => Column::Error { processor },
    };
    ring.open_parts(&Aad::new(source, id, column), key_id, nonce, ciphertext)
        .map_err(|e| (Unreadable::of(e.kind()), e.to_string()))
}

/// Opens nothing: a build without the feature `seal` has no key.
#[cfg(not(feature = "seal"))]
fn open(
    _: &Ring,
    _: &str,
    _: &str,
    _: Part<'_>,
    key_id: &str,
    _: &[u8],
    _: &[u8],
) -> Result<Vec<u8>, (Unreadable, String)> {
    Err((Unreadable::UnknownKey, unknown_key(key_id)))
}

/// Why a ciphertext under `key_id` does not open when no key has that id (as
/// [`Unreadable`](crate::seal)'s text).
fn unknown_key(key_id: &str) -> String {
    format!("sealed under key {key_id:?}, which no configured key has")
}

#[cfg(all(test, feature = "seal"))]
mod tests {
    use super::*;
    use crate::seal::{Key, KeyRing};

    fn ring(id: &str, byte: u8) -> Ring {
        Some(KeyRing::new([Key::new(id, [byte; 32]).unwrap()]).unwrap())
    }

    #[test]
    fn an_error_sealed_opens_with_what_sql_appended_and_only_for_its_route() {
        let k1 = ring("k1", 1);
        let text = "invalid type: string \"ada@example.com\"";
        let sealed = seal_error(k1.as_ref().unwrap(), "s", "evt_1", "billing", text);
        assert!(
            sealed.starts_with("sealed:v1:k1:") && !sealed.contains("ada@"),
            "{sealed}"
        );
        let appended = format!("{sealed}; then the last attempt ended without an outcome");
        assert_eq!(
            open_error(&k1, "s", "evt_1", "billing", appended),
            format!("{text}; then the last attempt ended without an outcome")
        );
        // Another processor's route, another event, another key: unreadable, said so.
        let other = open_error(&k1, "s", "evt_1", "email", sealed.clone());
        assert!(
            other.starts_with("[unreadable: sealed under key \"k1\" but it does not open"),
            "{other}"
        );
        let moved = open_error(&k1, "s", "evt_2", "billing", sealed.clone());
        assert!(moved.starts_with("[unreadable:"), "{moved}");
        assert_eq!(
            open_error(&ring("k2", 2), "s", "evt_1", "billing", sealed.clone()),
            "[unreadable: sealed under key \"k1\", which no configured key has]"
        );
        assert_eq!(
            open_error(&None, "s", "evt_1", "billing", sealed),
            "[unreadable: sealed under key \"k1\", which no configured key has]"
        );
        assert_eq!(
            open_error(&k1, "s", "evt_1", "billing", "HTTP 502".into()),
            "HTTP 502"
        );
    }

    #[test]
    fn a_body_in_clear_reads_as_it_is_and_a_sealed_one_only_with_its_key() {
        let k1 = ring("k1", 1);
        assert_eq!(
            open_body(&None, "s", "e", None, None, b"{}".to_vec()),
            Ok(b"{}".to_vec())
        );
        let aad = crate::seal::Aad::new("s", "e", crate::seal::Column::Body);
        let sealed = k1.as_ref().unwrap().seal(&aad, b"{}").unwrap();
        let (nonce, ct) = (sealed.nonce().as_slice(), sealed.ciphertext().to_vec());
        assert_eq!(
            open_body(&k1, "s", "e", Some("k1"), Some(nonce), ct.clone()),
            Ok(b"{}".to_vec())
        );
        assert_eq!(
            open_body(&None, "s", "e", Some("k1"), Some(nonce), ct.clone()).unwrap_err(),
            (
                Unreadable::UnknownKey,
                "the body cannot be opened: sealed under key \"k1\", which no configured key has"
                    .to_owned()
            )
        );
        let (kind, swapped) =
            open_body(&k1, "s", "other", Some("k1"), Some(nonce), ct).unwrap_err();
        assert_eq!(kind, Unreadable::Tampered);
        assert!(swapped.contains("does not open"), "{swapped}");
    }
}

//! One encryption key: 32 bytes and the id stored beside every ciphertext it seals.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::error::{ConfigError, ConfigErrorKind};

/// How many bytes a key has (XChaCha20-Poly1305's key size).
pub const KEY_BYTES: usize = 32;

/// The longest key id: it is stored beside every ciphertext, so it stays short.
pub const MAX_KEY_ID_BYTES: usize = 32;

/// A 32-byte XChaCha20-Poly1305 key and its id.
///
/// The id is stored in clear beside each ciphertext the key seals, so the ring knows which
/// key opens it; it names a key, it is not secret. The bytes are wiped when the key is
/// dropped, and neither `Debug` nor any error prints them.
///
/// ```
/// use tower_webhook::seal::Key;
///
/// let key = Key::new("2026-12", [7; 32])?;
/// assert_eq!(key.id(), "2026-12");
/// assert!(!format!("{key:?}").contains("7, 7"));
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
pub struct Key {
    id: Box<str>,
    bytes: Zeroizing<[u8; KEY_BYTES]>,
}

impl Key {
    /// A key from its id and bytes.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidEncryptionKey`] when the id is empty, longer than
    /// [`MAX_KEY_ID_BYTES`], or has a character outside `A-Z a-z 0-9 . _ -` (the id is a
    /// column value, and `,` and `:` separate entries of `WEBHOOK_ENCRYPTION_KEYS`).
    pub fn new(id: impl Into<String>, bytes: [u8; KEY_BYTES]) -> Result<Self, ConfigError> {
        // Wrapped before anything can return early, so the caller's copy is the only one
        // left unwiped.
        let bytes = Zeroizing::new(bytes);
        let id = id.into();
        check_id(&id)?;
        Ok(Self {
            id: id.into_boxed_str(),
            bytes,
        })
    }

    /// A key from its id and a slice of exactly [`KEY_BYTES`] bytes.
    ///
    /// # Errors
    ///
    /// As [`Key::new`], and [`ConfigErrorKind::InvalidEncryptionKey`] when `bytes` is not
    /// 32 bytes long (the message says how long it was, never what it held).
    pub fn from_slice(id: impl Into<String>, bytes: &[u8]) -> Result<Self, ConfigError> {
        let Ok(array) = <[u8; KEY_BYTES]>::try_from(bytes) else {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidEncryptionKey,
                format!(
                    "an encryption key must be {KEY_BYTES} bytes, not {}",
                    bytes.len()
                ),
            ));
        };
        Self::new(id, array)
    }

    /// The key's id, as stored beside its ciphertexts.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key's bytes, for the cipher (never printed).
    pub(super) fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.bytes
    }

    /// A keyed digest of an application's subject (a customer id), for erasure by
    /// subject: HMAC-SHA256 under a key derived from this one for digests alone (domain
    /// separated from the cipher's use of the bytes), over the subject length-prefixed.
    #[must_use]
    pub fn subject_digest(&self, subject: &str) -> [u8; 32] {
        let mut derive = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.bytes[..])
            .expect("HMAC takes any key length");
        derive.update(b"tower-webhook subject digest key v1");
        let digest_key = Zeroizing::new(<[u8; 32]>::from(derive.finalize().into_bytes()));
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&digest_key[..])
            .expect("HMAC takes any key length");
        mac.update(&(subject.len() as u64).to_be_bytes());
        mac.update(subject.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl Zeroize for Key {
    /// Wipes the bytes (the id, not secret, stays).
    fn zeroize(&mut self) {
        self.bytes.zeroize();
    }
}

// `Zeroizing` wipes the bytes when the key is dropped.
impl ZeroizeOnDrop for Key {}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .field("bytes", &"[redacted]")
            .finish()
    }
}

/// A key id: 1 to [`MAX_KEY_ID_BYTES`] characters of `A-Z a-z 0-9 . _ -`.
pub(super) fn check_id(id: &str) -> Result<(), ConfigError> {
    let allowed = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
    if id.is_empty() || id.len() > MAX_KEY_ID_BYTES || !id.bytes().all(allowed) {
        // The id is not printed: a malformed one may be a pasted key.
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidEncryptionKey,
            format!(
                "an encryption key's id must be 1 to {MAX_KEY_ID_BYTES} characters of \
                 A-Z a-z 0-9 . _ -"
            ),
        ));
    }
    Ok(())
}

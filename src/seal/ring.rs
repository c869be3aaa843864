//! [`KeyRing`]: the keys a store seals and opens with, and `WEBHOOK_ENCRYPTION_KEYS`'
//! format.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use chacha20poly1305::aead::{AeadInOut, Generate, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use super::frame;
use super::key::{check_id, Key, KEY_BYTES};
use super::{Aad, SealError, Sealed, Unreadable, UnreadableKind, NONCE_BYTES, TAG_BYTES};
use crate::error::{ConfigError, ConfigErrorKind};

/// The keys payloads are sealed and opened with: the first, the **current** key, seals;
/// every key, the current one included, opens what it sealed.
///
/// Rotation: put the new key first and keep the old ones after it; once every stored
/// ciphertext has been rewritten under the new key (the inbox's rekey), drop the old ones.
/// Cloning is cheap and shares the keys. `Debug` and `Display` print the ids, never a
/// key's bytes.
///
/// ```
/// use tower_webhook::seal::{Aad, Column, KeyRing};
///
/// // What `WEBHOOK_ENCRYPTION_KEYS` holds: `id:<base64 of 32 bytes>`, first = current.
/// let ring = KeyRing::parse(
///     "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
/// )?;
/// let aad = Aad::new("stripe", "evt_1", Column::Body);
/// let sealed = ring.seal(&aad, b"{\"amount\": 100}").unwrap();
/// assert_eq!(sealed.key_id(), "k2");
/// assert_eq!(ring.open(&aad, &sealed).unwrap(), b"{\"amount\": 100}");
/// // The same ciphertext claimed by another column (or event) does not open.
/// assert!(ring.open(&Aad::new("stripe", "evt_1", Column::Headers), &sealed).is_err());
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct KeyRing {
    /// First = current. A handful of keys: a linear search by id is the fastest lookup.
    keys: Arc<[Key]>,
    /// Whether [`seal`](Self::seal) compresses first ([`without_compression`](Self::without_compression)).
    compress: bool,
}

impl KeyRing {
    /// A ring of `keys`, the first the current one.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidEncryptionKey`] when there is no key, or two keys share
    /// an id (which of them opens a ciphertext would be a guess).
    pub fn new(keys: impl IntoIterator<Item = Key>) -> Result<Self, ConfigError> {
        let keys: Vec<Key> = keys.into_iter().collect();
        if keys.is_empty() {
            return Err(invalid("an encryption key ring needs at least one key"));
        }
        for (i, key) in keys.iter().enumerate() {
            if keys[..i].iter().any(|k| k.id() == key.id()) {
                return Err(invalid(format!(
                    "encryption key #{} has the id {:?} of an earlier key",
                    i + 1,
                    key.id()
                )));
            }
        }
        Ok(Self {
            keys: keys.into(),
            compress: true,
        })
    }

    /// The ring sealing payloads as they are, never compressed first.
    ///
    /// By default [`seal`](Self::seal) compresses a payload of 128 bytes or more with LZ4
    /// when that makes it shorter (as Rails' encryption does with zlib): a ciphertext is
    /// random bytes to the database, which could otherwise have compressed the payload
    /// itself (PostgreSQL's TOAST, a filesystem's compression). The price: a ciphertext's
    /// length then says how compressible its payload was, not only how long it is. Someone
    /// who can both put chosen text into the payloads you receive and read stored lengths
    /// may learn whether that text matched other text in the same payload (`SECURITY.md`).
    /// Turn compression off where that matters more than the space. Opening is the same
    /// either way: each ciphertext says whether it was compressed, so a ring with or without
    /// compression opens both. What is stored keeps its form until it is sealed again: a
    /// rekey reseals with this ring's setting what another key sealed, so turning
    /// compression off reaches stored rows with the next key rotation and its rekey.
    #[must_use]
    pub fn without_compression(mut self) -> Self {
        self.compress = false;
        self
    }

    /// Whether [`seal`](Self::seal) compresses a payload first (the default; see
    /// [`without_compression`](Self::without_compression)).
    #[must_use]
    pub fn compresses(&self) -> bool {
        self.compress
    }

    /// Parses the receiver's `WEBHOOK_ENCRYPTION_KEYS`: comma-separated `id:<key>`
    /// entries, each key standard base64 (`openssl rand -base64 32`) of 32 bytes; spaces
    /// around an entry are ignored. The first entry is the current key.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidEncryptionKey`], naming the entry by its position
    /// (the first is 1) and never printing a key: an empty value or entry, an entry
    /// without `:`, an id outside its alphabet, a key that is not base64 or not 32
    /// bytes, an id twice.
    pub fn parse(value: &str) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, entry) in value.split(',').enumerate() {
            let n = i + 1;
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(invalid(format!("encryption key entry {n} is empty")));
            }
            let Some((id, b64)) = entry.split_once(':') else {
                // Not even the id is printed: an entry without `:` may be a bare key.
                return Err(invalid(format!(
                    "encryption key entry {n} is not `id:<base64 of {KEY_BYTES} bytes>`"
                )));
            };
            check_id(id).map_err(|e| invalid(format!("encryption key entry {n}: {e}")))?;
            let bytes = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|_| {
                        invalid(format!(
                            "encryption key entry {n} ({id:?}): the key is not standard base64"
                        ))
                    })?,
            );
            keys.push(
                Key::from_slice(id, &bytes)
                    .map_err(|e| invalid(format!("encryption key entry {n} ({id:?}): {e}")))?,
            );
        }
        Self::new(keys)
    }

    /// The current key's id: what [`seal`](Self::seal) writes beside its ciphertexts.
    #[must_use]
    pub fn current_id(&self) -> &str {
        self.keys[0].id()
    }

    /// Every key's id, the current one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.keys.iter().map(Key::id)
    }

    /// Whether a ciphertext sealed under `key_id` must be rewritten by a rekey: it is not
    /// the current key's.
    #[must_use]
    pub fn needs_rekey(&self, key_id: &str) -> bool {
        key_id != self.current_id()
    }

    /// The subject's keyed digest under each key, the current one first: erasure by
    /// subject looks a stored `(key id, digest)` up among these, so a digest written
    /// before a rotation is still found until the rekey rewrites it.
    #[must_use]
    pub fn subject_digests(&self, subject: &str) -> Vec<(&str, [u8; 32])> {
        self.keys
            .iter()
            .map(|k| (k.id(), k.subject_digest(subject)))
            .collect()
    }

    /// Seals `plaintext` under the current key with a fresh random 24-byte nonce, its
    /// associated data `aad` (authenticated, not stored: the reader rebuilds it from the
    /// row it reads). A payload of 128 bytes or more is LZ4-compressed first when that
    /// makes it shorter, unless the ring is [`without_compression`](Self::without_compression).
    /// The ciphertext is one byte saying which, the payload (as it is: 1 + its length; or
    /// compressed: 5 + the LZ4 block's length) and the 16-byte tag.
    ///
    /// # Errors
    ///
    /// [`SealError`] when the system's random source fails (no nonce, no ciphertext), or
    /// the plaintext is longer than the cipher takes (256 GiB).
    pub fn seal(&self, aad: &Aad<'_>, plaintext: &[u8]) -> Result<Sealed, SealError> {
        let key = &self.keys[0];
        // Random nonces are safe at XChaCha's 192 bits: no counter to persist or share
        // between replicas.
        let nonce = XNonce::try_generate().map_err(|_| SealError::Random)?;
        let cipher = cipher(key);
        let mut buffer = frame::encode(plaintext, self.compress, TAG_BYTES);
        let tag = cipher
            .encrypt_inout_detached(&nonce, &aad.encode(), buffer.as_mut_slice().into())
            .map_err(|_| SealError::TooLong)?;
        buffer.extend_from_slice(&tag);
        Ok(Sealed {
            key_id: key.id().into(),
            nonce: nonce.into(),
            ciphertext: buffer,
        })
    }

    /// Opens what [`seal`](Self::seal) sealed, with the key its id names and the
    /// associated data of the row and column it was read from.
    ///
    /// # Errors
    ///
    /// [`Unreadable`]: no key of this ring has the id ([`UnreadableKind::UnknownKey`]:
    /// removed before a rekey reached it), or the tag does not verify
    /// ([`UnreadableKind::Tampered`]: altered, moved from another event or column, or
    /// sealed by another key under the same id), or the ciphertext is shorter than a tag
    /// or opens to something [`seal`](Self::seal) never writes
    /// ([`UnreadableKind::Malformed`]). Never a panic, never a partial plaintext.
    pub fn open(&self, aad: &Aad<'_>, sealed: &Sealed) -> Result<Vec<u8>, Unreadable> {
        self.open_parts(aad, &sealed.key_id, &sealed.nonce, &sealed.ciphertext)
    }

    /// [`open`](Self::open) on the parts as a store reads them from their columns (a
    /// nonce of the wrong length is [`UnreadableKind::Malformed`]).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_parts(
        &self,
        aad: &Aad<'_>,
        key_id: &str,
        nonce: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, Unreadable> {
        let unreadable = |kind| Unreadable::new(kind, key_id);
        let Some(key) = self.keys.iter().find(|k| k.id() == key_id) else {
            return Err(unreadable(UnreadableKind::UnknownKey));
        };
        let nonce: [u8; NONCE_BYTES] = nonce
            .try_into()
            .map_err(|_| unreadable(UnreadableKind::Malformed))?;
        let Some(split) = ciphertext.len().checked_sub(TAG_BYTES) else {
            return Err(unreadable(UnreadableKind::Malformed));
        };
        let (body, tag) = ciphertext.split_at(split);
        let tag = Tag::try_from(tag).map_err(|_| unreadable(UnreadableKind::Malformed))?;
        let mut buffer = body.to_vec();
        match cipher(key).decrypt_inout_detached(
            &XNonce::from(nonce),
            &aad.encode(),
            buffer.as_mut_slice().into(),
            &tag,
        ) {
            Ok(()) => frame::decode(buffer).ok_or_else(|| unreadable(UnreadableKind::Malformed)),
            Err(_) => Err(unreadable(UnreadableKind::Tampered)),
        }
    }
}

/// The cipher for one call: its copy of the key is wiped when it is dropped (the
/// `zeroize` feature of chacha20poly1305). Key setup is a copy, so nothing is cached.
pub(super) fn cipher(key: &Key) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(key.bytes().into())
}

fn invalid(detail: impl Into<String>) -> ConfigError {
    ConfigError::new(ConfigErrorKind::InvalidEncryptionKey, detail)
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("current", &self.current_id())
            .field("keys", &self.ids().collect::<Vec<_>>())
            .field("compress", &self.compress)
            .finish()
    }
}

impl fmt::Display for KeyRing {
    /// The ids, current first: `k2 (current), k1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, id) in self.ids().enumerate() {
            if i == 0 {
                write!(f, "{id} (current)")?;
            } else {
                write!(f, ", {id}")?;
            }
        }
        Ok(())
    }
}

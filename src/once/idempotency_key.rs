//! The key an action hands to an external API's own deduplication.

use std::fmt;

use sha2::{Digest, Sha256};

/// A key for an external API's own deduplication (Stripe's `Idempotency-Key` header, say),
/// derived from a [`Once`](super::Once)'s namespace and key: the same for every attempt at one action,
/// in every process, and different for every other action. 37 ASCII characters:
/// `once_` and 32 hex digits of a SHA-256 of the namespace and the key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub(super) fn derive(namespace: &str, key: &str) -> Self {
        // Lengths first, so no namespace and key can spell another pair's input.
        let mut digest = Sha256::new();
        digest.update(b"tower-webhook once v1\0");
        digest.update((namespace.len() as u64).to_be_bytes());
        digest.update(namespace.as_bytes());
        digest.update(key.as_bytes());
        let hash = digest.finalize();
        Self(format!("once_{}", hex::encode(&hash[..16])))
    }

    /// The key, to put in a header.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

//! The algorithms a signature is made with.

/// How a signature is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// HMAC-SHA1 with a shared secret (Twilio, Intercom).
    HmacSha1,
    /// HMAC-SHA256 with a shared secret (most providers).
    HmacSha256,
    /// HMAC-SHA512 with a shared secret.
    HmacSha512,
    /// Ed25519 (RFC 8032, pure) with the provider's public key (Standard Webhooks `v1a`,
    /// Discord).
    Ed25519,
    /// ECDSA over P-256 with SHA-256, DER or fixed-size signatures, with the provider's
    /// public key (SendGrid).
    EcdsaP256,
    /// RSASSA-PKCS1-v1_5 with SHA-1, with the provider's certificate (AWS SNS
    /// `SignatureVersion` 1).
    RsaSha1,
    /// RSASSA-PKCS1-v1_5 with SHA-256, with the provider's certificate (AWS SNS
    /// `SignatureVersion` 2, PayPal).
    RsaSha256,
    /// No signature: the shared secret itself travels in the delivery and is compared in
    /// constant time (Microsoft Graph's `clientState`).
    SharedToken,
}

impl Algorithm {
    /// Whether the key is a shared secret (HMAC) rather than a public key.
    #[must_use]
    pub fn is_hmac(self) -> bool {
        matches!(self, Self::HmacSha1 | Self::HmacSha256 | Self::HmacSha512)
    }

    /// The possible lengths of one signature, in bytes, before encoding.
    pub(crate) fn signature_len(self) -> (usize, usize) {
        match self {
            Self::HmacSha1 => (20, 20),
            Self::HmacSha256 => (32, 32),
            Self::HmacSha512 | Self::Ed25519 => (64, 64),
            // 64 bytes fixed (r ‖ s), or DER: at least 8, at most 72.
            Self::EcdsaP256 => (8, 72),
            // The modulus' length: 2048 to 4096 bits. Only the certificate presets, which
            // read their signature themselves, use RSA (never a signature header).
            Self::RsaSha1 | Self::RsaSha256 => (256, 512),
            Self::SharedToken => (0, 0),
        }
    }
}

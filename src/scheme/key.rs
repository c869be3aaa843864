//! Key kinds: what a signature is made with, and how each provider writes its keys.
//!
//! A verifier holds [`Key`]s: keyed HMAC states (shared secrets) or public keys. A scheme
//! may accept several kinds at once — Standard Webhooks sends `v1,` (HMAC-SHA256) and `v1a,`
//! (Ed25519) entries side by side — so a key list can mix them, and each signature entry is
//! only tried against keys of its own algorithm.
//!
//! Secret material is wiped when dropped: decoded secrets are held in
//! [`Zeroizing`](zeroize::Zeroizing) buffers, and the HMAC states are built on hashes
//! compiled with their `zeroize` feature (so are the signing keys used by
//! [`Scheme::sign`](super::Scheme::sign)).

use std::fmt;

use hmac::{Hmac, Mac};
use p256::ecdsa::signature::{self, MultipartVerifier as _};
use zeroize::Zeroizing;

mod algorithm; // how a signature is made
mod decode; // a provider's secret or key string, into a key
mod encoding; // key bytes as base64 or hex
mod public_key; // RSA and P-256 public keys in PEM, DER or SEC1
#[cfg(test)]
mod tests;

pub use algorithm::Algorithm;
pub(crate) use decode::{signing, verifying};
pub(crate) use public_key::rsa_public;

/// The longest signature of any algorithm, in bytes.
pub(crate) const MAX_SIGNATURE: usize = 72;

/// A tag or signature in a fixed buffer: no allocation per request.
pub(crate) struct Tag {
    bytes: [u8; MAX_SIGNATURE],
    len: usize,
}

impl Tag {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn from_slice(bytes: &[u8]) -> Self {
        let mut tag = Self {
            bytes: [0; MAX_SIGNATURE],
            len: bytes.len(),
        };
        tag.bytes[..bytes.len()].copy_from_slice(bytes);
        tag
    }
}

/// A key that verifies: a keyed HMAC state or a public key.
#[derive(Clone)]
pub(crate) enum Key {
    HmacSha1(Hmac<sha1::Sha1>),
    HmacSha256(Hmac<sha2::Sha256>),
    HmacSha512(Hmac<sha2::Sha512>),
    Ed25519(ed25519_dalek::VerifyingKey),
    EcdsaP256(p256::ecdsa::VerifyingKey),
    /// An RSA public key, from the provider's certificate: one key verifies both hashes.
    Rsa(Box<RsaKey>),
    /// A shared token, compared as it is (Microsoft Graph's `clientState`).
    Token(Zeroizing<Vec<u8>>),
    /// One shared secret keyed for both hashes a sender may declare per delivery (Twilio:
    /// SHA-1, or SHA-256 with a SharedKey); used as the declared one
    /// ([`Key::as_declared`]), as HMAC-SHA1 otherwise.
    HmacSha1OrSha256(Box<(Hmac<sha1::Sha1>, Hmac<sha2::Sha256>)>),
}

fn hmac_tag<M: Mac + Clone>(state: &M, pieces: &[&[u8]]) -> Tag {
    let mut mac = state.clone();
    for piece in pieces {
        mac.update(piece);
    }
    Tag::from_slice(&mac.finalize().into_bytes())
}

impl Key {
    pub(crate) fn algorithm(&self) -> Algorithm {
        match self {
            Self::HmacSha1(_) | Self::HmacSha1OrSha256(_) => Algorithm::HmacSha1,
            Self::HmacSha256(_) => Algorithm::HmacSha256,
            Self::HmacSha512(_) => Algorithm::HmacSha512,
            Self::Ed25519(_) => Algorithm::Ed25519,
            Self::EcdsaP256(_) => Algorithm::EcdsaP256,
            Self::Rsa(_) => Algorithm::RsaSha256,
            Self::Token(_) => Algorithm::SharedToken,
        }
    }

    /// This key for the hash a delivery declares: one half of a two-hash key, or the key
    /// itself (whose algorithm then decides whether it matches).
    pub(crate) fn as_declared(&self, algorithm: Algorithm) -> Self {
        match (self, algorithm) {
            (Self::HmacSha1OrSha256(pair), Algorithm::HmacSha256) => {
                Self::HmacSha256(pair.1.clone())
            }
            (Self::HmacSha1OrSha256(pair), _) => Self::HmacSha1(pair.0.clone()),
            (key, _) => key.clone(),
        }
    }

    /// Whether `candidate` is this shared token, in constant time for equal lengths;
    /// `false` for any other kind of key.
    pub(crate) fn token_matches(&self, candidate: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        match self {
            Self::Token(token) => token.as_slice().ct_eq(candidate).into(),
            _ => false,
        }
    }

    /// The HMAC of the signed content, fed piece by piece from a clone of the keyed state;
    /// `None` for a public key.
    pub(crate) fn mac(&self, pieces: &[&[u8]]) -> Option<Tag> {
        match self {
            Self::HmacSha1(k) => Some(hmac_tag(k, pieces)),
            Self::HmacSha1OrSha256(pair) => Some(hmac_tag(&pair.0, pieces)),
            Self::HmacSha256(k) => Some(hmac_tag(k, pieces)),
            Self::HmacSha512(k) => Some(hmac_tag(k, pieces)),
            Self::Ed25519(_) | Self::EcdsaP256(_) | Self::Rsa(_) | Self::Token(_) => None,
        }
    }

    /// Whether `signature` (decoded) is this public key's signature of the signed content.
    /// Always `false` for an HMAC key (those are compared through [`Key::mac`]).
    pub(crate) fn verifies(&self, pieces: &[&[u8]], signature: &[u8]) -> bool {
        self.verifies_as(self.algorithm(), pieces, signature)
    }

    /// As [`Key::verifies`], choosing the hash for an RSA key (SNS signs with SHA-1 or
    /// SHA-256 under one certificate).
    pub(crate) fn verifies_as(
        &self,
        algorithm: Algorithm,
        pieces: &[&[u8]],
        signature: &[u8],
    ) -> bool {
        match self {
            Self::Rsa(key) => {
                let Ok(sig) = rsa::pkcs1v15::Signature::try_from(signature) else {
                    return false;
                };
                match algorithm {
                    Algorithm::RsaSha1 => rsa_verifies(&key.sha1, pieces, &sig),
                    Algorithm::RsaSha256 => rsa_verifies(&key.sha256, pieces, &sig),
                    _ => false,
                }
            }
            Self::Ed25519(key) => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|sig| key.multipart_verify(pieces, &sig).is_ok()),
            Self::EcdsaP256(key) => {
                // Providers send DER (SendGrid); accept the fixed r ‖ s form as well.
                if let Ok(sig) = p256::ecdsa::DerSignature::from_bytes(signature) {
                    return key.multipart_verify(pieces, &sig).is_ok();
                }
                p256::ecdsa::Signature::from_slice(signature)
                    .is_ok_and(|sig| key.multipart_verify(pieces, &sig).is_ok())
            }
            Self::HmacSha1(_)
            | Self::HmacSha1OrSha256(_)
            | Self::HmacSha256(_)
            | Self::HmacSha512(_)
            | Self::Token(_) => false,
        }
    }
}

/// An RSA public key, ready for both hashes SNS signs with.
#[derive(Clone)]
pub(crate) struct RsaKey {
    sha1: rsa::pkcs1v15::VerifyingKey<sha1::Sha1>,
    sha256: rsa::pkcs1v15::VerifyingKey<sha2::Sha256>,
}

/// An RSASSA-PKCS1-v1_5 check of the signed content, fed piece by piece to the hash.
fn rsa_verifies<D>(
    key: &rsa::pkcs1v15::VerifyingKey<D>,
    pieces: &[&[u8]],
    sig: &rsa::pkcs1v15::Signature,
) -> bool
where
    D: sha2::Digest + Default + sha2::digest::FixedOutput + sha2::digest::HashMarker,
{
    use rsa::signature::DigestVerifier as _;
    let feed = |digest: &mut D| {
        for piece in pieces {
            sha2::digest::Update::update(digest, piece);
        }
        Ok(())
    };
    key.verify_digest(feed, sig).is_ok()
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Public keys are public, but one redacted form for all keeps the rule simple.
        write!(f, "Key({:?})", self.algorithm())
    }
}

/// A key that signs, for [`Scheme::sign`](super::Scheme::sign): the shared secret, or the
/// private key whose public half the receiver holds.
pub(crate) enum SigningKey {
    Hmac(Box<Key>),
    Ed25519(Box<ed25519_dalek::SigningKey>),
    EcdsaP256(Box<p256::ecdsa::SigningKey>),
}

impl SigningKey {
    pub(crate) fn sign(&self, pieces: &[&[u8]]) -> Tag {
        match self {
            Self::Hmac(key) => key.mac(pieces).expect("an HMAC key"),
            Self::Ed25519(key) => {
                let message: Vec<u8> = pieces.concat();
                let sig: ed25519_dalek::Signature = signature::Signer::sign(&**key, &message);
                Tag::from_slice(&sig.to_bytes())
            }
            Self::EcdsaP256(key) => {
                let message: Vec<u8> = pieces.concat();
                let sig: p256::ecdsa::Signature = signature::Signer::sign(&**key, &message);
                Tag::from_slice(sig.to_der().as_bytes())
            }
        }
    }
}

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

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use p256::ecdsa::signature::{self, MultipartVerifier as _};
use zeroize::Zeroizing;

use super::{Format, Scheme, SecretEncoding};
use crate::error::{ConfigError, ConfigErrorKind};

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

/// Which of the scheme's formats a key string belongs to: the one whose key prefix it
/// carries (`whpk_` → `v1a`), else the first without a required prefix.
fn format_for<'s>(scheme: &'s Scheme, secret: &str, signing: bool) -> Option<&'s Format> {
    let prefix = |f: &Format| {
        if signing {
            f.signing_key_prefix
        } else {
            f.key_prefix
        }
    };
    scheme
        .formats
        .iter()
        .find(|f| prefix(f).is_some_and(|p| secret.starts_with(p)))
        .or_else(|| scheme.formats.iter().find(|f| prefix(f).is_none()))
}

fn invalid(index: usize, why: &str) -> ConfigError {
    ConfigError::new(
        ConfigErrorKind::InvalidSecret,
        format!("secret #{index}: {why}"),
    )
}

/// Decodes one secret or public key, in its provider's format, into a verifying key.
/// Errors name the position, never the value.
pub(crate) fn verifying(scheme: &Scheme, secret: &str, index: usize) -> Result<Key, ConfigError> {
    if secret.starts_with("-----BEGIN") {
        // PEM delimits itself: the newline a certificate file ends with is harmless.
        let pem = secret.trim_end();
        return match scheme.formats.first().map(|f| f.algorithm) {
            Some(Algorithm::RsaSha1 | Algorithm::RsaSha256) => {
                rsa_public(pem).map_err(|why| invalid(index, why))
            }
            Some(Algorithm::EcdsaP256) => ecdsa_public(pem)
                .map(Key::EcdsaP256)
                .ok_or_else(|| invalid(index, "not a P-256 public key in PEM")),
            _ => Err(invalid(index, "a PEM key where this scheme takes a secret")),
        };
    }
    check_whitespace(secret, index)?;
    let format = format_for(scheme, secret, false).ok_or_else(|| {
        invalid(
            index,
            "not a key this scheme takes (a signing key? the receiver needs the public key)",
        )
    })?;
    let text = format
        .key_prefix
        .and_then(|p| secret.strip_prefix(p))
        .unwrap_or(secret);
    match format.algorithm {
        a if a.is_hmac() => hmac_key(scheme, a, secret, index),
        Algorithm::Ed25519 => {
            let bytes = decode_key(text, 32).ok_or_else(|| {
                invalid(
                    index,
                    "not an Ed25519 public key (32 bytes as hex or base64)",
                )
            })?;
            let bytes: [u8; 32] = bytes[..].try_into().expect("32 bytes");
            let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                .map_err(|_| invalid(index, "not a point on Ed25519"))?;
            if key.is_weak() {
                // A small-order key: signatures under it prove nothing.
                return Err(invalid(index, "a weak (small-order) Ed25519 key"));
            }
            Ok(Key::Ed25519(key))
        }
        Algorithm::EcdsaP256 => ecdsa_public(text).map(Key::EcdsaP256).ok_or_else(|| {
            invalid(
                index,
                "not a P-256 public key (base64 DER, PEM or SEC1 hex)",
            )
        }),
        Algorithm::RsaSha1 | Algorithm::RsaSha256 => {
            rsa_public(text).map_err(|why| invalid(index, why))
        }
        Algorithm::SharedToken => {
            let min_len = scheme.min_secret_len;
            if text.len() < min_len {
                return Err(invalid(
                    index,
                    &format!("shorter than the {min_len} bytes this scheme requires"),
                ));
            }
            Ok(Key::Token(Zeroizing::new(text.as_bytes().to_vec())))
        }
        _ => unreachable!("every algorithm is covered"),
    }
}

/// Decodes one signing key: the shared secret for HMAC, a private key otherwise (Ed25519:
/// `whsk_` + base64, or hex, of the 32-byte seed or the 64-byte seed ‖ public key; P-256:
/// PKCS#8 PEM or base64 DER, or the 32-byte scalar in hex).
pub(crate) fn signing<'s>(
    scheme: &'s Scheme,
    secret: &str,
    index: usize,
) -> Result<(&'s Format, SigningKey), ConfigError> {
    check_whitespace(secret, index)?;
    let format = format_for(scheme, secret, true)
        .ok_or_else(|| invalid(index, "not a signing key this scheme takes"))?;
    let text = format
        .signing_key_prefix
        .and_then(|p| secret.strip_prefix(p))
        .unwrap_or(secret);
    let key = match format.algorithm {
        a if a.is_hmac() => SigningKey::Hmac(Box::new(hmac_key(scheme, a, secret, index)?)),
        Algorithm::Ed25519 => {
            let bytes = decode_key(text, 32)
                .or_else(|| decode_key(text, 64))
                .ok_or_else(|| invalid(index, "not an Ed25519 private key"))?;
            let seed: [u8; 32] = bytes[..32].try_into().expect("32 or 64 bytes");
            let key = ed25519_dalek::SigningKey::from_bytes(&seed);
            if bytes.len() == 64 && bytes[32..] != key.verifying_key().to_bytes() {
                return Err(invalid(index, "the public half does not match the seed"));
            }
            SigningKey::Ed25519(Box::new(key))
        }
        Algorithm::EcdsaP256 => {
            use p256::pkcs8::DecodePrivateKey as _;
            let key = p256::ecdsa::SigningKey::from_pkcs8_pem(text)
                .ok()
                .or_else(|| {
                    decode_b64(text)
                        .and_then(|der| p256::ecdsa::SigningKey::from_pkcs8_der(&der).ok())
                })
                .or_else(|| {
                    let bytes = Zeroizing::new(hex::decode(text).ok()?);
                    p256::ecdsa::SigningKey::from_slice(&bytes).ok()
                })
                .ok_or_else(|| invalid(index, "not a P-256 private key"))?;
            SigningKey::EcdsaP256(Box::new(key))
        }
        Algorithm::RsaSha1 | Algorithm::RsaSha256 | Algorithm::SharedToken => {
            return Err(invalid(index, "this scheme is not signed with a key"))
        }
        _ => unreachable!("every algorithm is covered"),
    };
    Ok((format, key))
}

fn check_whitespace(secret: &str, index: usize) -> Result<(), ConfigError> {
    if secret.trim() != secret {
        // Read from a file or an environment variable with its newline: every delivery
        // would fail verification, with nothing to say why.
        return Err(invalid(
            index,
            "starts or ends with whitespace (a trailing newline from a file or variable?)",
        ));
    }
    if secret.is_empty() {
        return Err(invalid(index, "empty"));
    }
    Ok(())
}

/// A shared secret as its scheme writes it, into a keyed HMAC state.
fn hmac_key(
    scheme: &Scheme,
    algorithm: Algorithm,
    secret: &str,
    index: usize,
) -> Result<Key, ConfigError> {
    // A public key used as a shared secret would let anyone who knows it sign: refuse
    // anything written as a key of another kind.
    if ["whpk_", "whsk_"].iter().any(|p| secret.starts_with(p)) {
        return Err(invalid(
            index,
            "an Ed25519 key where this scheme takes a shared secret",
        ));
    }
    let public_keys_too = scheme.formats.iter().any(|f| !f.algorithm.is_hmac());
    if public_keys_too
        && scheme.secret_encoding == SecretEncoding::Base64
        && !secret.starts_with("whsec_")
    {
        // The length of an Ed25519 public key without its `whpk_`, in base64 or in hex (64
        // hex digits are valid base64 too): as a shared secret, that key would let anyone
        // sign. Make the kind explicit.
        let hex_key = secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit());
        if hex_key || decode_b64_unpadded(secret).is_some_and(|b| b.len() == 32) {
            return Err(invalid(
                index,
                "32 bytes (base64 or hex) without a prefix: write it as whsec_… (a secret) \
                 or whpk_… (a public key)",
            ));
        }
    }
    let decoded = match scheme.secret_encoding {
        SecretEncoding::Raw => Zeroizing::new(secret.as_bytes().to_vec()),
        SecretEncoding::Base64 => {
            let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
            // Strict but for the padding, which the Standard Webhooks SDKs do not require:
            // a typo must not quietly become a different (or empty) key.
            decode_b64_unpadded(b64)
                .ok_or_else(|| invalid(index, "not valid base64 after the `whsec_` prefix"))?
        }
    };
    if decoded.is_empty() {
        return Err(invalid(index, "empty"));
    }
    // The minimum counts what is secret: not a `whsec_` prefix that every key shares
    // (Stripe keys the MAC with the whole string, prefix included).
    let secret_len = match scheme.secret_encoding {
        SecretEncoding::Raw => secret.strip_prefix("whsec_").unwrap_or(secret).len(),
        SecretEncoding::Base64 => decoded.len(),
    };
    let min_len = scheme.min_secret_len;
    if secret_len < min_len {
        return Err(invalid(
            index,
            &format!("{secret_len} bytes, shorter than the {min_len} this scheme requires"),
        ));
    }
    let any_length = "HMAC takes keys of any length";
    let hashes = |a| scheme.formats.iter().any(|f| f.algorithm == a);
    if scheme.algorithm_header.is_some()
        && hashes(Algorithm::HmacSha1)
        && hashes(Algorithm::HmacSha256)
    {
        // The delivery says which hash it was signed with: key both.
        return Ok(Key::HmacSha1OrSha256(Box::new((
            Hmac::new_from_slice(&decoded).expect(any_length),
            Hmac::new_from_slice(&decoded).expect(any_length),
        ))));
    }
    Ok(match algorithm {
        Algorithm::HmacSha1 => Key::HmacSha1(Hmac::new_from_slice(&decoded).expect(any_length)),
        Algorithm::HmacSha512 => Key::HmacSha512(Hmac::new_from_slice(&decoded).expect(any_length)),
        _ => Key::HmacSha256(Hmac::new_from_slice(&decoded).expect(any_length)),
    })
}

fn decode_b64(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .map(Zeroizing::new)
}

/// Standard base64 with or without its `=` padding (the Standard Webhooks SDKs accept
/// both for `whsec_` secrets); otherwise strict (no stray bits, no other alphabet).
fn decode_b64_unpadded(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const INDIFFERENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    INDIFFERENT.decode(text).ok().map(Zeroizing::new)
}

/// `len` bytes written as hex or standard base64.
fn decode_key(text: &str, len: usize) -> Option<Zeroizing<Vec<u8>>> {
    let bytes = if text.len() == len * 2 {
        Zeroizing::new(hex::decode(text).ok()?)
    } else {
        decode_b64(text)?
    };
    (bytes.len() == len).then_some(bytes)
}

/// The RSA public key of a PEM certificate (what SNS and PayPal serve), or of a PEM
/// `PUBLIC KEY`. Only the key is used: the certificate's trust comes from where it was
/// fetched (see `verify::certificate`) or from being pinned by the operator.
pub(crate) fn rsa_public(text: &str) -> Result<Key, &'static str> {
    use rsa::pkcs8::DecodePublicKey as _;
    use x509_cert::der::DecodePem as _;
    let unreadable = || "not an RSA certificate or public key in PEM";
    let key = if text.starts_with("-----BEGIN CERTIFICATE-----") {
        let cert = x509_cert::Certificate::from_pem(text).map_err(|_| unreadable())?;
        let spki = cert.tbs_certificate().subject_public_key_info();
        let der = x509_cert::der::Encode::to_der(spki).map_err(|_| unreadable())?;
        rsa::PublicKey::from_public_key_der(&der)
    } else {
        rsa::PublicKey::from_public_key_pem(text)
    }
    .map_err(|_| unreadable())?;
    if rsa::traits::PublicKeyParts::size(&key) < 256 {
        // Under 2048 bits: within reach of a determined attacker; no provider sends one.
        return Err("an RSA key shorter than 2048 bits");
    }
    Ok(Key::Rsa(Box::new(RsaKey {
        sha1: rsa::pkcs1v15::VerifyingKey::new(key.clone()),
        sha256: rsa::pkcs1v15::VerifyingKey::new(key),
    })))
}

fn ecdsa_public(text: &str) -> Option<p256::ecdsa::VerifyingKey> {
    use p256::pkcs8::DecodePublicKey as _;
    if text.starts_with("-----BEGIN") {
        return p256::ecdsa::VerifyingKey::from_public_key_pem(text).ok();
    }
    if let Some(der) = decode_b64(text) {
        // SendGrid's dashboard: base64 of a DER SubjectPublicKeyInfo.
        if let Ok(key) = p256::ecdsa::VerifyingKey::from_public_key_der(&der) {
            return Some(key);
        }
    }
    let sec1 = hex::decode(text).ok()?;
    p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}

    #[test]
    fn hash_states_behind_hmac_keys_are_wiped_on_drop() {
        // Compiles only while sha1 and sha2 are built with their `zeroize` feature: the
        // keyed HMAC states are two of these hash cores each.
        use sha2::digest::block_api::CoreProxy;
        wiped_on_drop::<<sha2::Sha256 as CoreProxy>::Core>();
        wiped_on_drop::<<sha2::Sha512 as CoreProxy>::Core>();
        wiped_on_drop::<<sha1::Sha1 as CoreProxy>::Core>();
        wiped_on_drop::<ed25519_dalek::SigningKey>();
    }

    #[test]
    fn public_keys_in_each_providers_format() {
        let standard = Scheme::standard();
        let pk = "whpk_1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4=";
        assert_eq!(
            verifying(&standard, pk, 0).unwrap().algorithm(),
            Algorithm::Ed25519
        );
        let sk = "whsk_6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbfVKIDij2HKpMKkioLlX0dRqSKJp4AJ6p9lMicMFs6Kvg==";
        // A signing key given to a receiver: refused, and the message says what to give.
        let err = verifying(&standard, sk, 3).unwrap_err();
        assert!(err.to_string().contains("secret #3"), "{err}");
        assert!(!err.to_string().contains("whsk_6Xb"), "{err}");
        assert!(signing(&standard, sk, 0).is_ok());
        // The public key without its prefix would become a shared secret anyone could
        // sign with: refused, as is a `whpk_` key where only secrets go.
        let bare = pk.trim_start_matches("whpk_");
        assert!(verifying(&standard, bare, 0).is_err());
        assert!(verifying(&Scheme::github(), pk, 0).is_err());
        // The same public key in hex (64 hex digits are valid base64 of 48 bytes): refused
        // too, with a message that names the two prefixes and not the key.
        let hex_bare = "d52880e28f61caa4c2a48a82e55f4751a92289a78009ea9f6532270c16ce8abe";
        assert!(
            verifying(&Scheme::discord(), hex_bare, 0).is_ok(),
            "the same key"
        );
        let err = verifying(&standard, hex_bare, 1).unwrap_err();
        assert!(err.to_string().contains("whpk_"), "{err}");
        assert!(!err.to_string().contains(&hex_bare[..16]), "{err}");
        assert!(verifying(&standard, &hex_bare.to_uppercase(), 0).is_err());
        // A bare 24-byte secret (Svix's length) is still a secret.
        assert!(verifying(&standard, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 0).is_ok());
        // Discord: hex; SendGrid: base64 DER.
        let discord = Scheme::discord();
        let hex_pk = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
        assert!(verifying(&discord, hex_pk, 0).is_ok());
        assert!(verifying(&discord, &hex_pk[2..], 0).is_err());
        // The identity point has small order: refused.
        let weak = format!("01{}", "00".repeat(31));
        assert!(verifying(&discord, &weak, 0).is_err());
        let sendgrid = Scheme::sendgrid();
        let spki = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
        assert_eq!(
            verifying(&sendgrid, spki, 0).unwrap().algorithm(),
            Algorithm::EcdsaP256
        );
        assert!(verifying(&sendgrid, "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE", 0).is_err());
    }

    #[test]
    fn an_ed25519_keypair_whose_halves_disagree_is_refused() {
        let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
        let wrong_public = "00".repeat(32);
        assert!(signing(&Scheme::discord(), seed, 0).is_ok());
        assert!(signing(&Scheme::discord(), &format!("{seed}{wrong_public}"), 0).is_err());
    }
}

//! A secret or key string, as its provider writes it, decoded into a verifying or a signing
//! key for its scheme.

use hmac::{Hmac, KeyInit};
use zeroize::Zeroizing;

use super::encoding::{decode_b64, decode_b64_unpadded, decode_key};
use super::public_key::{ecdsa_public, rsa_public};
use super::{Algorithm, Key, SigningKey};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::scheme::{Format, Scheme, SecretEncoding};

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

//! Providers' public keys: RSA from a PEM certificate or key, P-256 from PEM, base64 DER
//! or SEC1 hex.

use super::encoding::decode_b64;
use super::{Key, RsaKey};

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

pub(super) fn ecdsa_public(text: &str) -> Option<p256::ecdsa::VerifyingKey> {
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

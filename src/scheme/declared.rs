//! The hash a sender declares per delivery: Twilio's
//! `X-Twilio-Webhooks-Signature-Settings: key=<SharedKey sid>,algorithm=HMAC_SHA256`.
//!
//! Read as Twilio's SDKs read it (node `twilio` 6.x `getSignatureAlgorithm`, Python
//! `twilio` 9.x): comma-separated `name=value` parts, the first `algorithm` part with a
//! value counts, compared without case; no header, or none with an algorithm, is the legacy
//! auth-token signature, HMAC-SHA1. Which declared hashes are accepted is the scheme's
//! choice (its formats), so a sender cannot pick one the receiver did not allow.

use super::Algorithm;
use crate::error::{VerifyError, VerifyErrorKind};

/// The algorithm `value` declares; `None` when it declares one Twilio does not define.
pub(crate) fn algorithm(value: Option<&str>) -> Option<Algorithm> {
    let declared = value
        .unwrap_or("")
        .split(',')
        .filter_map(|part| part.split_once('='))
        .map(|(name, value)| (name.trim(), value.trim()))
        .find(|&(name, value)| name == "algorithm" && !value.is_empty())
        .map(|(_, algorithm)| algorithm);
    match declared {
        None => Some(Algorithm::HmacSha1),
        Some(a) if a.eq_ignore_ascii_case("HMAC_SHA1") => Some(Algorithm::HmacSha1),
        Some(a) if a.eq_ignore_ascii_case("HMAC_SHA256") => Some(Algorithm::HmacSha256),
        Some(_) => None,
    }
}

/// The algorithm `value` declares, if the scheme accepts it (one of its formats').
pub(crate) fn accepted(
    value: Option<&str>,
    accepts: &[Algorithm],
) -> Result<Algorithm, VerifyError> {
    let algorithm = algorithm(value).ok_or(VerifyError::new(
        VerifyErrorKind::MalformedHeader,
        "the signature settings declare an unknown algorithm",
    ))?;
    if !accepts.contains(&algorithm) {
        // A verifier set up for SHA-256 only is not talked down to SHA-1 by a header.
        return Err(VerifyError::new(
            VerifyErrorKind::InvalidSignature,
            "the delivery declares a signature algorithm this verifier does not accept",
        ));
    }
    Ok(algorithm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_algorithm_as_twilios_sdks_do() {
        let cases = [
            (None, Some(Algorithm::HmacSha1)),
            (Some(""), Some(Algorithm::HmacSha1)),
            (Some("key=KS123"), Some(Algorithm::HmacSha1)),
            (
                Some("key=KS123,algorithm=HMAC_SHA256"),
                Some(Algorithm::HmacSha256),
            ),
            (
                Some(" algorithm = hmac_sha256 , key=KS1"),
                Some(Algorithm::HmacSha256),
            ),
            (Some("algorithm=HMAC_SHA1"), Some(Algorithm::HmacSha1)),
            (Some("algorithm="), Some(Algorithm::HmacSha1)),
            (
                Some("algorithm=,algorithm=HMAC_SHA256"),
                Some(Algorithm::HmacSha256),
            ),
            (Some("algorithm=HMAC_SHA512"), None),
            (Some("algorithm=HMAC_SHA256=x"), None),
        ];
        for (value, expected) in cases {
            assert_eq!(algorithm(value), expected, "{value:?}");
        }
        let only_256 = [Algorithm::HmacSha256];
        assert!(accepted(None, &only_256).is_err());
        assert!(accepted(Some("algorithm=HMAC_SHA1"), &only_256).is_err());
        assert!(accepted(Some("algorithm=HMAC_SHA256"), &only_256).is_ok());
    }
}

//! [`OperatorToken`]: the operators' shared secret, checked in constant time.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::error::{ConfigError, ConfigErrorKind};

/// The shortest token accepted, in bytes. An empty token, what `TOKEN=${UNSET}` gives,
/// would otherwise match an empty `Authorization`.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The operators' token: what [`OperatorDoor`](super::OperatorDoor) checks a bearer
/// header and a browser's sign-in against.
///
/// Built with [`new`](Self::new), which refuses a token under [`MIN_TOKEN_BYTES`] bytes.
/// It keeps no copy of the token: only its SHA-256 digest, which each presented token's
/// digest is compared with in constant time (both are 32 bytes, so neither the
/// comparison's time nor an early length check tells a guesser how long the token is or
/// how much of it was right), and a key derived from it that signs the page's session
/// cookies. `Debug` prints neither.
#[derive(Clone)]
pub struct OperatorToken {
    digest: [u8; 32],
    // The page's sessions' key (feature `admin-ui`).
    #[cfg_attr(
        not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
        allow(dead_code)
    )]
    session_key: Zeroizing<[u8; 32]>,
}

impl OperatorToken {
    /// The token, checked: at least [`MIN_TOKEN_BYTES`] bytes. Use a random one (`openssl
    /// rand -hex 32`): the length rule stops an empty or trivial token, not a guessable
    /// one.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidSecret`] when the token is shorter than
    /// [`MIN_TOKEN_BYTES`] bytes (an empty one included).
    pub fn new(token: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let token = token.as_ref();
        if token.len() < MIN_TOKEN_BYTES {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidSecret,
                format!(
                    "the operator token must be at least {MIN_TOKEN_BYTES} bytes, not {}",
                    token.len()
                ),
            ));
        }
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(token).expect("HMAC takes any key length");
        mac.update(b"tower-webhook operator session key v1");
        let session_key = Zeroizing::new(mac.finalize().into_bytes().into());
        Ok(Self {
            digest: Sha256::digest(token).into(),
            session_key,
        })
    }

    /// Whether `presented` is the token, compared in constant time (digest against
    /// digest).
    #[must_use]
    pub fn matches(&self, presented: &[u8]) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented).into();
        bool::from(presented.ct_eq(&self.digest))
    }

    /// The key the page's session cookies are signed with: every process built from the
    /// same token derives the same key, so a session opened on one replica holds on all.
    #[cfg_attr(
        not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
        allow(dead_code)
    )]
    pub(super) fn session_key(&self) -> &[u8; 32] {
        &self.session_key
    }
}

impl fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_under_16_bytes_is_refused_and_one_of_16_is_taken() {
        for short in ["", "a", "fifteen-bytes-x"] {
            let error = OperatorToken::new(short).unwrap_err();
            assert_eq!(error.kind(), ConfigErrorKind::InvalidSecret, "{short:?}");
            assert!(error.to_string().contains("at least 16 bytes"), "{error}");
        }
        let token = OperatorToken::new("sixteen-bytes-xx").unwrap();
        assert!(token.matches(b"sixteen-bytes-xx"));
        for wrong in [
            &b""[..],
            b"sixteen-bytes-x",
            b"sixteen-bytes-xxx",
            b"Sixteen-bytes-xx",
        ] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn debug_prints_nothing_of_the_token() {
        let token = OperatorToken::new("operator-token-0123456789").unwrap();
        let printed = format!("{token:?} {token:#?}");
        assert_eq!(
            printed,
            "OperatorToken(<redacted>) OperatorToken(<redacted>)"
        );
    }
}

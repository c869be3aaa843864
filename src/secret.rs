//! Secrets: validated once, kept as precomputed keyed HMAC state, replaceable at runtime.

use std::fmt;
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::scheme::{Scheme, SecretEncoding};

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The keyed MAC states of the current secret list, first = current.
pub(crate) type Keys = Arc<[HmacSha256]>;

/// A cheap handle on a verifier's secret list, for rotation without rebuilding the
/// router. Clones share the list.
///
/// ```
/// use tower_webhook::{Scheme, Verifier};
///
/// let verifier = Verifier::new(Scheme::stripe(), ["whsec_current_secret_0001"])?;
/// let secrets = verifier.secrets();
/// // Later: the new secret first, the old one kept until the provider stops using it.
/// secrets.replace(["whsec_rotated_secret_0002", "whsec_current_secret_0001"])?;
/// assert_eq!(secrets.len(), 2);
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
///
/// `Debug` prints how many secrets there are, never a secret.
#[derive(Clone)]
pub struct Secrets {
    keys: Arc<RwLock<Keys>>,
    encoding: SecretEncoding,
    min_len: usize,
}

impl Secrets {
    pub(crate) fn new<I, S>(scheme: &Scheme, secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let encoding = scheme.secret_encoding;
        let min_len = scheme.min_secret_len;
        let keys = derive_all(encoding, min_len, secrets)?;
        Ok(Self {
            keys: Arc::new(RwLock::new(keys)),
            encoding,
            min_len,
        })
    }

    /// Replaces the whole list atomically; requests already being verified finish with the
    /// old list.
    ///
    /// # Errors
    ///
    /// The same as when the verifier was built: an empty list, or a secret that is
    /// empty, too short or undecodable. On error the old list stays in force.
    pub fn replace<I, S>(&self, secrets: I) -> Result<(), ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let keys = derive_all(self.encoding, self.min_len, secrets)?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = keys;
        Ok(())
    }

    /// How many secrets are in force.
    #[must_use]
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Always `false`: a list is never empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    fn current(&self) -> Keys {
        self.keys()
    }

    /// The list in force now: a snapshot (one reference count), used without the lock.
    pub(crate) fn keys(&self) -> Keys {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("len", &self.len())
            .field("encoding", &self.encoding)
            .finish_non_exhaustive()
    }
}

fn derive_all<I, S>(
    encoding: SecretEncoding,
    min_len: usize,
    secrets: I,
) -> Result<Keys, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let keys = secrets
        .into_iter()
        .enumerate()
        .map(|(i, s)| key(encoding, min_len, s.as_ref(), i))
        .collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::NoSecrets,
            "the secret list is empty",
        ));
    }
    Ok(keys.into())
}

/// Decodes one secret into its keyed MAC state. Errors name the position, never the value.
pub(crate) fn key(
    encoding: SecretEncoding,
    min_len: usize,
    secret: &str,
    index: usize,
) -> Result<HmacSha256, ConfigError> {
    let invalid = |why: &str| {
        ConfigError::new(
            ConfigErrorKind::InvalidSecret,
            format!("secret #{index}: {why}"),
        )
    };
    if secret.trim() != secret {
        // Read from a file or an environment variable with its newline: every delivery
        // would fail verification, with nothing to say why.
        return Err(invalid(
            "starts or ends with whitespace (a trailing newline from a file or variable?)",
        ));
    }
    let decoded;
    let bytes = match encoding {
        SecretEncoding::Raw => secret.as_bytes(),
        SecretEncoding::Base64 => {
            let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
            // Strict: a typo must not quietly become a different (or empty) key.
            decoded = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| invalid("not valid base64 after the `whsec_` prefix"))?;
            &decoded
        }
    };
    if bytes.is_empty() {
        return Err(invalid("empty"));
    }
    // The minimum counts what is secret: not a `whsec_` prefix that every key shares
    // (Stripe keys the MAC with the whole string, prefix included).
    let secret_len = match encoding {
        SecretEncoding::Raw => secret.strip_prefix("whsec_").unwrap_or(secret).len(),
        SecretEncoding::Base64 => bytes.len(),
    };
    if secret_len < min_len {
        return Err(invalid(&format!(
            "{secret_len} bytes, shorter than the {min_len} this scheme requires"
        )));
    }
    Ok(HmacSha256::new_from_slice(bytes).expect("HMAC takes keys of any length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_secrets_are_configuration_errors_that_do_not_echo_the_secret() {
        let standard = Scheme::standard();
        let cases: [(&Scheme, &[&str], ConfigErrorKind); 8] = [
            (&standard, &[], ConfigErrorKind::NoSecrets),
            (&standard, &[""], ConfigErrorKind::InvalidSecret),
            (
                &standard,
                &["whsec_not*base64*at*all!!"],
                ConfigErrorKind::InvalidSecret,
            ),
            // Valid base64 of 3 bytes: too short, even though it decodes.
            (&standard, &["whsec_c2Vj"], ConfigErrorKind::InvalidSecret),
            (
                &Scheme::github(),
                &["short-secret"],
                ConfigErrorKind::InvalidSecret,
            ),
            // Read from the environment with its newline, or pasted with a space.
            (
                &Scheme::github(),
                &["0123456789abcdef\n"],
                ConfigErrorKind::InvalidSecret,
            ),
            (
                &standard,
                &[" whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
                ConfigErrorKind::InvalidSecret,
            ),
            // Sixteen characters, but ten of them secret: the shared prefix does not count.
            (
                &Scheme::stripe(),
                &["whsec_0123456789"],
                ConfigErrorKind::InvalidSecret,
            ),
        ];
        for (scheme, secrets, kind) in cases {
            let err = Secrets::new(scheme, secrets.iter()).unwrap_err();
            assert_eq!(err.kind(), kind, "{secrets:?}");
            for s in secrets.iter().filter(|s| !s.is_empty()) {
                assert!(!err.to_string().contains(*s), "{err} echoes the secret");
                assert!(!format!("{err:?}").contains(*s));
            }
        }
    }

    #[test]
    fn replace_swaps_the_list_for_every_clone_and_keeps_it_on_error() {
        let secrets = Secrets::new(&Scheme::github(), ["0123456789abcdef"]).unwrap();
        let clone = secrets.clone();
        secrets
            .replace(["fedcba9876543210", "0123456789abcdef"])
            .unwrap();
        assert_eq!(clone.len(), 2);
        assert!(secrets.replace(["tiny"]).is_err());
        assert_eq!(clone.len(), 2);
        let debug = format!("{clone:?}");
        assert!(!debug.contains("0123456789abcdef"), "{debug}");
    }
}

//! Secrets: validated once, kept as precomputed keyed HMAC states or public keys,
//! replaceable at runtime. A replaced list is wiped from memory once the last
//! verification still using it ends.

use std::fmt;
use std::sync::{Arc, RwLock};

use crate::error::{ConfigError, ConfigErrorKind};
use crate::scheme::{key, Key, Scheme};

/// The keys of the current secret list, first = current.
pub(crate) type Keys = Arc<[Key]>;

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
    /// The scheme, to decode replacements as the first list was decoded.
    scheme: Arc<Scheme>,
}

impl Secrets {
    pub(crate) fn new<I, S>(scheme: Arc<Scheme>, secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let keys = derive_all(&scheme, secrets)?;
        Ok(Self {
            keys: Arc::new(RwLock::new(keys)),
            scheme,
        })
    }

    /// No keys at all: the prototype of per-tenant verifiers, which only checks headers.
    pub(crate) fn none(scheme: Arc<Scheme>) -> Self {
        Self {
            keys: Arc::new(RwLock::new(Arc::from([]))),
            scheme,
        }
    }

    /// A list of keys already decoded (a fetched certificate's), unshared.
    pub(crate) fn of_keys(scheme: Arc<Scheme>, keys: Vec<Key>) -> Self {
        Self {
            keys: Arc::new(RwLock::new(keys.into())),
            scheme,
        }
    }

    /// A new, unshared list for the same scheme.
    pub(crate) fn derive<S: AsRef<str>>(&self, secrets: &[S]) -> Result<Self, ConfigError> {
        Self::new(self.scheme.clone(), secrets)
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
        let keys = derive_all(&self.scheme, secrets)?;
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
            .field("scheme", &self.scheme.name())
            .finish_non_exhaustive()
    }
}

fn derive_all<I, S>(scheme: &Scheme, secrets: I) -> Result<Keys, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let keys = secrets
        .into_iter()
        .enumerate()
        .map(|(i, s)| key::verifying(scheme, s.as_ref(), i))
        .collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::NoSecrets,
            "the secret list is empty",
        ));
    }
    Ok(keys.into())
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
            let err = Secrets::new(Arc::new(scheme.clone()), secrets.iter()).unwrap_err();
            assert_eq!(err.kind(), kind, "{secrets:?}");
            for s in secrets.iter().filter(|s| !s.is_empty()) {
                assert!(!err.to_string().contains(*s), "{err} echoes the secret");
                assert!(!format!("{err:?}").contains(*s));
            }
        }
    }

    #[test]
    fn replace_swaps_the_list_for_every_clone_and_keeps_it_on_error() {
        let secrets = Secrets::new(Arc::new(Scheme::github()), ["0123456789abcdef"]).unwrap();
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

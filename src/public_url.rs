//! The URL a provider signs: see [`PublicUrl`].

use std::fmt;

use http::{HeaderMap, Uri};

use crate::error::{ConfigError, ConfigErrorKind};

/// The URL a provider signs, for the schemes that sign it (Twilio, Square, HubSpot).
///
/// The provider signs the URL it was configured with, not the one the server sees behind a
/// TLS terminator or a proxy that rewrites the host, scheme or path. So the verifier is told
/// that URL; trusting the `X-Forwarded-*` headers instead is an explicit choice
/// ([`PublicUrl::from_forwarded_headers`]), for a proxy that sets them and strips them from
/// clients.
///
/// # Security
///
/// The URL is what keeps a delivery signed for one endpoint from being replayed to
/// another that shares the secret (a Twilio auth token covers the whole account). A URL
/// taken from the request's own `Host` would let the sender choose it.
///
/// ```
/// use tower_webhook::{PublicUrl, Scheme, Verifier};
///
/// let url = PublicUrl::exact("https://example.com/webhooks/twilio")?;
/// let verifier = Verifier::new(Scheme::twilio(), ["0123456789abcdef0123456789abcdef"])?
///     .with_public_url(url);
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct PublicUrl(Kind);

#[derive(Clone, PartialEq, Eq)]
enum Kind {
    Exact(String),
    Origin(String),
    Forwarded,
}

impl PublicUrl {
    /// This URL's scheme, host and path, as entered in the provider's dashboard, with the
    /// request's own query string (the provider signs the query it sent, and Twilio adds
    /// `bodySHA256=…` to JSON deliveries); the configured query only when the request
    /// has none. The request's path is not used: give each route its own verifier.
    ///
    /// # Errors
    ///
    /// When `url` is not an absolute `http` or `https` URL.
    pub fn exact(url: &str) -> Result<Self, ConfigError> {
        absolute(url)?;
        Ok(Self(Kind::Exact(url.to_owned())))
    }

    /// This origin (`https://example.com`, with an optional path prefix that a proxy
    /// strips), followed by the request's path and query: for one server with many
    /// webhook paths.
    ///
    /// # Errors
    ///
    /// When `origin` is not an absolute `http` or `https` URL, or has a query.
    pub fn origin(origin: &str) -> Result<Self, ConfigError> {
        let uri = absolute(origin)?;
        if uri.query().is_some() {
            return Err(invalid("an origin has no query string"));
        }
        Ok(Self(Kind::Origin(origin.trim_end_matches('/').to_owned())))
    }

    /// The scheme and host from `X-Forwarded-Proto` and `X-Forwarded-Host` (else `Host`),
    /// followed by the request's path and query. Only behind a proxy that sets these
    /// headers itself and never passes a client's on.
    #[must_use]
    pub fn from_forwarded_headers() -> Self {
        Self(Kind::Forwarded)
    }

    /// The URL for one request; `None` when the request does not tell enough (no path
    /// for an origin, no host behind a proxy).
    pub(crate) fn resolve(&self, uri: Option<&Uri>, headers: &HeaderMap) -> Option<String> {
        let path_and_query = || uri.and_then(Uri::path_and_query).map(|p| p.as_str());
        match &self.0 {
            Kind::Exact(url) => match uri.and_then(Uri::query) {
                Some(query) => {
                    let base = url.split_once('?').map_or(url.as_str(), |(base, _)| base);
                    Some(format!("{base}?{query}"))
                }
                None => Some(url.clone()),
            },
            Kind::Origin(origin) => Some(format!("{origin}{}", path_and_query()?)),
            Kind::Forwarded => {
                let first = |name: &str| {
                    let value = headers.get(name)?.to_str().ok()?;
                    Some(value.split(',').next()?.trim().to_owned())
                };
                let proto = first("x-forwarded-proto").unwrap_or_else(|| "https".into());
                let host = first("x-forwarded-host").or_else(|| first("host"))?;
                Some(format!("{proto}://{host}{}", path_and_query()?))
            }
        }
    }
}

/// The decoded value of a URL's query parameter.
pub(crate) fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// The same URL with its scheme's default port written out, or taken away: Twilio's SDKs
/// accept either form, and Twilio signs with whichever its configuration holds.
pub(crate) fn with_port_toggled(url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    let default = match uri.scheme_str()? {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let host_start = url.find(authority.as_str())?;
    let rest = &url[host_start + authority.as_str().len()..];
    let prefix = &url[..host_start];
    // The host with any `user:pass@` kept (Twilio signs those too).
    let host = authority
        .as_str()
        .rsplit_once(':')
        .map_or(authority.as_str(), |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty() {
                h
            } else {
                authority.as_str()
            }
        });
    match authority.port_u16() {
        Some(_) => Some(format!("{prefix}{host}{rest}")),
        None => Some(format!("{prefix}{host}:{default}{rest}")),
    }
}

/// The form of a signed URL that a delivery is keyed on: scheme and host lower-case, the
/// scheme's default port dropped, the rest as it is. Behind
/// [`PublicUrl::from_forwarded_headers`] the sender picks `Host: x` or `Host: x:443`
/// (Twilio's signature verifies under both): one delivery must still be one key.
pub(crate) fn canonical(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let scheme = scheme.to_ascii_lowercase();
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // `user:pass@` is kept as it is (case matters there); only the host is folded.
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((user, host)) => (Some(user), host),
        None => (None, authority),
    };
    let default = match scheme.as_str() {
        "https" => Some(":443"),
        "http" => Some(":80"),
        _ => None,
    };
    let host_port = default
        .and_then(|port| host_port.strip_suffix(port))
        .unwrap_or(host_port)
        .to_ascii_lowercase();
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    format!("{scheme}://{userinfo}{host_port}{tail}")
}

fn absolute(url: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("https" | "http"), Some(_)) => Ok(uri),
        _ => Err(invalid("not an absolute http or https URL")),
    }
}

fn invalid(why: &str) -> ConfigError {
    ConfigError::new(ConfigErrorKind::InvalidValue, format!("public URL: {why}"))
}

impl fmt::Debug for PublicUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            // The URL may hold `user:pass@` (Twilio allows it): print the form only.
            Kind::Exact(_) => f.write_str("PublicUrl::Exact(..)"),
            Kind::Origin(_) => f.write_str("PublicUrl::Origin(..)"),
            Kind::Forwarded => f.write_str("PublicUrl::Forwarded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_each_kind() {
        let uri: Uri = "/hooks/t1?bodySHA256=ab".parse().unwrap();
        let mut headers = HeaderMap::new();
        let exact = PublicUrl::exact("https://example.com/hooks").unwrap();
        assert_eq!(
            exact.resolve(Some(&uri), &headers).unwrap(),
            "https://example.com/hooks?bodySHA256=ab"
        );
        // The request's query is what was signed, whatever the configured one.
        let with_query = PublicUrl::exact("https://example.com/hooks?a=1").unwrap();
        assert_eq!(
            with_query.resolve(Some(&uri), &headers).unwrap(),
            "https://example.com/hooks?bodySHA256=ab"
        );
        let bare: Uri = "/hooks".parse().unwrap();
        assert_eq!(
            with_query.resolve(Some(&bare), &headers).unwrap(),
            "https://example.com/hooks?a=1"
        );
        let origin = PublicUrl::origin("https://example.com/prefix/").unwrap();
        assert_eq!(
            origin.resolve(Some(&uri), &headers).unwrap(),
            "https://example.com/prefix/hooks/t1?bodySHA256=ab"
        );
        assert_eq!(origin.resolve(None, &headers), None);
        let forwarded = PublicUrl::from_forwarded_headers();
        assert_eq!(forwarded.resolve(Some(&uri), &headers), None);
        headers.insert("host", "internal:8080".parse().unwrap());
        headers.insert("x-forwarded-host", "example.com, proxy".parse().unwrap());
        assert_eq!(
            forwarded.resolve(Some(&uri), &headers).unwrap(),
            "https://example.com/hooks/t1?bodySHA256=ab"
        );
        for bad in ["example.com/hooks", "ftp://example.com/", "/relative", ""] {
            assert!(PublicUrl::exact(bad).is_err(), "{bad}");
        }
        assert!(PublicUrl::origin("https://example.com/?a=1").is_err());
    }

    #[test]
    fn canonical_form_folds_case_and_the_default_port_only() {
        let cases = [
            ("https://A.com:443/X?Y=1", "https://a.com/X?Y=1"),
            ("HTTPS://a.com/x", "https://a.com/x"),
            ("http://a.com:80/x", "http://a.com/x"),
            ("http://a.com:443/x", "http://a.com:443/x"),
            ("https://a.com:8443", "https://a.com:8443"),
            ("https://U:P@A.com:443/x", "https://U:P@a.com/x"),
            ("https://[::1]:443/x", "https://[::1]/x"),
        ];
        for (url, canonical_form) in cases {
            assert_eq!(canonical(url), canonical_form, "{url}");
        }
    }

    #[test]
    fn toggles_the_default_port() {
        let cases = [
            ("https://a.com/x?y=1", "https://a.com:443/x?y=1"),
            ("https://a.com:443/x", "https://a.com/x"),
            ("http://a.com/x", "http://a.com:80/x"),
            ("http://a.com:1234/x", "http://a.com/x"),
            ("https://u:p@a.com/x", "https://u:p@a.com:443/x"),
        ];
        for (url, toggled) in cases {
            assert_eq!(with_port_toggled(url).unwrap(), toggled, "{url}");
        }
    }
}

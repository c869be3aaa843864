//! The request headers the SQL inbox's [`Accept`](super::Accept) stores with an event, for
//! an operator to read back ([`StoredEvent::headers`](super::StoredEvent::headers)):
//! see [`StoredHeaders`].
//!
//! Stored as text, one `name: value` a line, names in lower case, in the order the
//! request had them (a name given twice, twice). Values that are not UTF-8 are stored
//! with the replacement character in place of what does not decode.

use http::{HeaderMap, HeaderName};

use crate::scheme::{Algorithm, Custom, IdSource, TimestampSource};
use crate::Scheme;

/// What a header's name says when it carries a credential, compared in lower case with
/// `-`, `_` and `.` left out, anywhere in the name: `X-Gitlab-Token`,
/// `Cf-Access-Jwt-Assertion`, `x_api_key`, `Proxy-Authorization`, `Set-Cookie`.
/// Storing a little less than needed costs nothing; storing a credential leaks it.
const CREDENTIAL_WORDS: [&str; 17] = [
    "token",
    "secret",
    "password",
    "passwd",
    "session",
    "cookie",
    "auth", // authorization, authentication, oauth, x-auth-*
    "jwt",
    "assertion",
    "credential",
    "apikey",
    "accesskey",
    "privatekey",
    "signingkey",
    "functionskey",    // Azure Functions' x-functions-key
    "subscriptionkey", // Azure API Management's Ocp-Apim-Subscription-Key
    "oidc",            // an AWS load balancer's x-amzn-oidc-* (the user's signed claims)
];

/// PayPal's own headers (its preset verifies them by code of its own): `PAYPAL-AUTH-ALGO`
/// names a hash, no credential.
const PAYPAL: [&str; 5] = [
    "paypal-transmission-id",
    "paypal-transmission-time",
    "paypal-transmission-sig",
    "paypal-cert-url",
    "paypal-auth-algo",
];

/// The most bytes of headers stored with an event.
pub(crate) const MAX_STORED: usize = 8 * 1024;

/// Which request headers the SQL inbox's [`Accept`](super::Accept) stores with an event
/// ([`Accept::with_stored_headers`](super::Accept::with_stored_headers)); the default is
/// [`all_but_credentials`](Self::all_but_credentials).
///
/// Never stored, whatever the choice:
/// - a header whose name says it carries a credential: its name, in any case and with
///   `-`, `_` or `.` anywhere or nowhere, contains `token`, `secret`, `password`,
///   `passwd`, `session`, `cookie`, `auth`, `jwt`, `assertion`, `credential`, `api-key`,
///   `access-key`, `private-key`, `signing-key`, `functions-key`, `subscription-key` or
///   `oidc` (so `Authorization`, `Proxy-Authorization`, `Cookie`, `X-Gitlab-Token`,
///   `X-Amz-Security-Token`, `Cf-Access-Jwt-Assertion`, `X-Api-Key`, …);
/// - a header the application names with [`with_excluded`](Self::with_excluded);
/// - any value the application marked sensitive
///   ([`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive), as
///   `tower_http::sensitive_headers` does) before `Accept`;
/// - what does not fit: the headers kept add up to at most 8 KiB (counted as stored:
///   `name: value` and a line break each), and a header that would go over is left out
///   (the ones after it that still fit are kept).
///
/// The verifying scheme's own headers — its signature, id, timestamp, type and
/// algorithm headers (`Stripe-Signature`, `X-Hub-Signature-256`, `webhook-id`,
/// `PAYPAL-AUTH-ALGO`, …) — are kept even where their name has one of those words: a
/// signature is a MAC or a public-key signature over what the provider sent in the
/// clear, useful to an operator and no key to anything.
///
/// ```
/// use http::HeaderName;
/// use tower_webhook::inbox::StoredHeaders;
///
/// // Everything but credentials, and two more headers of this deployment's proxy.
/// let stored = StoredHeaders::all_but_credentials().with_excluded([
///     HeaderName::from_static("x-tenant-key"),
///     HeaderName::from_static("x-client-cert"),
/// ]);
/// // Or only these (and the scheme's own).
/// let only = StoredHeaders::only([HeaderName::from_static("user-agent")]);
/// # let _ = (stored, only);
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct StoredHeaders {
    excluded: Vec<HeaderName>,
    /// An allowlist: only these (and the scheme's own) are stored.
    only: Option<Vec<HeaderName>>,
}

impl StoredHeaders {
    /// Every header of the delivery but those never stored (the default).
    pub fn all_but_credentials() -> Self {
        Self::default()
    }

    /// Only the headers named here, and the verifying scheme's own; never a credential,
    /// even one named here.
    pub fn only(names: impl IntoIterator<Item = HeaderName>) -> Self {
        Self {
            excluded: Vec::new(),
            only: Some(names.into_iter().collect()),
        }
    }

    /// Replaces the headers the application names as never stored (none by default),
    /// beside those whose names say they carry a credential: a header of yours whose
    /// name does not say so.
    pub fn with_excluded(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.excluded = names.into_iter().collect();
        self
    }

    /// Whether a header named `name` is stored with a delivery `scheme` verified.
    fn keeps(&self, name: &HeaderName, scheme: Option<&Scheme>) -> bool {
        if self.excluded.contains(name) {
            return false;
        }
        if scheme.is_some_and(|scheme| names(scheme, name)) {
            return true;
        }
        !names_a_credential(name.as_str())
            && self.only.as_ref().is_none_or(|only| only.contains(name))
    }

    /// `headers` as the inbox stores them: the ones kept, one `name: value` a line.
    pub(crate) fn stored(&self, headers: &HeaderMap, scheme: Option<&Scheme>) -> String {
        let mut text = String::with_capacity(512); // a provider's usual set, in one allocation
        for (name, value) in headers {
            if value.is_sensitive() || !self.keeps(name, scheme) {
                continue;
            }
            let name = name.as_str(); // lower case already
            let value = String::from_utf8_lossy(value.as_bytes());
            let line = name.len() + 2 + value.len() + 1;
            if text.len() + line > MAX_STORED {
                continue;
            }
            text.push_str(name);
            text.push_str(": ");
            text.push_str(&value);
            text.push('\n');
        }
        text
    }
}

/// Whether `name` (lower case) says it carries a credential: see [`CREDENTIAL_WORDS`].
/// The name without its separators is lower-cased into a buffer on the stack (a longer
/// name, onto the heap), and each word tried only where its first letter is: no
/// substring search a word (~1 700 instructions a header before, ~2 000 with an
/// iterator cloned at each letter; counted by callgrind on the inbox's accept).
pub(crate) fn names_a_credential(name: &str) -> bool {
    let letters = name
        .bytes()
        .filter(|b| !matches!(b, b'-' | b'_' | b'.'))
        .map(|b| b.to_ascii_lowercase());
    let mut stack = [0u8; 64];
    let heap: Vec<u8>;
    let bare: &[u8] = if name.len() <= stack.len() {
        let mut len = 0;
        for (slot, b) in stack.iter_mut().zip(letters) {
            *slot = b;
            len += 1;
        }
        &stack[..len]
    } else {
        heap = letters.collect();
        &heap
    };
    (0..bare.len()).any(|at| {
        let rest = &bare[at..];
        CREDENTIAL_WORDS
            .iter()
            .any(|word| word.as_bytes()[0] == rest[0] && rest.starts_with(word.as_bytes()))
    })
}

/// Whether `scheme` names `name` as one of its own headers: signature, id, timestamp, type
/// or declared algorithm (PayPal's, its preset's). A scheme whose secret itself travels
/// in its signature header (a shared token) does not vouch for that header.
fn names(scheme: &Scheme, name: &HeaderName) -> bool {
    let token = scheme
        .formats
        .iter()
        .any(|f| f.algorithm == Algorithm::SharedToken);
    let signature: &[HeaderName] = if token {
        &[]
    } else {
        &scheme.signature_headers
    };
    let id: &[HeaderName] = match &scheme.id {
        IdSource::Header(headers) => headers,
        _ => &[],
    };
    let timestamp: &[HeaderName] = match &scheme.timestamp {
        Some(TimestampSource::Header(headers, _)) => headers,
        _ => &[],
    };
    let paypal =
        matches!(scheme.custom, Some(Custom::PayPal { .. })) && PAYPAL.contains(&name.as_str());
    paypal
        || signature
            .iter()
            .chain(id)
            .chain(timestamp)
            .chain(&scheme.type_header)
            .chain(&scheme.algorithm_header)
            .any(|own| own == name)
}

/// The stored text read back as pairs, in their order.
pub(crate) fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn stored(map: &HeaderMap) -> String {
        StoredHeaders::default().stored(map, None)
    }

    #[test]
    fn names_that_say_credential_are_never_stored() {
        let credentials = [
            // The four a review found stored and shown.
            "X-Amzn-Oidc-Accesstoken",
            "X-Forwarded-Access-Token",
            "X-Gitlab-Token",
            "Cf-Access-Jwt-Assertion",
            // The six of before.
            "Authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "X-Auth-Token",
            // More, in every spelling.
            "x_api_key",
            "apikey",
            "X-APIKEY",
            "Api.Key",
            "X-Amz-Security-Token",
            "X-Amzn-Oidc-Data",
            "X-Aws-Access-Key-Id",
            "X-Webhook-Secret",
            "Cf-Access-Client-Secret",
            "X-Goog-Iap-Jwt-Assertion",
            "X-Ms-Token-Aad-Id-Token",
            "X-Session-Id",
            "X-Db-Password",
            "WWW-Authenticate",
            "X-Oauth-Scopes",
            "X-Client-Credential",
            "X-Functions-Key",
            "Ocp-Apim-Subscription-Key",
            "X-Private-Key",
            "x-csrftoken",
        ];
        for name in credentials {
            assert!(names_a_credential(&name.to_ascii_lowercase()), "{name}");
            let map = headers(&[(name, "secret-value"), ("x-kept", "1")]);
            assert_eq!(stored(&map), "x-kept: 1\n", "{name}");
        }
        let ordinary = [
            "Content-Type",
            "User-Agent",
            "X-Request-Id",
            "X-Forwarded-For",
            "X-GitHub-Event",
            "X-GitHub-Hook-Id",
            "Webhook-Id",
            "X-Idempotency-Key",
            "Sec-Fetch-Mode",
            "Traceparent",
        ];
        for name in ordinary {
            assert!(!names_a_credential(&name.to_ascii_lowercase()), "{name}");
        }
        // Past the stack's 64 bytes, read the same; a word split by separators too.
        let long = format!("x-{}", "a".repeat(70));
        assert!(!names_a_credential(&long));
        assert!(names_a_credential(&format!("{long}-api-key")));
        assert!(names_a_credential(&format!("{long}-t.o_k-en")));
        assert!(names_a_credential("x-t.o_k-en"));
    }

    #[test]
    fn the_schemes_own_headers_are_kept_even_where_their_name_has_such_a_word() {
        let paypal = Scheme::paypal("WH-1");
        let map = headers(&[
            ("paypal-auth-algo", "SHA256withRSA"),
            ("paypal-transmission-sig", "c2ln"),
            ("x-paypal-auth-token", "secret"),
        ]);
        assert_eq!(
            StoredHeaders::default().stored(&map, Some(&paypal)),
            "paypal-auth-algo: SHA256withRSA\npaypal-transmission-sig: c2ln\n"
        );
        // Without PayPal's scheme, `paypal-auth-algo` is a name like any other.
        assert_eq!(stored(&map), "paypal-transmission-sig: c2ln\n");
        // A scheme of the application's, whose headers happen to say `token` and `auth`.
        let own = Scheme::hmac(HeaderName::from_static("x-auth-signature"))
            .with_id_header(HeaderName::from_static("x-delivery-token-id"));
        let map = headers(&[
            ("x-auth-signature", "abc"),
            ("x-delivery-token-id", "d_1"),
            ("x-gitlab-token", "secret"),
        ]);
        assert_eq!(
            StoredHeaders::default().stored(&map, Some(&own)),
            "x-auth-signature: abc\nx-delivery-token-id: d_1\n"
        );
    }

    #[test]
    fn the_application_names_more_or_stores_only_what_it_lists() {
        let map = headers(&[
            ("content-type", "application/json"),
            ("x-tenant-key", "secret"),
            ("user-agent", "GitHub-Hookshot/1"),
            ("x-gitlab-token", "secret"),
            ("x-hub-signature-256", "sha256=ab"),
        ]);
        let github = Scheme::github();
        let excluded = StoredHeaders::all_but_credentials()
            .with_excluded([HeaderName::from_static("x-tenant-key")]);
        assert_eq!(
            excluded.stored(&map, Some(&github)),
            "content-type: application/json\nuser-agent: GitHub-Hookshot/1\n\
             x-hub-signature-256: sha256=ab\n"
        );
        // Named in an allowlist, a credential is still not stored; the scheme's own is.
        let only = StoredHeaders::only([
            HeaderName::from_static("user-agent"),
            HeaderName::from_static("x-gitlab-token"),
        ]);
        assert_eq!(
            only.stored(&map, Some(&github)),
            "user-agent: GitHub-Hookshot/1\nx-hub-signature-256: sha256=ab\n"
        );
        // The application's exclusion wins over the scheme's own.
        let excluded = StoredHeaders::all_but_credentials()
            .with_excluded([HeaderName::from_static("x-hub-signature-256")]);
        assert!(!excluded
            .stored(&map, Some(&github))
            .contains("x-hub-signature"));
    }

    #[test]
    fn credentials_are_left_out_and_signatures_kept() {
        let map = headers(&[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer secret"),
            ("COOKIE", "session=secret"),
            ("Proxy-Authorization", "Basic secret"),
            ("X-Api-Key", "secret"),
            ("webhook-signature", "v1,abc="),
            ("webhook-id", "msg_1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
        ]);
        let text = stored(&map);
        assert!(!text.contains("secret"), "{text}");
        assert_eq!(
            parse(&text),
            [
                ("content-type", "application/json"),
                ("webhook-signature", "v1,abc="),
                ("webhook-id", "msg_1"),
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-for", "10.0.0.2"),
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn a_value_marked_sensitive_is_left_out() {
        let mut map = headers(&[("x-tenant-sig", "secret"), ("x-tenant", "acme")]);
        map.get_mut("x-tenant-sig").unwrap().set_sensitive(true);
        assert_eq!(stored(&map), "x-tenant: acme\n");
    }

    #[test]
    fn what_does_not_fit_in_8_kib_is_left_out_and_smaller_ones_after_it_kept() {
        let big = "a".repeat(MAX_STORED);
        let half = "b".repeat(MAX_STORED / 2);
        let map = headers(&[
            ("x-first", &half),
            ("x-big", &big),
            ("x-second", &half),
            ("x-small", "c"),
        ]);
        let text = stored(&map);
        assert!(text.len() <= MAX_STORED, "{}", text.len());
        let names: Vec<String> = parse(&text).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["x-first", "x-small"]);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_stored_lossily_and_colons_in_values_survive() {
        let mut map = HeaderMap::new();
        map.insert("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        map.insert("x-time", HeaderValue::from_static("12:30: noon"));
        assert_eq!(
            parse(&stored(&map)),
            [
                ("x-raw".to_owned(), "caf\u{fffd}".to_owned()),
                ("x-time".to_owned(), "12:30: noon".to_owned()),
            ]
        );
    }
}

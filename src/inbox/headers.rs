//! The request headers the SQL inbox's [`Accept`](super::Accept) stores with an event, for
//! an operator to read back ([`StoredEvent::headers`](super::StoredEvent::headers)).
//!
//! Kept: every header of the delivery but
//! - credentials: `Authorization`, `Proxy-Authorization`, `Cookie`, `Set-Cookie`,
//!   `X-Api-Key` and `X-Auth-Token` (`NOT_STORED`), whatever their case;
//! - any value the application marked sensitive
//!   ([`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive), as
//!   `tower_http::sensitive_headers` does) before `Accept`;
//! - what does not fit: the headers kept add up to at most `MAX_STORED` bytes (8 KiB,
//!   counted as stored: `name: value` and a line break each), and a header that would go
//!   over is left out (the ones after it that still fit are kept).
//!
//! Signature headers are kept: a signature is a MAC over data the provider sent in the
//! clear, useful to an operator and no key to anything. Values that are not UTF-8 are
//! stored with the replacement character in place of what does not decode.
//!
//! Stored as text, one `name: value` a line, names in lower case, in the order the
//! request had them (a name given twice, twice).

use http::HeaderMap;

/// The headers never stored: credentials of the caller, not of the event.
pub(crate) const NOT_STORED: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "x-auth-token",
];

/// The most bytes of headers stored with an event.
pub(crate) const MAX_STORED: usize = 8 * 1024;

/// `headers` as the inbox stores them: the ones kept, one `name: value` a line.
pub(crate) fn stored(headers: &HeaderMap) -> String {
    let mut text = String::new();
    for (name, value) in headers {
        let name = name.as_str(); // lower case already
        if value.is_sensitive() || NOT_STORED.contains(&name) {
            continue;
        }
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
        let mut map = headers(&[("x-tenant-token", "secret"), ("x-tenant", "acme")]);
        map.get_mut("x-tenant-token").unwrap().set_sensitive(true);
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

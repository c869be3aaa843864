//! Shared by the fuzz targets: the schemes, a fixed clock, and how raw input becomes
//! header values.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use tower_webhook::{Scheme, Verifier};

/// The fuzzers' "now".
pub const NOW: u64 = 1_700_000_000;
pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const SECRET: &str = "fuzz-secret-0123456789";

pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

/// One of the presets, chosen by `byte`, with its secret.
pub fn scheme(byte: u8) -> (Scheme, &'static str) {
    match byte % 5 {
        0 => (Scheme::standard(), STANDARD_SECRET),
        1 => (Scheme::stripe(), "whsec_fuzz_secret_0123456789"),
        2 => (Scheme::github(), SECRET),
        3 => (Scheme::slack(), SECRET),
        _ => (Scheme::shopify(), SECRET),
    }
}

pub fn verifier(scheme: Scheme, secret: &str) -> Verifier {
    Verifier::new(scheme, [secret])
        .expect("valid fuzz secrets")
        .with_clock(now)
}

/// Sets `name` to `value` when the bytes are a valid header value (any other is refused
/// by the HTTP stack before a middleware sees it).
pub fn set(headers: &mut HeaderMap, name: &str, value: &[u8]) {
    if let Ok(value) = HeaderValue::from_bytes(value) {
        headers.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
    }
}

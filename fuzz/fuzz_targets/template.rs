//! The signed-content template's parser: any string is a template or a `ConfigError`;
//! one that parses signs and verifies its own deliveries (at a public URL, for templates
//! that sign it).
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::{HeaderName, Method, Uri};
use libfuzzer_sys::fuzz_target;
use tower_webhook::scheme::TimestampFormat;
use tower_webhook::{PublicUrl, Scheme, Verifier};

const URL: &str = "https://hooks.example.com/webhooks";

fuzz_target!(|template: &str| {
    let Ok(scheme) = Scheme::hmac(HeaderName::from_static("x-sig"))
        .with_timestamp_header(HeaderName::from_static("x-ts"), TimestampFormat::Unix)
        .with_id_header(HeaderName::from_static("x-id"))
        .allow_unsigned_id()
        .allow_unsigned_timestamp()
        .with_signed_content(template)
    else {
        return;
    };
    let Ok(verifier) = Verifier::new(scheme.clone(), [common::SECRET]) else {
        return;
    };
    let verifier = verifier
        .with_clock(common::now)
        .with_public_url(PublicUrl::exact(URL).expect("a valid URL"));
    let body = Bytes::from_static(b"{\"id\":1}");
    let headers = scheme
        .sign_request(
            [common::SECRET],
            &Method::POST,
            URL,
            "evt_1",
            common::now(),
            &body,
        )
        .expect("a parsed template signs");
    let uri = Uri::from_static("/webhooks");
    assert!(
        verifier
            .verify_request(&Method::POST, &uri, &headers, body)
            .is_ok(),
        "{template:?} does not verify its own"
    );
});

//! Timestamp parsing and the window: an arbitrary timestamp value, as a unix header
//! (Standard Webhooks) and as an RFC 3339 header (a custom scheme). Never a panic.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::HeaderName;
use libfuzzer_sys::fuzz_target;
use tower_webhook::scheme::{Encoding, TimestampFormat};
use tower_webhook::Scheme;

fuzz_target!(|data: &[u8]| {
    let body = Bytes::from_static(b"{}");
    let mut headers = Scheme::standard()
        .sign([common::STANDARD_SECRET], "msg_1", common::now(), &body)
        .unwrap();
    common::set(&mut headers, "webhook-timestamp", data);
    let standard = common::verifier(Scheme::standard(), common::STANDARD_SECRET);
    let _ = standard.verify(&headers, body.clone());

    let rfc3339 = Scheme::hmac(HeaderName::from_static("x-sig"))
        .with_encoding(Encoding::Hex)
        .with_timestamp_header(HeaderName::from_static("x-ts"), TimestampFormat::Rfc3339)
        .with_signed_content("{timestamp}.{body}")
        .unwrap();
    let mut headers = rfc3339
        .sign([common::SECRET], "", common::now(), &body)
        .unwrap();
    common::set(&mut headers, "x-ts", data);
    let _ = common::verifier(rfc3339, common::SECRET).verify(&headers, body);
});

//! The whole check on arbitrary input: a scheme, then every header it reads and the body,
//! separated by 0xFF. It must answer (Ok or a `VerifyError`), never panic.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 12] = [
    "webhook-signature",
    "webhook-timestamp",
    "webhook-id",
    "stripe-signature",
    "x-hub-signature-256",
    "x-github-delivery",
    "x-github-event",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-shopify-hmac-sha256",
    "x-shopify-topic",
    "svix-id",
];

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let (scheme, secret) = common::scheme(choice);
    let verifier = common::verifier(scheme, secret);
    let mut pieces = rest.split(|b| *b == 0xFF);
    let mut headers = HeaderMap::new();
    for name in NAMES {
        if let Some(value) = pieces.next() {
            common::set(&mut headers, name, value);
        }
    }
    let body = pieces.next().unwrap_or_default();
    let _ = verifier.verify(&headers, Bytes::copy_from_slice(body));
});

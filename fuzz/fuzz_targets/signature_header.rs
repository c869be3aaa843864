//! The signature header's parser: an arbitrary signature header beside otherwise valid
//! headers of the scheme, so parsing (entries, prefixes, lengths, Stripe's `t=`) is what
//! the input drives. Never a panic; never a match without the secret.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, value)) = data.split_first() else {
        return;
    };
    let (scheme, secret) = common::scheme(choice);
    let body = br#"{"id":"evt_1","type":"invoice.paid"}"#;
    let mut headers = scheme
        .sign([secret], "msg_1", common::now(), body)
        .expect("signs");
    let name = headers
        .keys()
        .find(|n| n.as_str().contains("signature") || n.as_str().contains("hmac"))
        .cloned()
        .expect("a signature header");
    // A value no HTTP stack would pass on is not an input here (and `set` would leave the
    // genuine header in place).
    let Ok(replacement) = http::HeaderValue::from_bytes(value) else {
        return;
    };
    headers.insert(name.clone(), replacement);
    let verified = common::verifier(scheme, secret).verify(&headers, Bytes::from_static(body));
    // An arbitrary value verifies only if it still holds the genuine MAC it replaced.
    if verified.is_ok() {
        let genuine = common::scheme(choice)
            .0
            .sign([secret], "msg_1", common::now(), body)
            .unwrap();
        // The MAC-sized pieces of the genuine header (hex or base64, 40 characters or more).
        let genuine = genuine[&name].to_str().unwrap();
        let value = String::from_utf8_lossy(value);
        let holds_a_mac = genuine
            .split([' ', ','])
            .filter(|piece| piece.len() >= 40)
            .any(|mac| value.contains(mac));
        assert!(holds_a_mac, "a forged signature header verified: {value}");
    }
});

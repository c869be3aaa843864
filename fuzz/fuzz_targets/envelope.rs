//! The JSON envelope's parser: an arbitrary body, genuinely signed, so it verifies and
//! the event's lazily parsed fields are read. Parsing is not authentication: any body
//! verifies, and a body that is not JSON just has no fields.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for choice in [0u8, 1] {
        let (scheme, secret) = common::scheme(choice);
        let headers = scheme.sign([secret], "msg_1", common::now(), data).unwrap();
        let event = common::verifier(scheme, secret)
            .verify(&headers, Bytes::copy_from_slice(data))
            .expect("a genuinely signed body verifies");
        let _ = (
            event.id(),
            event.event_type(),
            event.livemode(),
            event.object_id(),
        );
        let _ = event.dedupe_id();
        let _ = event.json::<serde_json_value::Value>();
    }
});

mod serde_json_value {
    /// Any JSON, without naming serde_json here: `IgnoredAny` walks the whole document.
    pub type Value = serde::de::IgnoredAny;
}

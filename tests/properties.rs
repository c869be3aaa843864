//! Property: any single changed byte of the body, the id or the timestamp fails
//! verification, and no input makes the verifier panic.

mod common;

use bytes::Bytes;
use common::{at, verifier, NOW};
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use tower_webhook::Scheme;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const EMPTY_OBJECT: &[u8] = b"{}";

fn signed(id: &str, body: &[u8]) -> HeaderMap {
    Scheme::standard()
        .sign([SECRET], id, at(NOW), body)
        .unwrap()
}

/// `s` with the byte at `index` replaced by another visible ASCII byte.
fn tweak_ascii(s: &str, index: usize, delta: u8) -> String {
    let mut bytes = s.as_bytes().to_vec();
    let i = index % bytes.len();
    let visible = (b'!'..=b'~').count() as u8;
    bytes[i] = b'!' + ((bytes[i] - b'!' + 1 + delta % (visible - 1)) % visible);
    String::from_utf8(bytes).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_changed_body_byte_fails(body in proptest::collection::vec(any::<u8>(), 1..600), index: usize, flip in 1u8..=255) {
        let v = verifier(Scheme::standard(), &[SECRET]);
        let headers = signed("msg_prop", &body);
        prop_assert!(v.verify(&headers, Bytes::from(body.clone())).is_ok());
        let mut changed = body.clone();
        let i = index % changed.len();
        changed[i] ^= flip;
        prop_assert!(v.verify(&headers, Bytes::from(changed)).is_err());
    }

    #[test]
    fn any_changed_id_byte_fails(id in "[a-zA-Z0-9_]{1,40}", index: usize, delta: u8) {
        let v = verifier(Scheme::standard(), &[SECRET]);
        let mut headers = signed(&id, EMPTY_OBJECT);
        headers.insert("webhook-id", HeaderValue::from_str(&tweak_ascii(&id, index, delta)).unwrap());
        prop_assert!(v.verify(&headers, Bytes::from_static(EMPTY_OBJECT)).is_err());
    }

    #[test]
    fn any_changed_timestamp_byte_fails(index: usize, delta: u8) {
        let v = verifier(Scheme::standard(), &[SECRET]);
        let mut headers = signed("msg_prop", EMPTY_OBJECT);
        let ts = headers["webhook-timestamp"].to_str().unwrap().to_owned();
        headers.insert("webhook-timestamp", HeaderValue::from_str(&tweak_ascii(&ts, index, delta)).unwrap());
        prop_assert!(v.verify(&headers, Bytes::from_static(EMPTY_OBJECT)).is_err());
    }

    #[test]
    fn stripe_any_changed_byte_of_the_signed_content_fails(body in proptest::collection::vec(any::<u8>(), 1..300), index: usize, flip in 1u8..=255) {
        let secret = "whsec_stripe_prop_0123456789";
        let v = verifier(Scheme::stripe(), &[secret]);
        let headers = Scheme::stripe().sign([secret], "", at(NOW), &body).unwrap();
        let mut changed = body.clone();
        let i = index % changed.len();
        changed[i] ^= flip;
        prop_assert!(v.verify(&headers, Bytes::from(changed)).is_err());
    }

    #[test]
    fn arbitrary_header_values_never_panic(sig in proptest::collection::vec(any::<u8>(), 0..400), ts in proptest::collection::vec(any::<u8>(), 0..40)) {
        let v = verifier(Scheme::standard(), &[SECRET]);
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", HeaderValue::from_static("msg"));
        if let Ok(value) = HeaderValue::from_bytes(&sig) {
            headers.insert("webhook-signature", value);
        }
        if let Ok(value) = HeaderValue::from_bytes(&ts) {
            headers.insert("webhook-timestamp", value);
        }
        prop_assert!(v.verify(&headers, Bytes::from_static(EMPTY_OBJECT)).is_err());
    }
}

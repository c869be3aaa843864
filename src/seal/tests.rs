use base64::Engine as _;
use zeroize::Zeroize;

use super::{Aad, Column, Key, KeyRing, UnreadableKind, NONCE_BYTES, TAG_BYTES};
use crate::ConfigErrorKind;

fn key(id: &str, byte: u8) -> Key {
    Key::new(id, [byte; 32]).unwrap()
}

fn ring(keys: &[(&str, u8)]) -> KeyRing {
    KeyRing::new(keys.iter().map(|&(id, b)| key(id, b))).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

const BODY: Aad<'static> = Aad {
    source: "stripe",
    event_id: "evt_1",
    column: Column::Body,
};

#[test]
fn what_is_sealed_opens_to_the_same_bytes_and_holds_none_of_them() {
    // Uncompressed too: a compressed run of 0xA5 would hold no 16-byte run of it anyway.
    let rings = [ring(&[("k1", 1)]), ring(&[("k1", 1)]).without_compression()];
    let plaintexts = [&b""[..], b"{\"name\": \"Ada\"}", &vec![0xA5; 64 * 1024]];
    for (ring, plaintext) in rings.iter().flat_map(|r| plaintexts.map(|p| (r, p))) {
        let sealed = ring.seal(&BODY, plaintext).unwrap();
        assert_eq!(sealed.key_id(), "k1");
        // Stored (one byte saying so) unless compression made it shorter.
        assert!(sealed.ciphertext().len() <= 1 + plaintext.len() + TAG_BYTES);
        assert_eq!(sealed.nonce().len(), NONCE_BYTES);
        if plaintext.len() > 4 {
            assert!(!sealed
                .ciphertext()
                .windows(plaintext.len().min(16))
                .any(|w| w == &plaintext[..plaintext.len().min(16)]));
        }
        assert_eq!(ring.open(&BODY, &sealed).unwrap(), plaintext);
        let parts = (sealed.key_id(), &sealed.nonce()[..], sealed.ciphertext());
        assert_eq!(
            ring.open_parts(&BODY, parts.0, parts.1, parts.2).unwrap(),
            plaintext
        );
    }
}

#[test]
fn each_seal_takes_a_fresh_nonce() {
    let ring = ring(&[("k1", 1)]);
    let a = ring.seal(&BODY, b"same").unwrap();
    let b = ring.seal(&BODY, b"same").unwrap();
    assert_ne!(a.nonce(), b.nonce());
    assert_ne!(a.ciphertext(), b.ciphertext());
}

#[test]
fn changing_any_part_of_the_associated_data_refuses_the_ciphertext() {
    let ring = ring(&[("k1", 1)]);
    let error = |processor| Aad::new("stripe", "evt_1", Column::Error { processor });
    let cases = [
        (BODY, Aad::new("github", "evt_1", Column::Body)),
        (BODY, Aad::new("stripe", "evt_2", Column::Body)),
        (BODY, Aad::new("stripe", "evt_1", Column::Headers)),
        (BODY, Aad::new("stripe", "evt_1", Column::Message)),
        (BODY, Aad::new("stripe", "evt_1", Column::Subject)),
        (BODY, error("default")),
        (error("billing"), error("email")),
        (error(""), BODY),
        // Parts that would meet under a separator or plain concatenation.
        (
            Aad::new("a|b", "c", Column::Body),
            Aad::new("a", "b|c", Column::Body),
        ),
        (
            Aad::new("ab", "c", Column::Body),
            Aad::new("a", "bc", Column::Body),
        ),
        (
            Aad::new("s", "id", Column::Error { processor: "" }),
            Aad::new("s", "id", Column::Error { processor: "x" }),
        ),
    ];
    for (sealed_for, read_as) in cases {
        let sealed = ring.seal(&sealed_for, b"payload").unwrap();
        assert_eq!(ring.open(&sealed_for, &sealed).unwrap(), b"payload");
        let err = ring.open(&read_as, &sealed).unwrap_err();
        assert_eq!(
            err.kind(),
            UnreadableKind::Tampered,
            "{sealed_for:?} read as {read_as:?}"
        );
    }
}

#[test]
fn a_ciphertext_swapped_between_columns_or_rows_does_not_open() {
    let ring = ring(&[("k1", 1)]);
    let headers = Aad::new("stripe", "evt_1", Column::Headers);
    let body = ring.seal(&BODY, b"body").unwrap();
    let head = ring.seal(&headers, b"[[\"x\", \"y\"]]").unwrap();
    // The body's column now holds the headers' ciphertext, and the other way round.
    assert_eq!(
        ring.open(&BODY, &head).unwrap_err().kind(),
        UnreadableKind::Tampered
    );
    assert_eq!(
        ring.open(&headers, &body).unwrap_err().kind(),
        UnreadableKind::Tampered
    );
    // Another event's body copied into this row.
    let other = ring
        .seal(&Aad::new("stripe", "evt_2", Column::Body), b"theirs")
        .unwrap();
    assert_eq!(
        ring.open(&BODY, &other).unwrap_err().kind(),
        UnreadableKind::Tampered
    );
}

#[test]
fn only_the_current_key_seals_and_every_key_opens() {
    let before = ring(&[("k1", 1)]);
    let old = before.seal(&BODY, b"old").unwrap();
    let rotated = ring(&[("k2", 2), ("k1", 1)]);
    assert_eq!(rotated.current_id(), "k2");
    assert_eq!(rotated.ids().collect::<Vec<_>>(), ["k2", "k1"]);
    let new = rotated.seal(&BODY, b"new").unwrap();
    assert_eq!(new.key_id(), "k2");
    assert_eq!(rotated.open(&BODY, &old).unwrap(), b"old");
    assert_eq!(rotated.open(&BODY, &new).unwrap(), b"new");
    assert!(rotated.needs_rekey(old.key_id()));
    assert!(!rotated.needs_rekey(new.key_id()));
    // The old ring does not know k2.
    assert_eq!(
        before.open(&BODY, &new).unwrap_err().kind(),
        UnreadableKind::UnknownKey
    );
}

#[test]
fn an_unknown_key_id_is_unreadable_and_names_the_id() {
    let sealed = ring(&[("retired", 9)]).seal(&BODY, b"x").unwrap();
    let err = ring(&[("k2", 2)]).open(&BODY, &sealed).unwrap_err();
    assert_eq!(err.kind(), UnreadableKind::UnknownKey);
    assert_eq!(err.key_id(), "retired");
    assert!(err.to_string().contains("\"retired\""), "{err}");
}

#[test]
fn altered_truncated_or_misattributed_ciphertexts_are_unreadable_not_a_panic() {
    let ring1 = ring(&[("k1", 1)]);
    let sealed = ring1.seal(&BODY, b"payload").unwrap();
    let (id, nonce, ct) = (sealed.key_id(), sealed.nonce(), sealed.ciphertext());
    let open = |nonce: &[u8], ct: &[u8]| ring1.open_parts(&BODY, id, nonce, ct).unwrap_err();
    let mut flipped = ct.to_vec();
    flipped[0] ^= 1;
    assert_eq!(open(nonce, &flipped).kind(), UnreadableKind::Tampered);
    let mut tag = ct.to_vec();
    *tag.last_mut().unwrap() ^= 0x80;
    assert_eq!(open(nonce, &tag).kind(), UnreadableKind::Tampered);
    let mut other_nonce = *nonce;
    other_nonce[23] ^= 1;
    assert_eq!(open(&other_nonce, ct).kind(), UnreadableKind::Tampered);
    assert_eq!(open(&nonce[..12], ct).kind(), UnreadableKind::Malformed);
    assert_eq!(
        open(nonce, &ct[..TAG_BYTES - 1]).kind(),
        UnreadableKind::Malformed
    );
    assert_eq!(open(nonce, &[]).kind(), UnreadableKind::Malformed);
    // Another key configured under the sealing key's id.
    let impostor = ring(&[("k1", 7)]);
    assert_eq!(
        impostor.open(&BODY, &sealed).unwrap_err().kind(),
        UnreadableKind::Tampered
    );
}

#[test]
fn a_ring_refuses_no_keys_a_duplicate_id_a_bad_id_and_a_bad_length() {
    let err = KeyRing::new([]).unwrap_err();
    assert_eq!(err.kind(), ConfigErrorKind::InvalidEncryptionKey);
    let err = KeyRing::new([key("a", 1), key("b", 2), key("a", 3)]).unwrap_err();
    assert_eq!(err.kind(), ConfigErrorKind::InvalidEncryptionKey);
    assert!(err.to_string().contains("#3"), "{err}");
    for id in ["", "has space", "a:b", "a,b", "é", &"x".repeat(33)] {
        let err = Key::new(id, [1; 32]).unwrap_err();
        assert_eq!(err.kind(), ConfigErrorKind::InvalidEncryptionKey, "{id:?}");
    }
    assert!(Key::new("2026-12_a.b", [1; 32]).is_ok());
    for len in [0, 16, 31, 33, 64] {
        let err = Key::from_slice("k", &vec![0x42; len]).unwrap_err();
        assert_eq!(err.kind(), ConfigErrorKind::InvalidEncryptionKey);
        assert!(err.to_string().contains(&format!("not {len}")), "{err}");
    }
}

#[test]
fn the_environment_format_parses_first_as_current() {
    let value = format!(" k2:{} ,k1:{}", b64(&[2; 32]), b64(&[1; 32]));
    let parsed = KeyRing::parse(&value).unwrap();
    assert_eq!(parsed.ids().collect::<Vec<_>>(), ["k2", "k1"]);
    // The parsed keys are the bytes given: the same as a ring built from them.
    let sealed = ring(&[("k1", 1)]).seal(&BODY, b"x").unwrap();
    assert_eq!(parsed.open(&BODY, &sealed).unwrap(), b"x");
    assert_eq!(parsed.seal(&BODY, b"y").unwrap().key_id(), "k2");
}

#[test]
fn a_malformed_entry_is_named_by_position_and_never_printed() {
    let good = format!("k1:{}", b64(&[1; 32]));
    let short = b64(&[0x5A; 31]);
    let long = b64(&[0x5A; 33]);
    let bare = b64(&[0x5A; 32]);
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "entry 1 is empty"),
        (format!("{good},"), "entry 2 is empty"),
        (format!("{good},{bare}"), "entry 2 is not"),
        (format!("{good},k2:{short}"), "entry 2 (\"k2\")"),
        (format!("k2:{long},{good}"), "entry 1 (\"k2\")"),
        (format!("{good},k2:{}!", &bare[..40]), "not standard base64"),
        (format!("{good},bad id:{bare}"), "entry 2:"),
        (format!("{good},{good}"), "#2 has the id \"k1\""),
    ];
    for (value, expected) in cases {
        let err = KeyRing::parse(&value).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), ConfigErrorKind::InvalidEncryptionKey, "{text}");
        assert!(text.contains(expected), "{value:?}: {text}");
        let debug = format!("{err:?}");
        for secret in [&short, &long, &bare, &b64(&[1; 32])] {
            assert!(!text.contains(secret.as_str()), "{text}");
            assert!(!debug.contains(secret.as_str()), "{debug}");
        }
        assert!(!text.contains("bad id"), "{text}");
    }
}

#[test]
fn keys_and_rings_print_ids_never_bytes() {
    let secret = [0xAB; 32];
    let value = format!("live:{}", b64(&secret));
    let parsed = KeyRing::parse(&value).unwrap();
    let key = Key::new("live", secret).unwrap();
    let sealed = parsed.seal(&BODY, b"x").unwrap();
    let printed = [
        format!("{key:?}"),
        format!("{parsed:?}"),
        format!("{parsed:#?}"),
        format!("{parsed}"),
        format!("{sealed:?}"),
    ];
    for text in &printed {
        assert!(text.contains("live"), "{text}");
        assert!(!text.contains(&b64(&secret)), "{text}");
        assert!(!text.contains("171"), "{text}"); // 0xAB as Debug prints a byte
        assert!(!text.to_lowercase().contains("abab"), "{text}");
    }
    assert_eq!(format!("{parsed}"), "live (current)");
    assert_eq!(format!("{}", ring(&[("b", 2), ("a", 1)])), "b (current), a");
}

fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}

#[test]
fn keys_are_wiped() {
    // Compiles only while `Key` and the cipher (its `zeroize` feature: each call's copy
    // of the key) are wiped on drop.
    wiped_on_drop::<Key>();
    wiped_on_drop::<chacha20poly1305::XChaCha20Poly1305>();
    let mut key = Key::new("k", [0xCD; 32]).unwrap();
    key.zeroize();
    assert_eq!(key.bytes(), &[0; 32]);
    assert_eq!(key.id(), "k");
}

#[test]
fn subject_digests_are_keyed_per_key_and_unambiguous() {
    let rotated = ring(&[("k2", 2), ("k1", 1)]);
    let digests = rotated.subject_digests("cus_42");
    assert_eq!(digests.len(), 2);
    assert_eq!(digests[0].0, "k2");
    assert_ne!(digests[0].1, digests[1].1);
    // Stable for one key, so a digest stored before a rotation is still found.
    assert_eq!(
        digests[1].1,
        ring(&[("k1", 1)]).subject_digests("cus_42")[0].1
    );
    assert_ne!(digests[0].1, rotated.subject_digests("cus_43")[0].1);
    // Not the plain hash of the subject, and not the same key material as the cipher's.
    let k1 = key("k1", 1);
    assert_ne!(k1.subject_digest(""), key("k1", 3).subject_digest(""));
}

#[test]
fn compressible_payloads_seal_shorter_unless_the_ring_says_not_and_either_ring_opens_both() {
    let json =
        br#"{"type":"customer.updated","data":{"object":{"address":{"city":"Ada"}}}}"#.repeat(30);
    let compressing = ring(&[("k1", 1)]);
    let plain = ring(&[("k1", 1)]).without_compression();
    assert!(compressing.compresses() && !plain.compresses());
    let small = compressing.seal(&BODY, &json).unwrap();
    let full = plain.seal(&BODY, &json).unwrap();
    assert!(
        small.ciphertext().len() < json.len() / 4,
        "{}",
        small.ciphertext().len()
    );
    assert_eq!(full.ciphertext().len(), 1 + json.len() + TAG_BYTES);
    for ring in [&compressing, &plain] {
        assert_eq!(ring.open(&BODY, &small).unwrap(), json);
        assert_eq!(ring.open(&BODY, &full).unwrap(), json);
    }
    assert!(format!("{plain:?}").contains("compress: false"));
}

#[test]
fn a_ciphertext_that_opens_to_no_frame_of_ours_is_malformed() {
    use chacha20poly1305::aead::AeadInOut;
    let ring1 = ring(&[("k1", 1)]);
    let nonce = [3; NONCE_BYTES];
    // Sealed with the right key and associated data, but framed as nothing `seal` writes.
    for frame in [vec![], vec![9, 1, 2], vec![1, 0xff, 0xff, 0xff, 0x7f, 0]] {
        let mut buffer = frame.clone();
        let tag = super::ring::cipher(&key("k1", 1))
            .encrypt_inout_detached(&nonce.into(), &BODY.encode(), buffer.as_mut_slice().into())
            .unwrap();
        buffer.extend_from_slice(&tag);
        let err = ring1.open_parts(&BODY, "k1", &nonce, &buffer).unwrap_err();
        assert_eq!(err.kind(), UnreadableKind::Malformed, "{frame:?}");
    }
}

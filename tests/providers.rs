//! The provider catalogue beyond the first five HMAC schemes: each preset against its
//! provider's published test vectors where they exist (the source is named beside each),
//! else against a vector computed independently (Python `cryptography`/`hmac`, labelled),
//! and each refusing a forged body, a wrong key and a stale timestamp.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use tower_webhook::{Scheme, Verifier, VerifyErrorKind};

use common::header_map as headers;

fn at(scheme: Scheme, keys: &[&str], unix: u64) -> Verifier {
    Verifier::new(scheme, keys)
        .unwrap()
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(unix))
}

fn refused(v: &Verifier, h: &HeaderMap, body: &[u8]) -> VerifyErrorKind {
    v.verify(h, Bytes::copy_from_slice(body))
        .unwrap_err()
        .kind()
}

/// The common refusals: a changed body byte, a verifier holding another key, and (where
/// the scheme signs a timestamp) the same delivery an hour later.
fn refuses_forgery(
    scheme: impl Fn() -> Scheme,
    key: &str,
    other_key: &str,
    h: &HeaderMap,
    body: &[u8],
    unix: u64,
) {
    let name = scheme().name().to_owned();
    let v = at(scheme(), &[key], unix);
    assert!(v.verify(h, Bytes::copy_from_slice(body)).is_ok(), "{name}");
    let mut forged = body.to_vec();
    let last = forged.len() - 2;
    forged[last] ^= 1;
    assert_eq!(
        refused(&v, h, &forged),
        VerifyErrorKind::InvalidSignature,
        "{name}: forged"
    );
    let wrong = at(scheme(), &[other_key], unix);
    assert_eq!(
        refused(&wrong, h, body),
        VerifyErrorKind::InvalidSignature,
        "{name}: wrong key"
    );
    if scheme().name() != "meta" && scheme().name() != "intercom" {
        let late = at(scheme(), &[key], unix + 3600);
        assert_eq!(
            refused(&late, h, body),
            VerifyErrorKind::TimestampTooOld,
            "{name}: stale"
        );
    }
}

// Standard Webhooks v1a: svix/svix-webhooks `server/svix-server/src/worker.rs`
// (`test_asymmetric_key_signing`), the same signature the spec prints as its example.
const SW_SK: &str =
    "whsk_6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbfVKIDij2HKpMKkioLlX0dRqSKJp4AJ6p9lMicMFs6Kvg==";
const SW_PK: &str = "whpk_1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4=";
const SW_HMAC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_V1: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
const SW_V1A: &str =
    "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg==";
const SW_TS: u64 = 1_614_265_330;

fn sw_headers(signature: &str) -> HeaderMap {
    headers(&[
        ("webhook-id", SW_ID),
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", signature),
    ])
}

#[test]
fn standard_webhooks_v1a_svix_vector_verifies_with_the_public_key() {
    let h = sw_headers(SW_V1A);
    let event = at(Scheme::standard(), &[SW_PK], SW_TS)
        .verify(&h, Bytes::from_static(SW_BODY))
        .unwrap();
    assert_eq!(event.id(), Some(SW_ID));
    let other_pk = "whpk_iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=";
    refuses_forgery(Scheme::standard, SW_PK, other_pk, &h, SW_BODY, SW_TS);
    // The HMAC secret alone does not accept an Ed25519 entry, nor the reverse.
    let hmac_only = at(Scheme::standard(), &[SW_HMAC], SW_TS);
    assert_eq!(
        refused(&hmac_only, &h, SW_BODY),
        VerifyErrorKind::InvalidSignature
    );
    let pk_only = at(Scheme::standard(), &[SW_PK], SW_TS);
    assert_eq!(
        refused(&pk_only, &sw_headers(SW_V1), SW_BODY),
        VerifyErrorKind::InvalidSignature
    );
}

#[test]
fn standard_webhooks_mixes_whsec_and_whpk_in_one_list_and_one_header() {
    // Rotating from a shared secret to a key pair: the receiver holds both, the sender
    // sends both entries, and either alone still verifies.
    let v = at(Scheme::standard(), &[SW_PK, SW_HMAC], SW_TS);
    let both = v
        .verify(
            &sw_headers(&format!("{SW_V1} {SW_V1A}")),
            Bytes::from_static(SW_BODY),
        )
        .unwrap();
    assert_eq!(both.secret_index(), 0);
    let v1 = v
        .verify(&sw_headers(SW_V1), Bytes::from_static(SW_BODY))
        .unwrap();
    assert_eq!(v1.secret_index(), 1);
    // `sign` with a mixed list of signing keys reproduces both published entries.
    let signed = Scheme::standard()
        .sign(
            [SW_HMAC, SW_SK],
            SW_ID,
            UNIX_EPOCH + Duration::from_secs(SW_TS),
            SW_BODY,
        )
        .unwrap();
    assert_eq!(
        signed["webhook-signature"],
        format!("{SW_V1} {SW_V1A}").as_str()
    );
    // A 32-byte seed (the Python and Go drafts) signs the same as the 64-byte form.
    let seed = "whsk_6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbc=";
    let from_seed = Scheme::standard()
        .sign(
            [seed],
            SW_ID,
            UNIX_EPOCH + Duration::from_secs(SW_TS),
            SW_BODY,
        )
        .unwrap();
    assert_eq!(from_seed["webhook-signature"], SW_V1A);
}

// Discord publishes no vector (its libraries test with random keys). This one uses the
// RFC 8032 §7.1 TEST 1 key pair, signed independently with Python `cryptography`.
const DISCORD_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const DISCORD_PK: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const DISCORD_BODY: &[u8] = br#"{"id":"787053080478613555","token":"ThisIsATokenFromDiscordThatIsVeryLong","type":1,"version":1}"#;
const DISCORD_SIG: &str = "3a85e26b1bcb1706c3df13288bcca333417b02075b29e50f40b0c3aceb44d8313dfaf314f171b9f7f2996b81a7b5608a0507d6a7a5a08d879cea56ddff425e0d";

#[test]
fn discord_ed25519_vector_verifies_and_sign_reproduces_it() {
    let h = headers(&[
        ("x-signature-ed25519", DISCORD_SIG),
        ("x-signature-timestamp", "1600000000"),
    ]);
    let event = at(Scheme::discord(), &[DISCORD_PK], 1_600_000_000)
        .verify(&h, Bytes::from_static(DISCORD_BODY))
        .unwrap();
    assert_eq!(event.id(), Some("787053080478613555"));
    assert_eq!(event.event_type(), Some("1"));
    let signed = Scheme::discord()
        .sign(
            [DISCORD_SEED],
            "",
            UNIX_EPOCH + Duration::from_secs(1_600_000_000),
            DISCORD_BODY,
        )
        .unwrap();
    assert_eq!(signed["x-signature-ed25519"], DISCORD_SIG);
    let other = "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c";
    refuses_forgery(
        Scheme::discord,
        DISCORD_PK,
        other,
        &h,
        DISCORD_BODY,
        1_600_000_000,
    );
}

// SendGrid: sendgrid-nodejs `packages/eventwebhook/src/eventwebhook.spec.js` (the single
// event vector is also in sendgrid-python and sendgrid-go).
const SG_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
const SG_SIG: &str = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM=";
const SG_BODY: &[u8] = b"[{\"email\":\"hello@world.com\",\"event\":\"dropped\",\"reason\":\"Bounced Address\",\"sg_event_id\":\"ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA\",\"sg_message_id\":\"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0\",\"smtp-id\":\"<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>\",\"timestamp\":1600112492}]\r\n";
const SG_OTHER_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA==";

fn sg_headers(signature: &str, ts: &str) -> HeaderMap {
    headers(&[
        ("x-twilio-email-event-webhook-signature", signature),
        ("x-twilio-email-event-webhook-timestamp", ts),
    ])
}

#[test]
fn sendgrid_ecdsa_vectors_verify_and_their_negative_cases_do_not() {
    let h = sg_headers(SG_SIG, "1600112502");
    let event = at(Scheme::sendgrid(), &[SG_KEY], 1_600_112_502)
        .verify(&h, Bytes::from_static(SG_BODY))
        .unwrap();
    // No delivery id: keyed on the signed content.
    assert_eq!(event.id(), None);
    assert!(event.dedupe_id().starts_with("sha256:"));
    refuses_forgery(
        Scheme::sendgrid,
        SG_KEY,
        SG_OTHER_KEY,
        &h,
        SG_BODY,
        1_600_112_502,
    );
    // The SDKs' own negative case: a valid signature of something else.
    let other_sig = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH3j/0=";
    let v = at(Scheme::sendgrid(), &[SG_KEY], 1_600_112_502);
    assert_eq!(
        refused(&v, &sg_headers(other_sig, "1600112502"), SG_BODY),
        VerifyErrorKind::InvalidSignature
    );

    // The multi-event vector (nodejs only), CR LF between and after the events.
    let multi_key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEQ4LIFtWztlsF7skFqOncjD1lun4H5w8XOhyOArHW9RcIx/FfEzx6cikC/yPfUvwaX/JScE7Fc9CJD2afQ9Ok3Q==";
    let multi_sig = "MEYCIQC/I4o6vCgqRYrTljjoVWB/GRWNtxeePlLMHr3x9ETeRQIhAIpV+03nREPTTHWSW0wIOA0EoMPdcNgXa70yCaqDJlu5";
    let multi_body = b"[{\"email\":\"invalid@gmail.com\",\"event\":\"processed\",\"send_at\":0,\"sg_event_id\":\"cHJvY2Vzc2VkLTE5OTQyMTEyLXFOd0JMZ1BRUWpXNkRKdktRd1NBYnctMA\",\"sg_message_id\":\"qNwBLgPQQjW6DJvKQwSAbw.filterdrecv-canary-547b64655b-cw6zx-1-6089EA4A-56.0\",\"smtp-id\":\"<qNwBLgPQQjW6DJvKQwSAbw@ismtpd0178p1mdw1.sendgrid.net>\",\"timestamp\":1619651146},\r\n{\"email\":\"invalid@gmail.com\",\"event\":\"bounce\",\"ip\":\"167.89.101.76\",\"reason\":\"552 5.2.2 The email account that you tried to reach is over quota and inactive. Please direct the recipient to https://support.google.com/mail/?p=OverQuotaPerm c17si1130468pgv.34 - gsmtp\",\"sg_event_id\":\"Ym91bmNlLTAtMTk5NDIxMTItcU53QkxnUFFRalc2REp2S1F3U0Fidy0w\",\"sg_message_id\":\"qNwBLgPQQjW6DJvKQwSAbw.filterdrecv-canary-547b64655b-cw6zx-1-6089EA4A-56.0\",\"smtp-id\":\"<qNwBLgPQQjW6DJvKQwSAbw@ismtpd0178p1mdw1.sendgrid.net>\",\"status\":\"5.2.2\",\"timestamp\":1619651147,\"tls\":1,\"type\":\"blocked\"}]\r\n";
    at(Scheme::sendgrid(), &[multi_key], 1_619_651_159)
        .verify(
            &sg_headers(multi_sig, "1619651159"),
            Bytes::from_static(multi_body),
        )
        .unwrap();
}

#[test]
fn sendgrid_sign_reproduces_a_deterministic_ecdsa_signature() {
    // RFC 6979 A.2.5's P-256 key, signed independently (deterministic ECDSA-SHA256).
    let private = "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721";
    let public = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYP7UuiVanTHJYet0xjVtaMBJuJI7Yfps5mliLmDyn7Z5A/4QCLi8maQa6elWKLxk8vGyDC1+n1F3o8KU1EYimQ==";
    let body = b"[{\"event\":\"processed\",\"sg_event_id\":\"x\"}]\r\n";
    let at_ts = UNIX_EPOCH + Duration::from_secs(1_600_112_502);
    let signed = Scheme::sendgrid().sign([private], "", at_ts, body).unwrap();
    assert_eq!(
        signed["x-twilio-email-event-webhook-signature"],
        "MEUCICElZ8I5n4sPDnCWT2HJcQK4LNI74zRoHb28GJEFJmFlAiEAvxsOlb+5afNK1dMPomynjaST1WABInBAIA+T8p72w6w="
    );
    at(Scheme::sendgrid(), &[public], 1_600_112_502)
        .verify(&signed, Bytes::from_static(body))
        .unwrap();
}

// Paddle: paddle-python-sdk `tests/Unit/Notification/test_Verifier.py` with its
// `standard_payload.json` fixture, and paddle-node-sdk's webhooks-validator test.
const PADDLE_SECRET: &str =
    "pdl_ntfset_01hs0t3tw21j988db1pam5xg8m_GrOWLNef+vmtjJYq4mSnHNzvc8uWoJ1I";
const PADDLE_BODY: &[u8] = br#"{"data":{"id":"ctm_01hs0tqf76sxmp7ba5e4mw1sc8","name":"John Doe","email":"blackhole+verification2@paddle.com","locale":"en","status":"active","created_at":"2024-03-15T10:32:37.862Z","updated_at":"2024-03-15T10:32:37.862Z","custom_data":null,"import_meta":null,"marketing_consent":false},"event_id":"evt_01hs0tqfme2xwb2hvwv87p8y3w","event_type":"customer.created","occurred_at":"2024-03-15T10:32:38.286848Z","notification_id":"ntf_01hs0tqfrhgkyp39x4wyvy7h6n"}"#;
const PADDLE_HEADER: &str =
    "ts=1710498758;h1=558bf93944dbeb4790c7a8af6cb2ea435c8ca9c8396aafc1a4e37424ac132744";

#[test]
fn paddle_vectors_verify_with_the_envelope_read_from_paddles_fields() {
    let h = headers(&[("paddle-signature", PADDLE_HEADER)]);
    let event = at(Scheme::paddle(), &[PADDLE_SECRET], 1_710_498_758)
        .verify(&h, Bytes::from_static(PADDLE_BODY))
        .unwrap();
    assert_eq!(event.id(), Some("evt_01hs0tqfme2xwb2hvwv87p8y3w"));
    assert_eq!(event.event_type(), Some("customer.created"));
    assert!(event.type_is_signed() && event.id_is_signed());
    let signed = Scheme::paddle()
        .sign(
            [PADDLE_SECRET],
            "",
            UNIX_EPOCH + Duration::from_secs(1_710_498_758),
            PADDLE_BODY,
        )
        .unwrap();
    assert_eq!(signed["paddle-signature"], PADDLE_HEADER);
    refuses_forgery(
        Scheme::paddle,
        PADDLE_SECRET,
        "pdl_ntfset_01hs0t3tw21j988db1pam5xg8m_other+secret/value",
        &h,
        PADDLE_BODY,
        1_710_498_758,
    );
    // node: duplicated `h1` entries and an unknown `h2` beside them.
    let node = headers(&[(
        "paddle-signature",
        "ts=1698796800;h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;\
         h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;h2=RANDOM_HASH",
    )]);
    let node_scheme = Scheme::paddle().with_min_secret_len(8);
    at(node_scheme, &["VALID_SECRET"], 1_698_796_801)
        .verify(&node, Bytes::from_static(br#"{"data": "value"}"#))
        .unwrap();
    // python: a rotated list where the third secret matches, past an `h1=dummy`.
    let python = headers(&[(
        "paddle-signature",
        "ts=1696195954;h1=dummy;h1=d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02",
    )]);
    let rotated = [
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_TjIG2BXbm83HPXqNfziwe506sBEdqL/4",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_vB/yIOnTOCWIvpBadM5jzBZPHc7OmdSo",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_WvRO0eL4Bj9rgYYIBZY6wZhG4EHy9jzh",
    ];
    let event = at(Scheme::paddle(), &rotated, 1_696_195_954)
        .verify(&python, Bytes::from_static(b"hello-world"))
        .unwrap();
    assert_eq!(event.secret_index(), 2);
}

// Twitch: twitch-rs/twitch_api `src/eventsub/mod.rs` (`verify_request`); Twitch itself
// publishes no signed vector.
const TWITCH_BODY: &[u8] = br#"{"subscription":{"id":"ae2ff348-e102-16be-a3eb-6830c1bf38d2","status":"enabled","type":"channel.follow","version":"1","condition":{"broadcaster_user_id":"44429626"},"transport":{"method":"webhook","callback":"null"},"created_at":"2021-02-19T23:47:00.7621315Z"},"event":{"user_id":"28408015","user_login":"testFromUser","user_name":"testFromUser","broadcaster_user_id":"44429626","broadcaster_user_login":"44429626","broadcaster_user_name":"testBroadcaster"}}"#;

#[test]
fn twitch_vector_verifies_over_id_timestamp_and_body() {
    let h = headers(&[
        (
            "twitch-eventsub-message-id",
            "ae2ff348-e102-16be-a3eb-6830c1bf38d2",
        ),
        (
            "twitch-eventsub-message-timestamp",
            "2021-02-19T23:47:00.8091512Z",
        ),
        ("twitch-eventsub-message-type", "notification"),
        ("twitch-eventsub-subscription-type", "channel.follow"),
        (
            "twitch-eventsub-message-signature",
            "sha256=d10f5bd9474b7ac7bd7105eb79c2d52768b4d0cd2a135982c3bf5a1d59a78823",
        ),
    ]);
    let at_ts = 1_613_778_420;
    let scheme = || Scheme::twitch().with_min_secret_len(8);
    let event = at(scheme(), &["secretabcd"], at_ts)
        .verify(&h, Bytes::from_static(TWITCH_BODY))
        .unwrap();
    assert_eq!(event.id(), Some("ae2ff348-e102-16be-a3eb-6830c1bf38d2"));
    assert!(event.id_is_signed());
    assert_eq!(event.event_type(), Some("channel.follow"));
    assert!(!event.type_is_signed());
    refuses_forgery(scheme, "secretabcd", "secretabce", &h, TWITCH_BODY, at_ts);
    // The id is signed: the same body and signature under another id is refused.
    let mut other_id = h.clone();
    other_id.insert(
        "twitch-eventsub-message-id",
        HeaderValue::from_static("be2ff348-e102-16be-a3eb-6830c1bf38d2"),
    );
    assert_eq!(
        refused(
            &at(scheme(), &["secretabcd"], at_ts),
            &other_id,
            TWITCH_BODY
        ),
        VerifyErrorKind::InvalidSignature
    );
}

/// Zoom, Meta and Intercom publish no vectors; these were computed independently with
/// Python's `hmac` from the providers' documented formats.
#[test]
fn zoom_meta_and_intercom_verify_independently_computed_vectors() {
    let zoom_body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}"#;
    let zoom = headers(&[
        (
            "x-zm-signature",
            "v0=86387de90cfe48dfd48bf3c026d5352351a8f32d11ade9fbccaa6c91f5fff743",
        ),
        ("x-zm-request-timestamp", "1654503849"),
    ]);
    let event = at(Scheme::zoom(), &["test_secret_token"], 1_654_503_849)
        .verify(&zoom, Bytes::from_static(zoom_body))
        .unwrap();
    assert_eq!(event.event_type(), Some("endpoint.url_validation"));
    assert!(event.dedupe_id().starts_with("sha256:"));
    refuses_forgery(
        Scheme::zoom,
        "test_secret_token",
        "test_secret_tokem",
        &zoom,
        zoom_body,
        1_654_503_849,
    );

    let meta_body = br#"{"object":"page","entry":[]}"#;
    let meta = headers(&[(
        "x-hub-signature-256",
        "sha256=5da47c9c7409e70d7a1851f0cfd9bc27786bd99587a9bf1dd5b51e23a2de03cf",
    )]);
    // Real app secrets are 32 hex characters; this vector's is shorter.
    let meta_scheme = || Scheme::meta().with_min_secret_len(8);
    let event = at(meta_scheme(), &["test_app_secret"], 0)
        .verify(&meta, Bytes::from_static(meta_body))
        .unwrap();
    assert_eq!(event.event_type(), Some("page"));
    refuses_forgery(
        meta_scheme,
        "test_app_secret",
        "test_app_secreT",
        &meta,
        meta_body,
        0,
    );

    let intercom_body = br#"{"type":"notification_event","topic":"ping"}"#;
    let intercom = headers(&[(
        "x-hub-signature",
        "sha1=59dc376710f2bb3f57a9fdb4921361641556cfb1",
    )]);
    let event = at(Scheme::intercom(), &["test_client_secret"], 0)
        .verify(&intercom, Bytes::from_static(intercom_body))
        .unwrap();
    assert_eq!(event.event_type(), Some("ping"));
    refuses_forgery(
        Scheme::intercom,
        "test_client_secret",
        "test_client_secreT",
        &intercom,
        intercom_body,
        0,
    );
    // SHA-1 is 40 hex characters: a SHA-256-length entry cannot match and costs no MAC.
    let long = headers(&[("x-hub-signature", &*format!("sha1={}", "ab".repeat(32)))]);
    assert_eq!(
        refused(
            &at(Scheme::intercom(), &["test_client_secret"], 0),
            &long,
            intercom_body
        ),
        VerifyErrorKind::InvalidSignature
    );
}

#[test]
fn every_preset_signs_what_it_verifies_and_refuses_a_tampered_copy() {
    // An independent check of the round trip for each preset by name, with keys of each
    // kind; the published vectors above pin the formats themselves.
    let now = SystemTime::now();
    let hmac = "a-shared-secret-of-some-length";
    let cases: &[(&str, &str, &str)] = &[
        ("standard", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SW_HMAC),
        ("standard", SW_SK, SW_PK),
        ("stripe", hmac, hmac),
        ("github", hmac, hmac),
        ("slack", hmac, hmac),
        ("shopify", hmac, hmac),
        ("discord", DISCORD_SEED, DISCORD_PK),
        (
            "sendgrid",
            "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721",
            "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYP7UuiVanTHJYet0xjVtaMBJuJI7Yfps5mliLmDyn7Z5A/4QCLi8maQa6elWKLxk8vGyDC1+n1F3o8KU1EYimQ==",
        ),
        ("paddle", hmac, hmac),
        ("zoom", hmac, hmac),
        ("meta", hmac, hmac),
        ("intercom", hmac, hmac),
        ("twitch", hmac, hmac),
    ];
    let id = "0b5c2e1a-1f0e-4c1e-9a7e-3c5d2b1a0f9e";
    let body = br#"{"id":"evt_1","type":"thing.happened"}"#;
    for &(name, signing, verifying) in cases {
        let scheme: Scheme = name.parse().unwrap();
        let signed = scheme.sign([signing], id, now, body).unwrap();
        let v = Verifier::new(name.parse().unwrap(), [verifying]).unwrap();
        assert!(
            v.verify(&signed, Bytes::from_static(body)).is_ok(),
            "{name}"
        );
        let tampered = br#"{"id":"evt_1","type":"thing.happeneD"}"#;
        assert_eq!(
            v.verify(&signed, Bytes::from_static(tampered))
                .unwrap_err()
                .kind(),
            VerifyErrorKind::InvalidSignature,
            "{name}"
        );
    }
}

// ---- schemes that sign the URL ----

use http::{Method, Uri};
use tower_webhook::PublicUrl;

fn verify_at_url(
    scheme: Scheme,
    key: &str,
    public: PublicUrl,
    uri: &str,
    h: &HeaderMap,
    body: &[u8],
    unix: u64,
) -> Result<tower_webhook::Event, VerifyErrorKind> {
    let v = at(scheme, &[key], unix).with_public_url(public);
    let uri: Uri = uri.parse().unwrap();
    v.verify_request(&Method::POST, &uri, h, Bytes::copy_from_slice(body))
        .map_err(|e| e.kind())
}

// Twilio: twilio-node `spec/validation.spec.js` and twilio-python
// `tests/unit/test_request_validator.py`: token `12345`, these form fields, and each URL
// form its SDKs accept.
const TWILIO_FORM: &[u8] =
    b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";

fn twilio() -> Scheme {
    // The published vectors' token is five characters; real auth tokens are 32.
    Scheme::twilio().with_min_secret_len(5)
}

fn twilio_sig(sig: &str) -> HeaderMap {
    headers(&[("x-twilio-signature", sig)])
}

#[test]
fn twilio_form_vectors_verify_with_and_without_the_default_port() {
    let cases = [
        // (the configured URL, the signature Twilio sent)
        (
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
        ),
        (
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            "kvajT1Ptam85bY51eRf/AJRuM3w=",
        ),
        (
            "http://mycompany.com/myapp.php?foo=1&bar=2",
            "0ZXoZLH/DfblKGATFgpif+LLRf4=",
        ),
        (
            "https://user:pass@mycompany.com/myapp.php?foo=1&bar=2",
            "CukzLTc1tT5dXEDIHm/tKBanW10=",
        ),
        (
            "https://user:pass@mycompany.com/myapp.php?foo=1&bar=2",
            "ZQFR1PTIZXF2MXB8ZnKCvnnA+rI=",
        ),
        (
            "https://user@mycompany.com/myapp.php?foo=1&bar=2",
            "2YRLlVAflCqxaNicjMpJcSTgzSs=",
        ),
        (
            "https://mycompany.com/myapp.php?foo=1&bar=2&Body=It%27s+amazing",
            "TfZzewPq8wqrGlMfyAud8+/IvJ0=",
        ),
    ];
    for (url, sig) in cases {
        let public = PublicUrl::exact(url).unwrap();
        let event = verify_at_url(
            twilio(),
            "12345",
            public,
            "/myapp.php",
            &twilio_sig(sig),
            TWILIO_FORM,
            0,
        )
        .unwrap_or_else(|e| panic!("{url} {sig}: {e:?}"));
        assert!(event.dedupe_id().starts_with("sha256:"));
    }
    // Twilio signs `http://…:1234` as it is.
    let public = PublicUrl::exact("http://mycompany.com:1234/myapp.php?foo=1&bar=2").unwrap();
    verify_at_url(
        twilio(),
        "12345",
        public,
        "/",
        &twilio_sig("Zmvh+3yNM1Phv2jhDCwEM3q5ebU="),
        TWILIO_FORM,
        0,
    )
    .unwrap();

    // Repeated fields: sorted by value, once each.
    let public = || PublicUrl::exact("https://mycompany.com/myapp.php?foo=1&bar=2").unwrap();
    let repeated = b"Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234&Digits=1234";
    verify_at_url(
        twilio(),
        "12345",
        public(),
        "/",
        &twilio_sig("IK+Dwps556ElfBT0I3Rgjkr1wJU="),
        repeated,
        0,
    )
    .unwrap();
    for order in [
        &b"MessagingBinding.Address=%2B1325xxxxxxx&MessagingBinding.Address=%2B1415xxxxxxx"[..],
        b"MessagingBinding.Address=%2B1415xxxxxxx&MessagingBinding.Address=%2B1325xxxxxxx",
    ] {
        verify_at_url(
            twilio(),
            "12345",
            public(),
            "/",
            &twilio_sig("83O6e2vORAoJHUNzJjDWN1jz+BA="),
            order,
            0,
        )
        .unwrap();
    }

    // Refused: a changed field, another token, another URL, and no public URL at all.
    let sig = twilio_sig("RSOYDt4T1cUTdK1PDd93/VVr8B8=");
    let changed = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1235&From=%2B14158675309&To=%2B18005551212";
    assert_eq!(
        verify_at_url(twilio(), "12345", public(), "/", &sig, changed, 0).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    assert_eq!(
        verify_at_url(twilio(), "12346", public(), "/", &sig, TWILIO_FORM, 0).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    let elsewhere = PublicUrl::exact("https://mycompany.com/other.php?foo=1&bar=2").unwrap();
    assert_eq!(
        verify_at_url(twilio(), "12345", elsewhere, "/", &sig, TWILIO_FORM, 0).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    let v = at(twilio(), &["12345"], 0);
    assert_eq!(
        refused(&v, &sig, TWILIO_FORM),
        VerifyErrorKind::Misconfigured
    );
}

#[test]
fn twilio_json_vectors_bind_the_body_through_body_sha256() {
    let body = br#"{"property": "value", "boolean": true}"#;
    let hash = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    // The configured URL has no query: Twilio appends `bodySHA256`, the request carries it.
    let configured = PublicUrl::exact("https://mycompany.com/myapp.php").unwrap();
    let uri = format!("/myapp.php?bodySHA256={hash}");
    verify_at_url(
        twilio(),
        "12345",
        configured.clone(),
        &uri,
        &twilio_sig("y77kIzt2vzLz71DgmJGsen2scGs="),
        body,
        0,
    )
    .unwrap();
    let with_query = PublicUrl::exact(&format!(
        "https://mycompany.com/myapp.php?foo=1&bar=2&bodySHA256={hash}"
    ))
    .unwrap();
    verify_at_url(
        twilio(),
        "12345",
        with_query,
        "/",
        &twilio_sig("a9nBmqA0ju/hNViExpshrM61xv4="),
        body,
        0,
    )
    .unwrap();
    // `{}`, signed on the `:443` form of the URL.
    let empty = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
    let url = PublicUrl::exact(&format!(
        "https://mycompany.com/myapp.php?foo=1&bar=2&bodySHA256={empty}"
    ))
    .unwrap();
    verify_at_url(
        twilio(),
        "12345",
        url,
        "/",
        &twilio_sig("Ldidvp12m26NI7eqEvxnEpkd9Hc="),
        b"{}",
        0,
    )
    .unwrap();
    // Another body under the same signed URL: its hash does not match.
    assert_eq!(
        verify_at_url(
            twilio(),
            "12345",
            configured,
            &uri,
            &twilio_sig("y77kIzt2vzLz71DgmJGsen2scGs="),
            br#"{"property": "value", "boolean": false}"#,
            0
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
}

// Square: square-nodejs-sdk `tests/integration/webhooks.test.ts`.
#[test]
fn square_vectors_sign_the_notification_url_and_body() {
    let url = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9";
    let key = "Ibxx_5AKakO-3qeNVR61Dw";
    let body = br#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#;
    let sig = headers(&[(
        "x-square-hmacsha256-signature",
        "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=",
    )]);
    let square = || Scheme::square().with_min_secret_len(8);
    // At the body's signed `created_at` (2022-07-13T20:30:59Z), checked within 48 hours.
    let event = verify_at_url(
        square(),
        key,
        PublicUrl::exact(url).unwrap(),
        "/",
        &sig,
        body,
        1_657_744_259,
    )
    .unwrap();
    assert_eq!(event.id(), Some("ac3ac95b-f97d-458c-a6e6-18981597e05f"));
    assert_eq!(event.event_type(), Some("webhooks.test_notification"));
    let signed = square()
        .sign_request([key], &Method::POST, url, "", UNIX_EPOCH, body)
        .unwrap();
    assert_eq!(
        signed["x-square-hmacsha256-signature"],
        "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4="
    );
    // The SDK's negative cases: another URL, another key, a changed body.
    let other_url =
        PublicUrl::exact("https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9").unwrap();
    assert_eq!(
        verify_at_url(square(), key, other_url, "/", &sig, body, 0).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    assert_eq!(
        verify_at_url(
            square(),
            "MCmhFRxGX82xMwg5FsaoQA",
            PublicUrl::exact(url).unwrap(),
            "/",
            &sig,
            body,
            0
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    let mut changed = body.to_vec();
    changed[107] = b'5'; // 2022-07 → 2022-05 in `created_at`
    assert_eq!(
        verify_at_url(
            square(),
            key,
            PublicUrl::exact(url).unwrap(),
            "/",
            &sig,
            &changed,
            0
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    for (body, expected) in [
        (
            &br#"{"data":{"type":"webhooks","id":"fake_id"}}"#[..],
            "W3FlCNk5IA3ZQ2LHTWoajvzfaDu/OwY2tNHIHC3IUOA=",
        ),
        (
            br#"{"data":{"type":"webhooks","id":">id<"}}"#,
            "Cxt7+aTi4rKgcA0bC4g9EHdVtLSDWdqccmL5MvihU4U=",
        ),
    ] {
        let sig = headers(&[("x-square-hmacsha256-signature", expected)]);
        let public = PublicUrl::exact("https://webhook.site/webhooks").unwrap();
        verify_at_url(square(), "signature-key", public, "/", &sig, body, 0).unwrap();
    }
}

// HubSpot v3: hubspot-api-python `tests/spec/utils/test_signature.py::test_get_signature__v3`.
#[test]
fn hubspot_v3_vector_signs_method_url_body_and_a_millisecond_timestamp() {
    let secret = "yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy";
    let url = "https://www.example.com/webhook_uri";
    let body = b"{'example_field':'example_value'}";
    let h = headers(&[
        (
            "x-hubspot-signature-v3",
            "K36dawei4A+QBNolUOqo7s91KQDWQ5MXZ/QufNYuk/Y=",
        ),
        ("x-hubspot-request-timestamp", "1693657560000"),
    ]);
    let public = || PublicUrl::exact(url).unwrap();
    let event = verify_at_url(
        Scheme::hubspot(),
        secret,
        public(),
        "/webhook_uri",
        &h,
        body,
        1_693_657_560,
    )
    .unwrap();
    assert_eq!(
        event.timestamp(),
        Some(UNIX_EPOCH + Duration::from_secs(1_693_657_560))
    );
    let signed = Scheme::hubspot()
        .sign_request(
            [secret],
            &Method::POST,
            url,
            "",
            UNIX_EPOCH + Duration::from_millis(1_693_657_560_000),
            body,
        )
        .unwrap();
    assert_eq!(
        signed["x-hubspot-signature-v3"],
        "K36dawei4A+QBNolUOqo7s91KQDWQ5MXZ/QufNYuk/Y="
    );
    assert_eq!(signed["x-hubspot-request-timestamp"], "1693657560000");
    // Stale after five minutes; another method or URL is another signature.
    assert_eq!(
        verify_at_url(
            Scheme::hubspot(),
            secret,
            public(),
            "/",
            &h,
            body,
            1_693_657_560 + 301
        )
        .unwrap_err(),
        VerifyErrorKind::TimestampTooOld
    );
    let v = at(Scheme::hubspot(), &[secret], 1_693_657_560).with_public_url(public());
    let uri: Uri = "/webhook_uri".parse().unwrap();
    assert_eq!(
        v.verify_request(&Method::PUT, &uri, &h, Bytes::from_static(body))
            .unwrap_err()
            .kind(),
        VerifyErrorKind::InvalidSignature
    );
    let elsewhere = PublicUrl::exact("https://www.example.com/other").unwrap();
    assert_eq!(
        verify_at_url(
            Scheme::hubspot(),
            secret,
            elsewhere,
            "/",
            &h,
            body,
            1_693_657_560
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
}

/// Linear publishes no vector (its SDK's tests sign at run time); this one was computed
/// independently with Python's `hmac`. The timestamp is inside the signed body.
#[test]
fn linear_checks_the_signed_body_timestamp_within_a_minute() {
    let body = br#"{"action":"create","type":"Issue","data":{"id":"abc"},"webhookTimestamp":1700000000000}"#;
    let h = headers(&[
        (
            "linear-signature",
            "1bd5f13f55c3c73d99130026ab253f2ad255b9f522a0d227e3b76bf0027436b8",
        ),
        ("linear-delivery", "0b5c2e1a-1f0e-4c1e-9a7e-3c5d2b1a0f9e"),
        // Unsigned: a replay could set it to anything, so it is not read.
        ("linear-timestamp", "1900000000000"),
    ]);
    let linear = || Scheme::linear().with_min_secret_len(6);
    let event = at(linear(), &["SECRET"], 1_700_000_030)
        .verify(&h, Bytes::from_static(body))
        .unwrap();
    assert_eq!(event.event_type(), Some("Issue"));
    assert_eq!(
        event.timestamp(),
        Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    );
    assert!(!event.id_is_signed());
    assert!(event.dedupe_id().starts_with("sha256:"));
    // Past Linear's minute, either way.
    for now in [1_700_000_061, 1_699_999_939] {
        assert!(matches!(
            refused(&at(linear(), &["SECRET"], now), &h, body),
            VerifyErrorKind::TimestampTooOld | VerifyErrorKind::TimestampInFuture
        ));
    }
    refuses_forgery(linear, "SECRET", "SECRET2", &h, body, 1_700_000_000);
    // A signed body without the field proves no freshness: refused.
    let stale_free = br#"{"action":"create","type":"Issue"}"#;
    let signed = linear()
        .sign(["SECRET"], "d", UNIX_EPOCH, stale_free)
        .unwrap();
    assert_eq!(
        refused(&at(linear(), &["SECRET"], 0), &signed, stale_free),
        VerifyErrorKind::MalformedHeader
    );
}

#[test]
fn work_per_request_is_bounded_for_forms_and_public_keys() {
    // `a&a&a…`: refused before any sort, however it is signed.
    let form = "a&".repeat(5000).into_bytes();
    let public = PublicUrl::exact("https://mycompany.com/myapp.php").unwrap();
    let h = twilio_sig("RSOYDt4T1cUTdK1PDd93/VVr8B8=");
    assert_eq!(
        verify_at_url(twilio(), "12345", public, "/", &h, &form, 0).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    // At most four `v1a,` entries are checked per public key: a genuine one after four
    // bogus ones is not reached (a real sender sends one per key).
    let bogus = format!("v1a,{}", "A".repeat(86) + "==");
    let v = at(Scheme::standard(), &[SW_PK], SW_TS);
    let fifth = format!("{bogus} {bogus} {bogus} {bogus} {SW_V1A}");
    assert_eq!(
        refused(&v, &sw_headers(&fifth), SW_BODY),
        VerifyErrorKind::InvalidSignature
    );
    let fourth = format!("{bogus} {bogus} {bogus} {SW_V1A}");
    assert!(v
        .verify(&sw_headers(&fourth), Bytes::from_static(SW_BODY))
        .is_ok());
}

// Mailgun: mailgun/mailgun-php `tests/Api/WebhookTest.php` (`testVerifyWebhookGood`).
const MAILGUN_KEY: &str = "key-3ax6xnjp29jd6fds4gc373sgvjxteol0";
const MAILGUN_TOKEN: &str = "5egbgr1vjgqxtrnp65xfznchgdccwh5d6i09vijqi3whgowmn6";
const MAILGUN_SIG: &str = "9cfc5c41582e51246e73c88d34db3af0a3a2692a76fbab81492842f000256d33";

fn mailgun_body(timestamp: &str, token: &str, signature: &str) -> Vec<u8> {
    format!(
        r#"{{"signature":{{"timestamp":"{timestamp}","token":"{token}","signature":"{signature}"}},"event-data":{{"id":"MXcc2gEpS-eN8HfkOnmK2w","event":"delivered"}}}}"#
    )
    .into_bytes()
}

#[test]
fn mailgun_vector_verifies_its_body_signature_and_keys_on_the_token() {
    let body = mailgun_body("1403645220", MAILGUN_TOKEN, MAILGUN_SIG);
    let v = at(Scheme::mailgun(), &[MAILGUN_KEY], 1_403_645_220);
    let event = v
        .verify(&HeaderMap::new(), Bytes::from(body.clone()))
        .unwrap();
    assert_eq!(event.id(), Some(MAILGUN_TOKEN));
    assert!(event.id_is_signed());
    assert_eq!(event.dedupe_id(), MAILGUN_TOKEN);
    // The published bad case: another signature.
    let bad = mailgun_body(
        "1403645220",
        MAILGUN_TOKEN,
        "9cfc5c41582e51246e73c88d34db3af0a3a2692a76fbab81492842f000256d34",
    );
    assert_eq!(
        refused(&v, &HeaderMap::new(), &bad),
        VerifyErrorKind::InvalidSignature
    );
    // Another token or timestamp under the same signature, another key, a late delivery,
    // no signature object: all refused.
    let other_token = mailgun_body(
        "1403645220",
        "6egbgr1vjgqxtrnp65xfznchgdccwh5d6i09vijqi3whgowmn6",
        MAILGUN_SIG,
    );
    assert_eq!(
        refused(&v, &HeaderMap::new(), &other_token),
        VerifyErrorKind::InvalidSignature
    );
    let wrong_key = at(
        Scheme::mailgun(),
        &["key-0000000000000000000000000000000"],
        1_403_645_220,
    );
    assert_eq!(
        refused(&wrong_key, &HeaderMap::new(), &body),
        VerifyErrorKind::InvalidSignature
    );
    let late = at(Scheme::mailgun(), &[MAILGUN_KEY], 1_403_645_220 + 3600);
    assert_eq!(
        refused(&late, &HeaderMap::new(), &body),
        VerifyErrorKind::TimestampTooOld
    );
    assert_eq!(
        refused(&v, &HeaderMap::new(), br#"{"event-data":{"id":"x"}}"#),
        VerifyErrorKind::MalformedHeader
    );
    // No headers to sign: said plainly.
    assert!(Scheme::mailgun()
        .sign([MAILGUN_KEY], "", UNIX_EPOCH, &body)
        .is_err());
}

// ---- issue 19: what real senders send ----

// Twilio's SharedKey with HMAC-SHA256, signed by twilio-node 6.3.1 and twilio-python 9.13.0
// (`getExpectedTwilioSignature(secret, url, params, "HMAC_SHA256")`, the same tag from
// both; tests/fixtures/sdk/twilio-*-sha256.json). The SHA-1 tag of the same request under
// the same secret is Python's `hmac`.
const SHARED_KEY: &str = "sharedkey-secret-0123456789abcdefghij";
const TWILIO_SHA256: &str = "Ns74m03GwQ61AUOpotFMdBTAkYQctMIXbds5oGHldtg=";
const TWILIO_SHA1_SAME_KEY: &str = "rG3Hh6DBLvOPqwth8TFmk5sFDJ8=";
const DECLARES_SHA256: &str = "key=KS0123456789abcdef0123456789abcdef,algorithm=HMAC_SHA256";

fn twilio_settings(sig: &str, settings: Option<&str>) -> HeaderMap {
    let mut h = twilio_sig(sig);
    if let Some(settings) = settings {
        h.insert(
            "x-twilio-webhooks-signature-settings",
            HeaderValue::from_str(settings).unwrap(),
        );
    }
    h
}

fn twilio_at(scheme: Scheme, h: &HeaderMap) -> Result<tower_webhook::Event, VerifyErrorKind> {
    let public = PublicUrl::exact("https://mycompany.com/myapp.php?foo=1&bar=2").unwrap();
    verify_at_url(
        scheme,
        SHARED_KEY,
        public,
        "/myapp.php?foo=1&bar=2",
        h,
        TWILIO_FORM,
        0,
    )
}

#[test]
fn twilio_shared_key_sha256_is_accepted_as_its_settings_header_declares() {
    let declared = twilio_settings(TWILIO_SHA256, Some(DECLARES_SHA256));
    twilio_at(Scheme::twilio(), &declared).unwrap();
    twilio_at(Scheme::twilio_sha256(), &declared).unwrap();
    // The declaration chooses the hash: undeclared means SHA-1, so a SHA-256 tag without
    // it, or a SHA-1 tag under a SHA-256 declaration, is not a signature.
    assert_eq!(
        twilio_at(Scheme::twilio(), &twilio_settings(TWILIO_SHA256, None)).unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    assert_eq!(
        twilio_at(
            Scheme::twilio(),
            &twilio_settings(TWILIO_SHA1_SAME_KEY, Some(DECLARES_SHA256))
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    // The legacy SHA-1 signature still verifies with the generic preset, undeclared or
    // declared…
    twilio_at(
        Scheme::twilio(),
        &twilio_settings(TWILIO_SHA1_SAME_KEY, None),
    )
    .unwrap();
    twilio_at(
        Scheme::twilio(),
        &twilio_settings(TWILIO_SHA1_SAME_KEY, Some("key=KS1,algorithm=HMAC_SHA1")),
    )
    .unwrap();
    // …but not with the SHA-256 preset: no downgrade to the weaker hash.
    for settings in [None, Some("key=KS1,algorithm=HMAC_SHA1")] {
        assert_eq!(
            twilio_at(
                Scheme::twilio_sha256(),
                &twilio_settings(TWILIO_SHA1_SAME_KEY, settings)
            )
            .unwrap_err(),
            VerifyErrorKind::InvalidSignature,
            "{settings:?}"
        );
    }
    // An algorithm Twilio does not define: a malformed header, refused before the body.
    assert_eq!(
        twilio_at(
            Scheme::twilio(),
            &twilio_settings(TWILIO_SHA256, Some("key=KS1,algorithm=HMAC_SHA512"))
        )
        .unwrap_err(),
        VerifyErrorKind::MalformedHeader
    );
    // Another secret, another body: refused.
    let public = PublicUrl::exact("https://mycompany.com/myapp.php?foo=1&bar=2").unwrap();
    assert_eq!(
        verify_at_url(
            Scheme::twilio(),
            "another-shared-key-secret-0123456789",
            public,
            "/",
            &declared,
            TWILIO_FORM,
            0
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    let public = PublicUrl::exact("https://mycompany.com/myapp.php?foo=1&bar=2").unwrap();
    assert_eq!(
        verify_at_url(
            Scheme::twilio(),
            SHARED_KEY,
            public,
            "/",
            &declared,
            b"Digits=1",
            0
        )
        .unwrap_err(),
        VerifyErrorKind::InvalidSignature
    );
    // What the preset signs with SHA-256 it declares, and verifies.
    let signed = Scheme::twilio_sha256()
        .sign_request(
            [SHARED_KEY],
            &Method::POST,
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            "",
            UNIX_EPOCH,
            TWILIO_FORM,
        )
        .unwrap();
    assert_eq!(signed["x-twilio-signature"], TWILIO_SHA256);
    assert_eq!(
        signed["x-twilio-webhooks-signature-settings"],
        "algorithm=HMAC_SHA256"
    );
}

#[test]
fn twilio_behind_forwarded_headers_keys_one_delivery_once_whatever_its_host_port() {
    // Twilio's published vector for `https://mycompany.com/myapp.php?foo=1&bar=2`; the
    // proxy passes the host as the client wrote it.
    let mut keys = Vec::new();
    for host in ["mycompany.com", "mycompany.com:443"] {
        let mut h = twilio_sig("RSOYDt4T1cUTdK1PDd93/VVr8B8=");
        h.insert("host", HeaderValue::from_static("internal:8080"));
        h.insert("x-forwarded-host", HeaderValue::from_str(host).unwrap());
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let event = verify_at_url(
            twilio(),
            "12345",
            PublicUrl::from_forwarded_headers(),
            "/myapp.php?foo=1&bar=2",
            &h,
            TWILIO_FORM,
            0,
        )
        .unwrap_or_else(|e| panic!("{host}: {e:?}"));
        keys.push(event.dedupe_id().to_owned());
    }
    assert_eq!(keys[0], keys[1], "one delivery, one dedupe key");
}

#[test]
fn a_standard_webhooks_public_key_in_hex_is_not_taken_as_a_shared_secret() {
    // SW_PK's 32 bytes in hex: valid base64 too (48 bytes), so it used to become an HMAC
    // secret that anyone holding the public key could sign `v1,` with.
    let hex_pk = "d52880e28f61caa4c2a48a82e55f4751a92289a78009ea9f6532270c16ce8abe";
    let err = Verifier::new(Scheme::standard(), [hex_pk]).unwrap_err();
    assert_eq!(err.kind(), tower_webhook::ConfigErrorKind::InvalidSecret);
    assert!(err.to_string().contains("whpk_"), "{err}");
    assert!(!err.to_string().contains(hex_pk), "{err}");
    // As a public key it is one: the svix vector verifies under it with its prefix.
    let b64 = SW_PK.trim_start_matches("whpk_");
    assert!(Verifier::new(Scheme::standard(), [b64]).is_err());
    at(Scheme::standard(), &[SW_PK], SW_TS)
        .verify(&sw_headers(SW_V1A), Bytes::from_static(SW_BODY))
        .unwrap();
}

//! The whole check for the presets beyond the first five: public keys (Standard Webhooks
//! `v1a`, Discord, SendGrid), URL-signed schemes (Twilio's sorted form fields and
//! `bodySHA256`, Square, HubSpot), Linear's timestamp and Mailgun's signature in the
//! body, and the rest; and the presets verified by code of their own: AWS SNS (RSA over
//! chosen fields of the JSON body, under pinned certificates), PayPal (RSA over its
//! headers and a CRC32 of the body) and Microsoft Graph (client states in the body).
//! Input: a scheme, then every header in `NAMES`, the request's path and query, the body,
//! PayPal's headers (`PAYPAL_NAMES`, after the body so that the inputs written before
//! PayPal keep their meaning) and Twilio's signature settings (`LATE_NAMES`), separated by
//! 0xFF. It must answer (Ok or a `VerifyError`),
//! never panic.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, UNIX_EPOCH};
use tower_webhook::{PublicUrl, Scheme, Verifier};

const NAMES: [&str; 22] = [
    "webhook-signature",
    "webhook-timestamp",
    "webhook-id",
    "x-signature-ed25519",
    "x-signature-timestamp",
    "x-twilio-email-event-webhook-signature",
    "x-twilio-email-event-webhook-timestamp",
    "paddle-signature",
    "x-zm-signature",
    "x-zm-request-timestamp",
    "x-hub-signature-256",
    "x-hub-signature",
    "twitch-eventsub-message-signature",
    "twitch-eventsub-message-timestamp",
    "twitch-eventsub-message-id",
    "twitch-eventsub-message-type",
    "x-twilio-signature",
    "x-square-hmacsha256-signature",
    "x-hubspot-signature-v3",
    "x-hubspot-request-timestamp",
    "linear-signature",
    "linear-delivery",
];

/// PayPal's headers, read after the body.
const PAYPAL_NAMES: [&str; 5] = [
    "paypal-transmission-id",
    "paypal-transmission-time",
    "paypal-transmission-sig",
    "paypal-cert-url",
    "paypal-auth-algo",
];

/// Read after PayPal's, for the same reason: Twilio's signature settings (the hash a
/// delivery declares, `key=…,algorithm=HMAC_SHA256`).
const LATE_NAMES: [&str; 1] = ["x-twilio-webhooks-signature-settings"];

/// The certificate AWS's published SNS vectors are signed under, and this crate's test
/// certificate (`tests/fixtures/rsa`).
const SNS_CERT: &str = include_str!("../../tests/fixtures/sns/certificate.pem");
const PAYPAL_CERT: &str = include_str!("../../tests/fixtures/paypal/certificate.pem");
const TEST_CERT: &str = include_str!("../../tests/fixtures/rsa/signer.cert.pem");

/// The topics of AWS's vectors `notification-1.json` and `-2.json`, and one of ours.
const SNS_TOPICS: [&str; 3] = [
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-892f85fe-4836-424d-8188-ab85bef0f362",
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-62674b1d-4295-426b-88e7-5fb75652a04e",
    "arn:aws:sns:eu-west-1:123456789012:orders",
];
/// 2022-07-28T21:24:13Z, five seconds after `notification-2.json` was sent (and fifteen
/// after `notification-1.json`): the SNS seeds' timestamps are current.
const SNS_NOW: u64 = 1_659_043_453;

/// The webhook of PayPal's SDK vector (`tests/fixtures/paypal`).
const PAYPAL_WEBHOOK: &str = "96605875FF6516633";
/// 2017-03-30T20:04:10Z, five seconds after the PayPal vector's transmission time.
const PAYPAL_NOW: u64 = 1_490_904_250;

/// Microsoft Graph's client states (16 characters or more).
const GRAPH_STATES: [&str; 2] = [common::SECRET, "rotated-client-state-0002"];

/// The public URL the URL-signing schemes are verified against.
pub const PUBLIC_URL: &str = "https://hooks.example.com/webhooks";

fn verifier(choice: u8) -> Verifier {
    // New presets go at the end, so that the committed corpus keeps its choices.
    let mut now = common::NOW;
    let (scheme, keys): (Scheme, &[&str]) = match choice % 16 {
        0 => (
            Scheme::standard(),
            &["whpk_1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4=", common::STANDARD_SECRET],
        ),
        1 => (
            Scheme::discord(),
            &["d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"],
        ),
        2 => (
            Scheme::sendgrid(),
            &["MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYP7UuiVanTHJYet0xjVtaMBJuJI7Yfps5mliLmDyn7Z5A/4QCLi8maQa6elWKLxk8vGyDC1+n1F3o8KU1EYimQ=="],
        ),
        3 => (Scheme::paddle(), &[common::SECRET]),
        4 => (Scheme::zoom(), &[common::SECRET]),
        5 => (Scheme::meta(), &[common::SECRET]),
        6 => (Scheme::intercom(), &[common::SECRET]),
        7 => (Scheme::twitch(), &[common::SECRET]),
        8 => (Scheme::twilio(), &[common::SECRET]),
        9 => (Scheme::square(), &[common::SECRET]),
        10 => (Scheme::hubspot(), &[common::SECRET]),
        11 => (Scheme::linear(), &[common::SECRET]),
        12 => (Scheme::mailgun(), &[common::SECRET]),
        13 => {
            now = SNS_NOW;
            (Scheme::sns(SNS_TOPICS), &[SNS_CERT, TEST_CERT])
        }
        14 => {
            now = PAYPAL_NOW;
            (Scheme::paypal(PAYPAL_WEBHOOK), &[PAYPAL_CERT, TEST_CERT])
        }
        _ => (Scheme::microsoft_graph(), &GRAPH_STATES),
    };
    Verifier::new(scheme, keys)
        .expect("valid fuzz keys")
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(now))
        .with_tolerance(Duration::from_secs(300))
        .with_public_url(PublicUrl::exact(PUBLIC_URL).expect("a valid URL"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let verifier = verifier(choice);
    let mut pieces = rest.split(|b| *b == 0xFF);
    let mut headers = HeaderMap::new();
    for name in NAMES {
        if let Some(value) = pieces.next() {
            common::set(&mut headers, name, value);
        }
    }
    let uri = pieces
        .next()
        .and_then(|p| Uri::try_from(p).ok())
        .unwrap_or_else(|| Uri::from_static("/webhooks"));
    let body = pieces.next().unwrap_or_default();
    for name in PAYPAL_NAMES.iter().chain(&LATE_NAMES) {
        if let Some(value) = pieces.next() {
            common::set(&mut headers, name, value);
        }
    }
    let _ = verifier.verify_request(&Method::POST, &uri, &headers, Bytes::copy_from_slice(body));
});

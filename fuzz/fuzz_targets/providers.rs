//! The whole check for the presets beyond the first five: public keys (Standard Webhooks
//! `v1a`, Discord, SendGrid), URL-signed schemes (Twilio's sorted form fields and
//! `bodySHA256`, Square, HubSpot), Linear's timestamp and Mailgun's signature in the
//! body, and the rest. Input: a
//! scheme, then every header these read, the request's path and query, and the body,
//! separated by 0xFF. It must answer (Ok or a `VerifyError`), never panic.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use libfuzzer_sys::fuzz_target;
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

/// The public URL the URL-signing schemes are verified against.
pub const PUBLIC_URL: &str = "https://hooks.example.com/webhooks";

fn verifier(choice: u8) -> Verifier {
    let (scheme, keys): (Scheme, &[&str]) = match choice % 13 {
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
        _ => (Scheme::mailgun(), &[common::SECRET]),
    };
    Verifier::new(scheme, keys)
        .expect("valid fuzz keys")
        .with_clock(common::now)
        .with_tolerance(std::time::Duration::from_secs(300))
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
    let _ = verifier.verify_request(&Method::POST, &uri, &headers, Bytes::copy_from_slice(body));
});

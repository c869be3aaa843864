//! Deliveries signed by the providers' own SDKs, each verified through its preset, and a
//! tampered copy of each refused.
//!
//! The fixtures in `tests/fixtures/sdk/*.json` were written by
//! `tests/fixtures/sdk/generate/` (`generate.mjs` for the Node SDKs, `generate.py` for the
//! Python ones, versions pinned in its `package.json`, `package-lock.json` and
//! `requirements.txt`), and every one was checked by its SDK's own verifier before it was
//! written. They are committed: this test needs no network, Node or Python.
//!
//! | preset | SDK fixtures |
//! | --- | --- |
//! | `standard` | `standardwebhooks` (npm 1.1.1; PyPI 1.1.0), with padded and unpadded `whsec_` secrets |
//! | `standard` (Svix headers) | `svix` (npm 2.5.0) |
//! | `stripe` | `stripe` (npm 23.1.0, `webhooks.generateTestHeaderString`) |
//! | `github` | `@octokit/webhooks-methods` (npm 6.0.0, `sign`) |
//! | `twilio`, `twilio-sha256` | `twilio` (npm 6.3.1; PyPI 9.13.0): auth-token SHA-1, SharedKey SHA-256 (form and JSON) |
//! | `shopify` | `@shopify/shopify-api` (npm 15.0.0, `webhooks.validate` accepts it): unprefixed headers |
//! | `square` | `square` (npm 46.0.0, `WebhooksHelper.verifySignature` accepts it) |
//! | `paddle` | `@paddle/paddle-node-sdk` (npm 3.10.0, `WebhooksValidator.isValidSignature` accepts it) |
//! | `discord` | `discord-interactions` (npm 4.4.0, `verifyKey` accepts it) |
//! | `slack` | `@slack/bolt` (npm 5.1.0, `verifySlackRequest` accepts it) |
//! | `hubspot` | `@hubspot/api-client` (npm 14.0.1, `Signature.isValid` v3 accepts it) |
//! | `linear` | `@linear/sdk` (npm 98.0.0, `LinearWebhookClient.verify` accepts it) |
//! | `sendgrid` | `@sendgrid/eventwebhook` (npm 8.0.0, `EventWebhook.verifySignature` accepts it): a fixed P-256 key pair |
//!
//! Shopify's, Square's, Paddle's, Discord's, Slack's, HubSpot's, Linear's and SendGrid's
//! SDKs verify but do not sign (the provider signs on its servers): those deliveries are
//! signed by the script as the provider documents and written only once the SDK's
//! verifier accepts them. ECDSA signatures are randomised: the SendGrid fixture keeps its
//! signature across re-runs as long as the SDK still accepts it.
//!
//! No SDK fixtures, and why: Twitch publishes no official SDK that verifies EventSub
//! (the libraries that do, such as Twurple, are community projects; the preset is pinned
//! by twitch-rs's `verify_request` vector in `providers.rs`); Zoom, Meta, Intercom
//! and Mailgun publish no signing or verifying SDK for webhooks (vectors computed
//! independently, or mailgun-php's); SNS and PayPal sign with the provider's private key
//! (their SDKs' vectors are in `tests/fixtures/sns` and `tests/fixtures/paypal`);
//! Microsoft Graph signs nothing.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use tower_webhook::{PublicUrl, Scheme, Verifier, VerifyErrorKind};

struct Fixture {
    name: String,
    preset: String,
    sdk: String,
    secret: String,
    url: Option<String>,
    time: Option<u64>,
    headers: HeaderMap,
    body: Vec<u8>,
}

fn fixtures() -> Vec<Fixture> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            let s = |k: &str| json[k].as_str().map(str::to_owned);
            let mut headers = HeaderMap::new();
            for (k, v) in json["headers"].as_object().unwrap() {
                headers.insert(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v.as_str().unwrap()).unwrap(),
                );
            }
            Fixture {
                name: path.file_stem().unwrap().to_string_lossy().into_owned(),
                preset: s("preset").unwrap(),
                sdk: s("sdk").unwrap(),
                secret: s("secret").unwrap(),
                url: s("url"),
                time: json["time"].as_u64(),
                headers,
                body: s("body").unwrap().into_bytes(),
            }
        })
        .collect()
}

fn verify(f: &Fixture, body: &[u8]) -> Result<tower_webhook::Event, VerifyErrorKind> {
    let scheme: Scheme = f.preset.parse().unwrap();
    let unix = f.time.unwrap_or(1_767_225_600);
    let mut verifier = Verifier::new(scheme, [&f.secret])
        .unwrap_or_else(|e| panic!("{}: the SDK's secret is refused: {e}", f.name))
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(unix));
    let uri: Uri = match &f.url {
        Some(url) => {
            verifier = verifier.with_public_url(PublicUrl::exact(url).unwrap());
            let uri: Uri = url.parse().unwrap();
            uri.path_and_query().unwrap().as_str().parse().unwrap()
        }
        None => "/webhooks".parse().unwrap(),
    };
    verifier
        .verify_request(
            &Method::POST,
            &uri,
            &f.headers,
            Bytes::copy_from_slice(body),
        )
        .map_err(|e| e.kind())
}

#[test]
fn every_sdk_fixture_verifies_through_its_preset_and_a_tampered_copy_does_not() {
    let all = fixtures();
    let names: Vec<&str> = all.iter().map(|f| f.name.as_str()).collect();
    // A fixture that goes missing must fail here, not pass by being skipped.
    for expected in [
        "discord",
        "github",
        "hubspot",
        "linear",
        "paddle",
        "sendgrid",
        "shopify-unprefixed",
        "slack",
        "square",
        "standardwebhooks-node",
        "standardwebhooks-node-unpadded",
        "standardwebhooks-python",
        "standardwebhooks-python-unpadded",
        "stripe",
        "svix",
        "twilio-node-sha1",
        "twilio-node-sha256",
        "twilio-node-sha256-json",
        "twilio-python-sha1",
        "twilio-python-sha256",
    ] {
        assert!(names.contains(&expected), "missing fixture {expected}");
    }
    for f in &all {
        let event =
            verify(f, &f.body).unwrap_or_else(|e| panic!("{} ({}): refused: {e:?}", f.name, f.sdk));
        assert!(!event.dedupe_id().is_empty(), "{}", f.name);
        let mut tampered = f.body.clone();
        let i = tampered.len() / 2;
        tampered[i] ^= 0x01;
        assert_eq!(
            verify(f, &tampered).map(drop),
            Err(VerifyErrorKind::InvalidSignature),
            "{} ({}): a changed body byte",
            f.name,
            f.sdk
        );
    }
}

#[test]
fn sdk_fixtures_yield_the_ids_and_types_their_senders_put_in_them() {
    let all = fixtures();
    let by_name = |n: &str| all.iter().find(|f| f.name == n).unwrap();
    let stripe = verify(by_name("stripe"), &by_name("stripe").body).unwrap();
    assert_eq!(stripe.id(), Some("evt_1SdkFixture"));
    let shopify = by_name("shopify-unprefixed");
    let event = verify(shopify, &shopify.body).unwrap();
    assert_eq!(event.event_type(), Some("orders/create"));
    let svix = by_name("svix");
    assert_eq!(
        verify(svix, &svix.body).unwrap().id(),
        Some("msg_2Ahm4XAcOzbBV6S0m3mGTVvDEUf")
    );
}

#[test]
fn twilio_sha256_fixtures_are_refused_when_their_declaration_is_stripped() {
    for name in ["twilio-node-sha256", "twilio-python-sha256"] {
        let all = fixtures();
        let f = all.iter().find(|f| f.name == name).unwrap();
        let mut stripped = Fixture {
            name: f.name.clone(),
            preset: "twilio".into(),
            sdk: f.sdk.clone(),
            secret: f.secret.clone(),
            url: f.url.clone(),
            time: f.time,
            headers: f.headers.clone(),
            body: f.body.clone(),
        };
        assert!(verify(&stripped, &stripped.body).is_ok(), "{name}");
        // Without the settings header the delivery claims SHA-1: its SHA-256 tag is not one.
        stripped
            .headers
            .remove("x-twilio-webhooks-signature-settings");
        assert_eq!(
            verify(&stripped, &stripped.body).map(drop),
            Err(VerifyErrorKind::InvalidSignature),
            "{name}"
        );
    }
}

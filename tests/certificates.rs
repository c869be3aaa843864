//! The certificate-signed providers — AWS SNS and PayPal — and Microsoft Graph's client
//! state: their published vectors (AWS's `aws-php-sns-message-validator` functional
//! tests, PayPal's Java SDK `ValidateCertTest`), deliveries signed here with a test key
//! (`tests/fixtures/rsa`), and the refusals: a forged body, a wrong certificate, a stale
//! message, a foreign topic or webhook.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::call;
use http::{HeaderMap, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::Full;
use rsa::pkcs8::DecodePrivateKey as _;
use rsa::signature::{SignatureEncoding as _, Signer as _};
use serde_json::{json, Value};
use tower_webhook::store::{PgStore, RedisStore, SqliteStore, StoreFuture, TrustStore};
use tower_webhook::verify::Certificates;
use tower_webhook::{Scheme, Verifier, VerifyErrorKind, VerifyWebhookLayer};

const SNS_CERT: &str = include_str!("fixtures/sns/certificate.pem");
const PAYPAL_CERT: &str = include_str!("fixtures/paypal/certificate.pem");
const TEST_KEY: &str = include_str!("fixtures/rsa/signer.key.pem");
const TEST_CERT: &str = include_str!("fixtures/rsa/signer.cert.pem");
const OTHER_CERT: &str = include_str!("fixtures/rsa/other.cert.pem");

const SNS_VECTORS: [&str; 4] = [
    include_str!("fixtures/sns/notification-1.json"),
    include_str!("fixtures/sns/notification-2.json"),
    include_str!("fixtures/sns/notification-3.json"),
    include_str!("fixtures/sns/notification-4.json"),
];

fn at(scheme: Scheme, keys: &[&str], unix: u64) -> Verifier {
    Verifier::new(scheme, keys)
        .unwrap()
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(unix))
}

fn unix(rfc3339: &str) -> u64 {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .unwrap();
    t.unix_timestamp() as u64
}

fn refused(v: &Verifier, h: &HeaderMap, body: &[u8]) -> VerifyErrorKind {
    v.verify(h, Bytes::copy_from_slice(body))
        .unwrap_err()
        .kind()
}

// ---- AWS SNS ----

fn sns_topic(message: &Value) -> String {
    message["TopicArn"].as_str().unwrap().to_owned()
}

/// Signs an SNS message as SNS does (the fields for its type, `Name\nValue\n`), with the
/// test key: an independent rebuild of the string to sign.
fn sns_signed(mut message: Value, version: &str) -> Vec<u8> {
    let fields: &[&str] = match message["Type"].as_str().unwrap() {
        "Notification" => &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ],
        _ => &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ],
    };
    let mut text = String::new();
    for field in fields {
        if let Some(value) = message[*field].as_str() {
            text.push_str(&format!("{field}\n{value}\n"));
        }
    }
    let key = rsa::PrivateKey::from_pkcs8_pem(TEST_KEY).unwrap();
    let signature = match version {
        "1" => rsa::pkcs1v15::SigningKey::<sha1::Sha1>::new(key)
            .sign(text.as_bytes())
            .to_vec(),
        _ => rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key)
            .sign(text.as_bytes())
            .to_vec(),
    };
    use base64::Engine as _;
    message["SignatureVersion"] = json!(version);
    message["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode(signature));
    serde_json::to_vec(&message).unwrap()
}

const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders";

fn sns_notification(id: &str, timestamp: &str) -> Value {
    json!({
        "Type": "Notification",
        "MessageId": id,
        "TopicArn": TOPIC,
        "Subject": "order",
        "Message": "{\"order\":7}",
        "Timestamp": timestamp,
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem",
        "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
    })
}

#[test]
fn sns_vectors_verify_under_the_published_certificate_with_both_signature_versions() {
    for (i, vector) in SNS_VECTORS.iter().enumerate() {
        let message: Value = serde_json::from_str(vector).unwrap();
        let when = unix(message["Timestamp"].as_str().unwrap());
        let v = at(Scheme::sns([sns_topic(&message)]), &[SNS_CERT], when + 5);
        let event = v
            .verify(&HeaderMap::new(), Bytes::from_static(vector.as_bytes()))
            .unwrap_or_else(|e| panic!("vector {}: {e}", i + 1));
        assert_eq!(event.id(), message["MessageId"].as_str());
        assert_eq!(event.event_type(), Some("Notification"));
        assert_eq!(event.source(), "sns");

        // A changed message, the wrong certificate, an hour and more later, another
        // topic: each refused.
        let forged = vector.replace("Hello world", "Hello World");
        assert_eq!(
            refused(&v, &HeaderMap::new(), forged.as_bytes()),
            VerifyErrorKind::InvalidSignature
        );
        let wrong = at(Scheme::sns([sns_topic(&message)]), &[OTHER_CERT], when);
        assert_eq!(
            refused(&wrong, &HeaderMap::new(), vector.as_bytes()),
            VerifyErrorKind::InvalidSignature
        );
        let late = at(Scheme::sns([sns_topic(&message)]), &[SNS_CERT], when + 3601);
        assert_eq!(
            refused(&late, &HeaderMap::new(), vector.as_bytes()),
            VerifyErrorKind::TimestampTooOld
        );
        let foreign = at(Scheme::sns([TOPIC]), &[SNS_CERT], when);
        assert_eq!(
            refused(&foreign, &HeaderMap::new(), vector.as_bytes()),
            VerifyErrorKind::InvalidSignature
        );
    }
}

#[test]
fn sns_messages_signed_here_verify_and_the_signed_fields_are_the_ones_that_count() {
    let now = SystemTime::now();
    let ts = time::OffsetDateTime::from(now)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let v = Verifier::new(Scheme::sns([TOPIC]), [TEST_CERT]).unwrap();
    for version in ["1", "2"] {
        let body = sns_signed(sns_notification("m-1", &ts), version);
        let event = v.verify(&HeaderMap::new(), body.clone().into()).unwrap();
        assert_eq!(event.id(), Some("m-1"));
        // The unsigned fields may change (SNS does not sign UnsubscribeURL); the signed
        // ones may not, nor may a field be dropped or added.
        let mut message: Value = serde_json::from_slice(&body).unwrap();
        message["UnsubscribeURL"] = json!("https://sns.eu-west-1.amazonaws.com/?other");
        assert!(v
            .verify(
                &HeaderMap::new(),
                serde_json::to_vec(&message).unwrap().into()
            )
            .is_ok());
        for (field, value) in [
            ("Subject", json!("other")),
            ("Subject", Value::Null),
            (
                "TopicArn",
                json!("arn:aws:sns:eu-west-1:123456789012:other"),
            ),
            ("Type", json!("SubscriptionConfirmation")),
            ("MessageId", json!("m-2")),
        ] {
            let mut changed = message.clone();
            changed[field] = value;
            let body = serde_json::to_vec(&changed).unwrap();
            assert!(
                v.verify(&HeaderMap::new(), body.into()).is_err(),
                "{field} changed"
            );
        }
    }
    // A line break in a field other than Message would let the signed text split two
    // ways (a MessageId of the sender's choosing): refused.
    let mut message = sns_notification("m-5", &ts);
    message["Subject"] = json!("a\nMessageId\nm-6");
    let body = sns_signed(message, "2");
    assert_eq!(
        refused(&v, &HeaderMap::new(), &body),
        VerifyErrorKind::MalformedHeader
    );

    // A field given twice is ambiguous: refused before any signature check.
    let body = sns_signed(sns_notification("m-3", &ts), "2");
    let text = String::from_utf8(body).unwrap();
    let doubled = text.replacen("{", "{\"MessageId\":\"m-4\",", 1);
    assert_eq!(
        refused(&v, &HeaderMap::new(), doubled.as_bytes()),
        VerifyErrorKind::MalformedHeader
    );
    // An unknown signature version, and a body that is no SNS message.
    let mut message: Value = serde_json::from_str(&text).unwrap();
    message["SignatureVersion"] = json!("3");
    let body = serde_json::to_vec(&message).unwrap();
    assert_eq!(
        refused(&v, &HeaderMap::new(), &body),
        VerifyErrorKind::MalformedHeader
    );
    assert_eq!(
        refused(&v, &HeaderMap::new(), b"{}"),
        VerifyErrorKind::MalformedHeader
    );
}

#[test]
fn sns_needs_its_topics_and_an_rsa_certificate_of_2048_bits_or_more() {
    assert!(Verifier::new(Scheme::sns(Vec::<String>::new()), [SNS_CERT]).is_err());
    assert!("sns".parse::<Scheme>().is_err());
    // Not a certificate; a P-256 key; a shared secret.
    for key in [
        "not a pem",
        "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ] {
        let err = Verifier::new(Scheme::sns([TOPIC]), [key]).unwrap_err();
        assert!(!err.to_string().contains(key), "{err}");
    }
    // RSA is for the certificate presets only.
    let custom = Scheme::hmac(http::HeaderName::from_static("x-sig"))
        .with_algorithm(tower_webhook::scheme::Algorithm::RsaSha256);
    assert!(Verifier::new(custom, [TEST_CERT]).is_err());
}

// ---- PayPal ----

const PAYPAL_WEBHOOK: &str = "96605875FF6516633";

fn paypal_vector() -> (HeaderMap, &'static [u8]) {
    let mut h = HeaderMap::new();
    for (name, value) in [
        ("paypal-cert-url", "https://api.sandbox.paypal.com/v1/notifications/test"),
        ("paypal-transmission-id", "071f7d20-1584-11e7-abf0-6b62a8a99ac4"),
        ("paypal-transmission-time", "2017-03-30T20:04:05Z"),
        ("paypal-auth-algo", "SHA256withRSA"),
        ("paypal-transmission-sig", "aBjgm5/xljRYu3G64Q0axISrP2xcy7WbW1u4UTCKnQvyprOZ1a1BBmqn2Jdr6ce8E76I3Ti/AL9y4VYSHyGSEaoE6dVQcCDebLbOXLH0fjTAbTc1/rmfdWmsk0DPltW84Y8W8jOHe3CLWDOwg5zmozyt+AceG2x5eOiw7mLSycaEoj/5RG+dOIWXnmWcLEArbG3VFshy0wuhZrKuGa9C/bD4Ku+Y9gK7Bv5I5IuGRVnTGpcFnVG0KxOyJxccLGyBVCIUMY5IZS7LkmJszQ3HZZFDTNihvgJHECSLwLhzUaysIye5G6CbbLdtAmeeb6wiDciEAvr2dFf+SplOR4Lrng=="),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    (
        h,
        include_bytes!("fixtures/paypal/billing-plan-created.json"),
    )
}

/// Signs a PayPal delivery as PayPal does, with the test key.
pub fn paypal_signed(webhook_id: &str, transmission: &str, time: &str, body: &[u8]) -> HeaderMap {
    let text = format!(
        "{transmission}|{time}|{webhook_id}|{}",
        crc32fast::hash(body)
    );
    let key = rsa::PrivateKey::from_pkcs8_pem(TEST_KEY).unwrap();
    let signature = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key)
        .sign(text.as_bytes())
        .to_vec();
    use base64::Engine as _;
    let mut h = HeaderMap::new();
    let sig = base64::engine::general_purpose::STANDARD.encode(signature);
    for (name, value) in [
        (
            "paypal-cert-url",
            "https://api-m.paypal.com/v1/notifications/certs/CERT-test",
        ),
        ("paypal-transmission-id", transmission),
        ("paypal-transmission-time", time),
        ("paypal-auth-algo", "SHA256withRSA"),
        ("paypal-transmission-sig", &sig),
    ] {
        h.insert(name, HeaderValue::from_str(value).unwrap());
    }
    h
}

#[test]
fn paypal_vector_verifies_and_refuses_another_webhook_a_forged_body_and_a_stale_time() {
    let (h, body) = paypal_vector();
    let when = unix("2017-03-30T20:04:05Z");
    let v = at(Scheme::paypal(PAYPAL_WEBHOOK), &[PAYPAL_CERT], when + 10);
    let event = v.verify(&h, Bytes::from_static(body)).unwrap();
    assert_eq!(event.id(), Some("WH-2MW4820926242972J-6SG447389E205703U"));
    assert_eq!(event.event_type(), Some("BILLING.PLAN.CREATED"));

    // The SDK's own negative case: another webhook id.
    let other = at(Scheme::paypal("NotToBeFound"), &[PAYPAL_CERT], when);
    assert_eq!(refused(&other, &h, body), VerifyErrorKind::InvalidSignature);
    let mut forged = body.to_vec();
    forged[10] ^= 1;
    assert_eq!(refused(&v, &h, &forged), VerifyErrorKind::InvalidSignature);
    let wrong = at(Scheme::paypal(PAYPAL_WEBHOOK), &[OTHER_CERT], when);
    assert_eq!(refused(&wrong, &h, body), VerifyErrorKind::InvalidSignature);
    let late = at(Scheme::paypal(PAYPAL_WEBHOOK), &[PAYPAL_CERT], when + 301);
    assert_eq!(refused(&late, &h, body), VerifyErrorKind::TimestampTooOld);
    // Another algorithm named, a header missing.
    let mut h2 = h.clone();
    h2.insert("paypal-auth-algo", HeaderValue::from_static("SHA1withRSA"));
    assert_eq!(refused(&v, &h2, body), VerifyErrorKind::MalformedHeader);
    let mut h3 = h.clone();
    h3.remove("paypal-transmission-id");
    assert_eq!(refused(&v, &h3, body), VerifyErrorKind::MissingHeader);
    assert!(Verifier::new(Scheme::paypal(""), [PAYPAL_CERT]).is_err());
}

#[test]
fn paypal_deliveries_signed_here_verify() {
    let ts = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let body = br#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.COMPLETED"}"#;
    let h = paypal_signed("WEBHOOK-1", "tx-1", &ts, body);
    let v = Verifier::new(Scheme::paypal("WEBHOOK-1"), [TEST_CERT]).unwrap();
    let event = v.verify(&h, Bytes::from_static(body)).unwrap();
    assert_eq!(event.id(), Some("WH-1"));
    let v2 = Verifier::new(Scheme::paypal("WEBHOOK-2"), [TEST_CERT]).unwrap();
    assert_eq!(refused(&v2, &h, body), VerifyErrorKind::InvalidSignature);
}

// ---- Microsoft Graph ----

const CLIENT_STATE: &str = "secretClientValue-0001";

#[test]
fn graph_batches_verify_only_when_every_notification_carries_a_client_state() {
    let v = Verifier::new(
        Scheme::microsoft_graph(),
        [CLIENT_STATE, "rotated-client-state-0002"],
    )
    .unwrap();
    let batch = |states: &[&str]| {
        let value: Vec<Value> = states
            .iter()
            .map(|s| json!({"subscriptionId":"s-1","clientState":s,"changeType":"created","resource":"Users/1"}))
            .collect();
        serde_json::to_vec(&json!({ "value": value })).unwrap()
    };
    let ok = batch(&[CLIENT_STATE, "rotated-client-state-0002"]);
    let event = v.verify(&HeaderMap::new(), ok.clone().into()).unwrap();
    assert_eq!(event.id(), None);
    assert!(
        event.dedupe_id().starts_with("sha256:"),
        "{}",
        event.dedupe_id()
    );
    for bad in [
        batch(&[CLIENT_STATE, "guess"]),
        batch(&["secretClientValue-0002"]),
        br#"{"value":[{"subscriptionId":"s-1"}]}"#.to_vec(),
    ] {
        assert_eq!(
            refused(&v, &HeaderMap::new(), &bad),
            VerifyErrorKind::InvalidSignature
        );
    }
    for malformed in [&b"{\"value\":[]}"[..], b"[]", b"not json"] {
        assert_eq!(
            refused(&v, &HeaderMap::new(), malformed),
            VerifyErrorKind::MalformedHeader
        );
    }
    assert!(Verifier::new(Scheme::microsoft_graph(), ["short"]).is_err());
    let scheme: Scheme = "graph".parse().unwrap();
    assert_eq!(scheme.name(), "microsoft-graph");
}

/// Counts the heap each thread holds and its peak, to see what a verification allocates.
struct Counting;

thread_local! {
    /// (held now, peak) on this thread, in bytes; frees of another thread's memory may
    /// take it below zero.
    static HELD: std::cell::Cell<(isize, isize)> = const { std::cell::Cell::new((0, 0)) };
}

fn count(delta: isize) {
    let _ = HELD.try_with(|held| {
        let (now, peak) = held.get();
        let now = now + delta;
        held.set((now, peak.max(now)));
    });
}

// SAFETY: every call is passed to `System` unchanged; only sizes are counted.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as isize));
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        count(new as isize - layout.size() as isize);
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most heap `f` held at once on this thread, beyond what was held before it.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let start = HELD.with(|held| {
        let (now, _) = held.get();
        held.set((now, now));
        now
    });
    let out = f();
    (out, HELD.with(|held| held.get().1) - start)
}

#[test]
fn a_graph_batch_is_checked_as_it_is_read_without_building_it() {
    let v = Verifier::new(Scheme::microsoft_graph(), [CLIENT_STATE]).unwrap();
    let batch = |state: &str| {
        let one = format!(r#"{{"subscriptionId":"s-1","clientState":"{state}"}},"#);
        let mut body = String::from(r#"{"value":["#);
        while body.len() < 1024 * 1024 {
            body.push_str(&one);
        }
        body.pop();
        body.push_str("]}");
        Bytes::from(body)
    };
    // A forged batch of 1 MiB is refused at its first notification.
    let forged = batch("guessed-client-state");
    let (out, peak) = peak_heap(|| v.verify(&HeaderMap::new(), forged.clone()));
    assert_eq!(out.unwrap_err().kind(), VerifyErrorKind::InvalidSignature);
    assert!(
        peak < 16 * 1024,
        "{peak} bytes held to refuse a forged batch"
    );
    // A genuine one is read without keeping its notifications.
    let genuine = batch(CLIENT_STATE);
    let (out, peak) = peak_heap(|| v.verify(&HeaderMap::new(), genuine.clone()));
    assert!(out.is_ok(), "{out:?}");
    assert!(peak < 16 * 1024, "{peak} bytes held to verify a batch");
}

// ---- Through the layer: certificates fetched, cached, and their URLs checked ----

/// A fetcher serving `pem` for any URL, recording each URL asked for; it fails while
/// `failing` is set.
#[derive(Clone, Default)]
struct Server {
    asked: Arc<Mutex<Vec<String>>>,
    failing: Arc<AtomicUsize>,
}

impl Server {
    fn fetch(&self, pem: &'static str) -> impl tower_webhook::verify::Fetch {
        let this = self.clone();
        move |url: String| {
            let this = this.clone();
            async move {
                this.asked.lock().unwrap().push(url);
                // Slow enough for concurrent deliveries to overlap.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if this.failing.load(Ordering::SeqCst) > 0 {
                    return Err(std::io::Error::other("unreachable"));
                }
                Ok(Bytes::from_static(pem.as_bytes()))
            }
        }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn post(body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post("/sns")
        .header("content-type", "text/plain; charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn sns_layer(server: &Server) -> VerifyWebhookLayer {
    let certificates = Certificates::new(Scheme::sns([TOPIC]), server.fetch(TEST_CERT)).unwrap();
    VerifyWebhookLayer::from_certificates(certificates)
}

#[tokio::test]
async fn sns_certificates_are_fetched_once_from_the_named_url_and_shared_by_concurrent_deliveries()
{
    let server = Server::default();
    let layer = sns_layer(&server);
    let ts = now_rfc3339();
    let calls = (0..8).map(|i| {
        let layer = layer.clone();
        let body = sns_signed(sns_notification(&format!("m-{i}"), &ts), "2");
        async move { call(&layer, post(body)).await }
    });
    let outcomes = futures_join_all(calls).await;
    for out in &outcomes {
        assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
        assert_eq!(out.handled.len(), 1);
    }
    assert_eq!(
        server.asked(),
        ["https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem"]
    );
    // Cached: a later delivery fetches nothing.
    let out = call(&layer, post(sns_signed(sns_notification("m-9", &ts), "1"))).await;
    assert_eq!(out.handled[0].0.id(), Some("m-9"));
    assert_eq!(server.asked().len(), 1);
}

async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_certificate_url_off_the_providers_hosts_is_refused_without_a_fetch() {
    let server = Server::default();
    let layer = sns_layer(&server);
    let ts = now_rfc3339();
    for url in [
        "http://sns.eu-west-1.amazonaws.com/SimpleNotificationService-1.pem",
        "https://sns.eu-west-1.amazonaws.com.attacker.example/cert.pem",
        "https://127.0.0.1/cert.pem",
        "https://attacker.example/sns.eu-west-1.amazonaws.com/cert.pem",
    ] {
        let mut message = sns_notification("m-1", &ts);
        message["SigningCertURL"] = json!(url);
        let out = call(&layer, post(sns_signed(message, "2"))).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST, "{url}");
        assert_eq!(out.kind(), Some(VerifyErrorKind::MalformedHeader), "{url}");
        assert!(out.handled.is_empty());
    }
    assert!(server.asked().is_empty(), "{:?}", server.asked());
}

#[tokio::test(start_paused = true)]
async fn a_failed_fetch_is_shared_by_the_deliveries_waiting_on_it_and_tried_again_after_5_s() {
    let server = Server::default();
    let layer = sns_layer(&server);
    let ts = now_rfc3339();
    server.failing.store(1, Ordering::SeqCst);
    let calls = (0..6).map(|i| {
        let layer = layer.clone();
        let body = sns_signed(sns_notification(&format!("m-{i}"), &ts), "2");
        async move { call(&layer, post(body)).await }
    });
    for out in futures_join_all(calls).await {
        assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(out.kind(), Some(VerifyErrorKind::SecretsUnavailable));
        assert!(out.handled.is_empty());
    }
    assert_eq!(
        server.asked().len(),
        1,
        "one fetch for six waiting deliveries"
    );
    // Remembered briefly: a delivery right after gets 503 without a fetch.
    server.failing.store(0, Ordering::SeqCst);
    let body = sns_signed(sns_notification("m-9", &ts), "2");
    let out = call(&layer, post(body.clone())).await;
    assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(server.asked().len(), 1);
    // The provider's retry, later, finds the certificate.
    tokio::time::advance(Duration::from_secs(6)).await;
    let out = call(&layer, post(body)).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert_eq!(server.asked().len(), 2);
}

#[tokio::test]
async fn nothing_is_fetched_for_a_message_that_fails_before_its_signature() {
    let server = Server::default();
    let layer = sns_layer(&server);
    let ts = now_rfc3339();
    let url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem";
    let stale = sns_signed(sns_notification("m-1", "2020-01-01T00:00:00.000Z"), "2");
    let mut foreign = sns_notification("m-2", &ts);
    foreign["TopicArn"] = json!("arn:aws:sns:eu-west-1:999999999999:theirs");
    let foreign = sns_signed(foreign, "2");
    let bare = serde_json::to_vec(&json!({ "SigningCertURL": url })).unwrap();
    let mut short =
        serde_json::from_slice::<Value>(&sns_signed(sns_notification("m-3", &ts), "2")).unwrap();
    short["Signature"] = json!("c2hvcnQ=");
    let short = serde_json::to_vec(&short).unwrap();
    for body in [stale, foreign, bare, short] {
        let out = call(&layer, post(body)).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST, "{:?}", out.error);
    }
    assert!(server.asked().is_empty(), "{:?}", server.asked());
}

#[tokio::test]
async fn a_fetched_certificate_of_another_key_or_a_forged_message_is_refused() {
    let server = Server::default();
    let certificates = Certificates::new(Scheme::sns([TOPIC]), server.fetch(OTHER_CERT)).unwrap();
    let layer = VerifyWebhookLayer::from_certificates(certificates);
    let body = sns_signed(sns_notification("m-1", &now_rfc3339()), "2");
    let out = call(&layer, post(body)).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));

    let layer = sns_layer(&Server::default());
    let body = sns_signed(sns_notification("m-1", &now_rfc3339()), "2");
    let forged = String::from_utf8(body).unwrap().replace("order", "0rder");
    let out = call(&layer, post(forged.into_bytes())).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(out.handled.is_empty());
}

const SNS_URL: &str =
    "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem";

/// A notification naming `url`, signed with the test key; `forged`: its message changed
/// after signing, so it verifies under no certificate.
fn naming(url: &str, id: &str, forged: bool) -> Vec<u8> {
    let mut message = sns_notification(id, &now_rfc3339());
    message["SigningCertURL"] = json!(url);
    let body = String::from_utf8(sns_signed(message, "2")).unwrap();
    if forged {
        // The subject is signed; the topic, checked before any fetch, stays ours.
        let forged = body.replace(r#""Subject":"order""#, r#""Subject":"0rder""#);
        assert_ne!(forged, body);
        forged.into_bytes()
    } else {
        body.into_bytes()
    }
}

#[tokio::test(start_paused = true)]
async fn a_fragment_is_refused_and_a_written_out_port_is_the_same_certificate() {
    let server = Server::default();
    let layer = sns_layer(&server);
    for fragment in ["#1", "#2", "#"] {
        let url = format!("{SNS_URL}{fragment}");
        let out = call(&layer, post(naming(&url, "m-1", false))).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST, "{url}");
        assert_eq!(out.kind(), Some(VerifyErrorKind::MalformedHeader), "{url}");
    }
    assert!(server.asked().is_empty(), "{:?}", server.asked());
    // `:443` or not: one certificate, one fetch, for concurrent deliveries naming either.
    let with_port = SNS_URL.replace(".com/", ".com:443/");
    let calls = (0..6).map(|i| {
        let layer = layer.clone();
        let url = if i % 2 == 0 {
            SNS_URL.to_owned()
        } else {
            with_port.clone()
        };
        async move { call(&layer, post(naming(&url, &format!("m-{i}"), false))).await }
    });
    for out in futures_join_all(calls).await {
        assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    }
    assert_eq!(server.asked(), [SNS_URL]);
}

#[tokio::test(start_paused = true)]
async fn a_certificate_that_verified_a_delivery_is_not_evicted_by_misses() {
    let server = Server::default();
    let certificates = Certificates::new(Scheme::sns([TOPIC]), server.fetch(TEST_CERT))
        .unwrap()
        .with_fetch_limit(1000, Duration::from_secs(60));
    let layer = VerifyWebhookLayer::from_certificates(certificates);
    let out = call(&layer, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    // 300 forged deliveries, each naming a certificate of its own: each is a fetch.
    for i in 0..300 {
        let url =
            format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{i:x}.pem");
        let out = call(&layer, post(naming(&url, "m-x", true))).await;
        assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    }
    assert_eq!(server.asked().len(), 301);
    // The genuine certificate is still cached: the next delivery fetches nothing.
    let out = call(&layer, post(naming(SNS_URL, "m-2", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert_eq!(
        server.asked().len(),
        301,
        "the genuine certificate was fetched again"
    );
}

#[tokio::test(start_paused = true)]
async fn certificate_fetches_are_bounded_to_20_a_minute_and_cached_ones_still_verify() {
    let server = Server::default();
    let layer = sns_layer(&server);
    let out = call(&layer, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    let miss = |i: usize| {
        format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{i:x}.pem")
    };
    let mut refused = 0;
    for i in 1..60 {
        let out = call(&layer, post(naming(&miss(i), "m-x", true))).await;
        if out.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(out.kind(), Some(VerifyErrorKind::SecretsUnavailable));
            refused += 1;
        } else {
            assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
        }
    }
    assert_eq!(
        server.asked().len(),
        20,
        "20 fetches in the minute, the first included"
    );
    assert_eq!(refused, 40);
    // A certificate already cached does not wait for the window.
    let out = call(&layer, post(naming(SNS_URL, "m-2", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    // The next minute, fetches start again.
    tokio::time::advance(Duration::from_secs(61)).await;
    let out = call(&layer, post(naming(&miss(100), "m-x", true))).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert_eq!(server.asked().len(), 21);
}

/// A trusted certificate past its TTL, then a flood that fills the cache (256 URLs) and
/// spends the fetch limit: the trusted one is still known, so the genuine delivery's
/// refetch is a renewal outside the limit, not a refused miss.
#[tokio::test(start_paused = true)]
async fn a_trusted_certificate_survives_a_full_cache_and_its_renewal_is_not_a_miss() {
    let server = Server::default();
    let certificates = Certificates::new(Scheme::sns([TOPIC]), server.fetch(TEST_CERT))
        .unwrap()
        .with_ttl(Duration::from_secs(600))
        .with_fetch_limit(260, Duration::from_secs(60));
    let layer = VerifyWebhookLayer::from_certificates(certificates);
    let out = call(&layer, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    tokio::time::advance(Duration::from_secs(601)).await;
    for i in 0..260 {
        let out = call(&layer, post(naming(&miss(i), "m-x", true))).await;
        assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature), "{i}");
    }
    let out = call(&layer, post(naming(&miss(260), "m-x", true))).await;
    assert_eq!(
        out.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the limit is spent"
    );
    assert_eq!(server.asked().len(), 261);
    let out = call(&layer, post(naming(SNS_URL, "m-2", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert_eq!(server.asked().len(), 262);
    assert_eq!(server.asked().last().map(String::as_str), Some(SNS_URL));
}

fn miss(i: usize) -> String {
    format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-f{i:x}.pem")
}

/// A flood of 200 forged deliveries at once, each naming a fresh certificate URL, spends
/// the 20 fetches of the minute; meanwhile a genuine delivery under a certificate that
/// verified one before is verified at once (no fetch, no wait), while one under a
/// certificate never seen gets 503 until the window leaves a fetch (its provider retries).
#[tokio::test]
async fn a_delivery_under_a_trusted_certificate_is_verified_at_once_while_a_flood_spends_the_limit()
{
    let server = Server::default();
    let layer = sns_layer(&server);
    let out = call(&layer, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    let flooding = layer.clone();
    let flood = (0..200).map(move |i| {
        let layer = flooding.clone();
        async move {
            call(&layer, post(naming(&miss(i), "m-x", true)))
                .await
                .status
        }
    });
    let flood = tokio::spawn(futures_join_all(flood));
    // Each fetch takes 20 ms: the genuine delivery lands while the flood's are under way.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let started = std::time::Instant::now();
    let out = call(&layer, post(naming(SNS_URL, "m-2", false))).await;
    let took = started.elapsed();
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert!(took < Duration::from_millis(500), "waited {took:?}");
    let statuses = flood.await.unwrap();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(refused, 181, "19 fetches left in the minute for the flood");
    assert_eq!(server.asked().len(), 20);
    // What the flood still does: a certificate never seen waits for the next window.
    let first_time = SNS_URL.replace("0123456789abcdef", "fedcba9876543210");
    let out = call(&layer, post(naming(&first_time, "m-3", false))).await;
    assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);
    let out = call(&layer, post(naming(SNS_URL, "m-4", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert_eq!(server.asked().len(), 20);
}

/// After a restart under a flood: without the URLs trusted before, the genuine delivery's
/// certificate is a miss refused while the flood holds the limit; with them (saved from
/// the previous run's `trusted_urls`), it is fetched outside the limit and verified.
#[tokio::test(start_paused = true)]
async fn urls_trusted_in_a_previous_run_are_fetched_outside_the_limit_after_a_restart() {
    let before = Server::default();
    let certificates = Certificates::new(Scheme::sns([TOPIC]), before.fetch(TEST_CERT)).unwrap();
    let first = VerifyWebhookLayer::from_certificates(certificates.clone());
    let out = call(&first, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    let saved = certificates.trusted_urls();
    assert_eq!(saved, [SNS_URL]);

    for seeded in [false, true] {
        let server = Server::default();
        let mut certificates =
            Certificates::new(Scheme::sns([TOPIC]), server.fetch(TEST_CERT)).unwrap();
        if seeded {
            certificates = certificates.with_trusted_urls(&saved).unwrap();
        }
        let layer = VerifyWebhookLayer::from_certificates(certificates);
        for i in 0..25 {
            call(&layer, post(naming(&miss(i), "m-x", true))).await;
        }
        assert_eq!(
            server.asked().len(),
            20,
            "the flood spent the minute's fetches"
        );
        let out = call(&layer, post(naming(SNS_URL, "m-2", false))).await;
        let expected = if seeded {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        assert_eq!(out.status, expected, "seeded: {seeded}");
    }
    // Only certificate URLs on the provider's hosts, in their canonical form.
    let certificates = || Certificates::new(Scheme::sns([TOPIC]), before.fetch(TEST_CERT));
    let off = certificates()
        .unwrap()
        .with_trusted_urls(["https://attacker.example/SimpleNotificationService-1.pem"]);
    assert!(off.is_err());
    let with_port = SNS_URL.replace(".com/", ".com:443/");
    let seeded = certificates()
        .unwrap()
        .with_trusted_urls([with_port])
        .unwrap();
    assert_eq!(seeded.trusted_urls(), [SNS_URL]);
}

// ---- Trusted URLs kept in a store: across a restart, shared by replicas ----

/// A trust store that counts its reads.
struct CountingReads<S> {
    store: S,
    reads: Arc<AtomicUsize>,
}

impl<S: TrustStore> TrustStore for CountingReads<S> {
    fn load(&self) -> StoreFuture<Vec<String>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.store.load()
    }

    fn trust(&self, url: String) -> StoreFuture<()> {
        self.store.trust(url)
    }
}

/// Waits until `store` holds `url`: the verifying process writes it in the background.
async fn until_stored(store: &impl TrustStore, url: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !store.load().await.unwrap().iter().any(|u| u == url) {
        assert!(std::time::Instant::now() < deadline, "{url} never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Forged deliveries naming `misses`, signed before any is sent (an RSA signature in a
/// debug build takes milliseconds: the timings below are the receiver's, not these).
fn forged(misses: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    misses.map(|i| naming(&miss(i), "m-x", true)).collect()
}

/// `bodies` sent one after the other: their statuses.
async fn flood(layer: &VerifyWebhookLayer, bodies: Vec<Vec<u8>>) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for body in bodies {
        statuses.push(call(layer, post(body)).await.status);
    }
    statuses
}

fn trusting(server: &Server, store: impl TrustStore) -> VerifyWebhookLayer {
    let certificates = Certificates::new(Scheme::sns([TOPIC]), server.fetch(TEST_CERT))
        .unwrap()
        .with_trust_store(store);
    VerifyWebhookLayer::from_certificates(certificates)
}

/// A certificate trusted by one process, then a restart on the same database under a
/// flood that spends the fetch limit: the new process reads the URL from the store, so
/// the genuine delivery is fetched outside the limit and verified at once.
async fn trusted_across_a_restart<S: TrustStore, F: std::future::Future<Output = S>>(
    open: impl Fn() -> F,
) {
    let before = Server::default();
    let layer = trusting(&before, open().await);
    let out = call(&layer, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    until_stored(&open().await, SNS_URL).await;
    drop(layer);

    let (bodies, genuine) = (forged(0..25), naming(SNS_URL, "m-2", false));
    let server = Server::default();
    let layer = trusting(&server, open().await);
    let statuses = flood(&layer, bodies).await;
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(refused, 5, "the flood spent the minute's 20 fetches");
    let started = std::time::Instant::now();
    let out = call(&layer, post(genuine)).await;
    let took = started.elapsed();
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert!(took < Duration::from_millis(500), "waited {took:?}");
    assert_eq!(server.asked().len(), 21, "one fetch outside the limit");
    assert_eq!(server.asked().last().map(String::as_str), Some(SNS_URL));
}

#[tokio::test]
async fn a_certificate_trusted_before_a_restart_is_read_from_sqlite_and_verified_under_a_flood() {
    let path = common::stores::temp_sqlite_path();
    trusted_across_a_restart(|| async { SqliteStore::open(&path).await.unwrap() }).await;
}

#[tokio::test]
async fn a_certificate_trusted_before_a_restart_is_read_from_postgres_and_verified_under_a_flood() {
    let url = common::fresh_pg_url().await;
    trusted_across_a_restart(|| async { PgStore::connect(&url).await.unwrap() }).await;
}

/// Replica B runs, and a flood spends its fetch limit; then replica A verifies a delivery
/// under a certificate B never saw. B reads the store again at most every 5 s: within
/// 5 s of its last read, the genuine delivery is refused like the flood's (no read per
/// delivery); after them, one read for a whole flood, and the genuine delivery is
/// fetched outside the limit and verified.
///
/// `wait`: the 5 s pass in real time, not by moving Tokio's clock (Redis's client times
/// its replies on that clock, and a moved clock times them out).
async fn shared_by_replicas(a: impl TrustStore, b: impl TrustStore + Clone, wait: bool) {
    let (bodies, later) = (forged(0..25), forged(100..150));
    let genuine = [2, 3].map(|i| naming(SNS_URL, &format!("m-{i}"), false));
    let reads = Arc::new(AtomicUsize::new(0));
    let b_server = Server::default();
    let counting = CountingReads {
        store: b.clone(),
        reads: reads.clone(),
    };
    let replica_b = trusting(&b_server, counting);
    let statuses = flood(&replica_b, bodies).await;
    assert_eq!(b_server.asked().len(), 20);
    assert_eq!(statuses[20..], [StatusCode::SERVICE_UNAVAILABLE; 5]);
    assert_eq!(
        reads.load(Ordering::SeqCst),
        1,
        "read once, at the first delivery"
    );

    let replica_a = trusting(&Server::default(), a);
    let out = call(&replica_a, post(naming(SNS_URL, "m-1", false))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    until_stored(&b, SNS_URL).await;
    let [genuine, again] = genuine;
    let out = call(&replica_b, post(genuine)).await;
    assert_eq!(
        out.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "read under 5 s ago"
    );
    assert_eq!(reads.load(Ordering::SeqCst), 1);

    // 5 s later.
    if wait {
        tokio::time::sleep(Duration::from_secs(5)).await;
    } else {
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(6)).await;
        tokio::time::resume();
    }
    let flooding = replica_b.clone();
    let flood = later.into_iter().map(move |body| {
        let layer = flooding.clone();
        async move { call(&layer, post(body)).await.status }
    });
    let flood = tokio::spawn(futures_join_all(flood));
    let out = call(&replica_b, post(again)).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    let statuses = flood.await.unwrap();
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(
        reads.load(Ordering::SeqCst),
        2,
        "one read for 51 deliveries"
    );
    let asked = b_server.asked();
    assert_eq!(asked.len(), 21, "{asked:?}");
    assert_eq!(asked.iter().filter(|u| *u == SNS_URL).count(), 1);
}

#[tokio::test]
async fn a_certificate_trusted_by_one_replica_is_verified_by_another_under_a_flood_postgres() {
    let url = common::fresh_pg_url().await;
    let a = PgStore::connect(&url).await.unwrap();
    let b = PgStore::connect(&url).await.unwrap();
    shared_by_replicas(a, b, false).await;
}

#[tokio::test]
async fn a_certificate_trusted_by_one_replica_is_verified_by_another_under_a_flood_redis() {
    let prefix = format!("tower-webhook-test:{}:", uuid::Uuid::new_v4().simple());
    let connect = || async {
        RedisStore::connect(&common::redis_url())
            .await
            .unwrap()
            .with_prefix(&prefix)
    };
    shared_by_replicas(connect().await, connect().await, true).await;
}

/// Each store keeps the 64 URLs trusted last, the latest first; trusting one again makes
/// it the latest.
#[tokio::test]
async fn a_trust_store_keeps_the_64_urls_trusted_last() {
    async fn keeps(store: impl TrustStore) {
        let url = |i: usize| {
            format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{i:03}.pem")
        };
        for i in 0..70 {
            store.trust(url(i)).await.unwrap();
        }
        // A later millisecond (ties are ordered by URL, the greater first).
        tokio::time::sleep(Duration::from_millis(5)).await;
        store.trust(url(10)).await.unwrap();
        let expected: Vec<String> = [10]
            .into_iter()
            .chain((11..70).rev())
            .chain((6..10).rev())
            .map(url)
            .collect();
        assert_eq!(store.load().await.unwrap(), expected);
    }
    const ROWS: &str = "SELECT COUNT(*) FROM webhook_trusted_certificates";
    let sqlite = SqliteStore::open(common::stores::temp_sqlite_path())
        .await
        .unwrap();
    keeps(sqlite.clone()).await;
    let rows: i64 = sqlx::query_scalar(ROWS)
        .fetch_one(sqlite.pool())
        .await
        .unwrap();
    assert_eq!(rows, 64, "the older rows are deleted");
    let pg = PgStore::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    keeps(pg.clone()).await;
    let rows: i64 = sqlx::query_scalar(ROWS).fetch_one(pg.pool()).await.unwrap();
    assert_eq!(rows, 64, "the older rows are deleted");
    keeps(common::stores::redis().await).await;
}

/// The figures SECURITY.md gives for a sustained flood (not run by default: 10 s of real
/// time). Run: `cargo test --all-features --test certificates -- --ignored --nocapture
/// a_sustained_certificate_flood_measured`. Four tasks send forged SNS deliveries as fast
/// as they can, each naming a fresh certificate URL on SNS's hosts (which the host
/// answers 404, after 20 ms); meanwhile a genuine delivery under a trusted certificate
/// every 50 ms, and one under a certificate never seen every second (a provider retrying).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: 10 s of real time"]
async fn a_sustained_certificate_flood_measured() {
    const FIRST_TIME: &str =
        "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-fedcba9876543210.pem";
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let fetch = move |url: String| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if url == SNS_URL || url == FIRST_TIME {
                Ok(Bytes::from_static(TEST_CERT.as_bytes()))
            } else {
                Err(std::io::Error::other("404"))
            }
        }
    };
    let certificates = Certificates::new(Scheme::sns([TOPIC]), fetch).unwrap();
    let layer = VerifyWebhookLayer::from_certificates(certificates);
    let genuine = naming(SNS_URL, "m-1", false);
    assert_eq!(
        call(&layer, post(genuine.clone())).await.status,
        StatusCode::OK
    );
    let first_time = naming(FIRST_TIME, "m-2", false);
    // The baseline: the same delivery, 20 times, before the flood.
    let mut quiet = Vec::new();
    for _ in 0..20 {
        let started = std::time::Instant::now();
        assert_eq!(
            call(&layer, post(genuine.clone())).await.status,
            StatusCode::OK
        );
        quiet.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    quiet.sort();
    // The URL is not signed: one signed body serves every forged delivery.
    let template = String::from_utf8(naming(SNS_URL, "m-x", true)).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let sent = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..4)
        .map(|task| {
            let (layer, template, sent) = (layer.clone(), template.clone(), sent.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while std::time::Instant::now() < until {
                    let url = format!("SimpleNotificationService-{task}a{i:x}.pem");
                    let body =
                        template.replace("SimpleNotificationService-0123456789abcdef.pem", &url);
                    let out = call(&layer, post(body.into_bytes())).await;
                    assert_ne!(out.status, StatusCode::OK);
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    // A refusal never waits: give way, as a server's connections would.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let (mut trusted, mut first) = (Vec::new(), Vec::new());
    // The first try a second in, once the flood has spent the minute's fetches.
    let mut next_first = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < until {
        let started = std::time::Instant::now();
        let out = call(&layer, post(genuine.clone())).await;
        trusted.push((out.status, started.elapsed()));
        if std::time::Instant::now() >= next_first {
            first.push(call(&layer, post(first_time.clone())).await.status);
            next_first += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for task in flood {
        task.await.unwrap();
    }
    let mut latencies: Vec<Duration> = trusted.iter().map(|(_, t)| *t).collect();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "flood: {} forged deliveries in 10 s ({}/s), {} fetches started",
        sent.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed) / 10,
        asked.load(Ordering::SeqCst),
    );
    println!(
        "trusted certificate: {}/{} verified (200), latency p50 {:?} p99 {:?} max {:?}",
        trusted.iter().filter(|(s, _)| *s == StatusCode::OK).count(),
        trusted.len(),
        at(0.5),
        at(0.99),
        latencies.last().unwrap(),
    );
    println!(
        "the same, before the flood: p50 {:?} p99 {:?}",
        quiet[quiet.len() / 2],
        quiet[quiet.len() - 1],
    );
    println!(
        "first-time certificate, retried every second: {:?}",
        first.iter().map(|s| s.as_u16()).collect::<Vec<_>>()
    );
    assert!(trusted.iter().all(|(s, _)| *s == StatusCode::OK));
}

fn sns_confirmation(subscribe_url: &str) -> Value {
    json!({
        "Type": "SubscriptionConfirmation",
        "MessageId": "c-1",
        "Token": "2336412f37fb687f5d51e6e2425c464de12884c5",
        "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe to the topic. To confirm, visit the SubscribeURL.",
        "SubscribeURL": subscribe_url,
        "Timestamp": now_rfc3339(),
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem",
    })
}

#[tokio::test]
async fn sns_subscription_confirmation_visits_the_signed_subscribe_url_and_never_reaches_the_handler(
) {
    let server = Server::default();
    let layer = sns_layer(&server);
    let subscribe = "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:eu-west-1:123456789012:orders&Token=2336412f";
    let out = call(&layer, post(sns_signed(sns_confirmation(subscribe), "2"))).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert!(out.handled.is_empty());
    assert_eq!(
        server.asked()[1],
        subscribe,
        "certificate first, then the SubscribeURL"
    );

    // A SubscribeURL off SNS's hosts is not visited, even signed.
    let out = call(
        &layer,
        post(sns_signed(
            sns_confirmation("https://attacker.example/confirm"),
            "2",
        )),
    )
    .await;
    assert_eq!(out.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.asked().len(), 2);

    // A confirmation that cannot be made now answers 503, so SNS sends it again.
    server.failing.store(1, Ordering::SeqCst);
    let out = call(&layer, post(sns_signed(sns_confirmation(subscribe), "2"))).await;
    assert_eq!(out.status, StatusCode::SERVICE_UNAVAILABLE);

    // Without fetched certificates (a pinned one), the handler gets the confirmation.
    let pinned = VerifyWebhookLayer::new(Verifier::new(Scheme::sns([TOPIC]), [TEST_CERT]).unwrap());
    let out = call(&pinned, post(sns_signed(sns_confirmation(subscribe), "1"))).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(
        out.handled[0].0.event_type(),
        Some("SubscriptionConfirmation")
    );
}

#[tokio::test]
async fn paypal_certificates_are_fetched_from_paypal_hosts_and_headers_are_checked_before_the_body()
{
    let server = Server::default();
    let certificates =
        Certificates::new(Scheme::paypal("WEBHOOK-1"), server.fetch(TEST_CERT)).unwrap();
    let layer = VerifyWebhookLayer::from_certificates(certificates);
    let body = br#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.COMPLETED"}"#;
    let h = paypal_signed("WEBHOOK-1", "tx-1", &now_rfc3339(), body);
    let mut request = Request::post("/paypal")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    *request.headers_mut() = h.clone();
    let out = call(&layer, request).await;
    assert_eq!(out.status, StatusCode::OK, "{:?}", out.error);
    assert_eq!(out.handled[0].0.id(), Some("WH-1"));
    assert_eq!(
        server.asked(),
        ["https://api-m.paypal.com/v1/notifications/certs/CERT-test"]
    );

    // A stale transmission is refused from its headers alone.
    let stale = paypal_signed("WEBHOOK-1", "tx-2", "2017-03-30T20:04:05Z", body);
    let mut request = Request::post("/paypal")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    *request.headers_mut() = stale;
    assert_eq!(
        call(&layer, request).await.kind(),
        Some(VerifyErrorKind::TimestampTooOld)
    );
    // A certificate URL elsewhere is never fetched.
    let mut h2 = h;
    h2.insert(
        "paypal-cert-url",
        HeaderValue::from_static("https://paypal.attacker.example/v1/notifications/certs/x"),
    );
    let mut request = Request::post("/paypal")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    *request.headers_mut() = h2;
    assert_eq!(call(&layer, request).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(server.asked().len(), 1);
    assert!(Certificates::new(Scheme::github(), server.fetch(TEST_CERT)).is_err());
}

#[tokio::test]
async fn graph_validation_echoes_the_token_and_notifications_need_the_client_state() {
    let layer =
        VerifyWebhookLayer::new(Verifier::new(Scheme::microsoft_graph(), [CLIENT_STATE]).unwrap());
    let request = Request::post(
        "/graph?validationToken=Validation%3A%20Testing%20client%20application%20reachability",
    )
    .header("content-type", "text/plain")
    .body(Full::new(Bytes::new()))
    .unwrap();
    let out = call(&layer, request).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(
        &out.body[..],
        b"Validation: Testing client application reachability"
    );
    assert!(out.handled.is_empty());

    let batch = json!({"value":[{"subscriptionId":"s-1","clientState":CLIENT_STATE,"changeType":"created","resource":"Users/1"}]});
    let request = Request::post("/graph")
        .body(Full::new(Bytes::from(batch.to_string())))
        .unwrap();
    let out = call(&layer, request).await;
    assert_eq!(out.handled.len(), 1);
    let forged = json!({"value":[{"subscriptionId":"s-1","clientState":"guessed-client-state","changeType":"created"}]});
    let request = Request::post("/graph")
        .body(Full::new(Bytes::from(forged.to_string())))
        .unwrap();
    let out = call(&layer, request).await;
    assert_eq!(out.status, StatusCode::BAD_REQUEST);
    assert!(out.handled.is_empty());
}

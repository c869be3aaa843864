//! Verification cost beside its floor and its peers, at 1 KiB, 64 KiB and 1 MiB.
//!
//! - `floor/hmac`: a bare HMAC-SHA256 over the same signed bytes (key set up per call, as
//!   a hand-written receiver does) — the cost any verifier must pay.
//! - `<scheme>/1-secret`: `Verifier::verify` with one secret.
//! - `<scheme>/3-secrets-oldest`: three secrets, the delivery signed with the *last*
//!   (oldest) one — the worst case, three MACs. With the current secret first it costs
//!   the same as one secret.
//! - `peer/svix`, `peer/standardwebhooks`: those crates verifying the same Standard
//!   Webhooks delivery.
//! - `asymmetric/<alg>-floor` beside `asymmetric/<alg>-verifier`: a bare Ed25519
//!   (`ed25519-dalek`) or ECDSA P-256 (`p256`) verification of the signed bytes, and the
//!   Discord or SendGrid preset verifying the same delivery, at 1 KiB. Likewise RSA-2048
//!   (`rsa` PKCS#1 v1.5 with SHA-256, the test key of `tests/fixtures/rsa`): the PayPal
//!   preset against a bare verification of the string PayPal signs (the CRC32 of the body
//!   computed in the loop, as the preset does), and the SNS preset against a bare
//!   verification of the message's string to sign (prebuilt: the preset also parses the
//!   JSON to rebuild it).
//!
//! `cargo bench --bench verify`; ratios in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tower_webhook::{Scheme, Verifier};

const SIZES: [(usize, &str); 3] = [(1024, "1KiB"), (64 * 1024, "64KiB"), (1024 * 1024, "1MiB")];

fn secrets(scheme: &Scheme) -> [&'static str; 3] {
    match scheme.name() {
        "standard" => [
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "whsec_c3RyYW5nZXItc2VjcmV0LTAxMjM0NTY3",
        ],
        _ => [
            "whsec_bench_secret_current_0001",
            "whsec_bench_secret_previous_002",
            "whsec_bench_secret_oldest_00003",
        ],
    }
}

fn body(size: usize) -> Bytes {
    let mut body = br#"{"id":"evt_bench","type":"bench","data":{"blob":""#.to_vec();
    body.resize(size - 3, b'a');
    body.extend_from_slice(b"\"}}");
    Bytes::from(body)
}

fn floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("floor");
    let key = b"whsec_bench_secret_current_0001";
    let prefix = b"msg_bench_0000000000000000.1700000000.";
    for (size, label) in SIZES {
        let body = body(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("hmac", label), &body, |b, body| {
            b.iter(|| {
                let mut mac = Hmac::<Sha256>::new_from_slice(black_box(key)).unwrap();
                mac.update(prefix);
                mac.update(body);
                black_box(mac.finalize().into_bytes())
            })
        });
    }
}

fn schemes(c: &mut Criterion) {
    for scheme in [
        Scheme::standard(),
        Scheme::stripe(),
        Scheme::github(),
        Scheme::slack(),
        Scheme::shopify(),
    ] {
        let mut group = c.benchmark_group(scheme.name().to_owned());
        let all = secrets(&scheme);
        for (size, label) in SIZES {
            let body = body(size);
            group.throughput(Throughput::Bytes(size as u64));
            for (name, held, signer) in [
                ("1-secret", &all[..1], all[0]),
                ("3-secrets-oldest", &all[..], all[2]),
            ] {
                let verifier = Verifier::new(scheme.clone(), held).unwrap();
                let headers = scheme
                    .sign(
                        [signer],
                        "msg_bench_0000000000000000",
                        SystemTime::now(),
                        &body,
                    )
                    .unwrap();
                assert!(verifier.verify(&headers, body.clone()).is_ok());
                group.bench_with_input(BenchmarkId::new(name, label), &body, |b, body| {
                    b.iter(|| black_box(verifier.verify(&headers, body.clone()).is_ok()))
                });
            }
        }
    }
}

fn peers(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    for (size, label) in SIZES {
        let body = body(size);
        group.throughput(Throughput::Bytes(size as u64));
        // The peers read the real clock (5-minute window): sign with it.
        let headers = Scheme::standard()
            .sign(
                [secret],
                "msg_bench_0000000000000000",
                SystemTime::now(),
                &body,
            )
            .unwrap();
        let svix = svix::webhooks::Webhook::new(secret).unwrap();
        assert!(svix.verify(&body, &headers).is_ok());
        group.bench_with_input(BenchmarkId::new("svix", label), &body, |b, body| {
            b.iter(|| black_box(svix.verify(body, &headers).is_ok()))
        });
        let sw = standardwebhooks::Webhook::new(secret).unwrap();
        assert!(sw.verify(&body, &headers).is_ok());
        group.bench_with_input(
            BenchmarkId::new("standardwebhooks", label),
            &body,
            |b, body| b.iter(|| black_box(sw.verify(body, &headers).is_ok())),
        );
    }
}

fn asymmetric(c: &mut Criterion) {
    use p256::ecdsa::signature::Verifier as _;
    let mut group = c.benchmark_group("asymmetric");
    let body = body(1024);
    let ts = "1700000000";
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let signed_bytes = [ts.as_bytes(), &body].concat();

    let seed = [7u8; 32];
    let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
    let public = hex::encode(signing.verifying_key().to_bytes());
    let headers = Scheme::discord()
        .sign([hex::encode(seed)], "", at, &body)
        .unwrap();
    let sig_hex = headers["x-signature-ed25519"].to_str().unwrap();
    let sig = ed25519_dalek::Signature::from_slice(&hex::decode(sig_hex).unwrap()).unwrap();
    let key = signing.verifying_key();
    group.bench_function("ed25519-floor", |b| {
        b.iter(|| black_box(key.verify(black_box(&signed_bytes), &sig).is_ok()))
    });
    let verifier = Verifier::new(Scheme::discord(), [public])
        .unwrap()
        .with_clock(move || at);
    assert!(verifier.verify(&headers, body.clone()).is_ok());
    group.bench_function("ed25519-verifier", |b| {
        b.iter(|| black_box(verifier.verify(&headers, body.clone()).is_ok()))
    });

    let scalar = "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721";
    let signing = p256::ecdsa::SigningKey::from_slice(&hex::decode(scalar).unwrap()).unwrap();
    let key = *signing.verifying_key();
    let headers = Scheme::sendgrid().sign([scalar], "", at, &body).unwrap();
    let der = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        headers["x-twilio-email-event-webhook-signature"].as_bytes(),
    )
    .unwrap();
    let sig = p256::ecdsa::DerSignature::from_bytes(&der).unwrap();
    group.bench_function("p256-floor", |b| {
        b.iter(|| black_box(key.verify(black_box(&signed_bytes), &sig).is_ok()))
    });
    let public = {
        use p256::pkcs8::EncodePublicKey as _;
        let der = key.to_public_key_der().unwrap();
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der.as_bytes())
    };
    let verifier = Verifier::new(Scheme::sendgrid(), [public])
        .unwrap()
        .with_clock(move || at);
    assert!(verifier.verify(&headers, body.clone()).is_ok());
    group.bench_function("p256-verifier", |b| {
        b.iter(|| black_box(verifier.verify(&headers, body.clone()).is_ok()))
    });

    rsa_presets(&mut group, &body);
}

const RSA_KEY: &str = include_str!("../tests/fixtures/rsa/signer.key.pem");
const RSA_CERT: &str = include_str!("../tests/fixtures/rsa/signer.cert.pem");

/// RSA-2048, the PayPal and SNS presets with the pinned test certificate. Their times are
/// now, within an hour's tolerance: valid for the whole run.
fn rsa_presets(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    body: &Bytes,
) {
    use base64::Engine as _;
    use rsa::pkcs8::DecodePrivateKey as _;
    use rsa::signature::{SignatureEncoding as _, Signer as _, Verifier as _};
    let private = rsa::PrivateKey::from_pkcs8_pem(RSA_KEY).unwrap();
    let key = rsa::pkcs1v15::VerifyingKey::<Sha256>::new(private.to_public_key());
    let signing = rsa::pkcs1v15::SigningKey::<Sha256>::new(private);
    let b64 = &base64::engine::general_purpose::STANDARD;
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();

    // PayPal: `transmission id|time|webhook id|crc32(body)`, the CRC32 in decimal.
    let (transmission, webhook) = ("tx-bench-0000000000000000", "WEBHOOK-1");
    let text = format!("{transmission}|{now}|{webhook}|{}", crc32fast::hash(body));
    let sig = signing.sign(text.as_bytes());
    let mut headers = http::HeaderMap::new();
    for (name, value) in [
        (
            "paypal-cert-url",
            "https://api-m.paypal.com/v1/notifications/certs/CERT-bench",
        ),
        ("paypal-transmission-id", transmission),
        ("paypal-transmission-time", &now),
        ("paypal-auth-algo", "SHA256withRSA"),
        ("paypal-transmission-sig", &b64.encode(sig.to_vec())),
    ] {
        headers.insert(name, http::HeaderValue::from_str(value).unwrap());
    }
    group.bench_function("rsa-floor", |b| {
        b.iter(|| {
            black_box(crc32fast::hash(black_box(body)));
            black_box(key.verify(black_box(text.as_bytes()), &sig).is_ok())
        })
    });
    let verifier = Verifier::new(Scheme::paypal(webhook), [RSA_CERT])
        .unwrap()
        .with_tolerance(Duration::from_secs(3600));
    assert!(verifier.verify(&headers, body.clone()).is_ok());
    group.bench_function("rsa-verifier", |b| {
        b.iter(|| black_box(verifier.verify(&headers, body.clone()).is_ok()))
    });

    // SNS, SignatureVersion 2: `Name\nValue\n` for a notification's fields, sorted; the
    // message is the 1 KiB body as a string.
    let topic = "arn:aws:sns:eu-west-1:123456789012:bench";
    let message = std::str::from_utf8(body).unwrap();
    let (id, subject) = ("00000000-0000-4000-8000-000000000000", "bench");
    let text = format!(
        "Message\n{message}\nMessageId\n{id}\nSubject\n{subject}\nTimestamp\n{now}\n\
         TopicArn\n{topic}\nType\nNotification\n"
    );
    let sig = signing.sign(text.as_bytes());
    let sns = serde_json::to_vec(&serde_json::json!({
        "Type": "Notification",
        "MessageId": id,
        "TopicArn": topic,
        "Subject": subject,
        "Message": message,
        "Timestamp": now,
        "SignatureVersion": "2",
        "Signature": b64.encode(sig.to_vec()),
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-bench.pem",
        "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
    }))
    .unwrap();
    let sns = Bytes::from(sns);
    group.bench_function("sns-floor", |b| {
        b.iter(|| black_box(key.verify(black_box(text.as_bytes()), &sig).is_ok()))
    });
    let verifier = Verifier::new(Scheme::sns([topic]), [RSA_CERT])
        .unwrap()
        .with_tolerance(Duration::from_secs(3600));
    let none = http::HeaderMap::new();
    assert!(verifier.verify(&none, sns.clone()).is_ok());
    group.bench_function("sns-verifier", |b| {
        b.iter(|| black_box(verifier.verify(&none, sns.clone()).is_ok()))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = floor, schemes, peers, asymmetric
}
criterion_main!(benches);

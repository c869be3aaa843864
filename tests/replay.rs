//! What one captured, genuine delivery can still do (issue 19, items 1 and 2): a PayPal
//! transmission re-sent with another body of the same CRC-32, and a delivery of a scheme
//! that signs no time replayed after the ordinary retention pruned its key.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::stores::{self, Kind};
use http::{HeaderMap, HeaderValue};
use rsa::pkcs8::DecodePrivateKey as _;
use rsa::signature::{SignatureEncoding as _, Signer as _};
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, MemoryStore, Retention, Token,
};
use tower_webhook::{Event, Scheme, Verifier, VerifyErrorKind, VerifyWebhookLayer};

const TEST_KEY: &str = include_str!("fixtures/rsa/signer.key.pem");
const TEST_CERT: &str = include_str!("fixtures/rsa/signer.cert.pem");
const WEBHOOK: &str = "WEBHOOK-1";
const NOW: u64 = common::NOW;

fn rfc3339(unix: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// Signs a PayPal delivery as PayPal does (`id|time|webhook|crc32(body)`), with the test key.
fn paypal_signed(transmission: &str, time: &str, body: &[u8]) -> HeaderMap {
    let text = format!("{transmission}|{time}|{WEBHOOK}|{}", crc32fast::hash(body));
    let key = rsa::PrivateKey::from_pkcs8_pem(TEST_KEY).unwrap();
    let signature = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key)
        .sign(text.as_bytes())
        .to_vec();
    use base64::Engine as _;
    let sig = base64::engine::general_purpose::STANDARD.encode(signature);
    let mut h = HeaderMap::new();
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

/// The four bytes that, written at `at` in `body`, give it the CRC-32 `target`. CRC-32 is
/// affine over GF(2): the CRC of the body with bit `i` of those bytes set differs from
/// the one with them zero by a fixed vector, so solving a 32×32 linear system gives them.
fn force_crc(body: &mut [u8], at: usize, target: u32) {
    body[at..at + 4].fill(0);
    let base = crc32fast::hash(body);
    // Basis vectors by their highest bit, with the combination of bits that makes each.
    let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
    for bit in 0..32 {
        body[at + bit / 8] = 1 << (bit % 8);
        let (mut v, mut m) = (crc32fast::hash(body) ^ base, 1u32 << bit);
        body[at + bit / 8] = 0;
        while v != 0 {
            let top = 31 - v.leading_zeros() as usize;
            match basis[top] {
                Some((bv, bm)) => (v, m) = (v ^ bv, m ^ bm),
                None => {
                    basis[top] = Some((v, m));
                    break;
                }
            }
        }
    }
    let (mut t, mut x) = (target ^ base, 0u32);
    while t != 0 {
        let top = 31 - t.leading_zeros() as usize;
        let (bv, bm) = basis[top].expect("four adjacent bytes reach every CRC");
        (t, x) = (t ^ bv, x ^ bm);
    }
    body[at..at + 4].copy_from_slice(&x.to_le_bytes());
    assert_eq!(crc32fast::hash(body), target);
}

/// A JSON body of the attacker's choice with the CRC-32 of `genuine`: a salt is tried
/// until the four forced bytes are plain string characters.
fn forged_with_crc_of(genuine: &[u8]) -> Vec<u8> {
    let target = crc32fast::hash(genuine);
    for salt in 0u32.. {
        let mut body = format!(
            r#"{{"id":"WH-FORGED-{salt}","event_type":"PAYMENT.CAPTURE.COMPLETED","resource":{{"amount":{{"value":"99999.00","currency_code":"USD"}}}},"pad":"XXXX"}}"#
        )
        .into_bytes();
        let at = body.len() - 6;
        force_crc(&mut body, at, target);
        if body[at..at + 4]
            .iter()
            .all(|b| (0x20..0x7f).contains(b) && *b != b'"' && *b != b'\\')
        {
            return body;
        }
    }
    unreachable!()
}

fn paypal_verifier(now: u64) -> Verifier {
    Verifier::new(Scheme::paypal(WEBHOOK), [TEST_CERT])
        .unwrap()
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(now))
}

#[test]
fn paypal_a_second_body_under_a_captured_transmission_is_refused_and_genuine_retries_dedupe() {
    let genuine = br#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.REFUNDED","resource":{"amount":{"value":"1.00","currency_code":"USD"}}}"#;
    let time = rfc3339(NOW);
    let captured = paypal_signed("tx-1", &time, genuine);
    let v = paypal_verifier(NOW + 5);
    let first = v.verify(&captured, Bytes::from_static(genuine)).unwrap();
    assert_eq!(first.id(), Some("WH-1"));

    let forged = forged_with_crc_of(genuine);
    assert_eq!(crc32fast::hash(&forged), crc32fast::hash(genuine));
    serde_json::from_slice::<serde_json::Value>(&forged).expect("the forgery is JSON");
    // Under the captured headers the forgery verifies against a fresh verifier (this is
    // what the signature alone proves), with an id, so a dedupe key, of its own ...
    let fresh = paypal_verifier(NOW + 5);
    let passes = fresh
        .verify(&captured, Bytes::from(forged.clone()))
        .unwrap();
    assert_ne!(passes.dedupe_id(), first.dedupe_id());
    // ... but not after the genuine body came under that transmission — on any clone of
    // the verifier (the layer's, a fetched certificate's), and until twice the window.
    for verifier in [&v, &v.clone()] {
        let e = verifier
            .verify(&captured, Bytes::from(forged.clone()))
            .unwrap_err();
        assert_eq!(e.kind(), VerifyErrorKind::InvalidSignature, "{e}");
    }
    let later = v
        .clone()
        .with_clock(|| UNIX_EPOCH + Duration::from_secs(NOW + 299));
    assert_eq!(
        later
            .verify(&captured, Bytes::from(forged.clone()))
            .unwrap_err()
            .kind(),
        VerifyErrorKind::InvalidSignature
    );

    // The same transmission again, same body: verifies (the dedupe store answers it).
    let again = v.verify(&captured, Bytes::from_static(genuine)).unwrap();
    assert_eq!(again.dedupe_id(), first.dedupe_id());
    // PayPal's retry: a new transmission (id and time) of the same event — one event.
    let retry = paypal_signed("tx-2", &rfc3339(NOW + 60), genuine);
    let v_later = v
        .clone()
        .with_clock(|| UNIX_EPOCH + Duration::from_secs(NOW + 62));
    let retried = v_later.verify(&retry, Bytes::from_static(genuine)).unwrap();
    assert_eq!(retried.dedupe_id(), first.dedupe_id());
    assert_eq!(
        Delivery::from_event(&retried).id(),
        Delivery::from_event(&first).id()
    );
}

/// A replica: its own verifier (so its own in-process memory of transmissions), and the
/// shared transmission store when there is one.
fn replica(store: Option<std::sync::Arc<dyn DedupeStore>>) -> VerifyWebhookLayer {
    let layer = VerifyWebhookLayer::new(paypal_verifier(NOW + 5));
    match store {
        Some(store) => layer.with_transmission_store_arc(store),
        None => layer,
    }
}

#[tokio::test]
async fn paypal_a_forged_body_sent_to_another_replica_is_refused_through_the_shared_store() {
    let genuine = br#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.REFUNDED","resource":{"amount":{"value":"1.00","currency_code":"USD"}}}"#;
    let forged = forged_with_crc_of(genuine);
    let captured = paypal_signed("tx-1", &rfc3339(NOW), genuine);
    let send = |layer: &VerifyWebhookLayer, body: Vec<u8>| {
        let request = common::request(captured.clone(), body);
        let layer = layer.clone();
        async move { common::call(&layer, request).await }
    };
    // Without a shared store, a second replica (or a restarted process) has not seen the
    // transmission: the forgery reaches its handler.
    let (a, b) = (replica(None), replica(None));
    assert_eq!(send(&a, genuine.to_vec()).await.handled.len(), 1);
    let out = send(&b, forged.clone()).await;
    assert_eq!(out.handled.len(), 1, "per process: {:?}", out.status);

    for kind in Kind::ALL {
        let store = stores::open(kind).await;
        let (a, b) = (replica(Some(store.clone())), replica(Some(store.clone())));
        let first = send(&a, genuine.to_vec()).await;
        assert_eq!(first.handled.len(), 1, "{kind:?}: {:?}", first.status);
        // Another replica, and a process started after the first one's delivery.
        for other in [&b, &replica(Some(store.clone()))] {
            let out = send(other, forged.clone()).await;
            assert_eq!(out.status, 400, "{kind:?}");
            assert_eq!(
                out.kind(),
                Some(VerifyErrorKind::InvalidSignature),
                "{kind:?}"
            );
            assert!(out.handled.is_empty(), "{kind:?}: the forgery ran");
            // The genuine body under the same transmission still verifies there (the
            // dedupe layer, not this one, answers it as a duplicate).
            let again = send(other, genuine.to_vec()).await;
            assert_eq!(again.handled.len(), 1, "{kind:?}: {:?}", again.status);
        }
        // Concurrent replicas, each with another body under one fresh transmission: one
        // body wins everywhere.
        let racing = paypal_signed("tx-race", &rfc3339(NOW), genuine);
        let replicas: Vec<_> = (0..6).map(|_| replica(Some(store.clone()))).collect();
        let outs = futures_util::future::join_all(replicas.iter().enumerate().map(|(i, r)| {
            let body = if i % 2 == 0 {
                genuine.to_vec()
            } else {
                forged.clone()
            };
            let request = common::request(racing.clone(), body);
            let r = r.clone();
            async move { common::call(&r, request).await }
        }))
        .await;
        let bodies: std::collections::HashSet<_> = outs
            .iter()
            .flat_map(|o| o.handled.iter().map(|(_, body)| body.clone()))
            .collect();
        assert_eq!(
            bodies.len(),
            1,
            "{kind:?}: two bodies passed under one transmission"
        );
        assert_eq!(
            outs.iter().filter(|o| o.handled.len() == 1).count(),
            3,
            "{kind:?}: every replica with the winning body passes"
        );
    }
}

#[tokio::test]
async fn paypal_a_transmission_store_that_fails_answers_503_and_the_resend_passes() {
    use common::fault_store::{Fault, FaultStore, Op};
    let genuine = br#"{"id":"WH-2","event_type":"PAYMENT.CAPTURE.COMPLETED"}"#;
    let forged = forged_with_crc_of(genuine);
    let captured = paypal_signed("tx-2", &rfc3339(NOW), genuine);
    for kind in Kind::ALL {
        let faults = FaultStore::from_arc(stores::open(kind).await);
        let layer = replica(Some(std::sync::Arc::new(faults.clone())));
        let send = |body: Vec<u8>| common::call(&layer, common::request(captured.clone(), body));
        faults.script(Op::Claim, [Fault::Fail]);
        let out = send(genuine.to_vec()).await;
        assert_eq!(out.status, 503, "{kind:?}");
        assert_eq!(out.kind(), Some(VerifyErrorKind::StoreUnavailable));
        assert!(out.handled.is_empty());
        // The completion landed but its answer was lost: the same body again passes,
        // and the id is held for that body.
        faults.script(Op::Complete, [Fault::LoseAck]);
        assert_eq!(send(genuine.to_vec()).await.status, 503, "{kind:?}");
        let again = send(genuine.to_vec()).await;
        assert_eq!(again.handled.len(), 1, "{kind:?}: {:?}", again.status);
        let out = send(forged.clone()).await;
        assert_eq!(
            out.kind(),
            Some(VerifyErrorKind::InvalidSignature),
            "{kind:?}"
        );
    }
}

/// A verified GitHub delivery (no signed time) and a Standard Webhooks one (signed time).
fn events() -> (Event, Event) {
    let body = br#"{"action":"opened","number":7}"#;
    let github_secret = "It's a Secret to Everybody";
    let mut h = Scheme::github()
        .sign([github_secret], "delivery-1", SystemTime::now(), body)
        .unwrap();
    h.insert("x-github-event", HeaderValue::from_static("pull_request"));
    let github = Verifier::new(Scheme::github(), [github_secret])
        .unwrap()
        .verify(&h, Bytes::from_static(body))
        .unwrap();
    let standard_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let h = Scheme::standard()
        .sign([standard_secret], "msg_1", SystemTime::now(), body)
        .unwrap();
    let standard = Verifier::new(Scheme::standard(), [standard_secret])
        .unwrap()
        .verify(&h, Bytes::from_static(body))
        .unwrap();
    (github, standard)
}

async fn done(store: &dyn DedupeStore, d: &Delivery) {
    let token = Token::new();
    assert_eq!(
        store
            .claim(d.clone(), token, Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::New(token)
    );
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done
    );
}

async fn claim(store: &dyn DedupeStore, d: &Delivery) -> Claim {
    store
        .claim(d.clone(), Token::new(), Duration::from_secs(30))
        .await
        .unwrap()
}

/// A store of `kind` whose done event keys expire after `retention` where the store
/// expires them itself (memory, Redis).
async fn store(kind: Kind, retention: Retention) -> std::sync::Arc<dyn DedupeStore> {
    match kind {
        Kind::Memory => std::sync::Arc::new(MemoryStore::new().with_retention(retention)),
        Kind::Redis => std::sync::Arc::new(stores::redis().await.with_retention(retention)),
        kind => stores::open(kind).await,
    }
}

#[tokio::test]
async fn a_key_of_a_scheme_without_a_signed_time_outlives_the_retention_until_pruned_by_name() {
    let (github, standard) = events();
    let kept = Delivery::from_event(&github);
    let timed = Delivery::from_event(&standard);
    assert!(kept.is_kept() && !timed.is_kept());
    let short = Retention::shorter(Duration::from_millis(200));
    for kind in Kind::ALL {
        let store = store(kind, short).await;
        let store = &*store;
        done(store, &kept).await;
        done(store, &timed).await;
        // The ordinary retention passes: expiry (memory, Redis) and `prune` (all).
        tokio::time::sleep(Duration::from_millis(300)).await;
        store.prune(short).await.unwrap();
        assert_eq!(claim(store, &kept).await, Claim::Done, "{kind:?}: replayed");
        // A key of a timed scheme still goes (its signed time refuses the replay).
        assert!(
            matches!(claim(store, &timed).await, Claim::New(_)),
            "{kind:?}: a timed key is pruned as before"
        );
        // Pruned only by name: its source.
        assert_eq!(
            store
                .prune_once(github.source(), Duration::from_millis(100))
                .await
                .unwrap(),
            1,
            "{kind:?}"
        );
        assert!(
            matches!(claim(store, &kept).await, Claim::New(_)),
            "{kind:?}: pruned by name"
        );
    }
}

const SQUARE_URL: &str = "https://example.com/webhooks/square";
const SQUARE_KEY: &str = "sq0wss-0123456789abcdefghijklmnopqrstuv";

fn square_at(now: u64, body: &'static [u8]) -> Result<Event, VerifyErrorKind> {
    let h = Scheme::square()
        .sign_request(
            [SQUARE_KEY],
            &http::Method::POST,
            SQUARE_URL,
            "",
            UNIX_EPOCH,
            body,
        )
        .unwrap();
    Verifier::new(Scheme::square(), [SQUARE_KEY])
        .unwrap()
        .with_clock(move || UNIX_EPOCH + Duration::from_secs(now))
        .with_public_url(tower_webhook::PublicUrl::exact(SQUARE_URL).unwrap())
        .verify_request(
            &http::Method::POST,
            &"/webhooks/square".parse().unwrap(),
            &h,
            Bytes::from_static(body),
        )
        .map_err(|e| e.kind())
}

#[test]
fn square_signed_created_at_refuses_a_replay_once_its_key_may_be_pruned() {
    // 2023-11-14T22:13:20Z is `NOW`.
    let body = br#"{"merchant_id":"M1","type":"payment.updated","event_id":"e-1","created_at":"2023-11-14T22:13:20.123Z","data":{"type":"payment","id":"p-1"}}"#;
    // Square's retries (24 hours) pass, as a timed key, pruned with the retention.
    let retry = square_at(NOW + 24 * 3600, body).unwrap();
    assert_eq!(retry.id(), Some("e-1"));
    assert!(!Delivery::from_event(&retry).is_kept());
    // After the retention floor (4 days) the key may be gone: the signed time refuses it.
    assert_eq!(
        square_at(NOW + Retention::MIN.as_secs(), body).unwrap_err(),
        VerifyErrorKind::TimestampTooOld
    );
    assert_eq!(
        square_at(NOW + 48 * 3600 + 1, body).unwrap_err(),
        VerifyErrorKind::TimestampTooOld
    );
    // A body without `created_at` has no signed time: its key is kept until pruned.
    let untimed = br#"{"type":"payment.updated","event_id":"e-2","data":{}}"#;
    let event = square_at(NOW + Retention::MIN.as_secs(), untimed).unwrap();
    assert!(Delivery::from_event(&event).is_kept());
}

/// The SQL inbox keeps the row of an event without a signed time past `Inbox::prune`, and
/// a replay of it is a duplicate; `prune_once` with the source deletes it.
#[tokio::test]
async fn the_inbox_keeps_rows_of_a_scheme_without_a_signed_time_until_pruned_by_name() {
    use tower_webhook::inbox::{Accepted, Inbox, Worker};
    let (github, standard) = events();
    let sqlite = stores::sqlite().await;
    let pg = stores::postgres().await;
    let inboxes: [(Inbox, std::sync::Arc<dyn DedupeStore>); 2] = [
        (Inbox::sqlite(&sqlite), std::sync::Arc::new(sqlite.clone())),
        (Inbox::postgres(&pg), std::sync::Arc::new(pg.clone())),
    ];
    for (inbox, store) in inboxes {
        assert_eq!(inbox.accept(&github).await.unwrap(), Accepted::New);
        assert_eq!(inbox.accept(&standard).await.unwrap(), Accepted::New);
        let worker = Worker::new(&inbox, |_: Event, _| async { Ok::<_, std::io::Error>(()) })
            .with_poll_interval(Duration::from_millis(20))
            .unwrap()
            .spawn();
        for _ in 0..300 {
            if inbox.counts().await.unwrap().processed == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        worker.shutdown().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let short = Retention::shorter(Duration::from_millis(10));
        assert_eq!(inbox.prune(short).await.unwrap(), 1, "the timed row only");
        assert_eq!(inbox.accept(&github).await.unwrap(), Accepted::Duplicate);
        assert_eq!(
            store
                .prune_once(github.source(), Duration::from_millis(10))
                .await
                .unwrap(),
            1
        );
        assert_eq!(inbox.accept(&github).await.unwrap(), Accepted::New);
    }
}

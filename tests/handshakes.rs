//! Set-up handshakes are answered by `VerifyWebhookLayer` itself — after verification for
//! the signed ones, before anything for Meta's GET — and never reach the handler.

mod common;

use bytes::Bytes;
use common::{at, call, verifier, NOW};
use http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::Full;
use tower_webhook::{Scheme, VerifyErrorKind, VerifyWebhookLayer};

fn post(headers: HeaderMap, body: &'static [u8]) -> Request<Full<Bytes>> {
    let mut request = Request::post("/hooks")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    *request.headers_mut() = headers;
    request
}

#[tokio::test]
async fn slack_url_verification_is_answered_with_its_challenge_once_verified() {
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let layer = VerifyWebhookLayer::new(verifier(Scheme::slack(), &[secret]));
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let headers = Scheme::slack().sign([secret], "", at(NOW), body).unwrap();
    let out = call(&layer, post(headers.clone(), body)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(
        &out.body[..],
        b"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    assert!(out.handled.is_empty(), "the handler never sees a handshake");
    // Forged: the usual rejection, no challenge echoed.
    let forged = br#"{"token":"x","challenge":"attacker-chosen-text-of-some-length","type":"url_verification"}"#;
    let out = call(&layer, post(headers, forged)).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(!String::from_utf8_lossy(&out.body).contains("attacker"));
}

#[tokio::test]
async fn zoom_url_validation_answers_plain_and_encrypted_token() {
    let secret = "test_secret_token";
    let scheme = || Scheme::zoom().with_min_secret_len(8);
    let layer = VerifyWebhookLayer::new(verifier(scheme(), &["an_older_token_0001", secret]));
    let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}"#;
    let headers = scheme().sign([secret], "", at(NOW), body).unwrap();
    let out = call(&layer, post(headers, body)).await;
    assert_eq!(out.status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&out.body).unwrap();
    // The HMAC under the secret that signed the request, computed independently.
    assert_eq!(
        answer,
        serde_json::json!({
            "plainToken": "qgg8vlvZRS6UYooatFL8Aw",
            "encryptedToken": "4efea922935c335d972476de138d2208a0d46ab28c79ee592d497a1b216419b8",
        })
    );
    assert!(out.handled.is_empty());
    // An ordinary Zoom event goes on to the handler.
    let event = br#"{"event":"meeting.started","event_ts":1700000000000,"payload":{}}"#;
    let headers = scheme().sign([secret], "", at(NOW), event).unwrap();
    let out = call(&layer, post(headers, event)).await;
    assert_eq!(out.handled.len(), 1);
}

#[tokio::test]
async fn discord_ping_gets_a_pong_and_a_bad_signature_gets_401() {
    let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    let layer = VerifyWebhookLayer::new(verifier(Scheme::discord(), &[public]));
    let ping = br#"{"id":"787053080478613555","token":"ThisIsATokenFromDiscordThatIsVeryLong","type":1,"version":1}"#;
    let headers = Scheme::discord().sign([seed], "", at(NOW), ping).unwrap();
    let out = call(&layer, post(headers.clone(), ping)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(&out.body[..], br#"{"type":1}"#);
    assert!(out.handled.is_empty());
    // Discord sends invalid signatures on purpose and wants 401 for them (and for none).
    let tampered = br#"{"id":"787053080478613555","token":"ThisIsATokenFromDiscordThatIsVeryLong","type":1,"version":2}"#;
    let out = call(&layer, post(headers, tampered)).await;
    assert_eq!(out.status, StatusCode::UNAUTHORIZED);
    let out = call(&layer, post(HeaderMap::new(), ping)).await;
    assert_eq!(out.status, StatusCode::UNAUTHORIZED);
    // An interaction (type 2) reaches the handler.
    let command = br#"{"id":"787053080478613556","type":2,"data":{"name":"hello"}}"#;
    let headers = Scheme::discord()
        .sign([seed], "", at(NOW), command)
        .unwrap();
    let out = call(&layer, post(headers, command)).await;
    assert_eq!(out.handled.len(), 1);
}

#[tokio::test]
async fn twitch_callback_verification_is_answered_with_its_challenge() {
    // twitch-rs/twitch_api `verify_request_challenge`, at its own timestamp.
    let layer = VerifyWebhookLayer::new(
        tower_webhook::Verifier::new(Scheme::twitch().with_min_secret_len(8), ["HELLOabc2321"])
            .unwrap()
            .with_clock(|| at(1_644_120_204)),
    );
    let body = br#"{"challenge":"11535768-497e-14ec-8197-ba2cb5341a01","subscription":{"id":"8d8fa82b-9792-79da-4e11-a6fa58a7a582","status":"webhook_callback_verification_pending","type":"channel.subscribe","version":"1","condition":{"broadcaster_user_id":"88525095"},"transport":{"method":"webhook","callback":"http://localhost:80/twitch/eventsub"},"created_at":"2022-02-06T04:03:24.2706497Z","cost":0}}"#;
    let mut headers = HeaderMap::new();
    for (k, v) in [
        (
            "twitch-eventsub-message-id",
            "8d8fa82b-9792-79da-4e11-a6fa58a7a582",
        ),
        (
            "twitch-eventsub-message-timestamp",
            "2022-02-06T04:03:24.2726598Z",
        ),
        (
            "twitch-eventsub-message-type",
            "webhook_callback_verification",
        ),
        ("twitch-eventsub-subscription-type", "channel.subscribe"),
        (
            "twitch-eventsub-message-signature",
            "sha256=091f6a5c74fba820f2d50e9d0c5e7650556ee009375af2cc662e610e670bc412",
        ),
    ] {
        headers.insert(k, HeaderValue::from_static(v));
    }
    let out = call(&layer, post(headers, body)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(&out.body[..], b"11535768-497e-14ec-8197-ba2cb5341a01");
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn meta_get_handshake_needs_the_verify_token() {
    let layer = VerifyWebhookLayer::new(verifier(
        Scheme::meta(),
        &["0123456789abcdef0123456789abcdef"],
    ))
    .with_verify_token("meatyhamhock");
    let get = |query: &str| {
        Request::builder()
            .method(Method::GET)
            .uri(format!("/hooks?{query}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let out = call(
        &layer,
        get("hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meatyhamhock"),
    )
    .await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(&out.body[..], b"1158201444");
    assert!(out.handled.is_empty());
    for wrong in [
        "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=guess",
        "hub.mode=subscribe&hub.challenge=1158201444",
        "hub.mode=unsubscribe&hub.challenge=1158201444&hub.verify_token=meatyhamhock",
    ] {
        let out = call(&layer, get(wrong)).await;
        assert_eq!(out.status, StatusCode::FORBIDDEN, "{wrong}");
        assert!(!String::from_utf8_lossy(&out.body).contains("1158201444"));
    }
    // Without a configured token every handshake is refused.
    let no_token = VerifyWebhookLayer::new(verifier(
        Scheme::meta(),
        &["0123456789abcdef0123456789abcdef"],
    ));
    let out = call(
        &no_token,
        get("hub.mode=subscribe&hub.challenge=1&hub.verify_token=meatyhamhock"),
    )
    .await;
    assert_eq!(out.status, StatusCode::FORBIDDEN);
    // The token never shows in Debug.
    assert!(!format!("{layer:?}").contains("meatyhamhock"));
}

#[tokio::test]
async fn github_preset_takes_25_mib_bodies_where_others_stop_at_1_mib() {
    let secret = "0123456789abcdef0123";
    let big: &'static [u8] = Box::leak(vec![b' '; 3 * 1024 * 1024].into_boxed_slice());
    let headers = Scheme::github()
        .sign([secret], "d-1", at(NOW), big)
        .unwrap();
    let github = VerifyWebhookLayer::new(verifier(Scheme::github(), &[secret]));
    let out = call(&github, post(headers, big)).await;
    assert_eq!(out.status, StatusCode::OK);
    let shopify = VerifyWebhookLayer::new(verifier(Scheme::shopify(), &[secret]));
    let mut headers = Scheme::shopify()
        .sign([secret], "d-1", at(NOW), big)
        .unwrap();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(big.len()));
    let out = call(&shopify, post(headers, big)).await;
    assert_eq!(out.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_twitch_challenge_replayed_without_its_type_header_is_still_only_a_handshake() {
    let secret = "twitch-secret-0123456789";
    let layer = VerifyWebhookLayer::new(verifier(Scheme::twitch(), &[secret]));
    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"status":"webhook_callback_verification_pending"}}"#;
    // Signed, but sent without `Twitch-Eventsub-Message-Type` (it is not signed).
    let headers = Scheme::twitch()
        .sign(
            [secret],
            "8d8fa82b-9792-79da-4e11-a6fa58a7a582",
            at(NOW),
            body,
        )
        .unwrap();
    let out = call(&layer, post(headers, body)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(&out.body[..], b"pogchamp-kappa-360noscope-vohiyo");
    assert!(out.handled.is_empty(), "never reaches the handler");
}

//! `VerifyWebhookLayer` end to end through a recording handler: what reaches the handler,
//! and every way a request is refused before it does.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{at, call, request, verifier, Chunked, NOW};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::ServiceExt;
use tower_webhook::verify::{TenantFrom, Tenants};
use tower_webhook::{PublicUrl, Scheme, VerifyErrorKind, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const BODY: &[u8] = br#"{"type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;

fn layer() -> VerifyWebhookLayer {
    VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]))
}

fn signed(secret: &str, secs: u64, body: &[u8]) -> HeaderMap {
    Scheme::standard()
        .sign([secret], "msg_1", at(secs), body)
        .unwrap()
}

#[tokio::test]
async fn authentic_delivery_reaches_the_handler_with_the_same_bytes_and_the_event() {
    let out = call(&layer(), request(signed(SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.body, "handled");
    assert_eq!(out.handled.len(), 1);
    let (event, body) = &out.handled[0];
    assert_eq!(body.as_ref(), BODY);
    assert_eq!(event.body().as_ref(), BODY);
    assert_eq!(event.id(), Some("msg_1"));
    assert_eq!(event.event_type(), Some("invoice.paid"));
    assert_eq!(event.object_id(), Some("in_1"));
    assert_eq!(event.source(), "standard");
}

#[tokio::test]
async fn non_utf8_empty_and_non_json_bodies_verify_like_any_other() {
    for body in [&b"\xff\xfe\x00\x80 binary"[..], b"", b"not json at all"] {
        let out = call(
            &layer(),
            request(signed(SECRET, NOW, body), Bytes::copy_from_slice(body)),
        )
        .await;
        assert_eq!(out.status, StatusCode::OK, "{body:?}");
        assert_eq!(out.handled.len(), 1);
        assert_eq!(out.handled[0].1.as_ref(), body);
        assert_eq!(out.handled[0].0.event_type(), None);
    }
}

/// A valid set of headers, changed by `edit`.
fn edited(edit: impl FnOnce(&mut HeaderMap)) -> HeaderMap {
    let mut h = signed(SECRET, NOW, BODY);
    edit(&mut h);
    h
}

fn set(h: &mut HeaderMap, name: &'static str, value: &str) {
    h.insert(name, HeaderValue::from_str(value).unwrap());
}

#[tokio::test]
async fn hostile_inputs_get_a_clear_4xx_and_never_reach_the_handler() {
    let sig = signed(SECRET, NOW, BODY)["webhook-signature"]
        .to_str()
        .unwrap()
        .to_owned();
    let cases: Vec<(&str, HeaderMap, &[u8], VerifyErrorKind)> = vec![
        (
            "no signature",
            edited(|h| {
                h.remove("webhook-signature");
            }),
            BODY,
            VerifyErrorKind::MissingHeader,
        ),
        (
            "no id",
            edited(|h| {
                h.remove("webhook-id");
            }),
            BODY,
            VerifyErrorKind::MissingHeader,
        ),
        (
            "no timestamp",
            edited(|h| {
                h.remove("webhook-timestamp");
            }),
            BODY,
            VerifyErrorKind::MissingHeader,
        ),
        (
            "no headers at all",
            HeaderMap::new(),
            BODY,
            VerifyErrorKind::MissingHeader,
        ),
        (
            "signature header twice",
            edited(|h| {
                h.append("webhook-signature", HeaderValue::from_str(&sig).unwrap());
            }),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "id header twice",
            edited(|h| {
                h.append("webhook-id", HeaderValue::from_static("msg_2"));
            }),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "empty v1 signature",
            edited(|h| set(h, "webhook-signature", "v1,")),
            BODY,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "truncated signature",
            edited(|h| set(h, "webhook-signature", &sig[..sig.len() - 4])),
            BODY,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "undecodable signature of the right length",
            edited(|h| set(h, "webhook-signature", &format!("v1,{}", "!".repeat(44)))),
            BODY,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "signature of another version only",
            edited(|h| set(h, "webhook-signature", &sig.replace("v1,", "v2,"))),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "non-ASCII header bytes",
            edited(|h| {
                h.insert(
                    "webhook-signature",
                    HeaderValue::from_bytes(b"v1,\xff\xfeabc").unwrap(),
                );
            }),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "a header with thousands of entries",
            edited(|h| set(h, "webhook-signature", &vec![sig.as_str(); 3000].join(" "))),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "non-numeric timestamp",
            edited(|h| set(h, "webhook-timestamp", "soon")),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "i64::MIN timestamp",
            edited(|h| set(h, "webhook-timestamp", "-9223372036854775808")),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "timestamp past i64::MAX",
            edited(|h| set(h, "webhook-timestamp", "99999999999999999999")),
            BODY,
            VerifyErrorKind::MalformedHeader,
        ),
        (
            "signed with another secret",
            signed(OLD_SECRET, NOW, BODY),
            BODY,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "one body byte changed",
            signed(SECRET, NOW, BODY),
            br#"{"type":"invoice.paiD","data":{"object":{"id":"in_1"}}}"#,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "id changed after signing",
            edited(|h| set(h, "webhook-id", "msg_2")),
            BODY,
            VerifyErrorKind::InvalidSignature,
        ),
        (
            "replayed: signed 301 s ago",
            signed(SECRET, NOW - 301, BODY),
            BODY,
            VerifyErrorKind::TimestampTooOld,
        ),
        (
            "signed 301 s ahead",
            signed(SECRET, NOW + 301, BODY),
            BODY,
            VerifyErrorKind::TimestampInFuture,
        ),
        // The MAC is checked first: a forger learns nothing about the time window.
        // The window is public: a timestamp outside it is refused before any HMAC.
        (
            "stale and forged",
            signed(OLD_SECRET, NOW - 10_000, BODY),
            BODY,
            VerifyErrorKind::TimestampTooOld,
        ),
        (
            "timestamp of a billion years",
            edited(|h| set(h, "webhook-timestamp", "31536000000000000")),
            BODY,
            VerifyErrorKind::TimestampInFuture,
        ),
    ];
    for (name, headers, body, kind) in cases {
        let out = call(&layer(), request(headers, Bytes::from_static(body))).await;
        assert_eq!(out.status, StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(out.kind(), Some(kind), "{name}");
        assert!(out.handled.is_empty(), "{name}: the handler ran");
        let text = std::str::from_utf8(&out.body).unwrap();
        assert!(
            text.len() < 64 && !text.contains("whsec") && !text.contains("MfKQ"),
            "{name}: {text}"
        );
    }
}

#[tokio::test]
async fn stripe_header_without_timestamp_or_v1_is_malformed() {
    let secret = "whsec_stripe_test_0123456789";
    let layer = VerifyWebhookLayer::new(verifier(Scheme::stripe(), &[secret]));
    let good = Scheme::stripe().sign([secret], "", at(NOW), BODY).unwrap();
    let value = good["stripe-signature"].to_str().unwrap().to_owned();
    let (t, v1) = value.split_once(',').unwrap();
    for header in [
        v1.to_owned(),
        t.to_owned(),
        format!("{t},{t},{v1}"),
        format!("{t},v0={}", &v1[3..]),
    ] {
        let mut h = HeaderMap::new();
        h.insert("stripe-signature", HeaderValue::from_str(&header).unwrap());
        let out = call(&layer, request(h, BODY)).await;
        assert_eq!(
            out.kind(),
            Some(VerifyErrorKind::MalformedHeader),
            "{header}"
        );
        assert!(out.handled.is_empty());
    }
    let out = call(&layer, request(good, BODY)).await;
    assert_eq!(out.status, StatusCode::OK);
}

#[tokio::test]
async fn timestamp_exactly_at_either_tolerance_is_accepted_and_one_second_beyond_is_not() {
    let custom = VerifyWebhookLayer::new(
        verifier(Scheme::standard(), &[SECRET])
            .with_past_tolerance(Duration::from_secs(600))
            .with_future_tolerance(Duration::from_secs(30)),
    );
    for (secs, expected) in [
        (NOW - 600, StatusCode::OK),
        (NOW - 601, StatusCode::BAD_REQUEST),
        (NOW + 30, StatusCode::OK),
        (NOW + 31, StatusCode::BAD_REQUEST),
    ] {
        let out = call(&custom, request(signed(SECRET, secs, BODY), BODY)).await;
        assert_eq!(out.status, expected, "{}", secs as i64 - NOW as i64);
        assert_eq!(out.handled.len(), usize::from(expected == StatusCode::OK));
    }
    let default = layer();
    for (secs, ok) in [
        (NOW - 300, true),
        (NOW - 301, false),
        (NOW + 300, true),
        (NOW + 301, false),
    ] {
        let out = call(&default, request(signed(SECRET, secs, BODY), BODY)).await;
        assert_eq!(
            out.status == StatusCode::OK,
            ok,
            "{}",
            secs as i64 - NOW as i64
        );
    }
}

#[tokio::test]
async fn old_and_new_secrets_both_verify_and_the_match_is_recorded() {
    let layer = VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET, OLD_SECRET]));
    for (secret, index) in [(SECRET, 0), (OLD_SECRET, 1)] {
        let out = call(&layer, request(signed(secret, NOW, BODY), BODY)).await;
        assert_eq!(out.status, StatusCode::OK);
        assert_eq!(out.handled[0].0.secret_index(), index);
    }
    // Several signatures in one header, only one of them ours.
    let stranger = "whsec_c3RyYW5nZXItc2VjcmV0LTAxMjM0NTY3";
    let both = Scheme::standard()
        .sign([stranger, OLD_SECRET], "msg_1", at(NOW), BODY)
        .unwrap();
    let out = call(&layer, request(both, BODY)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled[0].0.secret_index(), 1);
    // Several signatures, none ours.
    let strangers = Scheme::standard()
        .sign(
            [stranger, "whsec_YW5vdGhlci1zdHJhbmdlci0wMTIzNDU2Nzg5"],
            "msg_1",
            at(NOW),
            BODY,
        )
        .unwrap();
    let out = call(&layer, request(strangers, BODY)).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn secrets_rotate_at_runtime_through_the_layer_handle() {
    let layer = VerifyWebhookLayer::new(verifier(Scheme::standard(), &[OLD_SECRET]));
    let out = call(&layer, request(signed(SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.status, StatusCode::BAD_REQUEST);

    layer.secrets().replace([SECRET, OLD_SECRET]).unwrap();
    let out = call(&layer, request(signed(SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.status, StatusCode::OK);

    layer.secrets().replace([SECRET]).unwrap();
    let out = call(&layer, request(signed(OLD_SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn content_length_over_the_limit_is_refused_before_reading() {
    let layer = layer().with_max_body(1024);
    // The body would fail if read: a 413 proves it was never polled.
    let mut req = Request::post("/webhooks")
        .header("content-length", "2048")
        .body(Chunked {
            chunks: 0,
            size: 0,
            fail: true,
        })
        .unwrap();
    req.headers_mut().extend(signed(SECRET, NOW, BODY));
    let out = call(&layer, req).await;
    assert_eq!(out.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(out.kind(), Some(VerifyErrorKind::BodyTooLarge));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn chunked_body_running_over_the_limit_is_refused() {
    let layer = layer().with_max_body(1024 * 1024);
    // 20 × 64 KiB without a length: stops at the limit, not at the end.
    let mut req = Request::post("/webhooks")
        .body(Chunked {
            chunks: 20,
            size: 64 * 1024,
            fail: false,
        })
        .unwrap();
    req.headers_mut().extend(signed(SECRET, NOW, BODY));
    let out = call(&layer, req).await;
    assert_eq!(out.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn body_exactly_at_the_limit_verifies() {
    let layer = layer().with_max_body(4 * 64 * 1024);
    let body = vec![b'x'; 4 * 64 * 1024];
    let mut req = Request::post("/webhooks")
        .body(Chunked {
            chunks: 4,
            size: 64 * 1024,
            fail: false,
        })
        .unwrap();
    req.headers_mut().extend(signed(SECRET, NOW, &body));
    let out = call(&layer, req).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled[0].1.len(), body.len());
}

#[tokio::test]
async fn body_that_fails_mid_read_is_a_400_not_a_dropped_connection() {
    let mut req = Request::post("/webhooks")
        .body(Chunked {
            chunks: 2,
            size: 10,
            fail: true,
        })
        .unwrap();
    req.headers_mut().extend(signed(SECRET, NOW, BODY));
    let out = call(&layer(), req).await;
    assert_eq!(out.status, StatusCode::BAD_REQUEST);
    assert_eq!(out.kind(), Some(VerifyErrorKind::BodyRead));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn rejection_response_can_be_replaced_and_still_carries_the_reason() {
    let layer = layer().with_rejection(|err| {
        http::Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .body(Bytes::from(format!(
                "{{\"error\":\"{}\"}}",
                err.body_text()
            )))
            .unwrap()
    });
    let out = call(&layer, request(signed(OLD_SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.status, StatusCode::UNAUTHORIZED);
    assert_eq!(out.body, r#"{"error":"invalid webhook signature"}"#);
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn default_rejection_is_short_fixed_text_and_never_410() {
    let out = call(&layer(), request(HeaderMap::new(), BODY)).await;
    assert_eq!(out.status, StatusCode::BAD_REQUEST);
    assert_eq!(out.body, "invalid webhook headers");
}

/// A request with `method` to `uri`, with `headers` and `body`.
fn with_method(
    method: Method,
    uri: &str,
    headers: HeaderMap,
    body: &'static [u8],
) -> Request<Full<Bytes>> {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    *request.headers_mut() = headers;
    request
}

#[tokio::test]
async fn a_method_the_scheme_does_not_take_gets_405_with_allow_and_never_reaches_the_handler() {
    // A load balancer's health check, a browser, a stray PUT: not deliveries. Even with a
    // valid signature, only POST is one (GET where the provider sends GET too).
    for method in [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
    ] {
        let out = call(
            &layer(),
            with_method(method.clone(), "/webhooks", signed(SECRET, NOW, BODY), BODY),
        )
        .await;
        assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(out.kind(), Some(VerifyErrorKind::MethodNotAllowed));
        assert_eq!(out.headers["allow"], "POST", "{method}");
        assert_eq!(
            out.body,
            "method not allowed: this webhook endpoint takes POST"
        );
        assert!(out.handled.is_empty(), "{method}");
    }
    let out = call(&layer(), request(signed(SECRET, NOW, BODY), BODY)).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled.len(), 1);

    // Discord answers failed authentication 401; a GET is no authentication: 405 still.
    let discord = VerifyWebhookLayer::new(verifier(
        Scheme::discord(),
        &["d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"], // RFC 8032 test 1
    ));
    let out = call(
        &discord,
        with_method(Method::GET, "/", HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    // Per tenant: refused before any tenant is looked up.
    let tenants = Tenants::new(
        Scheme::stripe(),
        TenantFrom::path_segment(1),
        |_: String| async {
            panic!("no tenant is looked up for a GET");
            #[allow(unreachable_code)]
            Ok::<Option<Vec<String>>, Infallible>(None)
        },
    )
    .unwrap();
    let out = call(
        &VerifyWebhookLayer::per_tenant(tenants),
        with_method(Method::GET, "/hooks/acme", HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    // A replaced rejection keeps its status, and gets the `Allow` a 405 must carry.
    let custom = layer().with_rejection(|err| {
        http::Response::builder()
            .status(err.status())
            .body(Bytes::from(format!(
                "{{\"error\":\"{}\"}}",
                err.body_text()
            )))
            .unwrap()
    });
    let out = call(
        &custom,
        with_method(Method::GET, "/webhooks", HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(out.headers["allow"], "POST");
}

#[tokio::test]
async fn schemes_whose_provider_sends_get_take_get_and_allow_it() {
    // Meta: the `GET ?hub.challenge` handshake (tests/handshakes.rs) and POSTed events.
    let meta = VerifyWebhookLayer::new(verifier(
        Scheme::meta(),
        &["0123456789abcdef0123456789abcdef"],
    ))
    .with_verify_token("meatyhamhock");
    let handshake = "/hooks?hub.mode=subscribe&hub.challenge=42&hub.verify_token=meatyhamhock";
    let out = call(
        &meta,
        with_method(Method::GET, handshake, HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.body, "42");
    let out = call(
        &meta,
        with_method(Method::PUT, "/hooks", HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(out.headers["allow"], "GET, POST");
    assert_eq!(
        out.body,
        "method not allowed: this webhook endpoint takes GET and POST"
    );

    // Twilio may be configured to send GET, its parameters in the signed URL.
    let token = "twilio-auth-token-0123456789abcd";
    let url = "https://hooks.example.com/sms?Body=hello&From=%2B14158675309";
    let headers = Scheme::twilio()
        .sign_request([token], &Method::GET, url, "", at(NOW), b"")
        .unwrap();
    let twilio = VerifyWebhookLayer::new(
        verifier(Scheme::twilio(), &[token])
            .with_public_url(PublicUrl::origin("https://hooks.example.com").unwrap()),
    );
    let out = call(
        &twilio,
        with_method(
            Method::GET,
            "/sms?Body=hello&From=%2B14158675309",
            headers,
            b"",
        ),
    )
    .await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled.len(), 1);
    let out = call(
        &twilio,
        with_method(Method::DELETE, "/sms", HeaderMap::new(), b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(out.headers["allow"], "GET, POST");

    // HubSpot signs the method: its workflows' GET verifies.
    let secret = "hubspot-client-secret-0123456789";
    let url = "https://hooks.example.com/hubspot?objectId=7";
    let headers = Scheme::hubspot()
        .sign_request([secret], &Method::GET, url, "", at(NOW), b"")
        .unwrap();
    let hubspot = VerifyWebhookLayer::new(
        verifier(Scheme::hubspot(), &[secret])
            .with_public_url(PublicUrl::origin("https://hooks.example.com").unwrap()),
    );
    let out = call(
        &hubspot,
        with_method(Method::GET, "/hubspot?objectId=7", headers, b""),
    )
    .await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled.len(), 1);
}

#[test]
fn debug_output_never_shows_a_secret() {
    let layer = layer();
    let v = verifier(Scheme::standard(), &[SECRET, OLD_SECRET]);
    for text in [
        format!("{layer:?}"),
        format!("{v:?}"),
        format!("{:?}", v.secrets()),
    ] {
        assert!(
            !text.contains("MfKQ") && !text.contains("C2FV") && !text.contains("whsec"),
            "{text}"
        );
        assert!(text.contains("len: 2") || text.contains("len: 1"), "{text}");
    }
}

/// A body that never sends a byte (a client that stalls), counting how often it was
/// polled: a request refused on its headers must not read it at all.
struct Stalled(Arc<std::sync::atomic::AtomicUsize>);

impl http_body::Body for Stalled {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::task::Poll::Pending
    }
}

fn stalled_request(headers: HeaderMap) -> (Request<Stalled>, Arc<std::sync::atomic::AtomicUsize>) {
    let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut request = Request::post("/webhooks")
        .body(Stalled(polls.clone()))
        .unwrap();
    *request.headers_mut() = headers;
    (request, polls)
}

#[tokio::test]
async fn headers_that_cannot_verify_are_refused_before_a_byte_of_the_body_is_read() {
    let body = br#"{"id":"evt_1"}"#;
    let cases: Vec<(&str, HeaderMap, VerifyErrorKind)> = vec![
        (
            "no signature header",
            HeaderMap::new(),
            VerifyErrorKind::MissingHeader,
        ),
        (
            "a stale timestamp (the window is public: no HMAC for it)",
            signed(SECRET, NOW - 3600, body),
            VerifyErrorKind::TimestampTooOld,
        ),
        (
            "no signature of the scheme's length (`v1,` alone)",
            edited(|h| set(h, "webhook-signature", "v1,")),
            VerifyErrorKind::InvalidSignature,
        ),
    ];
    for (what, headers, kind) in cases {
        let (request, polls) = stalled_request(headers);
        let outcome = tokio::time::timeout(Duration::from_secs(2), call(&layer(), request))
            .await
            .unwrap_or_else(|_| panic!("{what}: waited for a body that never comes"));
        assert_eq!(outcome.status, StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(outcome.kind(), Some(kind), "{what}");
        assert_eq!(
            polls.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "{what}: body read"
        );
        assert!(outcome.handled.is_empty(), "{what}");
    }
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408_within_the_read_timeout() {
    let body = br#"{"id":"evt_1"}"#;
    let layer = layer().with_body_timeout(Duration::from_millis(200));
    let (request, polls) = stalled_request(signed(SECRET, NOW, body));
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(5), call(&layer, request))
        .await
        .expect("answered within the read timeout");
    assert_eq!(outcome.status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(outcome.kind(), Some(VerifyErrorKind::BodyTimeout));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        polls.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "it did wait for the body"
    );
    assert!(outcome.handled.is_empty());
}

/// An unauthenticated request whose body trickles in holds no place in a concurrency limit
/// behind the layer: the inner service's readiness is taken only after verification.
#[tokio::test]
async fn a_trickling_request_does_not_hold_the_inner_services_concurrency_slot() {
    use tower::{Service, ServiceBuilder};
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = handled.clone();
    let svc = ServiceBuilder::new()
        .layer(layer())
        .concurrency_limit(1)
        .service(tower::service_fn(move |_req: Request<Full<Bytes>>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    // Valid headers, a body that never completes: it waits in the layer, not in the limit.
    let (stalled, _) = stalled_request(signed(SECRET, NOW, b"{}"));
    let mut first = svc.clone();
    let pending = tokio::spawn(async move {
        let ready =
            std::future::poll_fn(|cx| Service::<Request<Stalled>>::poll_ready(&mut first, cx));
        ready.await.unwrap();
        first.call(stalled).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let body = br#"{"id":"evt_2"}"#;
    let good = svc.oneshot(request(signed(SECRET, NOW, body), &body[..]));
    let response = tokio::time::timeout(Duration::from_secs(2), good)
        .await
        .expect("the limit's one slot was free for a verified delivery")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
    pending.abort();
}

#[tokio::test]
async fn url_signed_schemes_verify_the_public_url_not_the_host_the_request_names() {
    let token = "twilio-auth-token-0123456789abcd";
    let body = b"Body=hello&From=%2B14158675309";
    let signed_for = |url: &str| {
        Scheme::twilio()
            .sign_request([token], &http::Method::POST, url, "", at(NOW), body)
            .unwrap()
    };
    let post = |path: &str, host: &str, headers: HeaderMap| {
        let mut req = Request::post(path)
            .header("host", host)
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        req.headers_mut().extend(headers);
        req
    };
    // Behind a proxy: the origin is configured, the path comes from the request.
    let layer = VerifyWebhookLayer::new(
        verifier(Scheme::twilio(), &[token])
            .with_public_url(PublicUrl::origin("https://hooks.example.com").unwrap()),
    );
    let good = signed_for("https://hooks.example.com/sms/inbound");
    let out = call(&layer, post("/sms/inbound", "10.0.0.7:8080", good.clone())).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.handled.len(), 1);
    // Signed for another endpoint of the same account, replayed here: refused, whatever
    // `Host` the replay claims.
    let other = signed_for("https://hooks.example.com/voice/status");
    let out = call(&layer, post("/sms/inbound", "hooks.example.com", other)).await;
    assert_eq!(out.kind(), Some(VerifyErrorKind::InvalidSignature));
    assert!(out.handled.is_empty());
    // No public URL configured: a deployment error, 500, and nothing runs.
    let unset = VerifyWebhookLayer::new(verifier(Scheme::twilio(), &[token]));
    let out = call(&unset, post("/sms/inbound", "hooks.example.com", good)).await;
    assert_eq!(out.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(out.kind(), Some(VerifyErrorKind::Misconfigured));
    assert!(out.handled.is_empty());
}

#[tokio::test]
async fn mailgun_is_verified_from_its_body_through_the_layer_and_deduplicated_on_its_token() {
    use tower::ServiceBuilder;
    use tower_webhook::store::MemoryStore;
    use tower_webhook::{DedupeLayer, Event, Verifier};
    let key = "key-3ax6xnjp29jd6fds4gc373sgvjxteol0";
    let body = br#"{"signature":{"timestamp":"1403645220","token":"5egbgr1vjgqxtrnp65xfznchgdccwh5d6i09vijqi3whgowmn6","signature":"9cfc5c41582e51246e73c88d34db3af0a3a2692a76fbab81492842f000256d33"},"event-data":{"event":"delivered"}}"#;
    let verifier = Verifier::new(Scheme::mailgun(), [key])
        .unwrap()
        .with_clock(|| at(1_403_645_220));
    let runs = Arc::new(std::sync::Mutex::new(0));
    let counted = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier))
        .layer(DedupeLayer::new(MemoryStore::new()))
        .service(tower::service_fn(move |req: Request<Full<Bytes>>| {
            assert!(req.extensions().get::<Event>().is_some());
            *counted.lock().unwrap() += 1;
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    // No signature header at all: the body carries it.
    let post = || {
        Request::post("/mailgun")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(post()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(post()).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(*runs.lock().unwrap(), 1);
}

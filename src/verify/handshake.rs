//! Set-up handshakes: the requests a provider sends to prove an endpoint before (and while)
//! it delivers events. They are answered here, by the layer, so they never reach
//! deduplication or the handler — and a verifier in front no longer blocks them.
//!
//! | provider | request | signed? | answer |
//! |---|---|---|---|
//! | Slack | `{"type":"url_verification","challenge":…}` | yes | 200, the challenge as text |
//! | Zoom | `{"event":"endpoint.url_validation","payload":{"plainToken":…}}` | yes | 200 JSON: `plainToken` and `encryptedToken`, the hex HMAC-SHA256 of it under the secret |
//! | Discord | `{"type":1,…}` (PING) | yes | 200 `{"type":1}` |
//! | Twitch | `Twitch-Eventsub-Message-Type: webhook_callback_verification` | yes | 200, the challenge as text |
//! | Meta | `GET ?hub.mode=subscribe&hub.verify_token=…&hub.challenge=…` | no | 200, the challenge as text, when the verify token matches; else 403 |
//! | Microsoft Graph | `POST ?validationToken=…` | no | 200, the token (decoded) as text |
//! | AWS SNS | `{"Type":"SubscriptionConfirmation","SubscribeURL":…}` | yes | with [`Certificates`](super::Certificates): the `SubscribeURL` is visited, then 200 (503 when that fails); without, the handler gets it |
//!
//! Signed handshakes are verified like any delivery first: a forged one gets the usual
//! rejection. Meta's GET carries no signature; the verify token is what authenticates it.
//! Graph's validation carries nothing to authenticate: it echoes the token, as Graph
//! requires, and nothing else happens.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode, Uri};
use subtle::ConstantTimeEq;

use super::future::AnswerFuture;
use super::layer::Config;
use crate::json::{of, parse, Field};
use crate::scheme::Handshake;
use crate::{Event, Verifier};

/// The unsigned handshakes, answered before any check of the request (Meta's GET,
/// Microsoft Graph's validation).
pub(super) fn before(config: &Config, method: &Method, uri: &Uri) -> Option<Response<Bytes>> {
    match config.verifier.scheme().handshake? {
        Handshake::Meta if method == Method::GET => meta(config, uri),
        Handshake::Graph if method == Method::POST => graph(uri),
        _ => None,
    }
}

/// Microsoft Graph: `POST ?validationToken=…` is answered 200 with the token, decoded, as
/// plain text (within Graph's 10 s), whatever the body.
fn graph(uri: &Uri) -> Option<Response<Bytes>> {
    let token = form_urlencoded::parse(uri.query()?.as_bytes())
        .find(|(key, _)| key == "validationToken")?
        .1;
    // Graph's tokens are short opaque strings: a long one is no handshake of Graph's.
    if token.is_empty() || token.len() > 1024 {
        return Some(text(
            StatusCode::BAD_REQUEST,
            "invalid validationToken".into(),
        ));
    }
    Some(text(StatusCode::OK, token.into_owned()))
}

fn meta(config: &Config, uri: &Uri) -> Option<Response<Bytes>> {
    let query = uri.query()?;
    let (mut mode, mut token, mut challenge) = (None, None, None);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "hub.mode" => mode = Some(value.into_owned()),
            "hub.verify_token" => token = Some(value.into_owned()),
            "hub.challenge" => challenge = Some(value.into_owned()),
            _ => {}
        }
    }
    mode.as_ref()?;
    let expected = config.verify_token.as_deref();
    let matches = match (expected, token) {
        (Some(expected), Some(token)) => bool::from(expected.as_bytes().ct_eq(token.as_bytes())),
        _ => false,
    };
    Some(match (mode.as_deref(), matches, challenge) {
        (Some("subscribe"), true, Some(challenge)) => text(StatusCode::OK, challenge),
        _ => text(StatusCode::FORBIDDEN, "verify token does not match".into()),
    })
}

/// The signed handshakes, answered once the delivery verified.
pub(super) fn after(verifier: &Verifier, event: &Event) -> Option<Response<Bytes>> {
    match verifier.scheme().handshake? {
        Handshake::Slack if event.event_type() == Some("url_verification") => {
            Some(text(StatusCode::OK, challenge(event)?))
        }
        // The type header is not signed: a verified body with a challenge is the
        // handshake whatever the header says, so a replay without it never reaches the
        // handler as a notification.
        Handshake::Twitch => Some(text(StatusCode::OK, challenge(event)?)),
        Handshake::Discord if event.event_type() == Some("1") => {
            Some(json(Bytes::from_static(br#"{"type":1}"#)))
        }
        Handshake::Zoom if event.event_type() == Some("endpoint.url_validation") => {
            // `{"payload":{"plainToken":…}}`
            let plain_token = parse(
                event.body(),
                Field("payload", Field("plainToken", of::<String>())),
            )
            .ok()
            .flatten()
            .flatten()?;
            let encrypted = verifier.mac_hex(event.secret_index(), plain_token.as_bytes())?;
            let body = serde_json::json!({
                "plainToken": plain_token,
                "encryptedToken": encrypted,
            });
            Some(json(Bytes::from(body.to_string())))
        }
        _ => None,
    }
}

/// SNS: a verified `SubscriptionConfirmation` is confirmed by visiting its signed
/// `SubscribeURL` — when the layer fetches certificates; without them, it reaches the
/// handler like any event.
pub(super) fn confirm(config: &Config, event: &Event) -> Option<AnswerFuture> {
    let certificates = config.certificates.as_ref()?;
    if config.verifier.scheme().handshake != Some(Handshake::Sns)
        || event.event_type() != Some("SubscriptionConfirmation")
    {
        return None;
    }
    let url = crate::event::string_field(event.body(), "SubscribeURL")?;
    let confirm = certificates.confirm(url);
    Some(Box::pin(async move {
        confirm.await?;
        Ok(text(StatusCode::OK, "subscription confirmed".into()))
    }))
}

/// Slack's and Twitch's `{"challenge":…}`.
fn challenge(event: &Event) -> Option<String> {
    parse(event.body(), Field("challenge", of::<String>()))
        .ok()
        .flatten()
}

fn text(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // The challenge is the sender's text: never let a browser read it as HTML.
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn json(body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

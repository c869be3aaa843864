//! Shared by the examples (and the tests that drive them): configuration from the
//! environment, and a small HTTP client to post deliveries.
#![allow(dead_code)]

pub mod connections;
pub mod otel;
pub mod processors;
pub mod proxy;
pub mod signal;

use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_webhook::Scheme;

/// A development secret (or public key) per scheme, used when `WEBHOOK_SECRETS` is not
/// set. Never use it in production: it is published here.
pub fn dev_secret(scheme: &Scheme) -> &'static str {
    match scheme.name() {
        "standard" => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        // RFC 8032's first test key pair and RFC 6979's P-256 key: public test vectors.
        "discord" => "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "sendgrid" => "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYP7UuiVanTHJYet0xjVtaMBJuJI7Yfps5mliLmDyn7Z5A/4QCLi8maQa6elWKLxk8vGyDC1+n1F3o8KU1EYimQ==",
        _ => "dev-secret-do-not-use-in-production",
    }
}

/// What signs for [`dev_secret`]: the same secret, or the private half of its key pair.
pub fn dev_signing_key(scheme: &Scheme) -> &'static str {
    match scheme.name() {
        "discord" => "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "sendgrid" => "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721",
        _ => dev_secret(scheme),
    }
}

/// A comma-separated list from the environment; empty when unset.
fn env_list(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `WEBHOOK_SCHEME` (default `standard`); `sns` reads its topics from
/// `WEBHOOK_SNS_TOPICS`, `paypal` its webhook id from `WEBHOOK_PAYPAL_WEBHOOK_ID`.
pub fn scheme_from_env() -> Result<Scheme, String> {
    let name = std::env::var("WEBHOOK_SCHEME").unwrap_or_else(|_| "standard".into());
    scheme_named(&name)
}

/// The scheme called `name` (a preset's name); `sns` and `paypal` read their settings
/// from the environment as [`scheme_from_env`] says.
pub fn scheme_named(name: &str) -> Result<Scheme, String> {
    match name.trim() {
        "sns" => {
            let topics = env_list("WEBHOOK_SNS_TOPICS");
            if topics.is_empty() {
                return Err(
                    "WEBHOOK_SCHEME=sns needs WEBHOOK_SNS_TOPICS: the topic ARNs to \
                            accept, comma-separated"
                        .into(),
                );
            }
            Ok(Scheme::sns(topics))
        }
        "paypal" => match std::env::var("WEBHOOK_PAYPAL_WEBHOOK_ID") {
            Ok(id) if !id.trim().is_empty() => Ok(Scheme::paypal(id.trim())),
            _ => Err("WEBHOOK_SCHEME=paypal needs WEBHOOK_PAYPAL_WEBHOOK_ID".into()),
        },
        other => other.parse().map_err(|e| format!("WEBHOOK_SCHEME: {e}")),
    }
}

/// Whether the scheme's keys are certificates the provider serves (SNS, PayPal).
pub fn uses_certificates(scheme: &Scheme) -> bool {
    matches!(scheme.name(), "sns" | "paypal")
}

/// `WEBHOOK_SCHEME` and `WEBHOOK_SECRETS` (comma-separated, the first is current; PEM
/// certificates for SNS and PayPal); the flag says whether the development secret stands
/// in. SNS and PayPal without secrets get none: their certificates are fetched.
pub fn scheme_and_secrets() -> Result<(Scheme, Vec<String>, bool), String> {
    let scheme = scheme_from_env()?;
    let (secrets, dev) = secrets_for(&scheme);
    Ok((scheme, secrets, dev))
}

/// `WEBHOOK_SECRETS` for `scheme`, or its development secret (the flag says which).
pub fn secrets_for(scheme: &Scheme) -> (Vec<String>, bool) {
    let secrets = env_list("WEBHOOK_SECRETS");
    if !secrets.is_empty() || uses_certificates(scheme) {
        return (secrets, false);
    }
    (vec![dev_secret(scheme).to_owned()], true)
}

/// An HTTPS GET with the system's roots, for certificates and SNS confirmations: a 2xx
/// body of at most 64 KiB, or an error.
pub fn https_get() -> Result<impl tower_webhook::verify::Fetch, Box<dyn std::error::Error>> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_only()
        .enable_http1()
        .build();
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    Ok(move |url: String| {
        let client = client.clone();
        async move {
            let response = client.get(url.parse()?).await?;
            if !response.status().is_success() {
                return Err(format!("{url}: {}", response.status()).into());
            }
            let limited = http_body_util::Limited::new(response.into_body(), 64 * 1024);
            let body = limited.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(body)
        }
    })
}

/// A delivery body in the common envelope shape; Slack's id field is `event_id`.
pub fn event_body(id: &str, event_type: &str, object_id: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","event_id":"{id}","type":"{event_type}","livemode":false,"data":{{"object":{{"id":"{object_id}"}}}}}}"#
    )
    .into_bytes()
}

/// Signs `body` with `secret` as `scheme` would, now.
pub fn signed_headers(scheme: &Scheme, secret: &str, id: &str, body: &[u8]) -> HeaderMap {
    scheme
        .sign([secret], id, SystemTime::now(), body)
        .expect("a valid secret for this scheme")
}

/// Sends a GET to `url`; returns the status and the response body.
pub async fn get(
    url: &str,
) -> Result<(StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client.get(url.parse()?).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// Posts `body` with `headers` to `url`; returns the status and the response body.
pub async fn post(
    url: &str,
    headers: HeaderMap,
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::post(url).body(Full::new(Bytes::from(body)))?;
    request.headers_mut().extend(headers);
    let response = client.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// A server on its own task, stopped as a deploy stops it (see [`Serving::shut_down`]).
pub struct Serving {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Serves `app` on `listener` until [`Serving::shut_down`], closing connections that
/// hold their headers back for 10 s (see [`connections::serve_until`]).
pub fn serve(listener: tokio::net::TcpListener, app: axum::Router) -> Serving {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let header_timeout = std::time::Duration::from_secs(10);
    let task = tokio::spawn(connections::serve_until(
        listener,
        app,
        header_timeout,
        shutdown,
    ));
    Serving { stop, task }
}

impl Serving {
    /// Stops accepting and returns once the open connections have closed. Handlers whose
    /// client hung up may still run: wait for them with the layers' `drain()` after this.
    pub async fn shut_down(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        self.task.await.map_err(std::io::Error::other)
    }
}

//! [`JsonPost`]: a ready [`Alerter`] that POSTs each alert as JSON to a URL — a Slack
//! incoming webhook, or any endpoint that reads JSON — with a timeout and a few retries.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Alert, Alerter};
use crate::{ConfigError, ConfigErrorKind};

/// An [`Alerter`] that POSTs each [`Alert`] as `application/json` to a URL, in the shape
/// Slack's incoming webhooks take: a `text` field (the summary, with `&`, `<` and `>`
/// escaped, so no error text can mention `@channel`) and beside it the structured fields
/// (`kind`, `source`, `event_id`, `event_type`, `summary`, `details`, `count`, `lag_ms`,
/// `suppressed`, `dropped`, `at_ms`; absent ones `null`).
///
/// Each POST has 10 s to answer ([`with_timeout`](Self::with_timeout)); a connection
/// error, a timeout, a 5xx or a 429 is tried again twice
/// ([`with_retries`](Self::with_retries)), 0.5 s then 1 s later. Another status gives up
/// at once. A failure is logged (feature `tracing`) and otherwise dropped: alerts are best
/// effort.
///
/// `https://` goes over rustls — on the application's installed
/// [`CryptoProvider`](rustls::crypto::CryptoProvider) if there is one, else aws-lc-rs —
/// checked against the system's root certificates, read once when the `JsonPost` is built; `http://` is plain, for a relay on the same host
/// or network. HTTP/1.1, connections kept and reused.
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::alerts::{Alerts, JsonPost};
///
/// # fn main() -> Result<(), tower_webhook::ConfigError> {
/// let post = JsonPost::new("http://127.0.0.1:9000/hooks/T000/B000/XXXX")?
///     .with_timeout(Duration::from_secs(5))?;
/// assert_eq!(format!("{post:?}"), r#"JsonPost { url: "http://127.0.0.1:9000/…", timeout: 5s, retries: 2 }"#);
/// let alerts = Alerts::new(post);
/// # let _ = alerts;
/// # Ok(())
/// # }
/// ```
///
/// # Security
///
/// The URL is a secret (a Slack webhook URL is all it takes to post to the channel): it is
/// never logged, and `Debug` shows only its scheme, host and port.
#[derive(Clone)]
pub struct JsonPost {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    uri: Uri,
    /// What may be shown of the URL: `scheme://host[:port]`.
    shown: String,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
    retries: u32,
}

/// The wait before the first retry; it doubles for each one after.
const BACKOFF: Duration = Duration::from_millis(500);

impl JsonPost {
    /// POSTs to `url` (`http://` or `https://`).
    ///
    /// # Errors
    ///
    /// When `url` does not parse, is not `http` or `https`, has no host or carries a user
    /// name or password (the error never quotes the URL); for `https`, when the system has
    /// no root certificate rustls can use.
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        let invalid = |why: &str| {
            ConfigError::new(ConfigErrorKind::InvalidValue, format!("an alert URL {why}"))
        };
        let uri: Uri = url
            .parse()
            .map_err(|_| invalid("must be an absolute http(s) URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("must start with http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| invalid("must name a host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("must not carry a user name or password"));
        }
        let shown = match authority.port_u16() {
            Some(port) => format!(
                "{}://{}:{port}",
                uri.scheme_str().unwrap_or("http"),
                authority.host()
            ),
            None => format!(
                "{}://{}",
                uri.scheme_str().unwrap_or("http"),
                authority.host()
            ),
        };
        // The application's provider if it installed one; else ours, named: rustls picks
        // none itself when another crate in the build enables a second one.
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let builder = if https {
            HttpsConnectorBuilder::new()
                .with_provider_and_native_roots(provider)
                .map_err(|e| {
                    invalid(&format!("is https, but no root certificate was found: {e}"))
                })?
        } else {
            // Never used for plain http: no roots to read.
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| invalid(&format!("cannot be served: {e}")))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            HttpsConnectorBuilder::new().with_tls_config(tls)
        };
        let connector = builder.https_or_http().enable_http1().build();
        Ok(Self {
            inner: Arc::new(Inner {
                uri,
                shown,
                client: Client::builder(TokioExecutor::new()).build(connector),
                timeout: Duration::from_secs(10),
                retries: 2,
            }),
        })
    }

    /// Replaces how long one POST may take, from connecting to the status (default 10 s).
    ///
    /// # Errors
    ///
    /// When `timeout` is zero or above 5 minutes.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() || timeout > Duration::from_secs(300) {
            return Err(ConfigError::duration(
                "an alert POST's timeout",
                timeout,
                "above 0 and at most 5 min",
            ));
        }
        self.inner_mut().timeout = timeout;
        Ok(self)
    }

    /// Replaces how many times a POST that failed for a connection error, a timeout, a 5xx
    /// or a 429 is tried again (default 2), after 0.5 s, 1 s, 2 s…
    ///
    /// # Errors
    ///
    /// When `retries` is above 5 (an alert that late is no longer news).
    pub fn with_retries(mut self, retries: u32) -> Result<Self, ConfigError> {
        if retries > 5 {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "an alert POST is retried at most 5 times",
            ));
        }
        self.inner_mut().retries = retries;
        Ok(self)
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::make_mut(&mut self.inner)
    }
}

impl Inner {
    /// POSTs `body`, with retries; `Err` says why the last try failed.
    async fn post(&self, body: Bytes) -> Result<(), String> {
        let mut wait = BACKOFF;
        let mut attempt = 0;
        loop {
            let why = match tokio::time::timeout(self.timeout, self.send(body.clone())).await {
                Ok(Ok(status)) if status.is_success() => return Ok(()),
                Ok(Ok(status))
                    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS =>
                {
                    format!("answered {status}")
                }
                Ok(Ok(status)) => return Err(format!("answered {status}")),
                Ok(Err(error)) => error,
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            if attempt >= self.retries {
                return Err(why);
            }
            attempt += 1;
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }

    async fn send(&self, body: Bytes) -> Result<StatusCode, String> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("tower-webhook/", env!("CARGO_PKG_VERSION"))),
        );
        // The status is all that matters; the body is dropped with the response.
        let response = self.client.request(request).await.map_err(|e| chain(&e))?;
        Ok(response.status())
    }
}

/// An error with its sources, `error: cause: cause` (a client error never holds the URL).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Alerter for JsonPost {
    fn alert(&self, alert: Alert) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let body = Bytes::from(alert.to_json().to_string());
            if let Err(_why) = inner.post(body).await {
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    target: "tower_webhook",
                    url = %inner.shown,
                    kind = %alert.kind(),
                    "alert not delivered: {_why}"
                );
            }
        })
    }
}

impl std::fmt::Debug for JsonPost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonPost")
            .field("url", &format_args!("\"{}/…\"", self.inner.shown))
            .field("timeout", &self.inner.timeout)
            .field("retries", &self.inner.retries)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_host_and_never_the_path_or_query() {
        let post =
            JsonPost::new("http://127.0.0.1:8080/services/T0/B0/sEcReTpAtH?token=qUeRy").unwrap();
        let shown = format!("{post:?}");
        assert!(shown.contains("http://127.0.0.1:8080/…"), "{shown}");
        for secret in ["sEcReTpAtH", "qUeRy", "services"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let shown = format!("{:?}", JsonPost::new("http://relay.internal/x/y").unwrap());
        assert!(
            shown.contains(r#"url: "http://relay.internal/…""#),
            "{shown}"
        );
    }

    #[test]
    fn https_builds_on_the_system_roots_and_shows_its_host_only() {
        let post = JsonPost::new("https://hooks.slack.com/services/T0/B0/sEcReT").unwrap();
        assert_eq!(
            format!("{post:?}"),
            r#"JsonPost { url: "https://hooks.slack.com/…", timeout: 10s, retries: 2 }"#
        );
    }

    #[test]
    fn bad_urls_are_refused_without_quoting_them() {
        for url in [
            "hooks.slack.com/services/sEcReT",
            "ftp://example.com/sEcReT",
            "/services/sEcReT",
            "http://user:sEcReT@example.com/x",
            "not a url sEcReT",
        ] {
            let error = JsonPost::new(url).unwrap_err();
            assert_eq!(error.kind(), ConfigErrorKind::InvalidValue, "{url}");
            assert!(!error.to_string().contains("sEcReT"), "{error}");
        }
        let post = JsonPost::new("http://127.0.0.1/").unwrap();
        assert!(post.clone().with_timeout(Duration::ZERO).is_err());
        assert!(post.with_retries(6).is_err());
    }
}

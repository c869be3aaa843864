//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, unused_imports)]

#[path = "../../examples/support/mod.rs"]
mod support;
pub use support::*;

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod fault_store;
pub mod otlp;
pub mod seed;
pub mod sql_db;
pub mod stores;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_webhook::{Event, Scheme, Verifier, VerifyError, VerifyWebhookLayer};

/// The tests' "now": 2023-11-14T22:13:20Z.
pub const NOW: u64 = 1_700_000_000;

/// The Standard Webhooks secret the broker tests sign with.
pub const TEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Waits (checking every 20 ms, up to 20 s) until `check` holds; panics naming `what`.
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A verified Standard Webhooks event `id`, signed with [`TEST_SECRET`] at [`NOW`]: a live
/// `payment_intent.succeeded` about the object `pi_<id>`.
pub fn paid_event(id: &str) -> Event {
    signed_event(
        id,
        format!(
            r#"{{"type":"payment_intent.succeeded","livemode":true,"data":{{"object":{{"id":"pi_{id}"}}}}}}"#
        ),
    )
}

/// The Standard Webhooks event `id` with `body`, signed with [`TEST_SECRET`] at [`NOW`] and
/// verified.
pub fn signed_event(id: &str, body: String) -> Event {
    let headers = Scheme::standard()
        .sign([TEST_SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[TEST_SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

pub fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A header map from name and value pairs (names and values known valid).
pub fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            )
        })
        .collect()
}

/// A verifier whose clock stands at [`NOW`].
pub fn verifier<S: AsRef<str>>(scheme: Scheme, secrets: &[S]) -> Verifier {
    Verifier::new(scheme, secrets)
        .expect("valid test secrets")
        .with_clock(|| at(NOW))
}

/// What one request through `VerifyWebhookLayer` + a recording handler gave.
#[derive(Debug)]
pub struct Outcome {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub error: Option<VerifyError>,
    pub body: Bytes,
    /// Each time the handler ran: the event and the body bytes it received.
    pub handled: Vec<(Event, Bytes)>,
}

impl Outcome {
    pub fn kind(&self) -> Option<tower_webhook::VerifyErrorKind> {
        self.error.as_ref().map(VerifyError::kind)
    }
}

/// Sends `request` through `layer` to a handler that records what it saw.
pub async fn call<B>(layer: &VerifyWebhookLayer, request: Request<B>) -> Outcome
where
    B: Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = handled.clone();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let seen = seen.clone();
        async move {
            let event = req.extensions().get::<Event>().cloned().expect("an Event");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            seen.lock().unwrap().push((event, body));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"handled"))))
        }
    });
    let response = layer
        .layer(handler)
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let error = response.extensions().get::<VerifyError>().cloned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let handled = std::mem::take(&mut *handled.lock().unwrap());
    Outcome {
        status,
        headers,
        error,
        body,
        handled,
    }
}

/// A POST with these headers and body.
pub fn request(headers: HeaderMap, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut request = Request::post("/webhooks")
        .body(Full::new(body.into()))
        .unwrap();
    *request.headers_mut() = headers;
    request
}

/// A body that streams `chunks` chunks of `size` bytes without announcing its length,
/// then fails if `fail` is set: what a chunked upload looks like to the server.
pub struct Chunked {
    pub chunks: usize,
    pub size: usize,
    pub fail: bool,
}

impl Body for Chunked {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.chunks == 0 {
            return Poll::Ready(self.fail.then(|| {
                self.fail = false;
                Err(std::io::Error::other("connection reset"))
            }));
        }
        self.chunks -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; self.size])))))
    }
}

/// PostgreSQL's URL: `DATABASE_URL`, else the local server. Panics, naming the service,
/// the URL and how to start it, when nothing answers there.
pub fn database_url() -> String {
    service(
        "PostgreSQL",
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    )
}

/// Redis's URL: `REDIS_URL`, else the local server; panics as [`database_url`] does.
pub fn redis_url() -> String {
    service("Redis", "REDIS_URL", "redis://127.0.0.1:6379")
}

/// NATS's URL: `NATS_URL`, else the local server; panics as [`database_url`] does.
pub fn nats_url() -> String {
    service("NATS", "NATS_URL", "nats://127.0.0.1:4222")
}

/// RabbitMQ's URL: `AMQP_URL`, else the local broker (user `guest`); panics as
/// [`database_url`] does.
pub fn amqp_url() -> String {
    service(
        "RabbitMQ",
        "AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    )
}

/// The URL in `env` (else `default`), once its host's port accepts a TCP connection
/// within 2 s. A test that needs a service fails with one message saying which is missing
/// — never a hang, a driver's raw error, or a silent skip.
fn service(name: &str, env: &str, default: &str) -> String {
    let url = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    if let Err(why) = probe(&url) {
        panic!(
            "{name} is not reachable at {} ({why}): this test needs it. Start PostgreSQL, \
             Redis, NATS and RabbitMQ with `bash .ci/services` (`bash scripts/test` does, then runs \
             the tests), or point {env} at a running {name}.",
            redact(&url)
        );
    }
    url
}

/// Connects to the `host:port` of `scheme://[user[:password]@]host:port[/…]`.
pub fn probe(url: &str) -> Result<(), String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let addrs = host_port
        .to_socket_addrs()
        .map_err(|e| format!("{host_port}: {e}"))?;
    let mut last = format!("{host_port}: no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// `url` without its password.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// The URL of a fresh database of its own, so tests never see each other's rows.
pub async fn fresh_pg_url() -> String {
    let admin = sqlx::PgPool::connect(&database_url())
        .await
        .expect("PostgreSQL answers (database_url probed it)");
    let name = format!("tower_webhook_test_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = database_url();
    // Everything before the path: `postgres://user@host:port`.
    let authority = url.find("://").map_or(0, |i| i + 3);
    let base = url[authority..]
        .find('/')
        .map_or(url.as_str(), |slash| &url[..authority + slash]);
    format!("{base}/{name}")
}

/// An error with a cause, as a processor's own libraries return them: `Caused::chain()`
/// reads `charge failed: payment API: connection refused`.
#[derive(Debug)]
pub struct Caused(
    &'static str,
    Option<Box<dyn std::error::Error + Send + Sync>>,
);

impl Caused {
    /// Three errors deep; the last an `io::Error`.
    pub fn chain() -> Self {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        Caused(
            "charge failed",
            Some(Box::new(Caused("payment API", Some(Box::new(refused))))),
        )
    }

    /// What [`chain`](Self::chain) is stored and logged as.
    pub const CHAIN_TEXT: &'static str = "charge failed: payment API: connection refused";
}

impl std::fmt::Display for Caused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Caused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|e| e as _)
    }
}

/// An example's binary, built beside the running test's (`cargo test` builds the examples;
/// `cargo test --test X` alone does not: `cargo build --all-features --examples` first).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    // target/<profile>/deps/<test>-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --all-features --examples`",
        path.display()
    );
    path
}

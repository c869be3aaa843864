//! Keys fetched from the provider: see [`Certificates`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::error::{VerifyError, VerifyErrorKind};
use crate::scheme::{key, Custom};
use crate::{ConfigError, ConfigErrorKind, Event, Scheme, Verifier};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future a [`Fetch`] returns: the response body of a successful (2xx) GET.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Bytes, BoxError>> + Send>>;

/// An HTTPS GET to a provider's host, made by your HTTP client: fetching a signing
/// certificate, visiting an SNS `SubscribeURL`. Only URLs that passed the provider's host
/// check are given to it. Answer `Err` for anything but a 2xx response.
///
/// **Do not follow redirects** — the host check covers the URL given, not where a
/// redirect leads — and bound what you read (a certificate is a few KiB; more than
/// 64 KiB is refused anyway). Implemented for closures
/// `Fn(String) -> impl Future<Output = Result<Bytes, E>>`; with `reqwest`, for example:
///
/// ```text
/// let client = reqwest::Client::builder()
///     .redirect(reqwest::redirect::Policy::none())
///     .https_only(true)
///     .build()?;
/// let fetch = move |url: String| {
///     let client = client.clone();
///     async move {
///         let mut response = client.get(url).send().await?.error_for_status()?;
///         let mut body = Vec::new();
///         while let Some(chunk) = response.chunk().await? {
///             body.extend_from_slice(&chunk);
///             if body.len() > 64 * 1024 { return Err("too large".into()); }
///         }
///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(bytes::Bytes::from(body))
///     }
/// };
/// ```
///
/// (The receiver example's, on `hyper-rustls`, follows no redirect and reads at most
/// 64 KiB.)
pub trait Fetch: Send + Sync + 'static {
    /// GETs `url`.
    fn get(&self, url: String) -> FetchFuture;
}

impl<F, Fut, E> Fetch for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn get(&self, url: String) -> FetchFuture {
        let future = self(url);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// Keys fetched from the provider, for the schemes whose deliveries name the certificate
/// they were signed under: [AWS SNS](Scheme::sns) (`SigningCertURL`) and
/// [PayPal](Scheme::paypal) (`PAYPAL-CERT-URL`).
///
/// Nothing is fetched for a delivery that fails any check but its signature (SNS: its
/// fields, window and topic; PayPal: its headers). Then the URL must be HTTPS on the
/// provider's own hosts — SNS: `sns.<region>.amazonaws.com` (or `.amazonaws.com.cn`),
/// path `/SimpleNotificationService-<hex>.pem`; PayPal: `api.paypal.com`,
/// `api-m.paypal.com` or their `sandbox.` forms, path `/v1/notifications/certs/CERT-…` —
/// with no query, no fragment and no userinfo, so a forged delivery cannot make the
/// receiver fetch a key of the forger's choosing or reach an internal address. Any other
/// URL is refused with 400, without a fetch.
///
/// What a forger can still do is name a URL of the right shape that is not cached, and
/// that is bounded:
/// - The cache is keyed by the URL's one canonical form (`https://host/path`, the port
///   `:443` dropped; a fragment is refused), so one certificate is one entry and one fetch.
/// - Concurrent deliveries naming one URL share one fetch, and its failure. A fetch that
///   fails, or takes over 10 s, answers 503 (so the provider retries), and its URL answers
///   503 without a fetch for the next 5 s.
/// - At most 20 fetches start per minute ([`with_fetch_limit`](Self::with_fetch_limit));
///   past that, a delivery naming an uncached URL answers 503 without a fetch, so the
///   provider retries later.
/// - A certificate that has verified a delivery is kept for its TTL (24 h by default:
///   providers publish a new certificate under a new URL): past 256 URLs, the oldest of
///   those that verified nothing goes, so misses never push out a certificate in use.
///
/// The certificate's trust comes from that HTTPS fetch from the provider's host: its chain
/// and validity dates are not checked again.
///
/// With [`VerifyWebhookLayer::from_certificates`](crate::VerifyWebhookLayer::from_certificates),
/// an SNS `SubscriptionConfirmation` is confirmed by the layer: it GETs the signed
/// `SubscribeURL` (the same host check) and answers 200, or 503 when that fails.
///
/// ```
/// use bytes::Bytes;
/// use tower_webhook::verify::Certificates;
/// use tower_webhook::{Scheme, VerifyWebhookLayer};
///
/// # async fn http_get(url: String) -> Result<Bytes, std::io::Error> { unimplemented!() }
/// let topics = ["arn:aws:sns:eu-west-1:123456789012:orders"];
/// let certificates = Certificates::new(Scheme::sns(topics), http_get)?;
/// let layer = VerifyWebhookLayer::from_certificates(certificates);
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
///
/// Cloning shares the cache. Where no fetch is possible, pin the certificate instead:
/// `Verifier::new(Scheme::sns(topics), [pem])`.
#[derive(Clone)]
pub struct Certificates {
    inner: Arc<Inner>,
}

struct Inner {
    /// Each certificate's verifier is this one with the certificate's key.
    prototype: Verifier,
    fetch: Box<dyn Fetch>,
    ttl: Duration,
    /// At most this many fetches start per window.
    fetch_limit: (u32, Duration),
    cache: Mutex<Cache>,
}

/// The certificates by canonical URL, and the fetches started in the current window.
#[derive(Default)]
struct Cache {
    slots: HashMap<String, Slot>,
    /// When the current window began, and how many fetches started in it.
    window: Option<(Instant, u32)>,
}

/// One URL's verifier, fetched once for all the deliveries waiting on it — and a failure
/// shared the same way, and remembered briefly, so a slow or failing provider host costs
/// one fetch per URL at a time, not one per delivery.
#[derive(Clone)]
struct Slot {
    cell: Arc<OnceCell<Result<Verifier, VerifyError>>>,
    since: Instant,
    /// It verified a delivery: only other such slots may evict it before its TTL.
    trusted: bool,
}

impl Slot {
    fn fresh(&self, now: Instant, ttl: Duration) -> bool {
        let ttl = match self.cell.get() {
            Some(Err(_)) => FAILED_TTL,
            _ => ttl,
        };
        now.duration_since(self.since) < ttl
    }
}

/// At most this many certificate URLs are cached (providers use a handful).
const MAX_CACHED: usize = 256;

/// How long a failed fetch answers 503 for its URL before it is tried again.
const FAILED_TTL: Duration = Duration::from_secs(5);

/// At most this many fetches start per [`FETCH_WINDOW`] by default.
const FETCH_LIMIT: u32 = 20;

/// The window of the fetch limit.
const FETCH_WINDOW: Duration = Duration::from_secs(60);

/// How long a fetch may take before the delivery gets 503.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest certificate read.
const MAX_CERTIFICATE: usize = 64 * 1024;

const UNAVAILABLE: VerifyError = VerifyError::new(
    VerifyErrorKind::SecretsUnavailable,
    "the signing certificate could not be fetched",
);

const TOO_MANY_FETCHES: VerifyError = VerifyError::new(
    VerifyErrorKind::SecretsUnavailable,
    "too many certificate fetches: try again later",
);

const OFF_HOSTS: VerifyError = VerifyError::new(
    VerifyErrorKind::MalformedHeader,
    "the certificate URL is not on the provider's hosts",
);

impl Certificates {
    /// Certificates for `scheme` ([`Scheme::sns`] or [`Scheme::paypal`]), fetched with
    /// `fetch` and cached for 24 h.
    ///
    /// # Errors
    ///
    /// When the scheme is not one whose deliveries name a certificate, or fails the
    /// checks of [`Verifier::new`] (SNS without topics, PayPal without a webhook id).
    pub fn new(scheme: Scheme, fetch: impl Fetch) -> Result<Self, ConfigError> {
        if !scheme
            .custom
            .as_ref()
            .is_some_and(Custom::uses_certificates)
        {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "only the sns and paypal schemes are verified with fetched certificates",
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                prototype: Verifier::without_secrets(scheme)?,
                fetch: Box::new(fetch),
                ttl: Duration::from_secs(24 * 3600),
                fetch_limit: (FETCH_LIMIT, FETCH_WINDOW),
                cache: Mutex::new(Cache::default()),
            }),
        })
    }

    /// Replaces how long a certificate's key is kept (default 24 h).
    #[must_use]
    pub fn with_ttl(self, ttl: Duration) -> Self {
        self.map(|inner| inner.ttl = ttl.min(Duration::from_secs(365 * 24 * 3600)))
    }

    /// Replaces how many certificate fetches may start in a window (default 20 a
    /// minute; at least one). Past it, a delivery naming a certificate that is not cached
    /// answers 503 without a fetch: a flood of forged deliveries naming new URLs costs at
    /// most this many outbound requests.
    #[must_use]
    pub fn with_fetch_limit(self, fetches: u32, per: Duration) -> Self {
        self.map(|inner| inner.fetch_limit = (fetches.max(1), per))
    }

    /// Applies `f` to the verifier every certificate's is built from: its tolerance,
    /// clock or source (`|v| v.with_source("sns-orders")`).
    #[must_use]
    pub fn with_verifier(self, f: impl FnOnce(Verifier) -> Verifier) -> Self {
        self.map(|inner| inner.prototype = f(inner.prototype.clone()))
    }

    fn map(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::get_mut(&mut self.inner).expect("configured before it is shared"));
        self
    }

    /// Verifies one delivery under the certificate it names, fetched or cached: the whole
    /// check, for use outside a Tower stack (a queue consumer, a serverless function).
    ///
    /// # Errors
    ///
    /// As [`Verifier::verify_request`]; a certificate URL off the provider's hosts is
    /// [`VerifyErrorKind::MalformedHeader`], a failed fetch [`VerifyErrorKind::SecretsUnavailable`].
    pub async fn verify(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        // `url` checks everything but the signature first (PayPal's headers included).
        let url = self.url(headers, &body)?;
        let verifier = self.verifier(url.clone()).await?;
        let event = verifier.verify_request(method, uri, headers, body)?;
        self.trust(&url);
        Ok(event)
    }

    pub(crate) fn prototype(&self) -> &Verifier {
        &self.inner.prototype
    }

    fn custom(&self) -> &Custom {
        self.inner
            .prototype
            .scheme()
            .custom
            .as_ref()
            .expect("checked in new")
    }

    /// The certificate URL the delivery names, in its canonical form, if it is on the
    /// provider's hosts — once everything but the signature checked out, so a malformed,
    /// stale or foreign delivery never causes a fetch.
    pub(crate) fn url(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, VerifyError> {
        self.inner.prototype.check_before_key(headers, body)?;
        let url = crate::verifier::certificate_url(self.custom(), headers, body)?;
        match self.custom() {
            Custom::Sns { .. } => sns_certificate_url(&url),
            _ => paypal_certificate_url(&url),
        }
        .ok_or(OFF_HOSTS)
    }

    /// Marks the certificate at `url` as one that verified a delivery: misses no longer
    /// evict it before its TTL.
    pub(crate) fn trust(&self, url: &str) {
        if let Some(slot) = self.cache().slots.get_mut(url) {
            if matches!(slot.cell.get(), Some(Ok(_))) {
                slot.trusted = true;
            }
        }
    }

    /// The verifier holding the key of the certificate at `url`: cached, or fetched.
    pub(crate) fn verifier(
        &self,
        url: String,
    ) -> Pin<Box<dyn Future<Output = Result<Verifier, VerifyError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            let slot = this.slot(&url)?;
            let fetched = slot
                .cell
                .get_or_init(|| async {
                    let get = this.inner.fetch.get(url.clone());
                    let pem = match tokio::time::timeout(FETCH_TIMEOUT, get).await {
                        Ok(Ok(pem)) => pem,
                        Ok(Err(_error)) => {
                            #[cfg(feature = "tracing")]
                            tracing::warn!(target: "tower_webhook", url, "certificate fetch failed: {_error}");
                            return Err(UNAVAILABLE);
                        }
                        Err(_elapsed) => return Err(UNAVAILABLE),
                    };
                    let key = std::str::from_utf8(&pem)
                        .ok()
                        .filter(|_| pem.len() <= MAX_CERTIFICATE)
                        .and_then(|pem| key::rsa_public(pem.trim()).ok())
                        .ok_or(UNAVAILABLE)?;
                    Ok(this.inner.prototype.with_key(key))
                })
                .await;
            fetched.clone()
        })
    }

    /// Visits an SNS `SubscribeURL`, if it is on SNS's hosts.
    pub(crate) fn confirm(
        &self,
        url: String,
    ) -> Pin<Box<dyn Future<Output = Result<(), VerifyError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            if !sns_subscribe_url(&url) {
                return Err(VerifyError::new(
                    VerifyErrorKind::MalformedHeader,
                    "the SubscribeURL is not on SNS's hosts",
                ));
            }
            let get = this.inner.fetch.get(url);
            match tokio::time::timeout(FETCH_TIMEOUT, get).await {
                Ok(Ok(_)) => Ok(()),
                _ => Err(VerifyError::new(
                    VerifyErrorKind::SecretsUnavailable,
                    "the subscription could not be confirmed",
                )),
            }
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `url`: cached and fresh, or new — when a fetch may still start in
    /// this window (503 otherwise, without a fetch).
    fn slot(&self, url: &str) -> Result<Slot, VerifyError> {
        let now = Instant::now();
        let ttl = self.inner.ttl;
        let mut cache = self.cache();
        let renewal = match cache.slots.get(url) {
            Some(slot) if slot.fresh(now, ttl) => return Ok(slot.clone()),
            // A certificate in use, expired: its one refetch a TTL is not a miss.
            Some(slot) => slot.trusted,
            None => false,
        };
        if !renewal {
            let (limit, per) = self.inner.fetch_limit;
            let window = match cache.window {
                Some((start, started)) if now.duration_since(start) < per => (start, started),
                _ => (now, 0),
            };
            if window.1 >= limit {
                return Err(TOO_MANY_FETCHES);
            }
            cache.window = Some((window.0, window.1 + 1));
        }
        if cache.slots.len() >= MAX_CACHED {
            cache.slots.retain(|_, s| s.fresh(now, ttl));
            // Still full: the oldest that verified nothing goes (the oldest of all only
            // if every one did), never the whole cache.
            while cache.slots.len() >= MAX_CACHED {
                let oldest = cache
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| (s.trusted, s.since))
                    .map(|(url, _)| url.clone())
                    .expect("not empty");
                cache.slots.remove(&oldest);
            }
        }
        let slot = Slot {
            cell: Arc::new(OnceCell::new()),
            since: now,
            trusted: false,
        };
        cache.slots.insert(url.to_owned(), slot.clone());
        Ok(slot)
    }
}

/// An HTTPS URL on a host that passes `host`, without userinfo, another port or a
/// fragment (which the server never sees, so each would be a new cache entry for one
/// certificate).
fn https_host(url: &str, host: impl Fn(&str) -> bool) -> Option<Uri> {
    if url.contains('#') {
        return None;
    }
    let uri: Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    let plain = authority.as_str() == authority.host()
        || authority.as_str() == format!("{}:443", authority.host());
    (uri.scheme_str() == Some("https") && plain && host(authority.host())).then_some(uri)
}

/// `https://host/path`: the one form of a certificate URL, its cache key and what is
/// fetched (the query and fragment were refused, `:443` is dropped).
fn canonical(uri: &Uri) -> Option<String> {
    Some(format!("https://{}{}", uri.host()?, uri.path()))
}

/// An AWS region's name: `us-east-1`, `us-gov-west-1`, `cn-north-1` — letters in groups
/// and a number, never `s3-…` (`sns.s3-….amazonaws.com` is an S3 bucket named `sns`).
fn aws_region(region: &str) -> bool {
    let mut parts = region.split('-');
    let first = parts.next().unwrap_or("");
    let mut rest: Vec<&str> = parts.collect();
    let Some(number) = rest.pop() else {
        return false;
    };
    first.len() == 2
        && first.bytes().all(|b| b.is_ascii_lowercase())
        && !rest.is_empty()
        && rest
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && !number.is_empty()
        && number.len() <= 2
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// `sns.<region>.amazonaws.com[.cn]`.
fn sns_host(host: &str) -> bool {
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
    rest.and_then(|r| r.strip_prefix("sns."))
        .is_some_and(aws_region)
}

/// `https://sns.<region>.amazonaws.com[.cn]/SimpleNotificationService-<hex>.pem`, no
/// query or fragment (AWS names certificates by 32 hex digits; up to 64 are taken), in
/// its canonical form.
pub(crate) fn sns_certificate_url(url: &str) -> Option<String> {
    let uri = https_host(url, sns_host)?;
    let name = uri
        .path()
        .strip_prefix("/SimpleNotificationService-")
        .and_then(|p| p.strip_suffix(".pem"))?;
    let named = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
    (uri.query().is_none() && named)
        .then(|| canonical(&uri))
        .flatten()
}

/// An SNS `SubscribeURL`: `https://sns.<region>.amazonaws.com[.cn]/…` (with its query).
fn sns_subscribe_url(url: &str) -> bool {
    https_host(url, sns_host).is_some()
}

/// `https://api[-m][.sandbox].paypal.com/v1/notifications/certs/CERT-…`, no query or
/// fragment and nothing but letters, digits and `-` in the name (no `..` to climb out of
/// it; PayPal's are `CERT-<hex>-<hex>-<hex>`; up to 128 characters are taken), in its
/// canonical form.
pub(crate) fn paypal_certificate_url(url: &str) -> Option<String> {
    const HOSTS: [&str; 4] = [
        "api.paypal.com",
        "api-m.paypal.com",
        "api.sandbox.paypal.com",
        "api-m.sandbox.paypal.com",
    ];
    let uri = https_host(url, |h| HOSTS.contains(&h))?;
    let name = uri.path().strip_prefix("/v1/notifications/certs/CERT-")?;
    let named = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    (uri.query().is_none() && named)
        .then(|| canonical(&uri))
        .flatten()
}

/// Whether `url` is a certificate URL of SNS's or PayPal's shape; its canonical form if
/// so (for the fuzz targets: never panics, and the form is itself accepted unchanged).
#[doc(hidden)]
pub fn certificate_url_shape(url: &str) -> Option<String> {
    sns_certificate_url(url).or_else(|| paypal_certificate_url(url))
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificates")
            .field("scheme", &self.inner.prototype.scheme().name())
            .field("ttl", &self.inner.ttl)
            .field("cached", &self.cache().slots.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_providers_https_hosts_are_fetched_from() {
        for ok in [
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
            "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
            "https://sns.eu-west-1.amazonaws.com:443/SimpleNotificationService-01.pem",
            "https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-01.pem",
        ] {
            assert!(sns_certificate_url(ok).is_some(), "{ok}");
        }
        for bad in [
            "http://sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com.evil.com/x.pem",
            "https://evil.com/sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.evil.amazonaws.com@evil.com/x.pem",
            "https://user@sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com:8443/x.pem",
            "https://s3.us-east-1.amazonaws.com/x.pem",
            "https://sns.US-EAST-1.amazonaws.com/x.pem",
            "https://sns..amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com/x.crt",
            // Old-style S3 addresses of a bucket named `sns`: not SNS.
            "https://sns.s3-us-west-2.amazonaws.com/SimpleNotificationService-01.pem",
            "https://sns.s3-accelerate.amazonaws.com/SimpleNotificationService-01.pem",
            "https://sns.s3-external-1.amazonaws.com/SimpleNotificationService-01.pem",
            // Another path, or a query that would make a new cache entry per request.
            "https://sns.us-east-1.amazonaws.com/other/SimpleNotificationService-01.pem",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem?1",
            // A fragment: never sent, so each one would be a new cache key.
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem#1",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem#",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-.pem",
            "https://sns.a/b.amazonaws.com/x.pem",
            "//sns.us-east-1.amazonaws.com/x.pem",
            "not a url",
        ] {
            assert!(sns_certificate_url(bad).is_none(), "{bad}");
        }
        // A SubscribeURL has a query, not a `.pem` path.
        assert!(sns_subscribe_url(
            "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t"
        ));
        assert!(paypal_certificate_url(
            "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-1d93a270"
        )
        .is_some());
        assert!(paypal_certificate_url(
            "https://api-m.sandbox.paypal.com/v1/notifications/certs/CERT-1"
        )
        .is_some());
        for bad in [
            "http://api.paypal.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com.evil.com/v1/notifications/certs/CERT-1",
            "https://evil.paypal.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com/v1/oauth2/token",
            "https://api.paypal.com/v1/notifications/certs/../../oauth2/token",
            "https://api.paypal.com/v1/notifications/certs/CERT-1/../../../v2/checkout/orders/1",
            "https://api.paypal.com/v1/notifications/certs/%2e%2e/%2e%2e/oauth2/token",
            "https://api.paypal.com/v1/notifications/certs/CERT-1?x",
            "https://api.paypal.com/v1/notifications/certs/CERT-1#x",
            "https://api.paypal.com/v1/notifications/certs/CERT-1#",
        ] {
            assert!(paypal_certificate_url(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn one_certificate_has_one_canonical_url() {
        let url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-01.pem";
        let with_port = "https://sns.eu-west-1.amazonaws.com:443/SimpleNotificationService-01.pem";
        assert_eq!(sns_certificate_url(url).as_deref(), Some(url));
        assert_eq!(sns_certificate_url(with_port).as_deref(), Some(url));
        let url = "https://api.paypal.com/v1/notifications/certs/CERT-1";
        let with_port = "https://api.paypal.com:443/v1/notifications/certs/CERT-1";
        assert_eq!(paypal_certificate_url(with_port).as_deref(), Some(url));
        assert_eq!(certificate_url_shape(url).as_deref(), Some(url));
    }
}

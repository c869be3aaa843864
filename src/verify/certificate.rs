//! Keys fetched from the provider: see [`Certificates`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};

use crate::error::{VerifyError, VerifyErrorKind};
use crate::scheme::{key, Custom};
use crate::{ConfigError, ConfigErrorKind, Event, Scheme, Verifier};

mod cache; // each certificate fetched once, kept for its TTL; the misses bounded
mod fetch; // the application's HTTPS GET
mod hosts; // the provider's hosts, and each URL's canonical form
#[cfg(feature = "dedupe")]
mod stored; // the trusted URLs kept in a store: across restarts, shared by replicas
#[cfg(test)]
mod tests;

use cache::{Cache, Found};
pub use fetch::{Fetch, FetchFuture};
pub use hosts::certificate_url_shape;
use hosts::{paypal_certificate_url, sns_certificate_url, sns_subscribe_url};

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
/// - A certificate that has verified a delivery is *trusted*: kept apart from the other
///   URLs (of which at most 256 are cached, the oldest going first), so no number of
///   misses evicts it, and a delivery under it is verified at once while a flood spends
///   the fetch limit. Past its TTL (24 h by default: providers publish a new certificate
///   under a new URL) its URL is fetched again outside the limit. With a trust store
///   ([`with_trust_store`][with_trust_store]: `SqliteStore`, `PgStore`, `RedisStore`),
///   the trusted URLs — URLs only, not certificates — survive a restart and are shared
///   by the replicas on the store: a delivery under one is fetched outside the limit.
///   Without one, trust is kept in this process (or carried by the application:
///   [`trusted_urls`](Self::trusted_urls) saved and given back to
///   [`with_trusted_urls`](Self::with_trusted_urls)); otherwise, after a restart, a
///   certificate is a miss until it verifies a delivery again.
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
///
#[cfg_attr(feature = "dedupe", doc = "[with_trust_store]: Self::with_trust_store")]
#[cfg_attr(not(feature = "dedupe"), doc = "[with_trust_store]: crate#features")]
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
    /// Where the trusted URLs are kept, if anywhere.
    #[cfg(feature = "dedupe")]
    stored: Option<stored::Stored>,
}

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
                #[cfg(feature = "dedupe")]
                stored: None,
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

    /// Replaces the certificate URLs trusted before any delivery (none by default): a
    /// delivery naming one has its certificate fetched outside the fetch limit, so a
    /// flood cannot keep it out after a restart. Give it the
    /// [`trusted_urls`](Self::trusted_urls) of a previous run or another replica — or
    /// let a trust store keep them (`with_trust_store`, feature `dedupe`).
    ///
    /// # Errors
    ///
    /// A URL that is not a certificate URL on the scheme's provider's hosts.
    pub fn with_trusted_urls(
        self,
        urls: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<Self, ConfigError> {
        let sns = matches!(self.custom(), Custom::Sns { .. });
        let known = urls
            .into_iter()
            .map(|url| {
                let url = url.as_ref();
                let canonical = if sns {
                    sns_certificate_url(url)
                } else {
                    paypal_certificate_url(url)
                };
                canonical.ok_or(ConfigError::new(
                    ConfigErrorKind::InvalidValue,
                    "a trusted certificate URL is not on the provider's certificate hosts",
                ))
            })
            .collect::<Result<_, _>>()?;
        self.cache().known = known;
        Ok(self)
    }

    /// The URLs of the certificates trusted now: those that verified a delivery in this
    /// process, those given to [`with_trusted_urls`](Self::with_trusted_urls), and those
    /// last read from the trust store, if any — to save for the next start, or share with
    /// other replicas.
    #[must_use]
    pub fn trusted_urls(&self) -> Vec<String> {
        let cache = self.cache();
        let mut urls: Vec<String> = cache
            .trusted
            .keys()
            .chain(&cache.known)
            .chain(&cache.stored)
            .cloned()
            .collect();
        urls.sort();
        urls.dedup();
        urls
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

    /// The verifier holding the key of the certificate at `url`: cached, or fetched.
    pub(crate) fn verifier(
        &self,
        url: String,
    ) -> Pin<Box<dyn Future<Output = Result<Verifier, VerifyError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            let slot = match this.found(&url).await? {
                Found::Trusted(verifier) => return Ok(verifier),
                Found::Slot(slot) => slot,
            };
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

    /// What `url` has (with a trust store, `stored.rs` reads it first).
    #[cfg(not(feature = "dedupe"))]
    async fn found(&self, url: &str) -> Result<Found, VerifyError> {
        self.find(url)
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
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (trusted, cached) = {
            let cache = self.cache();
            (cache.trusted.len(), cache.slots.len())
        };
        f.debug_struct("Certificates")
            .field("scheme", &self.inner.prototype.scheme().name())
            .field("ttl", &self.inner.ttl)
            .field("trusted", &trusted)
            .field("cached", &cached)
            .finish_non_exhaustive()
    }
}

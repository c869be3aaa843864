//! A secret per tenant: see [`Tenants`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{request, HeaderMap, HeaderName, Uri};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::error::{VerifyError, VerifyErrorKind};
use crate::{ConfigError, Scheme, Verifier};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future a [`SecretSource`] returns.
pub type SecretsFuture =
    Pin<Box<dyn Future<Output = Result<Option<Vec<String>>, BoxError>> + Send>>;

/// Where tenants' secrets come from: `Ok(Some(list))` with the current secret first,
/// `Ok(None)` for a tenant it does not know, `Err` when it cannot answer now.
///
/// Implemented for closures `Fn(String) -> impl Future<Output = Result<Option<Vec<String>>, E>>`.
pub trait SecretSource: Send + Sync + 'static {
    /// The secrets of `tenant`.
    fn secrets(&self, tenant: String) -> SecretsFuture;
}

impl<F, Fut, E> SecretSource for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Vec<String>>, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn secrets(&self, tenant: String) -> SecretsFuture {
        let future = self(tenant);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// Where a delivery names its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantFrom(From);

#[derive(Debug, Clone, PartialEq, Eq)]
enum From {
    PathSegment(usize),
    Header(HeaderName),
    BodyField(&'static str),
}

impl TenantFrom {
    /// The `index`th segment of the request's path, from 0: `/webhooks/{tenant}` is 1.
    #[must_use]
    pub fn path_segment(index: usize) -> Self {
        Self(From::PathSegment(index))
    }

    /// A request header.
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self(From::Header(name))
    }

    /// A top-level string field of the JSON body, such as Stripe Connect's `account`.
    #[must_use]
    pub fn body_field(field: &'static str) -> Self {
        Self(From::BodyField(field))
    }

    /// Whether the tenant can only be known once the body is read.
    pub(crate) fn needs_body(&self) -> bool {
        matches!(self.0, From::BodyField(_))
    }

    /// The tenant this request names, if it names a valid one.
    pub(crate) fn read(&self, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Option<String> {
        let tenant = match &self.0 {
            From::PathSegment(i) => uri
                .path()
                .split('/')
                .filter(|s| !s.is_empty())
                .nth(*i)?
                .to_owned(),
            From::Header(name) => headers.get(name)?.to_str().ok()?.to_owned(),
            From::BodyField(field) => crate::event::string_field(body, field)?,
        };
        // A name, not a payload: bounded, visible ASCII without `/` (it joins the source).
        let valid = !tenant.is_empty()
            && tenant.len() <= 128
            && tenant.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        valid.then_some(tenant)
    }
}

/// A secret per tenant: one endpoint for many accounts (Stripe Connect platforms,
/// per-customer endpoints), each verified with its own secrets, looked up as deliveries
/// arrive and cached for a while.
///
/// The tenant is read from the request — a path segment, a header, or a top-level field
/// of the body (Stripe Connect's `account`) — and becomes part of the event's
/// [`source`](crate::Event::source) (`stripe/acct_1`), so deduplication keys never mix
/// tenants. Its secrets come from a [`SecretSource`]: an async lookup, a database query
/// typically, whose answer is cached for a TTL (60 s by default), so a tenant rotating its
/// secret is picked up within the TTL, or at once with [`Tenants::invalidate`].
///
/// | the request | response |
/// |---|---|
/// | no tenant where the tenant is read | 400 |
/// | a tenant the source does not know | 400, as a bad signature (cached like an answer: random names do not reach the source each time) |
/// | a tenant whose secrets do not decode | 500 (cached for at most 10 s, so a broken row is not read again on every delivery) |
/// | the source fails | 503, so the provider retries |
/// | otherwise | as for one verifier |
///
/// # Security
///
/// A tenant read from the body is read before the body is verified: it only chooses
/// whose secrets to verify with, and the delivery still has to verify under them (a body
/// naming its tenant twice names none).
///
/// Look tenants up exactly (no case folding, no aliases), and give each its own secrets:
/// two names that reach the same secrets verify the same delivery under two sources,
/// that is two dedupe keys, so a captured delivery could run once per name. Unknown
/// names are cached apart from known tenants, so a flood of invented names never evicts
/// a real tenant; each new name still costs the source one lookup, and concurrent
/// deliveries naming one name share that lookup (and its failure). A lookup that takes
/// over 10 s gets 503.
///
/// An unknown name is answered as a bad signature is (400, the same text), and after the
/// same work: once a tenant's secrets were looked up, a delivery naming an unknown tenant
/// is verified under them too and the outcome thrown away, so its time does not tell
/// whether the name exists.
///
/// ```
/// use std::collections::HashMap;
/// use tower_webhook::verify::{TenantFrom, Tenants};
/// use tower_webhook::{Scheme, VerifyWebhookLayer};
///
/// // In a real receiver, a query on the tenants table.
/// let table = HashMap::from([("acme".to_owned(), vec!["whsec_acme_secret_0001".to_owned()])]);
/// let tenants = Tenants::new(Scheme::stripe(), TenantFrom::path_segment(1), move |tenant: String| {
///     let secrets = table.get(&tenant).cloned();
///     async move { Ok::<_, std::convert::Infallible>(secrets) }
/// })?;
/// // `/webhooks/acme` is verified with acme's secrets, its events' source is `stripe/acme`.
/// let layer = VerifyWebhookLayer::per_tenant(tenants);
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
///
/// Cloning shares the cache.
#[derive(Clone)]
pub struct Tenants {
    inner: Arc<Inner>,
}

struct Inner {
    /// Every tenant's verifier is this one with the tenant's secrets and source.
    prototype: Verifier,
    from: TenantFrom,
    source: Box<dyn SecretSource>,
    ttl: Duration,
    cache: Mutex<Cache>,
}

/// Known tenants and unknown names apart, each bounded on its own: a flood of invented
/// names can only evict other invented names, never a real tenant's verifier.
#[derive(Default)]
struct Cache {
    known: HashMap<String, (Verifier, Instant)>,
    /// Names without a verifier until the instant: unknown to the source, or whose
    /// secrets do not decode — and the error each answers.
    unknown: HashMap<String, (Instant, VerifyError)>,
    /// The lookups under way, one per name, shared by the deliveries that wait on it.
    pending: HashMap<String, Lookup>,
    /// The verifier of the last tenant built: an unknown name's delivery is verified
    /// under it too, result discarded, so it costs what a known tenant's does.
    decoy: Option<Verifier>,
    /// Bumped by `invalidate`: an answer read before it is not stored after it.
    generation: u64,
}

/// One name's lookup, shared by every delivery naming it meanwhile.
type Lookup = Arc<OnceCell<Result<Verifier, VerifyError>>>;

/// At most this many known tenants, and as many unknown names, are cached; past it,
/// expired entries go, then (unknown names only) all of them.
const MAX_CACHED: usize = 10_000;

/// The longest a tenant whose secrets do not decode is answered 500 from the cache.
const BROKEN_TTL: Duration = Duration::from_secs(10);

/// How long the secret source may take before the delivery gets 503.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A TTL as long as "forever" without overflowing an `Instant`.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Tenants {
    /// Tenants of `scheme`, named by `from`, with secrets from `source`, cached for 60 s.
    ///
    /// # Errors
    ///
    /// When the scheme fails the checks of [`Verifier::new`].
    pub fn new(
        scheme: Scheme,
        from: TenantFrom,
        source: impl SecretSource,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            inner: Arc::new(Inner {
                prototype: Verifier::without_secrets(scheme)?,
                from,
                source: Box::new(source),
                ttl: Duration::from_secs(60),
                cache: Mutex::new(Cache::default()),
            }),
        })
    }

    /// Replaces how long a tenant's secrets (or its absence) are cached (default 60 s;
    /// anything past a century counts as a century).
    #[must_use]
    pub fn with_ttl(self, ttl: Duration) -> Self {
        self.map(|inner| inner.ttl = ttl.min(FOREVER))
    }

    /// Applies `f` to the verifier every tenant's is built from: its tolerance, clock or
    /// public URL (`|v| v.with_tolerance(…)`).
    #[must_use]
    pub fn with_verifier(self, f: impl FnOnce(Verifier) -> Verifier) -> Self {
        self.map(|inner| inner.prototype = f(inner.prototype.clone()))
    }

    fn map(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::get_mut(&mut self.inner).expect("configured before it is shared"));
        self
    }

    /// Forgets what is cached for `tenant`: its next delivery asks the source again
    /// (after a rotation, say). A lookup already under way when this is called does not
    /// store its (older) answer.
    pub fn invalidate(&self, tenant: &str) {
        let mut cache = self.cache();
        cache.known.remove(tenant);
        cache.unknown.remove(tenant);
        cache.pending.remove(tenant);
        cache.generation += 1;
    }

    pub(crate) fn prototype(&self) -> &Verifier {
        &self.inner.prototype
    }

    pub(crate) fn from(&self) -> &TenantFrom {
        &self.inner.from
    }

    /// The verifier of `tenant`: cached, or built from the source's answer — one lookup
    /// for all the deliveries naming it meanwhile.
    pub(crate) fn verifier(
        &self,
        tenant: String,
    ) -> Pin<Box<dyn Future<Output = Result<Verifier, VerifyError>> + Send>> {
        let this = self.clone();
        Box::pin(async move {
            let now = Instant::now();
            let (lookup, generation) = {
                let mut cache = this.cache();
                if let Some((verifier, until)) = cache.known.get(&tenant) {
                    if *until > now {
                        return Ok(verifier.clone());
                    }
                }
                if let Some((until, error)) = cache.unknown.get(&tenant) {
                    if *until > now {
                        return Err(error.clone());
                    }
                }
                let lookup = cache.pending.entry(tenant.clone()).or_default().clone();
                (lookup, cache.generation)
            };
            let answer = lookup
                .get_or_init(|| this.look_up(&tenant, now, generation))
                .await;
            // Whoever comes first clears the shared lookup (the cache holds its answer).
            let mut cache = this.cache();
            if cache
                .pending
                .get(&tenant)
                .is_some_and(|l| Arc::ptr_eq(l, &lookup))
            {
                cache.pending.remove(&tenant);
            }
            answer.clone()
        })
    }

    /// Asks the source for `tenant`'s secrets and caches the outcome (but a failure to
    /// answer, which the next delivery retries).
    async fn look_up(
        &self,
        tenant: &str,
        now: Instant,
        generation: u64,
    ) -> Result<Verifier, VerifyError> {
        let lookup = self.inner.source.secrets(tenant.to_owned());
        let answer = tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await;
        let outcome = match answer {
            Ok(Ok(Some(secrets))) => self.build(tenant, &secrets),
            Ok(Ok(None)) => Err(UNKNOWN),
            Ok(Err(_error)) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "tenant secrets unavailable: {_error}");
                return Err(UNAVAILABLE);
            }
            Err(_elapsed) => return Err(UNAVAILABLE),
        };
        self.store(tenant, &outcome, now, generation);
        outcome
    }

    /// After `error` refused a delivery: an unknown tenant's is verified under the decoy,
    /// result discarded. Why: an unknown name answers exactly as a bad signature does, so
    /// it must cost the same time too, or the time would tell which tenants exist.
    pub(crate) fn refused(&self, error: &VerifyError, parts: &request::Parts, body: &Bytes) {
        if error.kind() != VerifyErrorKind::UnknownTenant {
            return;
        }
        let decoy = self.cache().decoy.clone();
        if let Some(decoy) = decoy {
            let _ = std::hint::black_box(decoy.verify_request(
                &parts.method,
                &parts.uri,
                &parts.headers,
                body.clone(),
            ));
        }
    }

    fn build(&self, tenant: &str, secrets: &[String]) -> Result<Verifier, VerifyError> {
        let source = format!("{}/{tenant}", self.inner.prototype.source());
        self.inner
            .prototype
            .with_secret_list(secrets)
            .map(|v| v.with_tenant_source(&source))
            .map_err(|_: ConfigError| {
                // The source's data is wrong, not the sender: say so without the secret.
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", tenant, "a tenant's secrets do not decode");
                VerifyError::new(VerifyErrorKind::Misconfigured, "a tenant's secrets do not decode")
            })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn store(
        &self,
        tenant: &str,
        outcome: &Result<Verifier, VerifyError>,
        now: Instant,
        generation: u64,
    ) {
        let mut cache = self.cache();
        if let Ok(verifier) = outcome {
            cache.decoy = Some(verifier.clone());
        }
        if cache.generation != generation {
            return; // invalidated while the source answered: that answer may be stale
        }
        let until = now + self.inner.ttl;
        match outcome {
            Ok(verifier) => {
                if cache.known.len() >= MAX_CACHED {
                    cache.known.retain(|_, (_, until)| *until > now);
                }
                if cache.known.len() < MAX_CACHED {
                    cache
                        .known
                        .insert(tenant.to_owned(), (verifier.clone(), until));
                }
            }
            Err(error) => {
                let until = match error.kind() {
                    VerifyErrorKind::UnknownTenant => until,
                    _ => now + self.inner.ttl.min(BROKEN_TTL),
                };
                if cache.unknown.len() >= MAX_CACHED {
                    cache.unknown.retain(|_, (until, _)| *until > now);
                    if cache.unknown.len() >= MAX_CACHED {
                        cache.unknown.clear();
                    }
                }
                cache
                    .unknown
                    .insert(tenant.to_owned(), (until, error.clone()));
            }
        }
    }
}

const UNKNOWN: VerifyError =
    VerifyError::new(VerifyErrorKind::UnknownTenant, "no secrets for this tenant");

const UNAVAILABLE: VerifyError = VerifyError::new(
    VerifyErrorKind::SecretsUnavailable,
    "the tenant's secrets could not be read",
);

impl fmt::Debug for Tenants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tenants")
            .field("scheme", &self.inner.prototype.scheme().name())
            .field("from", &self.inner.from)
            .field("ttl", &self.inner.ttl)
            .field("cached", &self.cache().known.len())
            .finish_non_exhaustive()
    }
}

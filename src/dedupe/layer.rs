use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use bytes::Bytes;
use http::Response;

use super::Dedupe;
use crate::response::{self, RejectFn, Rejection, ResponseBody};
use crate::store::{checked_lease, DedupeStore, Delivery, Lease};
use crate::{ConfigError, Drain};

pub(crate) type KeyFn = dyn Fn(&Parts) -> Option<Delivery> + Send + Sync;

pub(crate) struct Config {
    pub(crate) store: Arc<dyn DedupeStore>,
    pub(crate) lease: Lease,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) key: Option<Arc<KeyFn>>,
    pub(crate) rejection: Option<Arc<RejectFn<Rejection>>>,
    pub(crate) drain: Drain,
}

impl Config {
    /// The middleware's own answer (see [`crate::response`]).
    pub(crate) fn reject<B>(&self, rejection: Rejection) -> Response<ResponseBody<B>> {
        response::respond(rejection, self.rejection.as_ref()).map(ResponseBody::fixed)
    }
}

impl Clone for Config {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            lease: self.lease,
            unavailable_retry_after: self.unavailable_retry_after,
            key: self.key.clone(),
            rejection: self.rejection.clone(),
            drain: self.drain.clone(),
        }
    }
}

/// Applies [`Dedupe`] to a service. See the [module docs](crate::dedupe).
///
/// Cloning is cheap and shares the store and the [`drain`](Self::drain).
#[derive(Clone)]
#[must_use]
pub struct DedupeLayer {
    config: Arc<Config>,
}

impl DedupeLayer {
    /// Deduplicates on `store`, with a 60 s lease renewed for up to 10 min of handler time.
    pub fn new(store: impl DedupeStore) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Deduplicates on a store already shared behind an `Arc`.
    pub fn from_arc(store: Arc<dyn DedupeStore>) -> Self {
        Self {
            config: Arc::new(Config {
                store,
                lease: Lease::renewed_for(Duration::from_secs(600)),
                unavailable_retry_after: Duration::from_secs(5),
                key: None,
                rejection: None,
                drain: Drain::new(),
            }),
        }
    }

    /// Replaces how long a claim holds before another attempt may take it over (default
    /// 60 s). While the handler runs, the claim is renewed every third of the lease, so
    /// the lease bounds how long a *crashed* attempt blocks the retries, not how long a
    /// handler may run (that is [`with_max_run`](Self::with_max_run)).
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day (a renewal every third of it needs
    /// time for a round trip; a day is what every store represents), or is shorter than
    /// the store keeps safely ([`DedupeStore::min_lease`]).
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        let lease = checked_lease(lease, self.config.store.min_lease())?;
        Arc::make_mut(&mut self.config).lease.length = lease;
        Ok(self)
    }

    /// Replaces how long a running handler keeps its claim renewed (default 10 min). Past
    /// it renewals stop, the lease runs out, and a retry may run beside the handler; the
    /// handler's response then carries [`ClaimLost`](super::ClaimLost).
    ///
    /// # Errors
    ///
    /// When `max_run` is shorter than 1 s.
    pub fn with_max_run(mut self, max_run: Duration) -> Result<Self, ConfigError> {
        Arc::make_mut(&mut self.config).lease.max_run = Lease::checked_max_run(max_run)?;
        Ok(self)
    }

    /// Replaces the `Retry-After` sent when the store cannot answer (default 5 s).
    pub fn with_unavailable_retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config).unavailable_retry_after = after;
        self
    }

    /// Replaces the responses the middleware gives itself (a duplicate's 204, 409, 503,
    /// a missing event's 500, no key's 400); the [`Rejection`] is still added to the
    /// response's extensions. See [`crate::response`].
    pub fn with_rejection(
        mut self,
        rejection: impl Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).rejection = Some(Arc::new(rejection));
        self
    }

    /// The handlers this layer runs on tasks of their own (every clone of the layer, and
    /// every service it made, shares it): after the server stops, wait for them with
    /// [`Drain::wait`], which stops and releases what is not done within its bound. See
    /// [`crate::drain`].
    pub fn drain(&self) -> Drain {
        self.config.drain.clone()
    }

    /// Takes the key from the request instead of the verified [`Event`](crate::Event),
    /// for deliveries that do not pass through `VerifyWebhookLayer`. `None` is a 400.
    pub fn with_key(
        mut self,
        key: impl Fn(&Parts) -> Option<Delivery> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).key = Some(Arc::new(key));
        self
    }
}

impl<S> Layer<S> for DedupeLayer {
    type Service = Dedupe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Dedupe::from_config(inner, self.config.clone())
    }
}

impl std::fmt::Debug for DedupeLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupeLayer")
            .field("lease", &self.config.lease.length)
            .field("max_run", &self.config.lease.max_run)
            .field("custom_rejection", &self.config.rejection.is_some())
            .finish_non_exhaustive()
    }
}

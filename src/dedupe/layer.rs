use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tower_layer::Layer;

use super::Dedupe;
use crate::store::{DedupeStore, Delivery};

pub(crate) type KeyFn = dyn Fn(&Parts) -> Option<Delivery> + Send + Sync;

pub(crate) struct Config {
    pub(crate) store: Arc<dyn DedupeStore>,
    pub(crate) lease: Duration,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) key: Option<Arc<KeyFn>>,
}

impl Clone for Config {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            lease: self.lease,
            unavailable_retry_after: self.unavailable_retry_after,
            key: self.key.clone(),
        }
    }
}

/// Applies [`Dedupe`] to a service. See the [module docs](crate::dedupe).
///
/// Cloning is cheap and shares the store.
#[derive(Clone)]
#[must_use]
pub struct DedupeLayer {
    config: Arc<Config>,
}

impl DedupeLayer {
    /// Deduplicates on `store`, with a 60 s lease.
    pub fn new(store: impl DedupeStore) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Deduplicates on a store already shared behind an `Arc`.
    pub fn from_arc(store: Arc<dyn DedupeStore>) -> Self {
        Self {
            config: Arc::new(Config {
                store,
                lease: Duration::from_secs(60),
                unavailable_retry_after: Duration::from_secs(5),
                key: None,
            }),
        }
    }

    /// Replaces how long a claim holds before another attempt may take it over (default
    /// 60 s; kept between 1 s and 1 day, which every store can represent). Make it longer
    /// than your handler ever runs: a claim taken over while its handler still runs means
    /// that handler runs twice.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        Arc::make_mut(&mut self.config).lease =
            lease.clamp(Duration::from_secs(1), Duration::from_secs(24 * 3600));
        self
    }

    /// Replaces the `Retry-After` sent when the store cannot answer (default 5 s).
    pub fn with_unavailable_retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config).unavailable_retry_after = after;
        self
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
            .field("lease", &self.config.lease)
            .finish_non_exhaustive()
    }
}

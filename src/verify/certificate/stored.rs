//! The trusted certificates' URLs kept in a [`TrustStore`]: read at the first delivery,
//! read again (at most every 5 s) when a delivery names a URL the fetch limit refuses, and
//! written in the background when a certificate is newly trusted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::cache::{Found, MAX_TRUSTED};
use super::hosts::{paypal_certificate_url, sns_certificate_url};
use super::Certificates;
use crate::error::VerifyError;
use crate::scheme::Custom;
use crate::store::{TrustStore, MAX_TRUSTED_URLS};

const _: () = assert!(
    MAX_TRUSTED == MAX_TRUSTED_URLS,
    "the store keeps what the cache does"
);

/// The store is read again at most this often: a flood of deliveries naming URLs the
/// limit refuses makes one read per interval, not one per delivery.
const REREAD: Duration = Duration::from_secs(5);

/// How long a read or a write of the store may take (a read holds the deliveries waiting
/// on it).
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// The store, and when it was read.
pub(super) struct Stored {
    store: Arc<dyn TrustStore>,
    /// Whether a read succeeded yet (until then, each delivery tries, every [`REREAD`]).
    loaded: AtomicBool,
    /// When the store was last read, or tried. Deliveries wait on the read in flight,
    /// which may bring the URL they name.
    last_read: tokio::sync::Mutex<Option<Instant>>,
}

impl Certificates {
    /// Keeps the URLs of the certificates that verify deliveries in `store`, and trusts
    /// the URLs it holds: after a restart, and in every replica sharing the store, a
    /// delivery under a certificate trusted before is fetched outside the fetch limit, so
    /// a flood of forged deliveries cannot keep it out (feature `dedupe`; `SqliteStore`,
    /// `PgStore` and `RedisStore` are trust stores).
    ///
    /// The store holds URLs only (never a certificate, nor a secret); a URL read back is
    /// checked against the provider's hosts again and its certificate fetched anew. It is
    /// read at the first delivery, and again — at most every 5 s — when a delivery names a
    /// URL that is not cached while the fetch limit is spent (so a replica learns the URLs
    /// another trusted since). A URL newly trusted is written in the background: a store
    /// that fails or takes over 2 s is logged (feature `tracing`) and never fails a
    /// delivery.
    #[must_use]
    pub fn with_trust_store(self, store: impl TrustStore) -> Self {
        let stored = Stored {
            store: Arc::new(store),
            loaded: AtomicBool::new(false),
            last_read: tokio::sync::Mutex::new(None),
        };
        self.map(|inner| inner.stored = Some(stored))
    }

    /// What `url` has, the store read first if it never was; if the fetch limit refuses
    /// it, the store read again (at most every [`REREAD`]) and `url` looked up again.
    pub(super) async fn found(&self, url: &str) -> Result<Found, VerifyError> {
        let Some(stored) = &self.inner.stored else {
            return self.find(url);
        };
        if !stored.loaded.load(Ordering::Acquire) {
            self.read(stored).await;
        }
        match self.find(url) {
            Err(_refused) => {
                self.read(stored).await;
                self.find(url)
            }
            found => found,
        }
    }

    /// Reads the store's URLs, unless it was read (or tried) within [`REREAD`].
    async fn read(&self, stored: &Stored) {
        let mut last_read = stored.last_read.lock().await;
        let now = Instant::now();
        if last_read.is_some_and(|at| now.duration_since(at) < REREAD) {
            return;
        }
        *last_read = Some(now);
        let urls = match tokio::time::timeout(STORE_TIMEOUT, stored.store.load()).await {
            Ok(Ok(urls)) => urls,
            Ok(Err(_error)) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "reading the trusted certificates failed: {_error}");
                return;
            }
            Err(_elapsed) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "reading the trusted certificates timed out");
                return;
            }
        };
        let sns = matches!(self.custom(), Custom::Sns { .. });
        // Checked again: a row written by hand must not make the receiver fetch elsewhere.
        let urls = urls
            .iter()
            .filter_map(|url| match sns {
                true => sns_certificate_url(url),
                false => paypal_certificate_url(url),
            })
            .take(MAX_TRUSTED)
            .collect();
        self.cache().stored = urls;
        stored.loaded.store(true, Ordering::Release);
    }

    /// Writes `url`, newly trusted, to the store, in the background.
    pub(super) fn record(&self, url: &str) {
        let Some(stored) = &self.inner.stored else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, url) = (stored.store.clone(), url.to_owned());
        // Not awaited: the delivery is verified, and neither waits for the store nor
        // fails with it.
        runtime.spawn(async move {
            let _written = tokio::time::timeout(STORE_TIMEOUT, store.trust(url)).await;
            #[cfg(feature = "tracing")]
            match _written {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(target: "tower_webhook", "recording a trusted certificate failed: {error}");
                }
                Err(_) => {
                    tracing::warn!(target: "tower_webhook", "recording a trusted certificate timed out");
                }
            }
        });
    }
}

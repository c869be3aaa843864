use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::{Certificates, Tenants, VerifyWebhook};
use crate::{Secrets, Verifier, VerifyError};

pub(crate) type RejectFn = crate::response::RejectFn<VerifyError>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) verifier: Verifier,
    pub(crate) max_body: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) rejection: Option<Arc<RejectFn>>,
    /// Meta's verify token, for its `GET ?hub.challenge` handshake.
    pub(crate) verify_token: Option<Arc<str>>,
    /// A secret per tenant: `verifier` is then their prototype, which checks headers only.
    pub(crate) tenants: Option<Tenants>,
    /// Keys fetched from the provider: `verifier` is then their prototype.
    pub(crate) certificates: Option<Certificates>,
    /// Where PayPal's transmissions are remembered across replicas (else per process).
    #[cfg(feature = "dedupe")]
    pub(crate) transmissions: Option<Arc<dyn crate::store::DedupeStore>>,
    /// Told of every rejection, for the spikes.
    #[cfg(feature = "alerts")]
    pub(crate) alerts: Option<crate::alerts::Alerts>,
}

/// Applies [`VerifyWebhook`] to a service. See the [module docs](crate::verify).
///
/// Cloning is cheap; clones share the verifier's secret list.
#[derive(Clone)]
#[must_use]
pub struct VerifyWebhookLayer {
    config: Arc<Config>,
}

impl VerifyWebhookLayer {
    /// A layer that verifies every request with `verifier`, buffering at most 1 MiB
    /// (the scheme's own limit: 25 MiB for GitHub) that must arrive within 10 s, and
    /// answering the scheme's set-up handshake (see [`crate::verify`]).
    pub fn new(verifier: Verifier) -> Self {
        Self {
            config: Arc::new(Config {
                max_body: verifier.scheme().max_body,
                verifier,
                body_timeout: Duration::from_secs(10),
                rejection: None,
                verify_token: None,
                tenants: None,
                certificates: None,
                #[cfg(feature = "dedupe")]
                transmissions: None,
                #[cfg(feature = "alerts")]
                alerts: None,
            }),
        }
    }

    /// A layer that verifies each tenant's deliveries with that tenant's secrets: see
    /// [`Tenants`].
    pub fn per_tenant(tenants: Tenants) -> Self {
        let mut layer = Self::new(tenants.prototype().clone());
        Arc::make_mut(&mut layer.config).tenants = Some(tenants);
        layer
    }

    /// A layer that verifies each delivery under the certificate it names, fetched from
    /// the provider and cached (AWS SNS, PayPal): see [`Certificates`]. With SNS, a
    /// `SubscriptionConfirmation` is confirmed by the layer.
    pub fn from_certificates(certificates: Certificates) -> Self {
        let mut layer = Self::new(certificates.prototype().clone());
        Arc::make_mut(&mut layer.config).certificates = Some(certificates);
        layer
    }

    /// Remembers PayPal's transmissions in `store` — the dedupe store the replicas
    /// share — so a transmission id is accepted with one body only across every replica
    /// and restart, not only within this process (see [`Scheme::paypal`]'s `# Security`).
    /// Each verified PayPal delivery then costs two store calls (a claim keyed by
    /// `{source}/transmission` and the transmission id, completed at once, kept like an
    /// event key); a store that cannot be reached answers 503
    /// ([`VerifyErrorKind::StoreUnavailable`](crate::VerifyErrorKind::StoreUnavailable)),
    /// so PayPal retries. Other schemes ignore it.
    ///
    /// [`Scheme::paypal`]: crate::Scheme::paypal
    #[cfg(feature = "dedupe")]
    pub fn with_transmission_store(self, store: impl crate::store::DedupeStore) -> Self {
        self.with_transmission_store_arc(Arc::new(store))
    }

    /// [`with_transmission_store`](Self::with_transmission_store) with a store already
    /// shared, such as the one a [`DedupeLayer`](crate::DedupeLayer) was built with.
    #[cfg(feature = "dedupe")]
    pub fn with_transmission_store_arc(
        mut self,
        store: Arc<dyn crate::store::DedupeStore>,
    ) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.transmissions = Some(store);
        // Once here, not on every request.
        if let Some(verifier) = config.verifier.deferring_transmissions() {
            config.verifier = verifier;
        }
        self
    }

    /// Reports every rejected delivery to `alerts`, which raises
    /// [`AlertKind::Rejections`](crate::alerts::AlertKind::Rejections) when a source's
    /// rejections within a window reach the threshold (default 20 within a minute): forged
    /// or replayed requests, or a secret out of step with the provider's. Each rejection
    /// costs a lock and a counter; the alert is sent on a task of its own.
    #[cfg(feature = "alerts")]
    pub fn with_alerts(mut self, alerts: crate::alerts::Alerts) -> Self {
        Arc::make_mut(&mut self.config).alerts = Some(alerts);
        self
    }

    /// Sets the verify token Meta's `GET ?hub.mode=subscribe&hub.verify_token=…` handshake
    /// must carry (the one entered in the app dashboard). Without it, or when it does not
    /// match, the handshake gets 403.
    pub fn with_verify_token(mut self, token: impl AsRef<str>) -> Self {
        Arc::make_mut(&mut self.config).verify_token = Some(Arc::from(token.as_ref()));
        self
    }

    /// Replaces how long the whole body may take to arrive (default 10 s); a sender that
    /// trickles it slower gets 408 and holds no buffer past it. Only requests whose
    /// headers passed the checks are read at all.
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).body_timeout = timeout;
        self
    }

    /// Replaces the body limit in bytes (default 1 MiB). A larger `Content-Length` is
    /// refused before reading; a body that grows past the limit is refused as soon as it
    /// does. Both get 413.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body = bytes;
        self
    }

    /// Replaces the rejection response. The [`VerifyError`] is still added to the
    /// response's extensions, and a 405's `Allow` header unless the response sets one.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{header, Response};
    /// # use tower_webhook::{Scheme, Verifier, VerifyWebhookLayer};
    /// # let verifier = Verifier::new(Scheme::github(), ["It's a Secret to Everybody"]).unwrap();
    /// let layer = VerifyWebhookLayer::new(verifier).with_rejection(|err| {
    ///     let body = format!(r#"{{"error":"{}"}}"#, err.body_text());
    ///     Response::builder()
    ///         .status(err.status())
    ///         .header(header::CONTENT_TYPE, "application/json")
    ///         .body(Bytes::from(body))
    ///         .unwrap()
    /// });
    /// ```
    pub fn with_rejection(
        mut self,
        rejection: impl Fn(&VerifyError) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).rejection = Some(Arc::new(rejection));
        self
    }

    /// A handle on the secret list, to rotate secrets while the server runs.
    #[must_use]
    pub fn secrets(&self) -> Secrets {
        self.config.verifier.secrets()
    }
}

impl<S> Layer<S> for VerifyWebhookLayer {
    type Service = VerifyWebhook<S>;

    fn layer(&self, inner: S) -> Self::Service {
        VerifyWebhook::from_config(inner, self.config.clone())
    }
}

impl std::fmt::Debug for VerifyWebhookLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("VerifyWebhookLayer");
        debug
            .field("verifier", &self.config.verifier)
            .field("max_body", &self.config.max_body)
            .field("body_timeout", &self.config.body_timeout)
            .field("custom_rejection", &self.config.rejection.is_some())
            .field(
                "verify_token",
                &self.config.verify_token.as_ref().map(|_| "<redacted>"),
            )
            .field("tenants", &self.config.tenants)
            .field("certificates", &self.config.certificates);
        #[cfg(feature = "alerts")]
        debug.field("alerts", &self.config.alerts.is_some());
        debug.finish()
    }
}

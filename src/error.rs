//! The two error types: [`ConfigError`] when a layer is built, [`VerifyError`] when a
//! delivery is rejected.

use std::fmt;

use http::StatusCode;

/// What is wrong with a configuration: returned when a scheme, a secret list or a layer is
/// built, never at request time.
///
/// Its `Display` names the problem and, for secrets, the position in the list — never the
/// secret itself.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    detail: String,
}

/// The kinds of [`ConfigError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The secret list is empty.
    NoSecrets,
    /// A secret is empty, too short, or cannot be decoded as the scheme requires.
    InvalidSecret,
    /// A header name is not a valid HTTP header name.
    InvalidHeaderName,
    /// The signed-content template does not parse, or names a part the scheme lacks.
    InvalidTemplate,
    /// A value to sign cannot be put into a header (a control character in an id, …).
    InvalidValue,
    /// A lease, run time or retention outside the range it must be in.
    InvalidDuration,
    /// An inbox's processors: a name outside its alphabet, a name twice, an empty set, an
    /// empty type filter, or a worker for a processor the inbox lacks.
    InvalidProcessor,
    /// An encryption key ring (feature `seal`): no key, an id twice or outside its
    /// alphabet, a key that is not base64 or not 32 bytes. The message names the entry by
    /// position, never the key.
    InvalidEncryptionKey,
    /// A payload schema (feature `schemas`): a file that cannot be read or is not JSON, a
    /// schema that does not compile or refers outside what was loaded, an OpenAPI
    /// document without webhooks. The message names the file or webhook.
    InvalidSchema,
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// A duration setting outside `range`: `what` names the setting.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))] // the dedupe layers' and the inbox's builders
    pub(crate) fn duration(what: &str, got: std::time::Duration, range: impl fmt::Display) -> Self {
        Self::new(
            ConfigErrorKind::InvalidDuration,
            format!("{what} must be {range}, not {got:?}"),
        )
    }

    /// What kind of problem this is.
    #[must_use]
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigError")
            .field("kind", &self.kind)
            .field("detail", &self.detail)
            .finish()
    }
}

impl std::error::Error for ConfigError {}

/// Why a delivery was rejected.
///
/// The rejection response carries this value in its extensions, so outer layers and logs
/// can see the reason while the body stays short and fixed:
///
/// ```
/// # use tower_webhook::{VerifyError, VerifyErrorKind};
/// # fn inspect(response: http::Response<()>) {
/// if let Some(err) = response.extensions().get::<VerifyError>() {
///     assert_eq!(err.kind(), VerifyErrorKind::InvalidSignature);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    kind: VerifyErrorKind,
    detail: &'static str,
    /// A provider that wants another status for failed authentication (Discord: 401).
    unauthorized: bool,
    /// For a 405: the endpoint takes GET as well as POST.
    takes_get: bool,
}

/// The kinds of [`VerifyError`], each with its default status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VerifyErrorKind {
    /// A header the scheme needs is absent (400).
    MissingHeader,
    /// A header is present twice, not ASCII, or not in the scheme's format (400).
    MalformedHeader,
    /// No signature in the header matches any configured secret (400).
    InvalidSignature,
    /// The signed timestamp is further in the past than the tolerance allows (400).
    TimestampTooOld,
    /// The signed timestamp is further in the future than the tolerance allows (400).
    TimestampInFuture,
    /// The body is larger than the configured limit (413).
    BodyTooLarge,
    /// The body could not be read from the connection (400).
    BodyRead,
    /// The body did not arrive within the read timeout (408).
    BodyTimeout,
    /// The verifier lacks what the scheme needs, such as the public URL a URL-signing
    /// scheme signs (500): a deployment error, not the sender's.
    Misconfigured,
    /// The tenant the request names is missing, malformed or unknown to the secret
    /// source (400).
    UnknownTenant,
    /// The tenant's secrets could not be read now (503, so the provider retries).
    SecretsUnavailable,
    /// The store that remembers PayPal's transmissions across replicas could not be
    /// reached (503, so the provider retries).
    StoreUnavailable,
    /// The request's method is not one the scheme's provider sends (405, with `Allow`):
    /// a GET health check or a browser on a POST-only endpoint. Schemes whose provider
    /// also sends GET (Meta's handshake, Twilio, HubSpot and schemes that sign the
    /// method) take GET and POST.
    MethodNotAllowed,
}

impl VerifyError {
    pub(crate) const fn new(kind: VerifyErrorKind, detail: &'static str) -> Self {
        Self {
            kind,
            detail,
            unauthorized: false,
            takes_get: false,
        }
    }

    /// A method the endpoint does not take: it takes POST, and GET too if `takes_get`.
    pub(crate) const fn method_not_allowed(takes_get: bool) -> Self {
        Self {
            takes_get,
            ..Self::new(
                VerifyErrorKind::MethodNotAllowed,
                "the request's method is not one the provider sends",
            )
        }
    }

    /// The methods a 405 names in its `Allow` header.
    pub(crate) fn allow(&self) -> Option<&'static str> {
        match (self.kind, self.takes_get) {
            (VerifyErrorKind::MethodNotAllowed, true) => Some("GET, POST"),
            (VerifyErrorKind::MethodNotAllowed, false) => Some("POST"),
            _ => None,
        }
    }

    /// Answered 401 instead of 400 when it is an authentication failure (a header, the
    /// signature or the timestamp), for schemes whose provider asks for it.
    pub(crate) fn unauthorized(mut self) -> Self {
        self.unauthorized = !matches!(
            self.kind,
            VerifyErrorKind::BodyTooLarge
                | VerifyErrorKind::BodyRead
                | VerifyErrorKind::BodyTimeout
                | VerifyErrorKind::Misconfigured
                | VerifyErrorKind::SecretsUnavailable
                | VerifyErrorKind::StoreUnavailable
                | VerifyErrorKind::MethodNotAllowed
        );
        self
    }

    /// What kind of rejection this is.
    #[must_use]
    pub fn kind(&self) -> VerifyErrorKind {
        self.kind
    }

    /// The status of the default rejection response: 413 for [`VerifyErrorKind::BodyTooLarge`],
    /// 408 for [`VerifyErrorKind::BodyTimeout`], 405 for
    /// [`VerifyErrorKind::MethodNotAllowed`] (with `Allow`), 500 for a misconfiguration, 503
    /// when secrets or the transmission store are unavailable, 400 for everything else — except 401 for a
    /// failed authentication under a scheme whose provider requires it (Discord). Never
    /// 410, which makes Standard Webhooks senders disable the endpoint.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        if self.unauthorized {
            return StatusCode::UNAUTHORIZED;
        }
        match self.kind {
            VerifyErrorKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            VerifyErrorKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            VerifyErrorKind::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
            VerifyErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            VerifyErrorKind::SecretsUnavailable | VerifyErrorKind::StoreUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The short, fixed text of the default rejection body.
    #[must_use]
    pub fn body_text(&self) -> &'static str {
        match self.kind {
            VerifyErrorKind::MissingHeader | VerifyErrorKind::MalformedHeader => {
                "invalid webhook headers"
            }
            VerifyErrorKind::InvalidSignature => "invalid webhook signature",
            VerifyErrorKind::TimestampTooOld | VerifyErrorKind::TimestampInFuture => {
                "webhook timestamp outside tolerance"
            }
            VerifyErrorKind::BodyTooLarge => "payload too large",
            VerifyErrorKind::BodyRead => "could not read body",
            VerifyErrorKind::BodyTimeout => "body not received in time",
            VerifyErrorKind::Misconfigured => "webhook endpoint misconfigured",
            // The same text as a bad signature: the response does not tell which tenants
            // exist (the kind, in the extensions, does).
            VerifyErrorKind::UnknownTenant => "invalid webhook signature",
            VerifyErrorKind::SecretsUnavailable => "webhook secrets unavailable",
            VerifyErrorKind::StoreUnavailable => "webhook store unavailable",
            VerifyErrorKind::MethodNotAllowed if self.takes_get => {
                "method not allowed: this webhook endpoint takes GET and POST"
            }
            VerifyErrorKind::MethodNotAllowed => {
                "method not allowed: this webhook endpoint takes POST"
            }
        }
    }
}

impl VerifyErrorKind {
    /// The kind's stable snake-case name: the `reason` label of the rejection metric
    /// (see [`crate::metrics`]). A new kind needs a rejection slot there too (its test
    /// lists every kind).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const fn as_label(self) -> &'static str {
        match self {
            VerifyErrorKind::MissingHeader => "missing_header",
            VerifyErrorKind::MalformedHeader => "malformed_header",
            VerifyErrorKind::InvalidSignature => "invalid_signature",
            VerifyErrorKind::TimestampTooOld => "timestamp_too_old",
            VerifyErrorKind::TimestampInFuture => "timestamp_in_future",
            VerifyErrorKind::BodyTooLarge => "body_too_large",
            VerifyErrorKind::BodyRead => "body_read",
            VerifyErrorKind::BodyTimeout => "body_timeout",
            VerifyErrorKind::Misconfigured => "misconfigured",
            VerifyErrorKind::UnknownTenant => "unknown_tenant",
            VerifyErrorKind::SecretsUnavailable => "secrets_unavailable",
            VerifyErrorKind::StoreUnavailable => "store_unavailable",
            VerifyErrorKind::MethodNotAllowed => "method_not_allowed",
        }
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.detail)
    }
}

impl std::error::Error for VerifyError {}

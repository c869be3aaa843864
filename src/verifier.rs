//! [`Verifier`]: the whole check of one delivery — headers, signature over the raw bytes,
//! timestamp — without any HTTP plumbing. `VerifyWebhookLayer` runs one per request; use
//! it directly where there is no Tower stack (a queue consumer, a serverless function).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri};

use crate::error::{ConfigError, ConfigErrorKind, VerifyError, VerifyErrorKind};
use crate::event::{self, Event};
use crate::public_url::{self, PublicUrl};
use crate::scheme::template::{self, Input, Part};
use crate::scheme::{Algorithm, Custom, IdSource, Key, Scheme, TimestampFormat, TimestampSource};
use crate::secret::Secrets;
use crate::timestamp::{self, Clock, Tolerance};

mod custom; // the presets verified by code of their own
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod fetched; // the event a body fetched from the provider's API would have given
mod headers; // the headers, checked before the body is read
mod transmissions;

pub(crate) use custom::certificate_url;
use headers::{one, one_str};

/// Verifies deliveries of one scheme against a list of secrets.
///
/// Cloning is cheap and shares the secret list (see [`Verifier::secrets`]).
///
/// ```
/// use std::time::SystemTime;
/// use tower_webhook::{Scheme, Verifier};
///
/// let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// let verifier = Verifier::new(Scheme::standard(), [secret])?;
///
/// let body = br#"{"type":"invoice.paid"}"#;
/// let headers = Scheme::standard().sign([secret], "msg_1", SystemTime::now(), body)?;
/// let event = verifier.verify(&headers, body.to_vec().into()).expect("authentic");
/// assert_eq!(event.id(), Some("msg_1"));
/// assert_eq!(event.event_type(), Some("invoice.paid"));
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Verifier {
    scheme: Arc<Scheme>,
    secrets: Secrets,
    tolerance: Tolerance,
    clock: Clock,
    source: Arc<str>,
    /// The `source` label of its metrics (a tenant's verifier keeps its prototype's).
    metrics: crate::metrics::Source,
    public_url: Option<PublicUrl>,
    /// PayPal's transmission ids seen lately, shared by clones (`Scheme::paypal`); `None`
    /// where the layer's shared store remembers them instead.
    transmissions: Option<Arc<transmissions::Transmissions>>,
}

impl Verifier {
    /// A verifier for `scheme` that accepts a signature made with any of `secrets`; the
    /// first is the current one.
    ///
    /// # Errors
    ///
    /// When the list is empty, a secret is empty, too short or does not decode, or the
    /// scheme's signed content names an id or timestamp the scheme does not read.
    pub fn new<I, S>(scheme: Scheme, secrets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let scheme = Arc::new(check_scheme(scheme)?);
        let secrets = Secrets::new(scheme.clone(), secrets)?;
        Ok(Self::from_parts(scheme, secrets))
    }

    /// A verifier without secrets, for a scheme that passes the build-time checks: the
    /// prototype of per-tenant verifiers (its headers can be checked; nothing verifies).
    pub(crate) fn without_secrets(scheme: Scheme) -> Result<Self, ConfigError> {
        let scheme = Arc::new(check_scheme(scheme)?);
        Ok(Self::from_parts(scheme.clone(), Secrets::none(scheme)))
    }

    /// This verifier with another, unshared secret list (a tenant's).
    pub(crate) fn with_secret_list(&self, secrets: &[String]) -> Result<Self, ConfigError> {
        Ok(Self {
            secrets: self.secrets.derive(secrets)?,
            ..self.clone()
        })
    }

    /// This verifier without its own memory of PayPal's transmissions, where it has one
    /// (a PayPal verifier not yet deferring): the layer's shared store decides alone (a
    /// body this process saw first must not overrule it). `None`: nothing to change.
    #[cfg(feature = "dedupe")]
    pub(crate) fn deferring_transmissions(&self) -> Option<Self> {
        let remembers = matches!(self.scheme.custom, Some(Custom::PayPal { .. }));
        (remembers && self.transmissions.is_some()).then(|| Self {
            transmissions: None,
            ..self.clone()
        })
    }

    /// This verifier with one key, unshared (a fetched certificate's).
    pub(crate) fn with_key(&self, key: Key) -> Self {
        Self {
            secrets: Secrets::of_keys(self.scheme.clone(), vec![key]),
            ..self.clone()
        }
    }

    fn from_parts(scheme: Arc<Scheme>, secrets: Secrets) -> Self {
        let tolerance = scheme
            .tolerance
            .map_or_else(Tolerance::default, |t| Tolerance { past: t, future: t });
        Self {
            source: Arc::from(scheme.name()),
            metrics: crate::metrics::Source::new(scheme.name()),
            scheme,
            secrets,
            tolerance,
            clock: timestamp::system_clock(),
            public_url: None,
            transmissions: Some(Arc::default()),
        }
    }

    /// Replaces both tolerances: how far a signed timestamp may lie in the past and in
    /// the future (default 300 s each, or the scheme's own: Twitch 10 min, Linear 1 min).
    /// Exactly the tolerance is accepted.
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = Tolerance {
            past: tolerance,
            future: tolerance,
        };
        self
    }

    /// Replaces how old a signed timestamp may be (default 300 s).
    #[must_use]
    pub fn with_past_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance.past = tolerance;
        self
    }

    /// Replaces how far in the future a signed timestamp may be (default 300 s): the
    /// sender's clock may run ahead of ours.
    #[must_use]
    pub fn with_future_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance.future = tolerance;
        self
    }

    /// Replaces the clock (default [`SystemTime::now`]); for tests.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Replaces the events' [`source`](Event::source) (default: the scheme's name). Give
    /// each endpoint its own when two endpoints receive the same provider's events.
    #[must_use]
    pub fn with_source(mut self, source: impl AsRef<str>) -> Self {
        self.source = Arc::from(source.as_ref());
        self.metrics = crate::metrics::Source::new(source.as_ref());
        self
    }

    /// This verifier, its events' source a tenant's (`stripe/acme`); its metrics keep
    /// the prototype's label (`stripe`): tenants are too many to be labels.
    pub(crate) fn with_tenant_source(mut self, source: &str) -> Self {
        self.source = Arc::from(source);
        self
    }

    /// The `source` label of this verifier's metrics.
    pub(crate) fn metrics(&self) -> &crate::metrics::Source {
        &self.metrics
    }

    /// Sets the URL the provider signs, for schemes that sign it (Twilio, Square,
    /// HubSpot): see [`PublicUrl`]. Without it, their deliveries are refused with
    /// [`VerifyErrorKind::Misconfigured`] (500).
    #[must_use]
    pub fn with_public_url(mut self, url: PublicUrl) -> Self {
        self.public_url = Some(url);
        self
    }

    /// A handle on the secret list, to rotate secrets while the server runs.
    #[must_use]
    pub fn secrets(&self) -> Secrets {
        self.secrets.clone()
    }

    /// The source given to events (see [`Verifier::with_source`]).
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The scheme this verifier checks.
    #[must_use]
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Verifies one delivery: its headers and its body exactly as received.
    ///
    /// The cheapest rejections come first: the headers (present, well formed, a signature
    /// of the right length among them) and the timestamp's window — public knowledge, so
    /// a stale replay costs no HMAC. Then every signature in the header is compared, in
    /// constant time, with the MAC under every secret.
    ///
    /// # Errors
    ///
    /// A [`VerifyError`] saying what was wrong: a missing or malformed header, a
    /// timestamp outside the tolerance, or no matching signature.
    pub fn verify(&self, headers: &HeaderMap, body: Bytes) -> Result<Event, VerifyError> {
        self.verify_parts(None, headers, body)
    }

    /// Verifies one delivery with its method and URI, for schemes that sign them (Twilio,
    /// Square, HubSpot); the same as [`verify`](Self::verify) for the others.
    /// `VerifyWebhookLayer` calls this one.
    ///
    /// # Errors
    ///
    /// As [`verify`](Self::verify); and [`VerifyErrorKind::Misconfigured`] when the scheme signs
    /// the URL and no [`PublicUrl`] resolves it.
    pub fn verify_request(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        self.verify_parts(Some((method, uri)), headers, body)
    }

    fn verify_parts(
        &self,
        request: Option<(&Method, &Uri)>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        let scheme = &*self.scheme;
        if let Some(custom) = &scheme.custom {
            return self.verify_custom(custom, headers, body);
        }
        let checked = self.check_headers(headers)?;
        let template = &scheme.template;
        let mut input = Input {
            id: checked.id.map_or(&b""[..], HeaderValue::as_bytes),
            timestamp: checked.raw_timestamp.map_or(&b""[..], str::as_bytes),
            body: &body,
            method: request.map_or(&b"POST"[..], |(m, _)| m.as_str().as_bytes()),
            ..Input::default()
        };
        // The URL forms to try: the public URL, and for Twilio the same with its default
        // port written out or taken away.
        let mut urls: Vec<String> = Vec::new();
        if template.uses(&Part::Url) {
            let url = self
                .public_url
                .as_ref()
                .and_then(|u| u.resolve(request.map(|(_, uri)| uri), headers))
                .ok_or(VerifyError::new(
                    VerifyErrorKind::Misconfigured,
                    "the scheme signs the URL: give the verifier its PublicUrl",
                ))?;
            let toggled = scheme
                .url_port_variants
                .then(|| public_url::with_port_toggled(&url))
                .flatten();
            urls.push(url);
            urls.extend(toggled);
        }
        let body_sha256 = scheme
            .body_sha256_param
            .and_then(|param| public_url::query_param(urls.first()?, param));
        let form = match (template.uses(&Part::SortedForm), &body_sha256) {
            // A JSON delivery signs its URL only; its body is bound by `bodySHA256`.
            (true, None) => template::sorted_form(&body).ok_or(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "too many form fields to be a genuine delivery",
            ))?,
            _ => Vec::new(),
        };
        input.form = &form;
        // A snapshot of the list: no lock is held while hashing, so a rotation never
        // waits for verifications in flight.
        let keys = self.secrets.keys();
        // Where the delivery declares its hash (Twilio), each key is used as that hash only.
        let declared: Option<Vec<Key>> = checked
            .algorithm
            .map(|a| keys.iter().map(|k| k.as_declared(a)).collect());
        let keys: &[Key] = declared.as_deref().unwrap_or(&keys);
        let candidates = &checked.signatures.candidates;
        let matched = |input: &Input<'_>| {
            let pieces = template.pieces(input);
            keys.iter()
                .position(|key| candidates.matches(&scheme.formats, key, &pieces))
        };
        let secret_index = match urls.as_slice() {
            [] => matched(&input),
            urls => urls.iter().find_map(|url| {
                matched(&Input {
                    url: url.as_bytes(),
                    ..input
                })
            }),
        }
        .ok_or(VerifyError::new(
            VerifyErrorKind::InvalidSignature,
            "no signature matches any secret",
        ))?;
        let mut timestamp = checked.timestamp;
        if let Some(TimestampSource::BodyFieldMillis(field)) = scheme.timestamp {
            let ms = event::number_field(&body, field).ok_or(VerifyError::new(
                VerifyErrorKind::MalformedHeader,
                "the body has no timestamp field",
            ))?;
            let secs = ms.div_euclid(1000);
            self.tolerance
                .check(secs, timestamp::unix_seconds((self.clock)()))?;
            timestamp = Some(secs);
        }
        if let Some(TimestampSource::BodyFieldRfc3339IfPresent(field)) = scheme.timestamp {
            if let Some(raw) = event::string_field(&body, field) {
                let secs = timestamp::parse(&raw, TimestampFormat::Rfc3339)?;
                self.tolerance
                    .check(secs, timestamp::unix_seconds((self.clock)()))?;
                timestamp = Some(secs);
            }
        }
        // No signed id: key on the signed content, its timestamp left out. Where that is
        // the body alone, the event hashes it when first asked (verification-only users
        // never pay for it); the URL and form are gone by then, so those schemes hash now.
        let unsigned_id = checked.id.is_some() && !template.uses(&Part::Id);
        let signs_request = [Part::Url, Part::Method, Part::SortedForm]
            .iter()
            .any(|p| template.uses(p));
        let keyed_on_content = unsigned_id || matches!(scheme.id, IdSource::None);
        let content_digest = (keyed_on_content && signs_request).then(|| {
            // Keyed on the URL's canonical form: `Host: x` and `Host: x:443` both verify.
            let url = urls.first().map(|u| public_url::canonical(u));
            let pieces = template.pieces(&Input {
                url: url.as_deref().map_or(&b""[..], str::as_bytes),
                timestamp: b"",
                ..input
            });
            format!("sha256:{}", hex::encode(pieces.digest())).into_boxed_str()
        });
        if let Some(expected) = body_sha256 {
            use sha2::Digest as _;
            let actual = hex::encode(sha2::Sha256::digest(&body));
            if !actual.eq_ignore_ascii_case(&expected) {
                return Err(VerifyError::new(
                    VerifyErrorKind::InvalidSignature,
                    "the body does not match the signed bodySHA256",
                ));
            }
        }
        Ok(Event::new(event::Parts {
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            header_id: checked.id.cloned(),
            header_type: checked.event_type.cloned(),
            id_field: match scheme.id {
                IdSource::BodyField(field) => Some(field),
                _ => None,
            },
            type_field: scheme.type_field,
            // An id header outside the signed content proves nothing: key on the body.
            unsigned_id,
            content_digest,
            // An unsigned timestamp header bounds nothing: anyone can write a fresh one.
            kept: timestamp.is_none()
                || (scheme.unsigned_timestamp && !template.uses(&Part::Timestamp)),
            timestamp: timestamp.and_then(timestamp::to_system_time),
            body,
            secret_index,
            scheme: self.scheme.clone(),
        }))
    }

    /// The hex HMAC of `data` under the secret at `index` (Zoom's handshake answers with
    /// one); `None` when that key is not an HMAC secret or no longer in the list.
    pub(crate) fn mac_hex(&self, index: usize, data: &[u8]) -> Option<String> {
        let tag = self.secrets.keys().get(index)?.mac(&[data])?;
        Some(hex::encode(tag.as_bytes()))
    }
}

/// The build-time checks of a scheme (see [`Verifier::new`]).
fn check_scheme(scheme: Scheme) -> Result<Scheme, ConfigError> {
    match &scheme.custom {
        Some(Custom::Sns { topics }) if topics.is_empty() => {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "sns: give the topic ARNs this endpoint accepts (AWS signs every account's \
                 topics alike)",
            ))
        }
        Some(Custom::PayPal { webhook_id }) if webhook_id.trim().is_empty() => {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "paypal: give the webhook id PayPal assigned to this endpoint",
            ))
        }
        Some(_) => return Ok(scheme), // a preset verified by code of its own
        None => {}
    }
    // RSA signatures are longer than a signature header's buffers, and a shared token is
    // no signature: only the presets built for them use those.
    if scheme.formats.iter().any(|f| {
        matches!(
            f.algorithm,
            Algorithm::RsaSha1 | Algorithm::RsaSha256 | Algorithm::SharedToken
        )
    }) {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidValue,
            "RSA and shared-token algorithms are for the sns, paypal and microsoft_graph \
             presets only",
        ));
    }
    let template = &scheme.template;
    if template.uses(&Part::Id) && !matches!(scheme.id, IdSource::Header(_)) {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidTemplate,
            "the signed content has {id}, but the scheme reads no id header",
        ));
    }
    if template.uses(&Part::Timestamp) && scheme.timestamp.is_none() {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidTemplate,
            "the signed content has {timestamp}, but the scheme reads no timestamp",
        ));
    }
    // A header the signature does not cover proves nothing: say so at build time.
    if matches!(scheme.id, IdSource::Header(_)) && !template.uses(&Part::Id) && !scheme.unsigned_id
    {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidTemplate,
            "the scheme reads an id header the signed content does not cover (anyone can \
                 resend a delivery under a new id): add {id} to the signed content, or call \
                 Scheme::allow_unsigned_id() to deduplicate on the signed content instead",
        ));
    }
    if matches!(scheme.timestamp, Some(TimestampSource::Header(..)))
        && !template.uses(&Part::Timestamp)
        && !scheme.unsigned_timestamp
    {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidTemplate,
            "the scheme reads a timestamp header the signed content does not cover (a \
                 replay would carry a fresh one): add {timestamp} to the signed content, or \
                 call Scheme::allow_unsigned_timestamp()",
        ));
    }
    Ok(scheme)
}
impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme.name())
            .field("source", &self.source)
            .field("secrets", &self.secrets)
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

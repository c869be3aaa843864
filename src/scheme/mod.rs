//! Signature schemes: where a provider puts the signature, timestamp and id, which bytes
//! it signs, with which kind of key, and how it encodes the signature.
//!
//! Every scheme is described by the same handful of settings, so the presets and a
//! provider of your own ([`Scheme::hmac`], then `with_*`) all run through one verifier. A
//! key is a shared secret (HMAC-SHA1, -SHA256, -SHA512) or a public key (Ed25519, ECDSA
//! P-256, or RSA from a certificate), in the provider's own format; a signature header may carry several kinds at
//! once (Standard Webhooks' `v1,` and `v1a,`), each tried only against keys of its kind.
//!
//! | preset | signature header | signed bytes | key | event id |
//! |---|---|---|---|---|
//! | [`standard`](Scheme::standard) | `webhook-signature` (`svix-signature`): `v1,<base64>` / `v1a,<base64>` entries | `{id}.{timestamp}.{body}` | `whsec_` secret / `whpk_` Ed25519 key | `webhook-id` |
//! | [`stripe`](Scheme::stripe) | `Stripe-Signature: t=…,v1=<hex>,…` (all `v1` count) | `{timestamp}.{body}` | the secret string's bytes | body `id` |
//! | [`github`](Scheme::github) | `X-Hub-Signature-256: sha256=<hex>` | `{body}` | the secret string's bytes | digest |
//! | [`slack`](Scheme::slack) | `X-Slack-Signature: v0=<hex>` | `v0:{timestamp}:{body}` | the secret string's bytes | body `event_id` |
//! | [`shopify`](Scheme::shopify) | `X-Shopify-Hmac-Sha256: <base64>` | `{body}` | the secret string's bytes | digest |
//! | [`discord`](Scheme::discord) | `X-Signature-Ed25519: <hex>` | `{timestamp}{body}` | Ed25519 public key, hex | body `id` |
//! | [`sendgrid`](Scheme::sendgrid) | `X-Twilio-Email-Event-Webhook-Signature: <base64 DER>` | `{timestamp}{body}` | P-256 public key, base64 DER | digest |
//! | [`paddle`](Scheme::paddle) | `Paddle-Signature: ts=…;h1=<hex>` | `{timestamp}:{body}` | the secret string's bytes | body `event_id` |
//! | [`zoom`](Scheme::zoom) | `x-zm-signature: v0=<hex>` | `v0:{timestamp}:{body}` | the secret token's bytes | digest |
//! | [`meta`](Scheme::meta) | `X-Hub-Signature-256: sha256=<hex>` | `{body}` | the app secret's bytes | digest |
//! | [`intercom`](Scheme::intercom) | `X-Hub-Signature: sha1=<hex>` (HMAC-SHA1) | `{body}` | the client secret's bytes | body `id` |
//! | [`twitch`](Scheme::twitch) | `Twitch-Eventsub-Message-Signature: sha256=<hex>` | `{id}{timestamp}{body}` | the secret's bytes | `Twitch-Eventsub-Message-Id` |
//! | [`twilio`](Scheme::twilio) | `X-Twilio-Signature: <base64>` (HMAC-SHA1) | `{url}` + sorted form fields | the auth token's bytes | digest |
//! | [`square`](Scheme::square) | `x-square-hmacsha256-signature: <base64>` | `{url}{body}` | the key's bytes | body `event_id` |
//! | [`hubspot`](Scheme::hubspot) | `X-HubSpot-Signature-v3: <base64>` | `{method}{url}{body}{timestamp}` | the client secret's bytes | digest |
//! | [`linear`](Scheme::linear) | `Linear-Signature: <hex>` | `{body}` (timestamp inside) | the secret's bytes | digest |
//! | [`mailgun`](Scheme::mailgun) | in the body: `signature.signature` (hex) | `signature.timestamp` + `signature.token` | the signing key's bytes | the token |
//! | [`sns`](Scheme::sns) | in the body: `Signature` (base64 RSA, SHA-1 or SHA-256) | `Name\nValue\n` of the message's fields for its `Type` | the certificate (PEM), fetched or pinned | body `MessageId` |
//! | [`paypal`](Scheme::paypal) | `PAYPAL-TRANSMISSION-SIG: <base64>` (RSA-SHA256) | `{transmission id}\|{time}\|{webhook id}\|{crc32 of body}` | the certificate (PEM), fetched or pinned | body `id` |
//! | [`microsoft_graph`](Scheme::microsoft_graph) | none: each notification's `clientState` | — | the client state | digest |
//!
//! "Digest": the provider signs no event id, so deliveries are deduplicated on a digest of
//! the signed content ([`Event::dedupe_id`](crate::Event::dedupe_id)).
//!
//! Each scheme can also [`sign`](Scheme::sign), to build valid deliveries in tests.
//!
//! ```
//! use http::HeaderName;
//! use tower_webhook::scheme::{Encoding, Scheme, TimestampFormat};
//!
//! // A provider that sends `X-Payment-Signature: <hex>` over `{timestamp}.{body}`,
//! // with an RFC 3339 `X-Payment-Timestamp` and the event id in `X-Payment-Event-Id`.
//! let scheme = Scheme::hmac(HeaderName::from_static("x-payment-signature"))
//!     .with_encoding(Encoding::Hex)
//!     .with_timestamp_header(
//!         HeaderName::from_static("x-payment-timestamp"),
//!         TimestampFormat::Rfc3339,
//!     )
//!     .with_id_header(HeaderName::from_static("x-payment-event-id"))
//!     .with_signed_content("{timestamp}.{body}")?;
//! # Ok::<(), tower_webhook::ConfigError>(())
//! ```

pub(crate) mod declared;
pub(crate) mod key;
mod presets;
mod sign;
pub(crate) mod signature;
pub(crate) mod template;

use std::borrow::Cow;
use std::sync::Arc;

use http::HeaderName;

use crate::error::ConfigError;
pub use key::Algorithm;
pub(crate) use key::Key;
use template::Template;

/// How a scheme encodes the MAC or signature in its signature header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// Lower- or upper-case hexadecimal (64 characters for HMAC-SHA256).
    Hex,
    /// Standard base64 with padding (44 characters for HMAC-SHA256).
    Base64,
}

/// One kind of entry a signature header carries: its prefix, encoding and algorithm, and
/// how keys for it are told apart in a mixed key list.
#[derive(Debug, Clone)]
pub(crate) struct Format {
    pub(crate) prefix: Cow<'static, str>,
    pub(crate) encoding: Encoding,
    pub(crate) algorithm: Algorithm,
    /// A verifying key for this format must start with this (`whpk_`).
    pub(crate) key_prefix: Option<&'static str>,
    /// A signing key for this format must start with this (`whsk_`).
    pub(crate) signing_key_prefix: Option<&'static str>,
}

impl Format {
    pub(crate) const fn new(
        prefix: &'static str,
        encoding: Encoding,
        algorithm: Algorithm,
    ) -> Self {
        Self {
            prefix: Cow::Borrowed(prefix),
            encoding,
            algorithm,
            key_prefix: None,
            signing_key_prefix: None,
        }
    }
}

/// How a timestamp header is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimestampFormat {
    /// Whole seconds since the Unix epoch, ASCII digits only.
    Unix,
    /// An RFC 3339 date and time, such as `2026-11-30T05:11:31Z`.
    Rfc3339,
    /// Whole milliseconds since the Unix epoch, ASCII digits only (HubSpot).
    UnixMillis,
}

/// How a secret string becomes the HMAC key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretEncoding {
    /// The secret string's own bytes are the key (Stripe, GitHub, Slack, Shopify).
    Raw,
    /// Strict base64, after an optional `whsec_` prefix (Standard Webhooks, Svix).
    Base64,
}

/// Where the timestamp comes from.
#[derive(Debug, Clone)]
pub(crate) enum TimestampSource {
    /// A header of its own.
    Header(Vec<HeaderName>, TimestampFormat),
    /// An entry of the signature header with this prefix, such as Stripe's `t=`.
    SignatureEntry(Cow<'static, str>),
    /// A top-level number of the signed JSON body, in milliseconds (Linear's
    /// `webhookTimestamp`): checked once the signature is.
    BodyFieldMillis(&'static str),
    /// A top-level RFC 3339 string of the signed JSON body (Square's `created_at`),
    /// checked once the signature is, when the body has it. A body without it has no
    /// signed time: its dedupe key is kept until pruned by name.
    BodyFieldRfc3339IfPresent(&'static str),
}

/// Where the event id comes from.
#[derive(Debug, Clone)]
pub(crate) enum IdSource {
    None,
    /// A header (the first present of these aliases).
    Header(Vec<HeaderName>),
    /// A top-level string field of the verified JSON body.
    BodyField(&'static str),
}

/// A signature scheme. See the [module docs](self).
///
/// Build one from a preset or from [`Scheme::hmac`]; settings are checked when a
/// [`Verifier`](crate::Verifier) is built from it.
#[derive(Debug, Clone)]
pub struct Scheme {
    pub(crate) name: Cow<'static, str>,
    pub(crate) signature_headers: Vec<HeaderName>,
    pub(crate) separator: Option<char>,
    /// The kinds of entry the signature header may carry; the first is the one the
    /// `with_prefix`, `with_encoding` and `with_algorithm` builders set.
    pub(crate) formats: Vec<Format>,
    pub(crate) timestamp: Option<TimestampSource>,
    pub(crate) id: IdSource,
    /// The type header (the first present of these aliases); none when empty.
    pub(crate) type_header: Vec<HeaderName>,
    /// The body field the type is read from when there is no type header.
    pub(crate) type_field: &'static str,
    pub(crate) template: Template,
    pub(crate) secret_encoding: SecretEncoding,
    pub(crate) min_secret_len: usize,
    /// An id header the signed content does not cover is accepted (keyed on a digest).
    pub(crate) unsigned_id: bool,
    /// A timestamp header the signed content does not cover is accepted (no replay
    /// protection from it).
    pub(crate) unsigned_timestamp: bool,
    /// The provider's set-up handshake, answered by `VerifyWebhookLayer`.
    pub(crate) handshake: Option<Handshake>,
    /// Failed authentication is answered 401, not 400 (Discord checks for it).
    pub(crate) unauthorized: bool,
    /// The body limit `VerifyWebhookLayer` starts from (1 MiB; GitHub 25 MiB).
    pub(crate) max_body: usize,
    /// The timestamp window the provider asks for, both ways (Twitch 10 min, Linear
    /// 1 min); the verifier's default (300 s) where `None`.
    pub(crate) tolerance: Option<std::time::Duration>,
    /// A header in which the sender declares which HMAC hash it signed with (Twilio's
    /// signature settings): only the formats' algorithms are accepted, and no declaration
    /// means HMAC-SHA1 (see `declared.rs`).
    pub(crate) algorithm_header: Option<HeaderName>,
    /// The signed URL may carry its scheme's default port or not (Twilio).
    pub(crate) url_port_variants: bool,
    /// A URL query parameter holding the hex SHA-256 of the body, checked once the URL's
    /// signature is (Twilio's `bodySHA256` for JSON bodies).
    pub(crate) body_sha256_param: Option<&'static str>,
    /// A provider whose signature does not fit the header-and-template mould, verified
    /// by code of its own (`verifier/custom.rs`).
    pub(crate) custom: Option<Custom>,
}

/// The providers verified by code of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Custom {
    /// `{"signature":{"timestamp":…,"token":…,"signature":<hex>},…}`: the HMAC of
    /// timestamp + token; the token is the signed id.
    Mailgun,
    /// AWS SNS: chosen fields of the JSON body, signed with RSA under the certificate at
    /// its `SigningCertURL`; only these topics are accepted.
    Sns { topics: Arc<[String]> },
    /// PayPal: RSA-SHA256 over `transmission id|transmission time|webhook id|crc32(body)`,
    /// under the certificate at `PAYPAL-CERT-URL`.
    PayPal { webhook_id: Arc<str> },
    /// Microsoft Graph: no signature; each notification carries the subscription's
    /// `clientState` secret.
    Graph,
}

impl Custom {
    /// Whether its keys are certificates fetched from a URL in the delivery.
    pub(crate) fn uses_certificates(&self) -> bool {
        matches!(self, Self::Sns { .. } | Self::PayPal { .. })
    }
}

/// A provider's set-up handshake: a request that proves the endpoint to the provider, and
/// that `VerifyWebhookLayer` answers itself, before deduplication and the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handshake {
    /// `url_verification`, signed: answered with its `challenge` as text.
    Slack,
    /// `endpoint.url_validation`, signed: `plainToken` and its HMAC as `encryptedToken`.
    Zoom,
    /// A PING (`type` 1), signed: answered `{"type":1}`.
    Discord,
    /// `webhook_callback_verification`, signed: answered with its `challenge` as text.
    Twitch,
    /// `GET ?hub.mode=subscribe&hub.verify_token=…&hub.challenge=…`, unsigned: the
    /// challenge when the verify token matches, else 403.
    Meta,
    /// `POST ?validationToken=…`, unsigned: the token as text (Microsoft Graph).
    Graph,
    /// A `SubscriptionConfirmation` message, signed: its `SubscribeURL` is visited (AWS
    /// SNS).
    Sns,
}

/// The body limit of a layer built for a scheme that sets none: 1 MiB.
const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// Shorter keys than this are refused unless [`Scheme::with_min_secret_len`] lowers it.
const DEFAULT_MIN_SECRET_LEN: usize = 16;

impl Scheme {
    /// A configurable HMAC-SHA256 scheme whose signature is in `signature_header`.
    ///
    /// Defaults: hex, no prefix, one signature per header, signed content `{body}`, the
    /// secret string's bytes as the key, no timestamp and no id. Change them with the
    /// `with_*` methods.
    #[must_use]
    pub fn hmac(signature_header: HeaderName) -> Self {
        Self {
            name: Cow::Borrowed("hmac"),
            signature_headers: vec![signature_header],
            separator: None,
            formats: vec![Format::new("", Encoding::Hex, Algorithm::HmacSha256)],
            timestamp: None,
            id: IdSource::None,
            type_header: Vec::new(),
            type_field: "type",
            template: Template::parse("{body}").expect("static template"),
            secret_encoding: SecretEncoding::Raw,
            min_secret_len: DEFAULT_MIN_SECRET_LEN,
            unsigned_id: false,
            unsigned_timestamp: false,
            handshake: None,
            unauthorized: false,
            max_body: DEFAULT_MAX_BODY,
            tolerance: None,
            algorithm_header: None,
            url_port_variants: false,
            body_sha256_param: None,
            custom: None,
        }
    }

    /// The scheme's name, the default [`Event::source`](crate::Event::source).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether its provider sends GET as well as POST: Meta's handshake; Twilio, whose
    /// webhooks may be set to GET (the form fields then in the signed URL); and schemes
    /// that sign the method (HubSpot's workflows may GET). The verify layer answers other
    /// methods 405.
    pub(crate) fn takes_get(&self) -> bool {
        self.handshake == Some(Handshake::Meta)
            || self.template.uses(&template::Part::SortedForm)
            || self.template.uses(&template::Part::Method)
    }

    /// Replaces the scheme's name (the default event source).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Replaces how the MAC is encoded.
    #[must_use]
    pub fn with_encoding(mut self, encoding: Encoding) -> Self {
        self.formats[0].encoding = encoding;
        self
    }

    /// Replaces the algorithm (default HMAC-SHA256). With a public-key algorithm, the
    /// verifier takes the provider's public key where it took a secret: Ed25519 as 32
    /// bytes in hex or base64; P-256 as base64 DER, PEM or SEC1 hex.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.formats[0].algorithm = algorithm;
        self
    }

    /// Replaces the text before each encoded MAC, such as `sha256=` or `v1,`. Entries with
    /// another prefix are ignored, so other versions can share the header.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.formats[0].prefix = prefix.into();
        self
    }

    /// Lets the signature header carry several entries separated by `separator` (for
    /// senders that sign with several secrets during a rotation).
    #[must_use]
    pub fn with_separator(mut self, separator: char) -> Self {
        self.separator = Some(separator);
        self
    }

    /// Reads a signed timestamp from `header`; it is checked against the tolerance.
    #[must_use]
    pub fn with_timestamp_header(mut self, header: HeaderName, format: TimestampFormat) -> Self {
        self.timestamp = Some(TimestampSource::Header(vec![header], format));
        self
    }

    /// Reads the event id from `header`.
    #[must_use]
    pub fn with_id_header(mut self, header: HeaderName) -> Self {
        self.id = IdSource::Header(vec![header]);
        self
    }

    /// Reads the event id from a top-level field of the verified JSON body.
    #[must_use]
    pub fn with_id_field(mut self, field: &'static str) -> Self {
        self.id = IdSource::BodyField(field);
        self
    }

    /// Reads the event type from `header` instead of the body's `type` field.
    #[must_use]
    pub fn with_type_header(mut self, header: HeaderName) -> Self {
        self.type_header = vec![header];
        self
    }

    /// Replaces the body limit a `VerifyWebhookLayer` built for this scheme starts with
    /// (1 MiB; GitHub's preset 25 MiB, the most GitHub sends).
    #[must_use]
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Replaces the timestamp window a verifier of this scheme starts with, both ways
    /// (default 300 s; Twitch's preset 10 min, Linear's 1 min).
    /// [`Verifier::with_tolerance`](crate::Verifier::with_tolerance) overrides it.
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: std::time::Duration) -> Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// Reads the event type from a top-level field of the verified JSON body (default
    /// `type`) instead of a header. Unlike a type header, the signature covers it.
    #[must_use]
    pub fn with_type_field(mut self, field: &'static str) -> Self {
        self.type_field = field;
        self.type_header = Vec::new();
        self
    }

    /// Replaces how a secret string becomes the key.
    #[must_use]
    pub fn with_secret_encoding(mut self, encoding: SecretEncoding) -> Self {
        self.secret_encoding = encoding;
        self
    }

    /// Replaces the shortest key accepted, in bytes after decoding (default 16; 24 for
    /// Standard Webhooks, as its spec requires). Lower it only for a provider that issues
    /// short secrets.
    #[must_use]
    pub fn with_min_secret_len(mut self, bytes: usize) -> Self {
        self.min_secret_len = bytes.max(1);
        self
    }

    /// Accepts an id header ([`with_id_header`](Self::with_id_header)) that the signed
    /// content does not cover, for providers that sign the body only (GitHub, Shopify).
    /// Anyone who captured a delivery can resend it under a new id, so deliveries are
    /// then deduplicated on a digest of the signed content
    /// ([`Event::dedupe_id`](crate::Event::dedupe_id)). Without it, such a scheme is a
    /// [`ConfigError`] when the verifier is built.
    #[must_use]
    pub fn allow_unsigned_id(mut self) -> Self {
        self.unsigned_id = true;
        self
    }

    /// Accepts a timestamp header ([`with_timestamp_header`](Self::with_timestamp_header))
    /// that the signed content does not cover. Its window then stops nothing: a replay
    /// carries a fresh timestamp of the attacker's choosing. Without it, such a scheme is
    /// a [`ConfigError`] when the verifier is built.
    #[must_use]
    pub fn allow_unsigned_timestamp(mut self) -> Self {
        self.unsigned_timestamp = true;
        self
    }

    /// Replaces the signed content: literal text with the placeholders `{id}`,
    /// `{timestamp}` and `{body}`; `{body}` exactly once, and literal text between any two
    /// placeholders (`{id}{body}` would sign `evt_1` + `{…}` and `evt_` + `1{…}` alike).
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidTemplate`](crate::ConfigErrorKind::InvalidTemplate) when
    /// the template does not parse.
    pub fn with_signed_content(mut self, template: &str) -> Result<Self, ConfigError> {
        self.template = Template::parse(template)?;
        Ok(self)
    }
}

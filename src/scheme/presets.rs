//! The providers' schemes, as settings of the one HMAC mechanism.

use std::borrow::Cow;
use std::str::FromStr;

use http::HeaderName;

use super::template::Template;
use crate::error::{ConfigError, ConfigErrorKind};

use super::{Encoding, IdSource, Scheme, SecretEncoding, TimestampFormat, TimestampSource};

fn template(text: &str) -> Template {
    Template::parse(text).expect("preset templates are valid")
}

impl Scheme {
    /// [Standard Webhooks](https://www.standardwebhooks.com/) and Svix: `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature` (or their `svix-*` aliases); the
    /// signature header holds space-separated `v1,<base64>` entries over
    /// `{id}.{timestamp}.{body}`; secrets are `whsec_` + base64 of at least 24 bytes.
    #[must_use]
    pub fn standard() -> Self {
        Self {
            name: Cow::Borrowed("standard"),
            signature_headers: vec![
                HeaderName::from_static("webhook-signature"),
                HeaderName::from_static("svix-signature"),
            ],
            separator: Some(' '),
            prefix: Cow::Borrowed("v1,"),
            encoding: Encoding::Base64,
            timestamp: Some(TimestampSource::Header(
                vec![
                    HeaderName::from_static("webhook-timestamp"),
                    HeaderName::from_static("svix-timestamp"),
                ],
                TimestampFormat::Unix,
            )),
            id: IdSource::Header(vec![
                HeaderName::from_static("webhook-id"),
                HeaderName::from_static("svix-id"),
            ]),
            type_header: None,
            template: template("{id}.{timestamp}.{body}"),
            secret_encoding: SecretEncoding::Base64,
            min_secret_len: 24,
            unsigned_id: false,
            unsigned_timestamp: false,
        }
    }

    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…][,v0=…]` over
    /// `{t}.{body}`. Every `v1` entry counts (Stripe sends one per active secret while
    /// you roll a secret); `v0` is ignored. The key is the secret string's bytes,
    /// `whsec_` included. The event id is the body's `id` (`evt_…`).
    #[must_use]
    pub fn stripe() -> Self {
        Self {
            name: Cow::Borrowed("stripe"),
            signature_headers: vec![HeaderName::from_static("stripe-signature")],
            separator: Some(','),
            prefix: Cow::Borrowed("v1="),
            encoding: Encoding::Hex,
            timestamp: Some(TimestampSource::SignatureEntry(Cow::Borrowed("t="))),
            id: IdSource::BodyField("id"),
            type_header: None,
            template: template("{timestamp}.{body}"),
            secret_encoding: SecretEncoding::Raw,
            min_secret_len: super::DEFAULT_MIN_SECRET_LEN,
            unsigned_id: false,
            unsigned_timestamp: false,
        }
    }

    /// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body; the id is
    /// `X-GitHub-Delivery` and the type `X-GitHub-Event`. GitHub signs neither of those
    /// headers, nor a timestamp: a captured delivery verifies forever under any delivery
    /// id. So deliveries are deduplicated on a digest of the signed body
    /// ([`Event::dedupe_id`](crate::Event::dedupe_id)), not on the id, and the type
    /// header is [not signed](crate::Event::type_is_signed).
    #[must_use]
    pub fn github() -> Self {
        Self::hmac(HeaderName::from_static("x-hub-signature-256"))
            .with_name("github")
            .with_prefix("sha256=")
            .with_id_header(HeaderName::from_static("x-github-delivery"))
            .allow_unsigned_id()
            .with_type_header(HeaderName::from_static("x-github-event"))
    }

    /// Slack: `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{body}` with
    /// `X-Slack-Request-Timestamp`; the id is the body's `event_id` (Events API).
    #[must_use]
    pub fn slack() -> Self {
        Self {
            template: template("v0:{timestamp}:{body}"),
            ..Self::hmac(HeaderName::from_static("x-slack-signature"))
                .with_name("slack")
                .with_prefix("v0=")
                .with_timestamp_header(
                    HeaderName::from_static("x-slack-request-timestamp"),
                    TimestampFormat::Unix,
                )
                .with_id_field("event_id")
        }
    }

    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>` over the body; the id is
    /// `X-Shopify-Webhook-Id` and the type `X-Shopify-Topic`. Shopify signs no timestamp.
    #[must_use]
    pub fn shopify() -> Self {
        Self::hmac(HeaderName::from_static("x-shopify-hmac-sha256"))
            .with_name("shopify")
            .with_encoding(Encoding::Base64)
            .with_id_header(HeaderName::from_static("x-shopify-webhook-id"))
            .allow_unsigned_id()
            .with_type_header(HeaderName::from_static("x-shopify-topic"))
    }
}

/// A preset by name: `standard` (or `svix`), `stripe`, `github`, `slack`, `shopify` — for
/// configuration read from the environment.
///
/// ```
/// use tower_webhook::Scheme;
/// let scheme: Scheme = "stripe".parse()?;
/// assert_eq!(scheme.name(), "stripe");
/// assert!("paypal".parse::<Scheme>().is_err());
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
impl FromStr for Scheme {
    type Err = ConfigError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "standard" | "standard-webhooks" | "svix" => Ok(Self::standard()),
            "stripe" => Ok(Self::stripe()),
            "github" => Ok(Self::github()),
            "slack" => Ok(Self::slack()),
            "shopify" => Ok(Self::shopify()),
            _ => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                format!("unknown scheme {name:?}: use standard, stripe, github, slack or shopify"),
            )),
        }
    }
}

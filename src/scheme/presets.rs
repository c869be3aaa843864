//! The providers' schemes, as settings of the one mechanism: where each provider puts its
//! signature, timestamp, id and type, what it signs, and with which key kind.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use http::HeaderName;

use super::template::{Part, Template};
use crate::error::{ConfigError, ConfigErrorKind};

use super::{
    Algorithm, Custom, Encoding, Format, Handshake, IdSource, Scheme, SecretEncoding,
    TimestampFormat, TimestampSource,
};

fn template(text: &str) -> Template {
    Template::parse(text).expect("preset templates are valid")
}

/// A template whose placeholders touch, as its provider signs it. Each caller says why the
/// split between the pieces is still unambiguous.
fn adjacent(text: &str) -> Template {
    Template::parse_adjacent(text).expect("preset templates are valid")
}

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

impl Scheme {
    /// [Standard Webhooks](https://www.standardwebhooks.com/) and Svix: `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature` (or their `svix-*` aliases); the
    /// signature header holds space-separated entries over `{id}.{timestamp}.{body}`:
    /// `v1,<base64>` (HMAC-SHA256, secrets `whsec_` + base64 of at least 24 bytes, its `=`
    /// padding optional as in the Standard Webhooks SDKs) and `v1a,<base64>` (Ed25519,
    /// public keys `whpk_` + base64). A key list may mix both; a bare 32-byte key, in
    /// base64 or hex, is refused until its prefix says which it is (as a secret, a public
    /// key would let anyone sign).
    #[must_use]
    pub fn standard() -> Self {
        let mut ed25519 = Format::new("v1a,", Encoding::Base64, Algorithm::Ed25519);
        ed25519.key_prefix = Some("whpk_");
        ed25519.signing_key_prefix = Some("whsk_");
        Self {
            name: Cow::Borrowed("standard"),
            signature_headers: vec![header("webhook-signature"), header("svix-signature")],
            separator: Some(' '),
            formats: vec![
                Format::new("v1,", Encoding::Base64, Algorithm::HmacSha256),
                ed25519,
            ],
            timestamp: Some(TimestampSource::Header(
                vec![header("webhook-timestamp"), header("svix-timestamp")],
                TimestampFormat::Unix,
            )),
            id: IdSource::Header(vec![header("webhook-id"), header("svix-id")]),
            template: template("{id}.{timestamp}.{body}"),
            secret_encoding: SecretEncoding::Base64,
            min_secret_len: 24,
            ..Self::hmac(header("webhook-signature"))
        }
    }

    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…][,v0=…]` over
    /// `{t}.{body}`. Every `v1` entry counts (Stripe sends one per active secret while
    /// you roll a secret); `v0` is ignored. The key is the secret string's bytes,
    /// `whsec_` included. The event id is the body's `id` (`evt_…`).
    #[must_use]
    pub fn stripe() -> Self {
        Self {
            separator: Some(','),
            timestamp: Some(TimestampSource::SignatureEntry(Cow::Borrowed("t="))),
            template: template("{timestamp}.{body}"),
            ..Self::hmac(header("stripe-signature"))
                .with_name("stripe")
                .with_prefix("v1=")
                .with_id_field("id")
        }
    }

    /// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body; the id is
    /// `X-GitHub-Delivery` and the type `X-GitHub-Event`. GitHub signs neither of those
    /// headers, nor a timestamp: a captured delivery verifies forever under any delivery
    /// id. So deliveries are deduplicated on a digest of the signed body
    /// ([`Event::dedupe_id`](crate::Event::dedupe_id)), not on the id, and the type
    /// header is [not signed](crate::Event::type_is_signed). Payloads reach 25 MB: give
    /// the layer a limit to match (see `VerifyWebhookLayer::with_limit`).
    #[must_use]
    pub fn github() -> Self {
        Self::hmac(header("x-hub-signature-256"))
            .with_name("github")
            .with_prefix("sha256=")
            .with_id_header(header("x-github-delivery"))
            .allow_unsigned_id()
            .with_type_header(header("x-github-event"))
            .with_max_body(25 * 1024 * 1024)
    }

    /// Slack: `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{body}` with
    /// `X-Slack-Request-Timestamp`; the id is the body's `event_id` (Events API).
    #[must_use]
    pub fn slack() -> Self {
        Self {
            template: template("v0:{timestamp}:{body}"),
            handshake: Some(Handshake::Slack),
            ..Self::hmac(header("x-slack-signature"))
                .with_name("slack")
                .with_prefix("v0=")
                .with_timestamp_header(header("x-slack-request-timestamp"), TimestampFormat::Unix)
                .with_id_field("event_id")
        }
    }

    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>` over the body; the id is
    /// `X-Shopify-Webhook-Id` and the type `X-Shopify-Topic`, neither signed. Shopify signs
    /// no timestamp. The same headers without `X-` (`shopify-hmac-sha256`,
    /// `shopify-webhook-id`, `shopify-topic`), which `@shopify/shopify-api` 15 sends and
    /// reads, are accepted too; where both are present the `X-` one is read.
    #[must_use]
    pub fn shopify() -> Self {
        Self {
            signature_headers: vec![
                header("x-shopify-hmac-sha256"),
                header("shopify-hmac-sha256"),
            ],
            id: IdSource::Header(vec![
                header("x-shopify-webhook-id"),
                header("shopify-webhook-id"),
            ]),
            type_header: vec![header("x-shopify-topic"), header("shopify-topic")],
            ..Self::hmac(header("x-shopify-hmac-sha256"))
                .with_name("shopify")
                .with_encoding(Encoding::Base64)
                .allow_unsigned_id()
        }
    }

    /// Discord interactions: `X-Signature-Ed25519: <hex>`, an Ed25519 signature over
    /// `{X-Signature-Timestamp}{body}` with the application's public key (hex, from the
    /// Developer Portal). The id is the body's `id`, the type its `type` (`1` is the PING
    /// that the layer answers). Discord wants 401 for a bad signature, and checks it.
    ///
    /// The timestamp and body touch; the timestamp is unix seconds (digits only) and the
    /// body JSON, which starts with `{`, so the split is unambiguous.
    #[must_use]
    pub fn discord() -> Self {
        Self {
            template: adjacent("{timestamp}{body}"),
            handshake: Some(Handshake::Discord),
            unauthorized: true,
            ..Self::hmac(header("x-signature-ed25519"))
                .with_name("discord")
                .with_algorithm(Algorithm::Ed25519)
                .with_timestamp_header(header("x-signature-timestamp"), TimestampFormat::Unix)
                .with_id_field("id")
        }
    }

    /// SendGrid's signed Event Webhook: `X-Twilio-Email-Event-Webhook-Signature`, base64 of
    /// a DER ECDSA P-256 / SHA-256 signature over
    /// `{X-Twilio-Email-Event-Webhook-Timestamp}{body}`, with the verification key from
    /// the dashboard (base64 DER). A delivery is a JSON array of events, each with its
    /// `sg_event_id`; there is no delivery id, so deliveries are deduplicated on a digest
    /// of the signed content.
    ///
    /// The timestamp (digits) and the body (a JSON array, `[`) touch unambiguously.
    #[must_use]
    pub fn sendgrid() -> Self {
        Self {
            template: adjacent("{timestamp}{body}"),
            ..Self::hmac(header("x-twilio-email-event-webhook-signature"))
                .with_name("sendgrid")
                .with_algorithm(Algorithm::EcdsaP256)
                .with_encoding(Encoding::Base64)
                .with_timestamp_header(
                    header("x-twilio-email-event-webhook-timestamp"),
                    TimestampFormat::Unix,
                )
        }
    }

    /// Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>` over `{ts}:{body}` with the
    /// endpoint's secret key; the id is the body's `event_id`, the type its `event_type`.
    /// Paddle's SDKs allow 5 s of skew; the verifier's default is 300 s.
    #[must_use]
    pub fn paddle() -> Self {
        Self {
            separator: Some(';'),
            timestamp: Some(TimestampSource::SignatureEntry(Cow::Borrowed("ts="))),
            template: template("{timestamp}:{body}"),
            ..Self::hmac(header("paddle-signature"))
                .with_name("paddle")
                .with_prefix("h1=")
                .with_id_field("event_id")
                .with_type_field("event_type")
        }
    }

    /// Zoom: `x-zm-signature: v0=<hex>` over `v0:{x-zm-request-timestamp}:{body}` with the
    /// app's secret token. Zoom sends no event id: deliveries are deduplicated on a digest
    /// of the signed content. The type is the body's `event`; `endpoint.url_validation` is
    /// the handshake the layer answers.
    #[must_use]
    pub fn zoom() -> Self {
        Self {
            template: template("v0:{timestamp}:{body}"),
            handshake: Some(Handshake::Zoom),
            ..Self::hmac(header("x-zm-signature"))
                .with_name("zoom")
                .with_prefix("v0=")
                .with_timestamp_header(header("x-zm-request-timestamp"), TimestampFormat::Unix)
                .with_type_field("event")
        }
    }

    /// Meta (WhatsApp, Instagram, Messenger): `X-Hub-Signature-256: sha256=<hex>` over the
    /// body with the app secret. No id and no timestamp are signed: deliveries are
    /// deduplicated on a digest of the body. The type is the body's `object`. The `GET
    /// ?hub.challenge` handshake is answered with a verify token
    /// (`VerifyWebhookLayer::with_meta_verify_token`).
    #[must_use]
    pub fn meta() -> Self {
        Self {
            handshake: Some(Handshake::Meta),
            ..Self::hmac(header("x-hub-signature-256"))
                .with_name("meta")
                .with_prefix("sha256=")
                .with_type_field("object")
        }
    }

    /// Intercom: `X-Hub-Signature: sha1=<hex>`, HMAC-SHA1 over the body with the app's
    /// client secret; the id is the body's `id` (`notif_…`), the type its `topic`. No
    /// timestamp is signed.
    #[must_use]
    pub fn intercom() -> Self {
        Self::hmac(header("x-hub-signature"))
            .with_name("intercom")
            .with_prefix("sha1=")
            .with_algorithm(Algorithm::HmacSha1)
            .with_id_field("id")
            .with_type_field("topic")
    }

    /// Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>` over
    /// `{Twitch-Eventsub-Message-Id}{Twitch-Eventsub-Message-Timestamp}{body}` with the
    /// subscription's secret; the timestamp is RFC 3339 (Twitch asks for a 10-minute
    /// window). The type header `Twitch-Eventsub-Subscription-Type` is not signed.
    /// `webhook_callback_verification` is the handshake the layer answers.
    ///
    /// The pieces touch: the id is a UUID (36 characters) and the timestamp ends at its
    /// `Z` or offset, before the body's `{`, so the split is unambiguous.
    #[must_use]
    pub fn twitch() -> Self {
        Self {
            template: adjacent("{id}{timestamp}{body}"),
            handshake: Some(Handshake::Twitch),
            ..Self::hmac(header("twitch-eventsub-message-signature"))
                .with_name("twitch")
                .with_prefix("sha256=")
                .with_timestamp_header(
                    header("twitch-eventsub-message-timestamp"),
                    TimestampFormat::Rfc3339,
                )
                .with_id_header(header("twitch-eventsub-message-id"))
                .with_type_header(header("twitch-eventsub-subscription-type"))
                .with_tolerance(Duration::from_secs(600))
        }
    }
}

impl Scheme {
    /// Twilio: `X-Twilio-Signature: <base64>`, an HMAC over the public URL followed by the
    /// form fields sorted by name, each as name + value. A JSON delivery signs its URL
    /// only, which carries `bodySHA256=<hex>` of the body; that is checked too. The URL is
    /// signed with or without its default port (both are tried, as Twilio's SDKs do).
    /// Twilio signs no id and no timestamp: deliveries are deduplicated on a digest of the
    /// signed content, its URL in canonical form (lower-case scheme and host, no default
    /// port). Needs [`Verifier::with_public_url`](crate::Verifier::with_public_url).
    ///
    /// The hash is what the delivery declares in `X-Twilio-Webhooks-Signature-Settings`
    /// (`key=…,algorithm=HMAC_SHA256` for a SharedKey with SHA-256, as Twilio's SDKs read
    /// it): HMAC-SHA256 when it says so, HMAC-SHA1 (the auth token's signature) when the
    /// header is absent or says `HMAC_SHA1`; an unknown algorithm is refused. Give the
    /// auth token or the SharedKey secret (or both) as the secrets. Once every webhook
    /// signs with SHA-256, use [`Scheme::twilio_sha256`], which refuses SHA-1.
    ///
    /// # Security
    ///
    /// Twilio's signed string is ambiguous by Twilio's design: fields are concatenated as
    /// name + value with nothing between them, so `a=bc` and `ab=c` sign alike, and the
    /// URL's query is not separated from the fields. A delivery whose fields are split
    /// another way verifies under the same signature (and its digest is a new dedupe
    /// key). Read fields by the names you expect and treat what you act on with that in
    /// mind; the signature cannot tell more than Twilio put in it.
    #[must_use]
    pub fn twilio() -> Self {
        Self {
            template: Template::from_parts(vec![Part::Url, Part::SortedForm]),
            url_port_variants: true,
            body_sha256_param: Some("bodySHA256"),
            formats: vec![
                Format::new("", Encoding::Base64, Algorithm::HmacSha1),
                Format::new("", Encoding::Base64, Algorithm::HmacSha256),
            ],
            algorithm_header: Some(header("x-twilio-webhooks-signature-settings")),
            ..Self::hmac(header("x-twilio-signature")).with_name("twilio")
        }
    }

    /// Twilio with a SharedKey signing with HMAC-SHA256 only: as [`Scheme::twilio`], but a
    /// delivery must declare `algorithm=HMAC_SHA256` in
    /// `X-Twilio-Webhooks-Signature-Settings`; one that declares SHA-1 or nothing is
    /// refused, so a captured or forged request cannot fall back to the auth token's
    /// SHA-1 signature. The secret is the SharedKey's.
    #[must_use]
    pub fn twilio_sha256() -> Self {
        Self {
            formats: vec![Format::new("", Encoding::Base64, Algorithm::HmacSha256)],
            ..Self::twilio()
        }
    }

    /// Square: `x-square-hmacsha256-signature: <base64>` over the notification URL
    /// followed by the body, with the subscription's signature key (its bytes, not
    /// decoded). The id is the body's `event_id`. The signed body's `created_at` (RFC 3339)
    /// is the timestamp, checked within 48 hours: Square retries a delivery for up to
    /// 24 hours, and done keys are kept at least 4 days ([`Retention`](crate::store::Retention)),
    /// so a replay after its key is pruned is refused as too old. A body without
    /// `created_at` has no signed time: its key is kept until pruned by name
    /// ([`DedupeStore::prune_once`](crate::store::DedupeStore::prune_once)). Needs
    /// [`Verifier::with_public_url`](crate::Verifier::with_public_url) with the URL exactly
    /// as entered in the Developer Console.
    ///
    /// The URL and the body touch; with [`PublicUrl::exact`](crate::PublicUrl::exact) the
    /// URL's path is the verifier's own setting, so bytes cannot move between the two: use
    /// it for this scheme rather than an origin.
    #[must_use]
    pub fn square() -> Self {
        Self {
            template: adjacent("{url}{body}"),
            timestamp: Some(TimestampSource::BodyFieldRfc3339IfPresent("created_at")),
            ..Self::hmac(header("x-square-hmacsha256-signature"))
                .with_name("square")
                .with_encoding(Encoding::Base64)
                .with_id_field("event_id")
                // Square retries for 24 hours: twice that, to spare a late retry.
                .with_tolerance(Duration::from_secs(48 * 3600))
        }
    }

    /// HubSpot, signature v3: `X-HubSpot-Signature-v3: <base64>` over
    /// `{method}{url}{body}{X-HubSpot-Request-Timestamp}` with the app's client secret; the
    /// timestamp is in milliseconds (HubSpot refuses past 5 minutes). A delivery is a JSON
    /// array of events, each with its `eventId`; there is no delivery id, so deliveries are
    /// deduplicated on a digest of the signed content. Needs
    /// [`Verifier::with_public_url`](crate::Verifier::with_public_url).
    ///
    /// The pieces touch: the method is upper-case letters and the timestamp digits after
    /// the body; with [`PublicUrl::exact`](crate::PublicUrl::exact) the URL's path is the
    /// verifier's own setting, so bytes cannot move between URL and body: use it for this
    /// scheme rather than an origin. HubSpot's retries carry a new `attemptNumber` in the
    /// body, so they are new digests: deduplicate on each event's `eventId` in the handler
    /// (for example with [`Once`](crate::once::Once)).
    #[must_use]
    pub fn hubspot() -> Self {
        Self {
            template: adjacent("{method}{url}{body}{timestamp}"),
            ..Self::hmac(header("x-hubspot-signature-v3"))
                .with_name("hubspot")
                .with_encoding(Encoding::Base64)
                .with_timestamp_header(
                    header("x-hubspot-request-timestamp"),
                    TimestampFormat::UnixMillis,
                )
        }
    }
}

impl Scheme {
    /// Linear: `Linear-Signature: <hex>` over the body with the webhook's signing secret.
    /// The timestamp is the signed body's `webhookTimestamp` (milliseconds), checked within
    /// ±60 s as Linear's SDK does; its `Linear-Timestamp` header is not signed and not
    /// read. The `Linear-Delivery` id header is not signed either: deliveries are
    /// deduplicated on a digest of the body — and since a retry carries a fresh
    /// `webhookTimestamp`, a retry is a new digest: deduplicate on the object and action
    /// in the handler (for example with [`Once`](crate::once::Once)). The type is the
    /// body's `type` (`Issue`, …).
    #[must_use]
    pub fn linear() -> Self {
        Self {
            timestamp: Some(TimestampSource::BodyFieldMillis("webhookTimestamp")),
            ..Self::hmac(header("linear-signature"))
                .with_name("linear")
                .with_id_header(header("linear-delivery"))
                .allow_unsigned_id()
                .with_tolerance(Duration::from_secs(60))
        }
    }
}

impl Scheme {
    /// Mailgun: the signature sits in the JSON body,
    /// `{"signature":{"timestamp":…,"token":…,"signature":<hex>},"event-data":{…}}`, an
    /// HMAC-SHA256 of timestamp + token with the HTTP webhook signing key. The event id is
    /// the token (signed; `event-data.id` is not).
    ///
    /// # Security
    ///
    /// Mailgun's signature does not cover `event-data`: someone who captured one delivery
    /// can post altered event data under its token while its timestamp is fresh, and the
    /// token dedupes that against the genuine delivery only if the genuine one came first.
    /// Treat `event-data` as a hint: re-read the event from Mailgun's events API by its id
    /// before acting on it. Only JSON webhooks are read (not the legacy form posts).
    ///
    /// The timestamp (digits) and the token touch; moving a character between them moves
    /// the timestamp tenfold, far outside any window.
    #[must_use]
    pub fn mailgun() -> Self {
        Self {
            template: Template::from_parts(vec![Part::Timestamp, Part::Id]),
            custom: Some(Custom::Mailgun),
            ..Self::hmac(header("x-mailgun-signature")).with_name("mailgun")
        }
    }
}

impl Scheme {
    /// AWS SNS over HTTP/S: the message is the JSON body; its `Signature` covers a fixed
    /// list of its fields, which depends on its `Type`, under the certificate at its
    /// `SigningCertURL` (RSA with SHA-1 for `SignatureVersion` 1, SHA-256 for 2). The event
    /// id is the signed `MessageId`, the type the signed `Type` (`Notification`,
    /// `SubscriptionConfirmation`, `UnsubscribeConfirmation`); the payload is its
    /// `Message` string. SNS does not sign `MessageAttributes` or `UnsubscribeURL`: do not
    /// act on them. A line break in any signed field but `Message` is refused (it would
    /// let the signed text be split another way).
    ///
    /// `topics` are the topic ARNs this endpoint accepts: AWS signs the messages of every
    /// account's topics alike, so without the list anyone could point a topic of their own
    /// at the endpoint. An empty list is refused when the verifier is built.
    ///
    /// The key is the certificate: fetched from `SigningCertURL` (checked to be an AWS SNS
    /// host over HTTPS first) by [`Certificates`](crate::verify::Certificates), or pinned
    /// by giving its PEM as the verifier's secret. The timestamp window is one hour: SNS
    /// retries an HTTP delivery for up to an hour under its delivery policies. With
    /// `Certificates`, `VerifyWebhookLayer` confirms a `SubscriptionConfirmation` itself
    /// (see [`crate::verify`]).
    #[must_use]
    pub fn sns<I, S>(topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let topics: Vec<String> = topics.into_iter().map(Into::into).collect();
        Self {
            formats: vec![Format::new("", Encoding::Base64, Algorithm::RsaSha256)],
            custom: Some(Custom::Sns {
                topics: topics.into(),
            }),
            handshake: Some(Handshake::Sns),
            type_field: "Type",
            tolerance: Some(Duration::from_secs(60 * 60)),
            ..Self::hmac(header("x-amz-sns-message-type")).with_name("sns")
        }
    }

    /// PayPal: `PAYPAL-TRANSMISSION-SIG` is RSA-SHA256 (`PAYPAL-AUTH-ALGO:
    /// SHA256withRSA`) over `{transmission id}|{transmission time}|{webhook id}|{crc32}`,
    /// the CRC32 of the body in decimal, under the certificate at `PAYPAL-CERT-URL`.
    /// `webhook_id` is the id PayPal gave this endpoint's webhook: a delivery for another
    /// webhook does not verify. The event id is the body's `id`, the type its
    /// `event_type`. Each retry is a new transmission with a fresh time, checked within
    /// the usual 300 s.
    ///
    /// The key is the certificate: fetched from `PAYPAL-CERT-URL` (checked to be a PayPal
    /// API host over HTTPS first) by [`Certificates`](crate::verify::Certificates), or
    /// pinned by giving its PEM as the verifier's secret.
    ///
    /// # Security
    ///
    /// PayPal signs a CRC32 of the body, not a cryptographic digest: someone who captured
    /// one delivery can craft another body with the same CRC32 and replay it within the
    /// time window under the captured transmission's headers — its content, and its `id`,
    /// so its dedupe key too. The verifier accepts a transmission id with one body only,
    /// remembered per process; across replicas and restarts, give
    /// [`VerifyWebhookLayer::with_transmission_store`](crate::VerifyWebhookLayer::with_transmission_store)
    /// the store they share. The first body seen under an id wins, so a forgery that
    /// arrives before the genuine delivery still passes. Treat the body as a hint for
    /// anything that moves money: re-read the event (and its resource) from PayPal's API
    /// by its id before acting on it, and act on what the API says.
    #[must_use]
    pub fn paypal(webhook_id: impl AsRef<str>) -> Self {
        Self {
            formats: vec![Format::new("", Encoding::Base64, Algorithm::RsaSha256)],
            custom: Some(Custom::PayPal {
                webhook_id: webhook_id.as_ref().into(),
            }),
            id: IdSource::BodyField("id"),
            type_field: "event_type",
            ..Self::hmac(header("paypal-transmission-sig")).with_name("paypal")
        }
    }

    /// Microsoft Graph change notifications: no signature; each notification in the
    /// batch (`{"value":[…]}`) carries the `clientState` the subscription was created
    /// with, compared in constant time with the verifier's secrets (its client states,
    /// at least 16 characters; a batch is refused unless every notification carries one).
    /// No id is signed: deliveries are deduplicated on a digest of the body. Graph's
    /// `POST ?validationToken=…` handshake is answered by `VerifyWebhookLayer`.
    ///
    /// # Security
    ///
    /// The client state is a bearer secret sent in every delivery, not a signature: it
    /// proves the sender knows it, and nothing prevents a replay. Serve the endpoint over
    /// HTTPS only. Rich notifications' encrypted content and validation tokens (JWTs) are
    /// not checked here.
    #[must_use]
    pub fn microsoft_graph() -> Self {
        Self {
            formats: vec![Format::new("", Encoding::Base64, Algorithm::SharedToken)],
            custom: Some(Custom::Graph),
            handshake: Some(Handshake::Graph),
            ..Self::hmac(header("content-type")).with_name("microsoft-graph")
        }
    }
}

/// A preset by name — `standard` (or `svix`), `stripe`, `github`, `slack`, `shopify`,
/// `discord`, `sendgrid`, `paddle`, `zoom`, `meta`, `intercom`, `twitch`, `twilio`,
/// `twilio-sha256`, `square`, `hubspot`, `linear`, `mailgun`, `microsoft-graph` (or `graph`) — for
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
            "discord" => Ok(Self::discord()),
            "sendgrid" => Ok(Self::sendgrid()),
            "paddle" => Ok(Self::paddle()),
            "zoom" => Ok(Self::zoom()),
            "meta" | "whatsapp" | "instagram" | "messenger" => Ok(Self::meta()),
            "intercom" => Ok(Self::intercom()),
            "twitch" => Ok(Self::twitch()),
            "twilio" => Ok(Self::twilio()),
            "twilio-sha256" => Ok(Self::twilio_sha256()),
            "square" => Ok(Self::square()),
            "hubspot" => Ok(Self::hubspot()),
            "linear" => Ok(Self::linear()),
            "mailgun" => Ok(Self::mailgun()),
            "graph" | "microsoft-graph" | "msgraph" => Ok(Self::microsoft_graph()),
            "sns" | "aws-sns" => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "sns needs the topic ARNs it accepts: use Scheme::sns(topics)",
            )),
            "paypal" => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "paypal needs its webhook id: use Scheme::paypal(webhook_id)",
            )),
            _ => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                format!(
                    "unknown scheme {name:?}: use standard, stripe, github, slack, shopify, \
                     discord, sendgrid, paddle, zoom, meta, intercom, twitch, twilio, \
                     twilio-sha256, square, hubspot, linear, mailgun or microsoft-graph"
                ),
            )),
        }
    }
}

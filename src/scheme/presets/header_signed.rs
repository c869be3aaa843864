//! The providers that sign in a header: a MAC or a signature over the body, with the
//! delivery's id and timestamp where they sign those too.

use std::borrow::Cow;
use std::time::Duration;

use super::{adjacent, header, template};
use crate::scheme::{
    Algorithm, Encoding, Format, Handshake, IdSource, Scheme, SecretEncoding, TimestampFormat,
    TimestampSource,
};

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
    /// Linear: `Linear-Signature: <hex>` over the body with the webhook's signing secret.
    /// The timestamp is the signed body's `webhookTimestamp` (milliseconds), checked within
    /// ±60 s as Linear's SDK does; its `Linear-Timestamp` header is not signed and not
    /// read. The `Linear-Delivery` id header is not signed either: deliveries are
    /// deduplicated on a digest of the body — and since a retry carries a fresh
    /// `webhookTimestamp`, a retry is a new digest: deduplicate on the object and action
    /// in the handler (for example with [`Once`]). The type is the
    /// body's `type` (`Issue`, …).
    ///
    #[cfg_attr(feature = "dedupe", doc = "[`Once`]: crate::once::Once")]
    #[cfg_attr(not(feature = "dedupe"), doc = "[`Once`]: crate#features")]
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

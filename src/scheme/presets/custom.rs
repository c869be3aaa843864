//! The providers verified by code of their own (`Custom`): Mailgun, AWS SNS, PayPal and
//! Microsoft Graph.

use std::time::Duration;

use super::header;
use crate::scheme::template::{Part, Template};
use crate::scheme::{Algorithm, Custom, Encoding, Format, Handshake, IdSource, Scheme};

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
    /// [`VerifyWebhookLayer::with_transmission_store`]
    /// the store they share. The first body seen under an id wins, so a forgery that
    /// arrives before the genuine delivery still passes. Treat the body as a hint for
    /// anything that moves money: re-read the event (and its resource) from PayPal's API
    /// by its id before acting on it, and act on what the API says.
    ///
    #[cfg_attr(
        feature = "dedupe",
        doc = "[`VerifyWebhookLayer::with_transmission_store`]: crate::VerifyWebhookLayer::with_transmission_store"
    )]
    #[cfg_attr(
        not(feature = "dedupe"),
        doc = "[`VerifyWebhookLayer::with_transmission_store`]: crate#features"
    )]
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

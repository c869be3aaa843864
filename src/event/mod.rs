//! [`Event`]: a verified delivery, as the handler sees it.

mod envelope; // the id, type, livemode and object id, read from the body in one pass

use self::envelope::Envelope;
pub(crate) use self::envelope::{number_field, string_field};

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderValue;
use serde::de::DeserializeOwned;

/// A verified webhook delivery: its raw body exactly as signed, and what is known about it.
///
/// `VerifyWebhookLayer` puts one in the request's extensions; with the `axum` feature it is
/// an extractor. Cloning is cheap (the fields sit behind an `Arc`).
///
/// Type, livemode and object id are read from the verified body's JSON envelope (`type`,
/// `livemode`, `data.object.id` or `data.id`) or the provider's headers, the first time
/// one of them is asked for. A body that is not JSON still verified; those fields are
/// then `None`: parsing is not authentication.
///
/// `Debug` prints what identifies the event (source, id, type, timestamp, the secret's
/// index) and the body's length, never the body: it is the provider's payload, customer
/// data, and does not belong in logs.
///
/// # From the inbox
///
/// An inbox worker's processor gets the event as [`Inbox::accept`] stored it (or
/// [`JetStream::accept`] published it), not the request it came in:
///
/// - [`source`](Self::source), [`body`](Self::body), [`event_type`](Self::event_type),
///   [`object_id`](Self::object_id) and [`livemode`](Self::livemode) are the stored
///   values, read from the delivery when it was accepted.
/// - [`id`](Self::id) is the key the event was stored under: the delivery's
///   [`dedupe_id`](Self::dedupe_id), so always `Some`. Where the signature covers the
///   provider's id that is the id; otherwise (GitHub, Shopify, schemes without an id) the
///   `sha256:` digest of the signed content. [`id_is_signed`](Self::id_is_signed) is then
///   `true` (a digest is of signed content too), and `dedupe_id` equals `id`.
/// - [`type_is_signed`](Self::type_is_signed) is `false`: whether the type came from a
///   signed body or an unsigned header is not stored, so it is not claimed.
/// - [`timestamp`](Self::timestamp) is `None` from the SQL inbox (not stored); from
///   JetStream it is the signed timestamp to the second (a message header).
/// - [`secret_index`](Self::secret_index) is `0`: which secret matched is not stored (a
///   sender still signing with an old one shows at delivery, in the verify layer's logs
///   and metrics).
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "[`Inbox::accept`]: crate::inbox::Inbox::accept"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`Inbox::accept`]: crate#features"
)]
#[cfg_attr(
    feature = "nats",
    doc = "[`JetStream::accept`]: crate::inbox::jetstream::JetStream::accept"
)]
#[cfg_attr(not(feature = "nats"), doc = "[`JetStream::accept`]: crate#features")]
#[derive(Clone)]
pub struct Event {
    inner: Arc<Inner>,
}

struct Inner {
    source: Arc<str>,
    /// The `source` label of metrics about this event (its verifier's), for the dedupe
    /// layers' counts.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    metrics: crate::metrics::Source,
    header_id: Option<HeaderValue>,
    header_type: Option<HeaderValue>,
    id_field: Option<&'static str>,
    type_field: &'static str,
    /// The id is a header the signature does not cover.
    unsigned_id: bool,
    /// Where the scheme signs no id and signs the request as well as the body (Twilio,
    /// Square, HubSpot): the digest of that signed content, its timestamp left out (the
    /// URL and form are not kept to compute it later).
    content_digest: Option<Box<str>>,
    /// `sha256:` and the hex SHA-256 of the body, computed when first needed.
    digest: OnceLock<Box<str>>,
    timestamp: Option<SystemTime>,
    /// No signed time bounds a replay of this delivery: its dedupe key is kept until
    /// pruned by name ([`Delivery::is_kept`](crate::store::Delivery::is_kept)).
    kept: bool,
    body: Bytes,
    secret_index: usize,
    envelope: OnceLock<Envelope>,
    /// From the inbox: the key the event was stored under (its delivery's dedupe id).
    /// The envelope's fields were stored beside it and are never parsed again.
    stored_id: Option<Box<str>>,
    /// The scheme that verified it (`None` from the inbox): its provider and headers.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )),
        allow(dead_code)
    )]
    scheme: Option<Arc<crate::Scheme>>,
}

pub(crate) struct Parts {
    pub(crate) source: Arc<str>,
    pub(crate) metrics: crate::metrics::Source,
    // Header values share the request's buffer: no copy. Both were checked to be visible
    // ASCII, so `to_str` cannot fail on them.
    pub(crate) header_id: Option<HeaderValue>,
    pub(crate) header_type: Option<HeaderValue>,
    pub(crate) id_field: Option<&'static str>,
    /// The body field the type is read from when no type header is (`type` by default).
    pub(crate) type_field: &'static str,
    pub(crate) unsigned_id: bool,
    pub(crate) content_digest: Option<Box<str>>,
    pub(crate) timestamp: Option<SystemTime>,
    /// The scheme signs no time for this delivery (or one it does not check): only its
    /// dedupe key stops a replay.
    pub(crate) kept: bool,
    pub(crate) body: Bytes,
    pub(crate) secret_index: usize,
    pub(crate) scheme: Arc<crate::Scheme>,
}

/// What the inbox stored of an accepted event (a row of `webhook_events`, or a JetStream
/// message's headers and payload).
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub(crate) struct Stored {
    pub(crate) source: String,
    /// The key it was stored under: the accepted event's dedupe id.
    pub(crate) id: String,
    pub(crate) event_type: Option<String>,
    pub(crate) object_id: Option<String>,
    pub(crate) livemode: Option<bool>,
    /// The signed timestamp, where the store kept it (JetStream's header).
    pub(crate) timestamp: Option<SystemTime>,
    pub(crate) body: Bytes,
}

impl Event {
    pub(crate) fn new(p: Parts) -> Self {
        Self {
            inner: Arc::new(Inner {
                source: p.source,
                metrics: p.metrics,
                header_id: p.header_id,
                header_type: p.header_type,
                id_field: p.id_field,
                type_field: p.type_field,
                unsigned_id: p.unsigned_id,
                content_digest: p.content_digest,
                digest: OnceLock::new(),
                timestamp: p.timestamp,
                kept: p.kept,
                body: p.body,
                secret_index: p.secret_index,
                envelope: OnceLock::new(),
                stored_id: None,
                scheme: Some(p.scheme),
            }),
        }
    }

    /// A stored event of `source` and `event_type`, for unit tests.
    #[cfg(all(
        test,
        any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )
    ))]
    pub(crate) fn of_type(source: &str, event_type: &str) -> Self {
        Self::stored(Stored {
            source: source.to_owned(),
            id: "evt_1".to_owned(),
            event_type: Some(event_type.to_owned()),
            object_id: None,
            livemode: None,
            timestamp: None,
            body: Bytes::new(),
        })
    }

    /// A stored event of `source` about `object_id`, for unit tests.
    #[cfg(all(
        test,
        any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )
    ))]
    pub(crate) fn about(source: &str, object_id: &str) -> Self {
        Self::stored(Stored {
            source: source.to_owned(),
            id: "evt_1".to_owned(),
            event_type: None,
            object_id: Some(object_id.to_owned()),
            livemode: None,
            timestamp: None,
            body: Bytes::new(),
        })
    }

    /// An event as the inbox stored it, for a worker's processor: the stored type, object
    /// id and livemode stand (the body is not parsed for them again). What each accessor
    /// then means: the type's docs, "From the inbox".
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(crate) fn stored(s: Stored) -> Self {
        let envelope = Envelope {
            ty: s.event_type,
            livemode: s.livemode,
            object_id: s.object_id,
            ..Envelope::default()
        };
        Self {
            inner: Arc::new(Inner {
                metrics: crate::metrics::Source::new(&s.source),
                source: Arc::from(s.source),
                header_id: None,
                header_type: None,
                id_field: None,
                type_field: "type",
                // The key is a signed id or the digest of signed content.
                unsigned_id: false,
                content_digest: None,
                digest: OnceLock::new(),
                timestamp: s.timestamp,
                // JetStream carries the signed time; without one, keep the key.
                kept: s.timestamp.is_none(),
                body: s.body,
                secret_index: 0,
                envelope: OnceLock::from(envelope),
                stored_id: Some(s.id.into_boxed_str()),
                scheme: None,
            }),
        }
    }

    /// The key of a stored event's row (empty for one that is not from the inbox).
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(crate) fn stored_id(&self) -> &str {
        self.inner.stored_id.as_deref().unwrap_or_default()
    }

    /// Which endpoint or provider this came from: the scheme's name unless the verifier
    /// was given another with [`Verifier::with_source`](crate::Verifier::with_source).
    /// Deduplication keys are scoped by it.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// The scheme that verified the delivery (`None` for an event from the inbox): whose
    /// provider it is, whatever its source, and which headers are its own.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )),
        allow(dead_code)
    )]
    pub(crate) fn scheme(&self) -> Option<&crate::Scheme> {
        self.inner.scheme.as_deref()
    }

    /// The `source` label of metrics about this event.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) fn metrics(&self) -> &crate::metrics::Source {
        &self.inner.metrics
    }

    /// The provider's event id: from a header (`webhook-id`, `X-GitHub-Delivery`, …) or the
    /// body (`id` for Stripe, `event_id` for Slack). `None` when the scheme has none or
    /// the body lacks it.
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        if let Some(id) = &self.inner.stored_id {
            return Some(id);
        }
        if let Some(id) = &self.inner.header_id {
            return id.to_str().ok();
        }
        let field = self.inner.id_field?;
        let env = self.envelope();
        match field {
            "id" => env.id.as_deref(),
            "event_id" => env.event_id.as_deref(),
            _ => env.other_id.as_deref(),
        }
    }

    /// Whether the signature covers [`id`](Self::id): an id in the body or in a signed
    /// header (Standard Webhooks' `webhook-id`) is; GitHub's `X-GitHub-Delivery` and
    /// Shopify's `X-Shopify-Webhook-Id` are not — anyone who captured a delivery can resend
    /// it under a fresh one.
    #[must_use]
    pub fn id_is_signed(&self) -> bool {
        !self.inner.unsigned_id
    }

    /// What deliveries of this event are deduplicated on: the [`id`](Self::id) when the
    /// signature covers it; otherwise — an unsigned id header (GitHub, Shopify), or no id
    /// at all (Zoom, Meta, SendGrid, Twilio) — `sha256:` and the hex SHA-256 of the signed
    /// content without its timestamp: the body, or for schemes that sign the request too
    /// (Twilio, Square, HubSpot) the URL, method, form and body. So a replayed body
    /// under a fresh, unsigned id is still a duplicate, and so is a provider's retry that
    /// re-signs the same body with a new timestamp header. (A retry whose body changes —
    /// Linear's `webhookTimestamp`, HubSpot's `attemptNumber` — is a new digest: see those
    /// presets.) Two genuinely different events differ in their bodies (each provider's body
    /// carries its own event time or id). A body-field id missing from the body falls back
    /// to the body's digest.
    #[must_use]
    pub fn dedupe_id(&self) -> &str {
        match self.id() {
            Some(id) if !id.is_empty() && self.id_is_signed() => id,
            _ if self.inner.content_digest.is_some() => {
                self.inner.content_digest.as_deref().expect("checked")
            }
            _ => self.inner.digest.get_or_init(|| {
                use sha2::Digest as _;
                let digest = sha2::Sha256::digest(&self.inner.body);
                format!("sha256:{}", hex::encode(digest)).into_boxed_str()
            }),
        }
    }

    /// Whether the signature covers [`event_type`](Self::event_type): the body's `type`
    /// is; a type header (`X-GitHub-Event`, `X-Shopify-Topic`) is not. `false` for an event
    /// from the inbox, which does not store where its type came from.
    #[must_use]
    pub fn type_is_signed(&self) -> bool {
        self.inner.header_type.is_none() && self.inner.stored_id.is_none()
    }

    /// The event type: a header where the provider sends one (`X-GitHub-Event`,
    /// `X-Shopify-Topic`), else the body's `type` (or the scheme's own field: Zoom's
    /// `event`, Paddle's `event_type`, Intercom's `topic`).
    #[must_use]
    pub fn event_type(&self) -> Option<&str> {
        match &self.inner.header_type {
            Some(t) => t.to_str().ok(),
            None => self.envelope().ty.as_deref(),
        }
    }

    /// The signed timestamp, for schemes that sign one (from the inbox: JetStream's, to the
    /// second; the SQL inbox does not store it).
    #[must_use]
    pub fn timestamp(&self) -> Option<SystemTime> {
        self.inner.timestamp
    }

    /// Whether no signed, checked time bounds a replay of this delivery, so only its
    /// dedupe key refuses one: its key is kept until pruned by name.
    #[allow(dead_code)] // read by the stores' `Delivery`
    pub(crate) fn keeps_key(&self) -> bool {
        self.inner.kept
    }

    /// The body's `livemode`, where the provider sends it (Stripe: `false` for test mode).
    #[must_use]
    pub fn livemode(&self) -> Option<bool> {
        self.envelope().livemode
    }

    /// The id of the object the event is about: the body's `data.object.id`, else `data.id`.
    #[must_use]
    pub fn object_id(&self) -> Option<&str> {
        self.envelope().object_id.as_deref()
    }

    /// The body exactly as received and signed.
    #[must_use]
    pub fn body(&self) -> &Bytes {
        &self.inner.body
    }

    /// The position, in the verifier's secret list, of the secret that matched: `0` is the
    /// current one; a higher index means the sender still signs with an older secret. `0`
    /// for an event from the inbox, which does not store it.
    #[must_use]
    pub fn secret_index(&self) -> usize {
        self.inner.secret_index
    }

    /// Deserializes the body (to read the event's own time, say, for
    /// [`latest::advance`]).
    ///
    #[cfg_attr(
        any(feature = "sqlite", feature = "postgres"),
        doc = "[`latest::advance`]: crate::latest::advance"
    )]
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        doc = "[`latest::advance`]: crate#features"
    )]
    ///
    /// # Errors
    ///
    /// When the body is not JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.inner.body)
    }

    fn envelope(&self) -> &Envelope {
        self.inner.envelope.get_or_init(|| {
            Envelope::parse(&self.inner.body, self.inner.id_field, self.inner.type_field)
        })
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("source", &self.source())
            .field("id", &self.id())
            .field("type", &self.event_type())
            .field("timestamp", &self.timestamp())
            .field("secret_index", &self.secret_index())
            .field("body_len", &self.inner.body.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: &'static [u8], id_field: Option<&'static str>) -> Event {
        Event::new(Parts {
            source: "test".into(),
            metrics: crate::metrics::Source::new("test"),
            header_id: None,
            header_type: None,
            id_field,
            type_field: "type",
            unsigned_id: false,
            content_digest: None,
            timestamp: None,
            kept: true,
            body: Bytes::from_static(body),
            secret_index: 0,
            scheme: Arc::new(crate::Scheme::standard()),
        })
    }

    #[test]
    fn reads_a_stripe_envelope() {
        let e = event(
            br#"{"id":"evt_1","object":"event","type":"payment_intent.succeeded","livemode":false,
                "data":{"object":{"id":"pi_7","amount":100,"metadata":{"id":"x"}}},"extra":[1,{"a":2}]}"#,
            Some("id"),
        );
        assert_eq!(e.id(), Some("evt_1"));
        assert_eq!(e.event_type(), Some("payment_intent.succeeded"));
        assert_eq!(e.livemode(), Some(false));
        assert_eq!(e.object_id(), Some("pi_7"));
    }

    #[test]
    fn reads_data_id_slack_event_id_and_numeric_ids() {
        let e = event(br#"{"type":"user.created","data":{"id":42}}"#, None);
        assert_eq!(e.object_id(), Some("42"));
        assert_eq!(e.id(), None);
        let slack = event(
            br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#,
            Some("event_id"),
        );
        assert_eq!(slack.id(), Some("Ev1"));
        assert_eq!(slack.event_type(), Some("event_callback"));
    }

    #[test]
    fn odd_or_non_json_bodies_give_none_not_errors() {
        for body in [
            &b"\xff\xfe not json"[..],
            b"",
            b"[1,2,3]",
            b"{\"type\": 5, \"livemode\": \"yes\", \"data\": \"str\"}",
            b"{\"type\":\"a\"} trailing",
            b"{\"id\":\"evt\"",
        ] {
            let e = event(body, Some("id"));
            assert_eq!(e.livemode(), None, "{body:?}");
            assert_eq!(e.object_id(), None, "{body:?}");
        }
        let odd = event(
            b"{\"type\": 5, \"livemode\": \"yes\", \"data\": \"str\", \"id\": \"evt_2\"}",
            Some("id"),
        );
        assert_eq!(odd.id(), Some("evt_2"));
        assert_eq!(odd.event_type(), Some("5"));
    }

    #[test]
    fn json_deserializes_the_body() {
        let e = event(br#"{"id":"evt_3"}"#, None);
        assert_eq!(e.json::<serde_json::Value>().unwrap()["id"], "evt_3");
        assert!(event(b"nope", None).json::<serde_json::Value>().is_err());
    }
}

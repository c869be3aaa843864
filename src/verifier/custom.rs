//! The providers whose signature does not fit the header-and-template mould, each verified
//! by code of its own: Mailgun (the signature in the body), AWS SNS (chosen body fields,
//! RSA), PayPal (RSA over a CRC32 of the body) and Microsoft Graph (a shared token in
//! each notification, no signature).

use super::{one_str, Verifier};
use crate::error::{VerifyError, VerifyErrorKind};
use crate::event::{self, Event};
use crate::json::{parse, Field, Strings};
use crate::scheme::template::Input;
use crate::scheme::{signature, Algorithm, Custom, TimestampFormat};
use crate::timestamp;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

/// The longest RSA signature read: 4096 bits.
const MAX_RSA_SIGNATURE: usize = 512;

const NO_MATCH: VerifyError = VerifyError::new(
    VerifyErrorKind::InvalidSignature,
    "no signature matches any secret",
);

fn malformed(why: &'static str) -> VerifyError {
    VerifyError::new(VerifyErrorKind::MalformedHeader, why)
}

/// PayPal's headers.
const TRANSMISSION_ID: HeaderName = HeaderName::from_static("paypal-transmission-id");
const TRANSMISSION_TIME: HeaderName = HeaderName::from_static("paypal-transmission-time");
const TRANSMISSION_SIG: HeaderName = HeaderName::from_static("paypal-transmission-sig");
const CERT_URL: HeaderName = HeaderName::from_static("paypal-cert-url");
const AUTH_ALGO: HeaderName = HeaderName::from_static("paypal-auth-algo");

/// The URL of the certificate a delivery says it was signed under (SNS: the body's
/// `SigningCertURL`; PayPal: `PAYPAL-CERT-URL`), for schemes verified with one.
pub(crate) fn certificate_url(
    custom: &Custom,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, VerifyError> {
    match custom {
        Custom::Sns { .. } => event::string_field(body, "SigningCertURL")
            .ok_or(malformed("the message has no SigningCertURL")),
        Custom::PayPal { .. } => one_str(headers, std::slice::from_ref(&CERT_URL))?
            .map(str::to_owned)
            .ok_or(VerifyError::new(
                VerifyErrorKind::MissingHeader,
                "PAYPAL-CERT-URL is missing",
            )),
        Custom::Mailgun | Custom::Graph => Err(VerifyError::new(
            VerifyErrorKind::Misconfigured,
            "this scheme is not verified with certificates",
        )),
    }
}

/// An SNS message checked but for its signature.
struct CheckedSns {
    /// The signed fields, by name, in the order SNS signs them.
    fields: Vec<(&'static str, String)>,
    algorithm: Algorithm,
    signature: Vec<u8>,
    timestamp: i64,
}

/// One RSA signature, base64, decoded.
fn rsa_signature(encoded: &str) -> Result<Vec<u8>, VerifyError> {
    if encoded.len() > MAX_RSA_SIGNATURE.div_ceil(3) * 4 {
        return Err(malformed("the signature is longer than any RSA signature"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| malformed("the signature is not base64"))
}

impl Verifier {
    pub(super) fn verify_custom(
        &self,
        custom: &Custom,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        match custom {
            Custom::Mailgun => self.verify_mailgun(body),
            Custom::Sns { topics } => self.verify_sns(topics, body),
            Custom::PayPal { webhook_id } => self.verify_paypal(webhook_id, headers, body),
            Custom::Graph => self.verify_graph(body),
        }
    }

    /// What can be checked before the body is read: PayPal's headers and timestamp.
    /// The others carry everything in the body.
    pub(super) fn check_custom_headers(
        &self,
        custom: &Custom,
        headers: &HeaderMap,
    ) -> Result<(), VerifyError> {
        match custom {
            Custom::PayPal { .. } => self.paypal_headers(headers).map(drop),
            Custom::Mailgun | Custom::Sns { .. } | Custom::Graph => Ok(()),
        }
    }

    fn event(&self, body: Bytes, timestamp: Option<i64>, secret_index: usize) -> event::Parts {
        event::Parts {
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            header_id: None,
            header_type: None,
            id_field: None,
            type_field: self.scheme.type_field,
            unsigned_id: false,
            content_digest: None,
            timestamp: timestamp.and_then(timestamp::to_system_time),
            // Graph signs no time; the others' is checked.
            kept: timestamp.is_none(),
            body,
            secret_index,
        }
    }

    /// Mailgun: the signature, its timestamp and token are in the JSON body; the HMAC
    /// covers the timestamp and token only. The body is parsed before the MAC (it is
    /// where the signature is), under the layer's body limit.
    fn verify_mailgun(&self, body: Bytes) -> Result<Event, VerifyError> {
        struct Signed {
            timestamp: String,
            token: String,
            signature: String,
        }
        // `{"signature":{"timestamp":…,"token":…,"signature":…},…}`
        let fields = Field("signature", Strings(["timestamp", "token", "signature"]));
        let Ok(Some([Some(timestamp), Some(token), Some(signature)])) = parse(&body, fields) else {
            return Err(malformed("the body has no signature object"));
        };
        let signed = Signed {
            timestamp,
            token,
            signature,
        };
        let ts = timestamp::parse(&signed.timestamp, TimestampFormat::Unix)?;
        self.tolerance
            .check(ts, timestamp::unix_seconds((self.clock)()))?;
        let token = HeaderValue::from_str(&signed.token)
            .ok()
            .filter(|t| (1..=256).contains(&t.len()))
            .ok_or(malformed("the signature token is not a short ASCII string"))?;
        let scheme = &*self.scheme;
        let parsed = signature::parse(scheme, &signed.signature)?;
        let pieces = scheme.template.pieces(&Input {
            timestamp: signed.timestamp.as_bytes(),
            id: token.as_bytes(),
            ..Input::default()
        });
        let secret_index = self
            .secrets
            .keys()
            .iter()
            .position(|key| parsed.candidates.matches(&scheme.formats, key, &pieces))
            .ok_or(NO_MATCH)?;
        Ok(Event::new(event::Parts {
            header_id: Some(token),
            ..self.event(body, Some(ts), secret_index)
        }))
    }

    /// AWS SNS: the message is JSON; its signature covers `Name\nValue\n` for a fixed,
    /// sorted list of its fields, which depends on its `Type`, under the key of the
    /// certificate at `SigningCertURL` (RSA with SHA-1 for `SignatureVersion` 1, SHA-256
    /// for 2). The event id is the signed `MessageId`.
    fn verify_sns(&self, topics: &[String], body: Bytes) -> Result<Event, VerifyError> {
        let checked = self.check_sns(topics, &body)?;
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(checked.fields.len() * 4);
        for (name, value) in &checked.fields {
            pieces.extend([name.as_bytes(), b"\n", value.as_bytes(), b"\n"]);
        }
        let secret_index = self
            .secrets
            .keys()
            .iter()
            .position(|key| key.verifies_as(checked.algorithm, &pieces, &checked.signature))
            .ok_or(NO_MATCH)?;
        Ok(Event::new(event::Parts {
            id_field: Some("MessageId"),
            ..self.event(body, Some(checked.timestamp), secret_index)
        }))
    }

    /// Everything about an SNS message but its signature, so a certificate is fetched
    /// only for a well-formed, fresh message of an accepted topic: its fields for its
    /// `Type`, no line break in any but `Message` (so the signed text splits one way
    /// only), the version, the window, the topic and the signature's length.
    fn check_sns(&self, topics: &[String], body: &[u8]) -> Result<CheckedSns, VerifyError> {
        struct Message {
            r#type: String,
            message_id: String,
            topic_arn: String,
            message: String,
            timestamp: String,
            signature_version: String,
            signature: String,
            subject: Option<String>,
            token: Option<String>,
            subscribe_url: Option<String>,
        }
        // Unknown fields are ignored; a field given twice is an error.
        let fields = Strings([
            "Type",
            "MessageId",
            "TopicArn",
            "Message",
            "Timestamp",
            "SignatureVersion",
            "Signature",
            "Subject",
            "Token",
            "SubscribeURL",
        ]);
        let not_sns = || malformed("not an SNS message");
        let [ty, id, arn, message, time, version, signature, subject, token, url] =
            parse(body, fields).map_err(|_| not_sns())?;
        let m = Message {
            r#type: ty.ok_or_else(not_sns)?,
            message_id: id.ok_or_else(not_sns)?,
            topic_arn: arn.ok_or_else(not_sns)?,
            message: message.ok_or_else(not_sns)?,
            timestamp: time.ok_or_else(not_sns)?,
            signature_version: version.ok_or_else(not_sns)?,
            signature: signature.ok_or_else(not_sns)?,
            subject,
            token,
            subscribe_url: url,
        };
        let algorithm = match m.signature_version.as_str() {
            "1" => Algorithm::RsaSha1,
            "2" => Algorithm::RsaSha256,
            _ => return Err(malformed("an SNS SignatureVersion other than 1 or 2")),
        };
        let ts = timestamp::parse(&m.timestamp, TimestampFormat::Rfc3339)?;
        self.tolerance
            .check(ts, timestamp::unix_seconds((self.clock)()))?;
        let signature = rsa_signature(&m.signature)?;
        if !(256..=MAX_RSA_SIGNATURE).contains(&signature.len()) {
            return Err(malformed("not the length of an RSA signature"));
        }
        let mut fields: Vec<(&'static str, String)> = match m.r#type.as_str() {
            "Notification" => {
                let mut fields = vec![("Message", m.message), ("MessageId", m.message_id)];
                fields.extend(m.subject.map(|s| ("Subject", s)));
                fields
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                let (Some(token), Some(url)) = (m.token, m.subscribe_url) else {
                    return Err(malformed("a confirmation without Token or SubscribeURL"));
                };
                vec![
                    ("Message", m.message),
                    ("MessageId", m.message_id),
                    ("SubscribeURL", url),
                    ("Token", token),
                ]
            }
            _ => return Err(malformed("an SNS message of an unknown Type")),
        };
        // Sorted by name, as SNS signs them.
        fields.extend([
            ("Timestamp", m.timestamp),
            ("TopicArn", m.topic_arn.clone()),
            ("Type", m.r#type),
        ]);
        fields.sort_by_key(|(name, _)| *name);
        if fields
            .iter()
            .any(|(name, value)| *name != "Message" && value.contains('\n'))
        {
            return Err(malformed("a line break in an SNS field other than Message"));
        }
        // Any AWS account can point a topic of its own at this endpoint, and AWS signs
        // that too: only the configured topics are ours.
        if !topics.contains(&m.topic_arn) {
            return Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "the message's topic is not one this endpoint accepts",
            ));
        }
        Ok(CheckedSns {
            fields,
            algorithm,
            signature,
            timestamp: ts,
        })
    }

    /// What can be checked of a delivery before its key is fetched: everything but the
    /// signature (SNS), or the headers (PayPal).
    pub(crate) fn check_before_key(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(), VerifyError> {
        match &self.scheme.custom {
            Some(Custom::Sns { topics }) => self.check_sns(topics, body).map(drop),
            Some(Custom::PayPal { .. }) => self.paypal_headers(headers).map(drop),
            _ => Ok(()),
        }
    }

    /// PayPal's headers, checked: the transmission id, the time within the tolerance, the
    /// algorithm, and the signature decoded.
    fn paypal_headers<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<(&'h HeaderValue, &'h str, i64, Vec<u8>), VerifyError> {
        let required = |name: &HeaderName, missing: &'static str| {
            super::one(headers, std::slice::from_ref(name))?
                .ok_or(VerifyError::new(VerifyErrorKind::MissingHeader, missing))
        };
        let id = required(&TRANSMISSION_ID, "PAYPAL-TRANSMISSION-ID is missing")?;
        let time = required(&TRANSMISSION_TIME, "PAYPAL-TRANSMISSION-TIME is missing")?;
        let time = time.to_str().expect("checked by `one`");
        let sig = required(&TRANSMISSION_SIG, "PAYPAL-TRANSMISSION-SIG is missing")?;
        required(&CERT_URL, "PAYPAL-CERT-URL is missing")?;
        let algo = required(&AUTH_ALGO, "PAYPAL-AUTH-ALGO is missing")?;
        if algo != "SHA256withRSA" {
            return Err(malformed("PAYPAL-AUTH-ALGO is not SHA256withRSA"));
        }
        let ts = timestamp::parse(time, TimestampFormat::Rfc3339)?;
        self.tolerance
            .check(ts, timestamp::unix_seconds((self.clock)()))?;
        let signature = rsa_signature(sig.to_str().expect("checked by `one`"))?;
        Ok((id, time, ts, signature))
    }

    /// PayPal: RSA-SHA256 over `transmission id|transmission time|webhook id|crc32(body)`,
    /// the CRC32 in decimal. The webhook id is ours, so a delivery meant for another
    /// webhook does not verify. The event id is the body's `id`.
    fn verify_paypal(
        &self,
        webhook_id: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        let (id, time, ts, signature) = self.paypal_headers(headers)?;
        let crc = crc32fast::hash(&body).to_string();
        let pieces: [&[u8]; 7] = [
            id.as_bytes(),
            b"|",
            time.as_bytes(),
            b"|",
            webhook_id.as_bytes(),
            b"|",
            crc.as_bytes(),
        ];
        let secret_index = self
            .secrets
            .keys()
            .iter()
            .position(|key| key.verifies_as(Algorithm::RsaSha256, &pieces, &signature))
            .ok_or(NO_MATCH)?;
        // Keyed on the body's `id`: PayPal retries an event as new transmissions (new id
        // and time), which must dedupe as one event. A CRC-32 is forced with four bytes,
        // so a transmission id is accepted with one body only, remembered while its
        // headers could still pass the time check.
        if let Some(transmissions) = &self.transmissions {
            let keep = i64::try_from(self.transmission_keep().as_secs()).unwrap_or(i64::MAX);
            let id = id.to_str().expect("checked by `one`");
            let now = timestamp::unix_seconds((self.clock)());
            transmissions.admit(id, &body, now, keep)?;
        }
        Ok(Event::new(event::Parts {
            id_field: Some("id"),
            ..self.event(body, Some(ts), secret_index)
        }))
    }

    /// How long a PayPal transmission is remembered: twice the window (past + future),
    /// past which its headers fail the time check anyway.
    fn transmission_keep(&self) -> Duration {
        (self.tolerance.past + self.tolerance.future).saturating_mul(2)
    }

    /// A verified PayPal delivery's transmission id and how long to remember it; `None`
    /// for every other scheme. For `VerifyWebhookLayer::with_transmission_store`.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) fn transmission<'h>(&self, headers: &'h HeaderMap) -> Option<(&'h str, Duration)> {
        match &self.scheme.custom {
            Some(Custom::PayPal { .. }) => {
                let id = headers.get(&TRANSMISSION_ID)?.to_str().ok()?;
                Some((id, self.transmission_keep()))
            }
            _ => None,
        }
    }

    /// Microsoft Graph: `{"value":[{…,"clientState":…},…]}`; every notification must
    /// carry one of the configured client states (a batch is all or nothing). No id and
    /// no timestamp are signed: deliveries are deduplicated on a digest of the body.
    ///
    /// Each notification's `clientState` is compared as soon as its object is read, and
    /// nothing of a notification is kept: a batch costs one client state of memory, and a
    /// forged one is refused at its first notification, not after the whole batch is built.
    fn verify_graph(&self, body: Bytes) -> Result<Event, VerifyError> {
        let keys = self.secrets.keys();
        let matches = |state: &str| {
            keys.iter()
                .position(|key| key.token_matches(state.as_bytes()))
        };
        let batch = graph::Batch::new(&matches);
        let parsed = parse(&body, Field("value", &batch));
        if batch.refused() {
            return Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "a notification's clientState matches no secret",
            ));
        }
        let (count, secret_index) = parsed
            .ok()
            .flatten()
            .ok_or(malformed("not a Microsoft Graph notification batch"))?;
        if count == 0 {
            return Err(malformed("an empty notification batch"));
        }
        Ok(Event::new(self.event(body, None, secret_index)))
    }
}

/// Microsoft Graph's batch, read with its client states compared on the way.
mod graph {
    use std::borrow::Cow;
    use std::cell::Cell;
    use std::fmt;

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// `[{…,"clientState":…},…]`: the number of notifications and the index of the
    /// secret the last one matched. A notification whose client state matches none
    /// stops the read (and [`refused`](Batch::refused) says so).
    pub(super) struct Batch<'m> {
        matches: &'m dyn Fn(&str) -> Option<usize>,
        refused: Cell<bool>,
    }

    impl<'m> Batch<'m> {
        pub(super) fn new(matches: &'m dyn Fn(&str) -> Option<usize>) -> Self {
            Self {
                matches,
                refused: Cell::new(false),
            }
        }

        /// Whether a notification's client state matched no secret.
        pub(super) fn refused(&self) -> bool {
            self.refused.get()
        }
    }

    impl<'de> DeserializeSeed<'de> for &Batch<'_> {
        type Value = (usize, usize);

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for &Batch<'_> {
        type Value = (usize, usize);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of notifications")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let (mut count, mut secret_index) = (0, 0);
            while let Some(state) = seq.next_element_seed(ClientState)? {
                match state.as_deref().and_then(self.matches) {
                    Some(index) => secret_index = index,
                    None => {
                        self.refused.set(true);
                        return Err(de::Error::custom("a clientState matches no secret"));
                    }
                }
                count += 1;
            }
            Ok((count, secret_index))
        }
    }

    /// One notification's `clientState` (a string or `null`; given twice, an error),
    /// everything else skipped unread.
    struct ClientState;

    impl<'de> DeserializeSeed<'de> for ClientState {
        type Value = Option<String>;

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for ClientState {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a notification object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut state: Option<Option<String>> = None;
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key != "clientState" {
                    map.next_value::<IgnoredAny>()?;
                } else if state.is_some() {
                    return Err(de::Error::custom("duplicate field"));
                } else {
                    state = Some(map.next_value()?);
                }
            }
            Ok(state.flatten())
        }
    }
}

//! AWS SNS: chosen fields of the JSON message, signed with RSA under the certificate the
//! message names.

use bytes::Bytes;

use super::{malformed, rsa_signature, MAX_RSA_SIGNATURE, NO_MATCH};
use crate::error::{VerifyError, VerifyErrorKind};
use crate::event::{self, Event};
use crate::json::{parse, Strings};
use crate::scheme::{Algorithm, TimestampFormat};
use crate::timestamp;
use crate::Verifier;

/// An SNS message checked but for its signature.
pub(super) struct CheckedSns {
    /// The signed fields, by name, in the order SNS signs them.
    fields: Vec<(&'static str, String)>,
    algorithm: Algorithm,
    signature: Vec<u8>,
    timestamp: i64,
}

impl Verifier {
    /// AWS SNS: the message is JSON; its signature covers `Name\nValue\n` for a fixed,
    /// sorted list of its fields, which depends on its `Type`, under the key of the
    /// certificate at `SigningCertURL` (RSA with SHA-1 for `SignatureVersion` 1, SHA-256
    /// for 2). The event id is the signed `MessageId`.
    pub(super) fn verify_sns(&self, topics: &[String], body: Bytes) -> Result<Event, VerifyError> {
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
    pub(super) fn check_sns(
        &self,
        topics: &[String],
        body: &[u8],
    ) -> Result<CheckedSns, VerifyError> {
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
}

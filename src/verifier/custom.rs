//! The providers whose signature does not fit the header-and-template mould, each verified
//! by code of its own: Mailgun (the signature in the body), AWS SNS (chosen body fields,
//! RSA), PayPal (RSA over a CRC32 of the body) and Microsoft Graph (a shared token in
//! each notification, no signature).

use super::{one_str, Verifier};
use crate::error::{VerifyError, VerifyErrorKind};
use crate::event::{self, Event};
use crate::scheme::Custom;
use crate::timestamp;
use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;

mod graph; // Microsoft Graph: a client state in each notification
mod mailgun; // Mailgun: the signature in the body
mod paypal; // PayPal: RSA over headers and a CRC32 of the body
mod sns; // AWS SNS: RSA over chosen fields of the message

use paypal::CERT_URL;

/// The longest RSA signature read: 4096 bits.
const MAX_RSA_SIGNATURE: usize = 512;

const NO_MATCH: VerifyError = VerifyError::new(
    VerifyErrorKind::InvalidSignature,
    "no signature matches any secret",
);

fn malformed(why: &'static str) -> VerifyError {
    VerifyError::new(VerifyErrorKind::MalformedHeader, why)
}

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
            scheme: self.scheme.clone(),
        }
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
}

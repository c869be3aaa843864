//! The headers of a delivery, checked before its body is read: each one the scheme needs
//! present once and visible ASCII, a signature that could match, the timestamp's window.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::Verifier;
use crate::error::{VerifyError, VerifyErrorKind};
use crate::scheme::{declared, signature, Algorithm, IdSource, TimestampFormat, TimestampSource};
use crate::timestamp::{self};

impl Verifier {
    /// Everything that can be checked before the body is read: the headers the scheme
    /// needs, at least one signature that could match, and the timestamp's window.
    /// `VerifyWebhookLayer` answers 400 on these before it reads a byte of the body.
    pub(crate) fn check_before_body(&self, headers: &HeaderMap) -> Result<(), VerifyError> {
        match &self.scheme.custom {
            Some(custom) => self.check_custom_headers(custom, headers),
            None => self.check_headers(headers).map(drop),
        }
    }

    pub(crate) fn check_headers<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<Checked<'h>, VerifyError> {
        let scheme = &*self.scheme;
        let signature_value =
            one_str(headers, &scheme.signature_headers)?.ok_or(VerifyError::new(
                VerifyErrorKind::MissingHeader,
                "signature header is missing",
            ))?;
        let signatures = signature::parse(scheme, signature_value)?;
        if signatures.candidates.is_empty() {
            // `v1,` alone, a truncated MAC: nothing any key could match, so no HMAC.
            return Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "no signature of the scheme's length",
            ));
        }
        let raw_timestamp = match &scheme.timestamp {
            // Checked once the body is verified: it is in the body.
            None
            | Some(
                TimestampSource::BodyFieldMillis(_) | TimestampSource::BodyFieldRfc3339IfPresent(_),
            ) => None,
            Some(TimestampSource::Header(names, format)) => Some((
                one_str(headers, names)?.ok_or(VerifyError::new(
                    VerifyErrorKind::MissingHeader,
                    "timestamp header is missing",
                ))?,
                *format,
            )),
            Some(TimestampSource::SignatureEntry(_)) => Some((
                signatures.timestamp.ok_or(VerifyError::new(
                    VerifyErrorKind::MalformedHeader,
                    "signature header has no timestamp",
                ))?,
                TimestampFormat::Unix,
            )),
        };
        let timestamp = raw_timestamp
            .map(|(raw, format)| timestamp::parse(raw, format))
            .transpose()?;
        if let Some(ts) = timestamp {
            self.tolerance
                .check(ts, timestamp::unix_seconds((self.clock)()))?;
        }
        let id = match &scheme.id {
            IdSource::Header(names) => Some(one(headers, names)?.ok_or(VerifyError::new(
                VerifyErrorKind::MissingHeader,
                "id header is missing",
            ))?),
            IdSource::None | IdSource::BodyField(_) => None,
        };
        let algorithm = match &scheme.algorithm_header {
            Some(name) => {
                let accepts: Vec<Algorithm> = scheme.formats.iter().map(|f| f.algorithm).collect();
                let value = one_str(headers, std::slice::from_ref(name))?;
                Some(declared::accepted(value, &accepts)?)
            }
            None => None,
        };
        let event_type = one(headers, &scheme.type_header)?;
        Ok(Checked {
            algorithm,
            signatures,
            raw_timestamp: raw_timestamp.map(|(raw, _)| raw),
            timestamp,
            id,
            event_type,
        })
    }
}

/// A delivery's headers, checked: what [`Verifier::check_headers`] read from them.
pub(crate) struct Checked<'h> {
    /// The hash the delivery declares it was signed with, where the scheme reads one.
    pub(super) algorithm: Option<Algorithm>,
    pub(super) signatures: signature::Parsed<'h>,
    pub(super) raw_timestamp: Option<&'h str>,
    pub(super) timestamp: Option<i64>,
    pub(super) id: Option<&'h HeaderValue>,
    pub(super) event_type: Option<&'h HeaderValue>,
}

/// The value of the first of `names` that is present. Twice the same header is ambiguous
/// (which one was signed?), and a value must be visible ASCII.
pub(super) fn one<'h>(
    headers: &'h HeaderMap,
    names: &[HeaderName],
) -> Result<Option<&'h HeaderValue>, VerifyError> {
    // One lookup per alias: `get_all` finds the entry and its duplicates together.
    let Some((value, mut values)) = names.iter().find_map(|name| {
        let mut values = headers.get_all(name).into_iter();
        values.next().map(|first| (first, values))
    }) else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(VerifyError::new(
            VerifyErrorKind::MalformedHeader,
            "a webhook header appears more than once",
        ));
    }
    match value.to_str() {
        Ok(_) => Ok(Some(value)),
        Err(_) => Err(VerifyError::new(
            VerifyErrorKind::MalformedHeader,
            "a webhook header is not visible ASCII",
        )),
    }
}

pub(super) fn one_str<'h>(
    headers: &'h HeaderMap,
    names: &[HeaderName],
) -> Result<Option<&'h str>, VerifyError> {
    Ok(one(headers, names)?.map(|v| v.to_str().expect("checked by `one`")))
}

//! Reading the signature header: its entries, the timestamp entry where the scheme keeps
//! one there, and the decoded MACs to compare.

use base64::Engine as _;

use super::{Encoding, Scheme, TimestampSource};
use crate::error::{ErrorKind, VerifyError};

/// The length of an HMAC-SHA256 tag.
pub(crate) const MAC_LEN: usize = 32;

/// At most this many entries are read from one signature header; a longer header is
/// malformed. This bounds the work one request can cause (`entries × secrets`).
pub(crate) const MAX_ENTRIES: usize = 16;

/// The decoded signatures of one header, on the stack.
pub(crate) struct Candidates {
    macs: [[u8; MAC_LEN]; MAX_ENTRIES],
    len: usize,
}

impl Candidates {
    pub(crate) fn as_slice(&self) -> &[[u8; MAC_LEN]] {
        &self.macs[..self.len]
    }
}

/// What one signature header holds.
pub(crate) struct Parsed<'a> {
    pub(crate) candidates: Candidates,
    /// The raw timestamp, for schemes that keep it in the signature header.
    pub(crate) timestamp: Option<&'a str>,
}

const TOO_MANY: VerifyError = VerifyError::new(
    ErrorKind::MalformedHeader,
    "signature header has too many entries",
);

pub(crate) fn parse<'a>(scheme: &Scheme, value: &'a str) -> Result<Parsed<'a>, VerifyError> {
    let timestamp_prefix = match &scheme.timestamp {
        Some(TimestampSource::SignatureEntry(prefix)) => Some(prefix.as_ref()),
        _ => None,
    };
    let mut parsed = Parsed {
        candidates: Candidates {
            macs: [[0; MAC_LEN]; MAX_ENTRIES],
            len: 0,
        },
        timestamp: None,
    };
    let mut signature_entries = 0;
    let mut entries = 0;
    let mut push = |entry: &'a str| -> Result<(), VerifyError> {
        let entry = entry.trim_matches(|c: char| c.is_ascii_whitespace());
        if entry.is_empty() {
            return Ok(());
        }
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(TOO_MANY);
        }
        if let Some(ts) = timestamp_prefix.and_then(|p| entry.strip_prefix(p)) {
            if parsed.timestamp.replace(ts).is_some() {
                return Err(VerifyError::new(
                    ErrorKind::MalformedHeader,
                    "signature header has two timestamps",
                ));
            }
        } else if let Some(encoded) = entry.strip_prefix(scheme.prefix.as_ref()) {
            signature_entries += 1;
            // An entry that does not decode to exactly 32 bytes can never match: skip it.
            if let Some(mac) = decode(scheme.encoding, encoded) {
                let c = &mut parsed.candidates;
                c.macs[c.len] = mac;
                c.len += 1;
            }
        }
        Ok(())
    };
    match scheme.separator {
        Some(sep) => value.split(sep).try_for_each(&mut push)?,
        None => push(value)?,
    }
    if signature_entries == 0 {
        return Err(VerifyError::new(
            ErrorKind::MalformedHeader,
            "signature header has no signature in the scheme's format",
        ));
    }
    Ok(parsed)
}

/// Decodes one encoded MAC, refusing any other length before doing any work.
fn decode(encoding: Encoding, encoded: &str) -> Option<[u8; MAC_LEN]> {
    let mut mac = [0; MAC_LEN];
    match encoding {
        Encoding::Hex => {
            if encoded.len() != MAC_LEN * 2 {
                return None;
            }
            hex::decode_to_slice(encoded, &mut mac).ok()?;
        }
        Encoding::Base64 => {
            if encoded.len() != MAC_LEN.div_ceil(3) * 4 {
                return None;
            }
            let mut buf = [0; MAC_LEN + 3];
            let n = base64::engine::general_purpose::STANDARD
                .decode_slice(encoded, &mut buf)
                .ok()?;
            if n != MAC_LEN {
                return None;
            }
            mac.copy_from_slice(&buf[..MAC_LEN]);
        }
    }
    Some(mac)
}

pub(crate) fn encode(encoding: Encoding, mac: &[u8]) -> String {
    match encoding {
        Encoding::Hex => hex::encode(mac),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(mac),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many decodable signatures, and the timestamp entry; or the error kind.
    type Outcome = Result<(usize, Option<&'static str>), ErrorKind>;

    fn kind(scheme: &Scheme, value: &str) -> Outcome {
        let value: &'static str = Box::leak(value.to_owned().into_boxed_str());
        parse(scheme, value)
            .map(|p| (p.candidates.as_slice().len(), p.timestamp))
            .map_err(|e| e.kind())
    }

    #[test]
    fn header_parsing_table() {
        let hex = "ab".repeat(32);
        let b64 = format!("{}=", "A".repeat(43));
        let stripe = Scheme::stripe();
        let standard = Scheme::standard();
        let github = Scheme::github();
        let cases: Vec<(&Scheme, String, Outcome)> = vec![
            (&stripe, format!("t=1,v1={hex}"), Ok((1, Some("1")))),
            (
                &stripe,
                format!("t=1,v1={hex},v1={hex},v0={hex}"),
                Ok((2, Some("1"))),
            ),
            (&stripe, format!("v1={hex},t=9"), Ok((1, Some("9")))),
            (
                &stripe,
                format!("t=1,t=2,v1={hex}"),
                Err(ErrorKind::MalformedHeader),
            ),
            (
                &stripe,
                format!("t=1,v0={hex}"),
                Err(ErrorKind::MalformedHeader),
            ),
            (&stripe, "t=1,v1=".into(), Ok((0, Some("1")))),
            (&stripe, format!("t=1,v1={}", &hex[1..]), Ok((0, Some("1")))),
            (
                &stripe,
                format!("t=1,v1={}zz", &hex[2..]),
                Ok((0, Some("1"))),
            ),
            (&standard, format!("v1,{b64}"), Ok((1, None))),
            (
                &standard,
                format!("v1a,xyz v2,{b64}  v1,{b64}"),
                Ok((1, None)),
            ),
            (&standard, "v1,".into(), Ok((0, None))),
            (&standard, "v1,!!!!".into(), Ok((0, None))),
            (&standard, format!("v1,{}", &b64[..43]), Ok((0, None))),
            (&standard, "".into(), Err(ErrorKind::MalformedHeader)),
            (
                &standard,
                format!("v2,{b64}"),
                Err(ErrorKind::MalformedHeader),
            ),
            (&github, format!("sha256={hex}"), Ok((1, None))),
            (
                &github,
                format!("sha256={}", hex.to_uppercase()),
                Ok((1, None)),
            ),
            (
                &github,
                format!("sha1={}", &hex[..40]),
                Err(ErrorKind::MalformedHeader),
            ),
        ];
        for (scheme, value, expected) in cases {
            assert_eq!(
                kind(scheme, &value),
                expected,
                "{} {value:?}",
                scheme.name()
            );
        }
    }

    #[test]
    fn thousands_of_entries_are_refused_without_decoding_them() {
        let value = vec!["v1,AAAA"; 5000].join(" ");
        assert_eq!(
            kind(&Scheme::standard(), &value),
            Err(ErrorKind::MalformedHeader)
        );
        let just_enough = vec!["v1,AAAA"; MAX_ENTRIES].join(" ");
        assert_eq!(kind(&Scheme::standard(), &just_enough), Ok((0, None)));
    }
}

//! Reading the signature header: its entries, the timestamp entry where the scheme keeps
//! one there, and the encoded MACs to compare.
//!
//! Candidates are compared in their encoded form: our MAC is encoded once per secret
//! (cheap, table-driven) instead of decoding every candidate, and a candidate of the
//! wrong length is set aside before any work.

use base64::Engine as _;
use subtle::{Choice, ConstantTimeEq};

use super::{Encoding, Scheme, TimestampSource};
use crate::error::{ErrorKind, VerifyError};

/// The length of an HMAC-SHA256 tag.
pub(crate) const MAC_LEN: usize = 32;

/// At most this many entries are read from one signature header; a longer header is
/// malformed. This bounds the work one request can cause (`entries × secrets`).
pub(crate) const MAX_ENTRIES: usize = 16;

/// The longest encoding of a MAC: hex.
const MAX_ENCODED: usize = MAC_LEN * 2;

/// The encoded signatures of one header that have the right length, on the stack.
pub(crate) struct Candidates<'a> {
    entries: [&'a [u8]; MAX_ENTRIES],
    len: usize,
}

impl Candidates<'_> {
    /// Whether no signature has the length a MAC encodes to: none could match.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether any candidate is `mac`, encoded as the scheme encodes it. Every candidate is
    /// compared in full, whatever the outcome.
    pub(crate) fn matches(&self, encoding: Encoding, mac: &[u8; MAC_LEN]) -> bool {
        let mut buf = [0; MAX_ENCODED];
        let expected = encode_into(encoding, mac, &mut buf);
        // Hex is case-insensitive: OR-ing 0x20 lower-cases A–F and leaves digits alone
        // (no other visible ASCII byte folds onto a lower-case hex digit).
        let fold = match encoding {
            Encoding::Hex => 0x20,
            Encoding::Base64 => 0,
        };
        let mut any = Choice::from(0);
        for candidate in &self.entries[..self.len] {
            // Branch-free XOR-OR over equal lengths (checked when parsed), then a
            // constant-time test of the result.
            let diff = candidate
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (c, e)| acc | ((c | fold) ^ e));
            any |= diff.ct_eq(&0);
        }
        any.into()
    }
}

/// What one signature header holds.
pub(crate) struct Parsed<'a> {
    pub(crate) candidates: Candidates<'a>,
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
    let encoded_len = encoded_len(scheme.encoding);
    let mut parsed = Parsed {
        candidates: Candidates {
            entries: [&[]; MAX_ENTRIES],
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
            // Any other length can never match (`v1,` alone, a truncated MAC): skip it.
            if encoded.len() == encoded_len {
                let c = &mut parsed.candidates;
                c.entries[c.len] = encoded.as_bytes();
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

fn encoded_len(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Hex => MAC_LEN * 2,
        Encoding::Base64 => MAC_LEN.div_ceil(3) * 4,
    }
}

/// Encodes `mac` into `buf` (lower-case hex, or standard base64 with padding).
fn encode_into<'b>(
    encoding: Encoding,
    mac: &[u8; MAC_LEN],
    buf: &'b mut [u8; MAX_ENCODED],
) -> &'b [u8] {
    let n = encoded_len(encoding);
    match encoding {
        Encoding::Hex => hex::encode_to_slice(mac, &mut buf[..n]).expect("64 bytes for 32"),
        Encoding::Base64 => {
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(mac, &mut buf[..n])
                .expect("44 bytes for 32");
            debug_assert_eq!(written, n);
        }
    }
    &buf[..n]
}

pub(crate) fn encode(encoding: Encoding, mac: &[u8; MAC_LEN]) -> String {
    let mut buf = [0; MAX_ENCODED];
    String::from_utf8(encode_into(encoding, mac, &mut buf).to_vec()).expect("ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many decodable signatures, and the timestamp entry; or the error kind.
    type Outcome = Result<(usize, Option<&'static str>), ErrorKind>;

    fn kind(scheme: &Scheme, value: &str) -> Outcome {
        let value: &'static str = Box::leak(value.to_owned().into_boxed_str());
        parse(scheme, value)
            .map(|p| (p.candidates.len(), p.timestamp))
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
                Ok((1, Some("1"))),
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
            (&standard, format!("v1,{}", "!".repeat(44)), Ok((1, None))),
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

#[cfg(test)]
mod match_tests {
    use super::*;

    fn candidates(values: &[&'static str]) -> Candidates<'static> {
        let mut c = Candidates {
            entries: [&[]; MAX_ENTRIES],
            len: 0,
        };
        for v in values {
            c.entries[c.len] = v.as_bytes();
            c.len += 1;
        }
        c
    }

    #[test]
    fn hex_matches_in_either_case_and_nothing_else() {
        let mac = [0xab; MAC_LEN];
        let lower: &'static str = Box::leak("ab".repeat(32).into_boxed_str());
        let upper: &'static str = Box::leak("AB".repeat(32).into_boxed_str());
        let mixed: &'static str = Box::leak("aB".repeat(32).into_boxed_str());
        for ok in [lower, upper, mixed] {
            assert!(candidates(&[ok]).matches(Encoding::Hex, &mac), "{ok}");
        }
        // 'K' | 0x20 = 'k', not a hex digit; '!' | 0x20 = '!'.
        let near: &'static str = Box::leak(format!("{}ak", "ab".repeat(31)).into_boxed_str());
        assert!(!candidates(&[near]).matches(Encoding::Hex, &mac));
        assert!(candidates(&[near, lower]).matches(Encoding::Hex, &mac));
    }

    #[test]
    fn base64_matches_exactly() {
        let mac = [0u8; MAC_LEN];
        let b64: &'static str = Box::leak(format!("{}=", "A".repeat(43)).into_boxed_str());
        let lower: &'static str = Box::leak(format!("{}=", "a".repeat(43)).into_boxed_str());
        assert!(candidates(&[b64]).matches(Encoding::Base64, &mac));
        assert!(!candidates(&[lower]).matches(Encoding::Base64, &mac));
    }
}

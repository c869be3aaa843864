//! Reading the signature header: its entries, the timestamp entry where the scheme keeps
//! one there, and the encoded MACs to compare.
//!
//! Candidates are compared in their encoded form: our MAC is encoded once per secret
//! (cheap, table-driven) instead of decoding every candidate, and a candidate of the
//! wrong length is set aside before any work.

use base64::Engine as _;
use subtle::{Choice, ConstantTimeEq};

use super::key::{Key, Tag, MAX_SIGNATURE};
use super::{Encoding, Format, Scheme, TimestampSource};
use crate::error::{VerifyError, VerifyErrorKind};

/// At most this many entries are read from one signature header; a longer header is
/// malformed. This bounds the work one request can cause (`entries × secrets`).
pub(crate) const MAX_ENTRIES: usize = 16;

/// At most this many signatures are checked against each public key: a genuine sender
/// sends one per key it signs with, and each check costs a pass over the body.
const MAX_PUBLIC_KEY_CANDIDATES: usize = 4;

/// The longest encoding of any signature: hex.
const MAX_ENCODED: usize = MAX_SIGNATURE * 2;

/// The encoded signatures of one header that have a possible length, on the stack, each
/// with the index of its format in the scheme.
pub(crate) struct Candidates<'a> {
    entries: [(u8, &'a [u8]); MAX_ENTRIES],
    len: usize,
}

impl Candidates<'_> {
    /// Whether no signature has a length its algorithm encodes to: none could match.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether any candidate is a signature of the signed content (`pieces`) under `key`.
    /// Only candidates of the key's algorithm are tried. HMAC tags are compared in
    /// constant time, every candidate in full whatever the outcome.
    pub(crate) fn matches(&self, formats: &[Format], key: &Key, pieces: &[&[u8]]) -> bool {
        let algorithm = key.algorithm();
        let mine = || {
            self.entries[..self.len]
                .iter()
                .map(|&(f, c)| (&formats[usize::from(f)], c))
                .filter(move |(f, _)| f.algorithm == algorithm)
        };
        if mine().next().is_none() {
            return false;
        }
        match key.mac(pieces) {
            Some(tag) => {
                let mut any = Choice::from(0);
                for (format, candidate) in mine() {
                    any |= encoded_eq(format.encoding, &tag, candidate);
                }
                any.into()
            }
            // A public key: decode each candidate and check it (nothing secret to leak).
            None => mine()
                .take(MAX_PUBLIC_KEY_CANDIDATES)
                .any(|(format, candidate)| {
                    let mut buf = [0; MAX_SIGNATURE];
                    decode_into(format.encoding, candidate, &mut buf)
                        .is_some_and(|sig| key.verifies(pieces, sig))
                }),
        }
    }
}

/// Whether `candidate` is `tag` encoded as `encoding`, in constant time for equal lengths
/// (lengths were checked when parsed; a different one is simply unequal).
fn encoded_eq(encoding: Encoding, tag: &Tag, candidate: &[u8]) -> Choice {
    let mut buf = [0; MAX_ENCODED];
    let expected = encode_into(encoding, tag.as_bytes(), &mut buf);
    if expected.len() != candidate.len() {
        return Choice::from(0);
    }
    // Hex is case-insensitive: OR-ing 0x20 lower-cases A–F and leaves digits alone
    // (no other visible ASCII byte folds onto a lower-case hex digit).
    let fold = match encoding {
        Encoding::Hex => 0x20,
        Encoding::Base64 => 0,
    };
    // Branch-free XOR-OR, then a constant-time test of the result.
    let diff = candidate
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (c, e)| acc | ((c | fold) ^ e));
    diff.ct_eq(&0)
}

/// What one signature header holds.
pub(crate) struct Parsed<'a> {
    pub(crate) candidates: Candidates<'a>,
    /// The raw timestamp, for schemes that keep it in the signature header.
    pub(crate) timestamp: Option<&'a str>,
}

const TOO_MANY: VerifyError = VerifyError::new(
    VerifyErrorKind::MalformedHeader,
    "signature header has too many entries",
);

pub(crate) fn parse<'a>(scheme: &Scheme, value: &'a str) -> Result<Parsed<'a>, VerifyError> {
    let timestamp_prefix = match &scheme.timestamp {
        Some(TimestampSource::SignatureEntry(prefix)) => Some(prefix.as_ref()),
        _ => None,
    };
    let mut parsed = Parsed {
        candidates: Candidates {
            entries: [(0, &[]); MAX_ENTRIES],
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
                    VerifyErrorKind::MalformedHeader,
                    "signature header has two timestamps",
                ));
            }
        } else if let Some((index, encoded)) = format_of(&scheme.formats, entry) {
            signature_entries += 1;
            // Any other length can never match (`v1,` alone, a truncated MAC): skip it.
            if plausible_len(&scheme.formats[index], encoded.len()) {
                let c = &mut parsed.candidates;
                c.entries[c.len] = (index as u8, encoded.as_bytes());
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
            VerifyErrorKind::MalformedHeader,
            "signature header has no signature in the scheme's format",
        ));
    }
    Ok(parsed)
}

/// The format whose prefix the entry carries (the longest, so `v1a,` is not read as
/// `v1,`), and the encoded signature after it.
fn format_of<'a>(formats: &[Format], entry: &'a str) -> Option<(usize, &'a str)> {
    let matching = || {
        formats
            .iter()
            .enumerate()
            .filter_map(|(i, f)| entry.strip_prefix(f.prefix.as_ref()).map(|rest| (i, rest)))
    };
    let best = matching().min_by_key(|(_, rest)| rest.len())?;
    // Formats that share a prefix (Twilio's SHA-1 and SHA-256, both bare base64) are told
    // apart by the signature's length.
    Some(
        matching()
            .filter(|(_, rest)| rest.len() == best.1.len())
            .find(|(i, rest)| plausible_len(&formats[*i], rest.len()))
            .unwrap_or(best),
    )
}

fn plausible_len(format: &Format, encoded: usize) -> bool {
    let (min, max) = format.algorithm.signature_len();
    let len = |bytes: usize| match format.encoding {
        Encoding::Hex => bytes * 2,
        Encoding::Base64 => bytes.div_ceil(3) * 4,
    };
    (len(min)..=len(max)).contains(&encoded)
        && (min == max || format.encoding == Encoding::Hex || encoded.is_multiple_of(4))
        && (format.encoding == Encoding::Base64 || encoded.is_multiple_of(2))
}

/// Encodes `tag` into `buf` (lower-case hex, or standard base64 with padding).
fn encode_into<'b>(encoding: Encoding, tag: &[u8], buf: &'b mut [u8; MAX_ENCODED]) -> &'b [u8] {
    match encoding {
        Encoding::Hex => {
            let n = tag.len() * 2;
            hex::encode_to_slice(tag, &mut buf[..n]).expect("twice the length");
            &buf[..n]
        }
        Encoding::Base64 => {
            let n = base64::engine::general_purpose::STANDARD
                .encode_slice(tag, &mut buf[..])
                .expect("room for any signature");
            &buf[..n]
        }
    }
}

/// Decodes an encoded signature into `buf`; `None` when it is not valid in its encoding.
fn decode_into<'b>(
    encoding: Encoding,
    encoded: &[u8],
    buf: &'b mut [u8; MAX_SIGNATURE],
) -> Option<&'b [u8]> {
    match encoding {
        Encoding::Hex => {
            let n = encoded.len() / 2;
            hex::decode_to_slice(encoded, buf.get_mut(..n)?).ok()?;
            Some(&buf[..n])
        }
        Encoding::Base64 => {
            let n = base64::engine::general_purpose::STANDARD
                .decode_slice(encoded, &mut buf[..])
                .ok()?;
            Some(&buf[..n])
        }
    }
}

pub(crate) fn encode(encoding: Encoding, tag: &Tag) -> String {
    let mut buf = [0; MAX_ENCODED];
    String::from_utf8(encode_into(encoding, tag.as_bytes(), &mut buf).to_vec()).expect("ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many decodable signatures, and the timestamp entry; or the error kind.
    type Outcome = Result<(usize, Option<&'static str>), VerifyErrorKind>;

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
                Err(VerifyErrorKind::MalformedHeader),
            ),
            (
                &stripe,
                format!("t=1,v0={hex}"),
                Err(VerifyErrorKind::MalformedHeader),
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
            (&standard, "".into(), Err(VerifyErrorKind::MalformedHeader)),
            (
                &standard,
                format!("v2,{b64}"),
                Err(VerifyErrorKind::MalformedHeader),
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
                Err(VerifyErrorKind::MalformedHeader),
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
            Err(VerifyErrorKind::MalformedHeader)
        );
        let just_enough = vec!["v1,AAAA"; MAX_ENTRIES].join(" ");
        assert_eq!(kind(&Scheme::standard(), &just_enough), Ok((0, None)));
    }
}

#[cfg(test)]
mod match_tests {
    use super::*;
    use crate::scheme::Algorithm;

    fn hmac_scheme(encoding: Encoding) -> Scheme {
        Scheme::github().with_prefix("").with_encoding(encoding)
    }

    /// A key whose tag over no pieces is known, and candidates to compare with it.
    fn matches(encoding: Encoding, candidates: &[String]) -> bool {
        let scheme = hmac_scheme(encoding);
        let key = crate::scheme::key::verifying(&scheme, "0123456789abcdef", 0).unwrap();
        let mut c = Candidates {
            entries: [(0, &[]); MAX_ENTRIES],
            len: 0,
        };
        for v in candidates {
            c.entries[c.len] = (0, v.as_bytes());
            c.len += 1;
        }
        c.matches(&scheme.formats, &key, &[b"payload"])
    }

    fn tag(encoding: Encoding) -> String {
        let scheme = hmac_scheme(encoding);
        let key = crate::scheme::key::verifying(&scheme, "0123456789abcdef", 0).unwrap();
        encode(encoding, &key.mac(&[b"payload"]).unwrap())
    }

    #[test]
    fn hex_matches_in_either_case_and_nothing_else() {
        let lower = tag(Encoding::Hex);
        assert_eq!(lower, lower.to_lowercase());
        let upper = lower.to_uppercase();
        assert!(matches(Encoding::Hex, std::slice::from_ref(&lower)));
        assert!(matches(Encoding::Hex, &[upper]));
        // 'K' | 0x20 = 'k', not a hex digit.
        let mut near = lower.clone();
        near.replace_range(63.., "k");
        assert!(!matches(Encoding::Hex, &[near.clone()]));
        assert!(matches(Encoding::Hex, &[near, lower]));
    }

    #[test]
    fn base64_matches_exactly() {
        let b64 = tag(Encoding::Base64);
        assert!(matches(Encoding::Base64, std::slice::from_ref(&b64)));
        assert!(!matches(Encoding::Base64, &[b64.to_lowercase()]));
    }

    #[test]
    fn plausible_lengths_follow_the_algorithm() {
        let f = |alg, enc| Format::new("", enc, alg);
        assert!(plausible_len(&f(Algorithm::HmacSha1, Encoding::Hex), 40));
        assert!(!plausible_len(&f(Algorithm::HmacSha1, Encoding::Hex), 64));
        assert!(plausible_len(
            &f(Algorithm::HmacSha512, Encoding::Base64),
            88
        ));
        assert!(plausible_len(&f(Algorithm::Ed25519, Encoding::Hex), 128));
        // DER ECDSA varies: 70 to 72 bytes in practice, base64 in steps of four.
        assert!(plausible_len(
            &f(Algorithm::EcdsaP256, Encoding::Base64),
            96
        ));
        assert!(!plausible_len(
            &f(Algorithm::EcdsaP256, Encoding::Base64),
            97
        ));
        assert!(!plausible_len(
            &f(Algorithm::EcdsaP256, Encoding::Base64),
            200
        ));
    }
}

//! Key bytes written as base64 or hex.

use base64::Engine as _;
use zeroize::Zeroizing;

pub(super) fn decode_b64(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .map(Zeroizing::new)
}

/// Standard base64 with or without its `=` padding (the Standard Webhooks SDKs accept
/// both for `whsec_` secrets); otherwise strict (no stray bits, no other alphabet).
pub(super) fn decode_b64_unpadded(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const INDIFFERENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    INDIFFERENT.decode(text).ok().map(Zeroizing::new)
}

/// `len` bytes written as hex or standard base64.
pub(super) fn decode_key(text: &str, len: usize) -> Option<Zeroizing<Vec<u8>>> {
    let bytes = if text.len() == len * 2 {
        Zeroizing::new(hex::decode(text).ok()?)
    } else {
        decode_b64(text)?
    };
    (bytes.len() == len).then_some(bytes)
}

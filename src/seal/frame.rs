//! What a ciphertext holds once opened: one byte saying how the payload follows, then the
//! payload, as it is or LZ4-compressed.
//!
//! Compressing before sealing keeps what a database could have compressed itself: a sealed
//! body is random bytes to PostgreSQL's TOAST and to SQLite's pages, so a sealed JSON body
//! would otherwise take its full length in the row, the WAL and every backup. The cost
//! (a ciphertext's length says how compressible its payload was) is `SECURITY.md`'s, and
//! [`KeyRing::without_compression`](super::KeyRing::without_compression) turns it off.

/// The payload follows as it is.
const STORED: u8 = 0;
/// The payload's length (4 bytes, little-endian) follows, then its LZ4 block.
const LZ4: u8 = 1;

/// Shorter payloads are stored as they are: LZ4 saves few bytes on them (Rails' encryption
/// draws its line at 140).
const COMPRESS_FROM: usize = 128;

/// LZ4 cannot expand a block more than 255 times (a match's length grows by at most 255 a
/// byte): a larger stated length is not one of ours, and is refused before allocating it.
const MAX_RATIO: usize = 255;

/// The framed payload to seal, with room for the tag after it (`spare` bytes), so sealing
/// never reallocates. Compressed when `compress` is set, the payload is long enough and
/// LZ4 makes it shorter; otherwise stored.
pub(super) fn encode(payload: &[u8], compress: bool, spare: usize) -> Vec<u8> {
    if compress && payload.len() >= COMPRESS_FROM {
        if let Ok(len) = u32::try_from(payload.len()) {
            let most = lz4_flex::block::get_maximum_output_size(payload.len());
            let mut out = vec![0; 5 + most + spare]; // `most` exceeds the payload's length
            out[0] = LZ4;
            out[1..5].copy_from_slice(&len.to_le_bytes());
            if let Ok(n) = lz4_flex::block::compress_into(payload, &mut out[5..5 + most]) {
                if 5 + n < 1 + payload.len() {
                    out.truncate(5 + n);
                    out.shrink_to(5 + n + spare); // a sealed row can wait in a batch: not the whole bound
                    return out;
                }
            }
            // Incompressible (random bytes, already compressed): the buffer is reused, and
            // its spare tenth given back.
            out.clear();
            out.push(STORED);
            out.extend_from_slice(payload);
            out.shrink_to(1 + payload.len() + spare);
            return out;
        }
    }
    let mut out = Vec::with_capacity(1 + payload.len() + spare);
    out.push(STORED);
    out.extend_from_slice(payload);
    out
}

/// The payload of an opened frame, or `None` when it is not a frame this module wrote
/// (only a key's holder can make one: the tag verified before this runs).
pub(super) fn decode(mut frame: Vec<u8>) -> Option<Vec<u8>> {
    match *frame.first()? {
        STORED => {
            frame.remove(0);
            Some(frame)
        }
        LZ4 => {
            let len = u32::from_le_bytes(frame.get(1..5)?.try_into().ok()?) as usize;
            let block = &frame[5..];
            if len > block.len().saturating_mul(MAX_RATIO) {
                return None;
            }
            let mut payload = vec![0; len];
            match lz4_flex::block::decompress_into(block, &mut payload) {
                Ok(n) if n == len => Some(payload),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{decode, encode, COMPRESS_FROM, LZ4, STORED};

    #[test]
    fn compressible_payloads_shrink_and_come_back_whole() {
        let json =
            br#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"customer":"cus_1"}}}"#
                .repeat(20);
        let frame = encode(&json, true, 16);
        assert_eq!(frame[0], LZ4);
        assert!(
            frame.len() < json.len() / 4,
            "{} of {}",
            frame.len(),
            json.len()
        );
        assert!(frame.capacity() >= frame.len() + 16, "room for the tag");
        assert_eq!(decode(frame).unwrap(), json);
    }

    #[test]
    fn short_incompressible_or_uncompressed_payloads_are_stored_as_they_are() {
        // xorshift64: bytes without repeats for LZ4 to find.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[3]
            })
            .collect();
        let short = vec![b'x'; COMPRESS_FROM - 1];
        let long = vec![b'x'; 64 * 1024];
        for (payload, compress) in [
            (&random, true),
            (&short, true),
            (&long, false),
            (&vec![], true),
        ] {
            let frame = encode(payload, compress, 16);
            assert_eq!(frame[0], STORED);
            assert_eq!(&frame[1..], &payload[..]);
            assert_eq!(decode(frame).unwrap(), *payload);
        }
    }

    #[test]
    fn frames_this_module_never_writes_are_refused_not_a_panic() {
        let good = encode(&vec![b'x'; 4096], true, 0);
        let mut too_long = good.clone();
        too_long[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut too_short = good.clone();
        too_short[1..5].copy_from_slice(&100u32.to_le_bytes());
        // One byte more than the block holds: the length must match exactly.
        let mut one_more = good.clone();
        one_more[1..5].copy_from_slice(&4097u32.to_le_bytes());
        let mut cut = good.clone();
        cut.truncate(good.len() - 3);
        for frame in [
            vec![],
            vec![2, 0],
            vec![LZ4, 1, 0],
            too_long,
            too_short,
            one_more,
            cut,
        ] {
            assert_eq!(decode(frame), None);
        }
    }
}

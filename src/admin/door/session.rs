//! The page's sessions: a cookie that is a random id and an expiry, signed with a key
//! derived from the token (so every replica built from the same token accepts it, and the
//! cookie says nothing of the token); sign-out revokes its id in this process until it
//! would have expired.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::OperatorToken;

/// The cookie's name.
pub(super) const COOKIE: &str = "tower_webhook_admin";

/// Revoked sessions kept at most (each until it would have expired): far more sign-outs
/// than operators make within a session's life.
const MAX_REVOKED: usize = 10_000;

/// id (16 random bytes) ‖ expiry (unix milliseconds, big-endian) ‖ HMAC-SHA256 of both.
const ID: usize = 16;
const SIGNED: usize = ID + 8;
const LEN: usize = SIGNED + 32;

/// An open session, as its cookie says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Session {
    id: [u8; ID],
    expires_ms: u64,
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn mac(token: &OperatorToken, signed: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(token.session_key())
        .expect("HMAC takes any key length");
    mac.update(signed);
    mac
}

/// A new session for `max_age`: its cookie value.
pub(super) fn open(token: &OperatorToken, max_age: Duration) -> String {
    let id = uuid::Uuid::new_v4().into_bytes(); // 122 bits from the OS's random source
    let expires_ms =
        now_ms().saturating_add(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX));
    let mut value = [0u8; LEN];
    value[..ID].copy_from_slice(&id);
    value[ID..SIGNED].copy_from_slice(&expires_ms.to_be_bytes());
    let tag = mac(token, &value[..SIGNED]).finalize().into_bytes();
    value[SIGNED..].copy_from_slice(&tag);
    URL_SAFE_NO_PAD.encode(value)
}

/// The session a cookie value holds, when its signature is the token's and it has not
/// expired (revocation is [`Revoked`]'s to say).
pub(super) fn read(token: &OperatorToken, value: &str) -> Option<Session> {
    let bytes = URL_SAFE_NO_PAD.decode(value).ok()?;
    let bytes: &[u8; LEN] = bytes.as_slice().try_into().ok()?;
    mac(token, &bytes[..SIGNED])
        .verify_slice(&bytes[SIGNED..])
        .ok()?; // constant time
    let session = Session {
        id: bytes[..ID].try_into().ok()?,
        expires_ms: u64::from_be_bytes(bytes[ID..SIGNED].try_into().ok()?),
    };
    (session.expires_ms > now_ms()).then_some(session)
}

/// The sessions signed out in this process, each kept until it would have expired.
#[derive(Debug, Default)]
pub(super) struct Revoked {
    ids: Mutex<HashMap<[u8; ID], u64>>,
}

impl Revoked {
    pub(super) fn revoke(&self, session: Session) {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.len() >= MAX_REVOKED {
            let now = now_ms();
            ids.retain(|_, expires| *expires > now);
        }
        if ids.len() >= MAX_REVOKED {
            // Still full: the one nearest its own expiry goes first.
            let nearest = ids.iter().min_by_key(|(_, e)| **e).map(|(id, _)| *id);
            if let Some(id) = nearest {
                ids.remove(&id);
            }
        }
        ids.insert(session.id, session.expires_ms);
    }

    pub(super) fn contains(&self, session: Session) -> bool {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.contains_key(&session.id)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(t: &str) -> OperatorToken {
        OperatorToken::new(t).unwrap()
    }

    #[test]
    fn a_session_reads_back_under_its_token_only_and_until_it_expires() {
        let (a, b) = (
            token("operator-token-aaaaaaaa"),
            token("operator-token-bbbbbbbb"),
        );
        let value = open(&a, Duration::from_secs(60));
        let session = read(&a, &value).expect("its own token reads it");
        assert!(
            read(&token("operator-token-aaaaaaaa"), &value).is_some(),
            "another process with the same token"
        );
        assert_eq!(read(&b, &value), None, "another token's");
        assert_ne!(
            open(&a, Duration::from_secs(60)),
            value,
            "each session its own id"
        );
        let mut tampered = URL_SAFE_NO_PAD.decode(&value).unwrap();
        tampered[ID + 7] ^= 1; // a later expiry
        assert_eq!(read(&a, &URL_SAFE_NO_PAD.encode(&tampered)), None);
        for bad in ["", "x", &value[1..], "tower_webhook_admin"] {
            assert_eq!(read(&a, bad), None, "{bad:?}");
        }
        assert!(session.expires_ms > now_ms() + 59_000);
        let gone = open(&a, Duration::ZERO);
        assert_eq!(read(&a, &gone), None, "expired");
    }

    #[test]
    fn revoked_sessions_are_bounded() {
        let a = token("operator-token-aaaaaaaa");
        let revoked = Revoked::default();
        let first = read(&a, &open(&a, Duration::from_secs(60))).unwrap();
        revoked.revoke(first);
        assert!(revoked.contains(first));
        for _ in 0..MAX_REVOKED + 10 {
            revoked.revoke(read(&a, &open(&a, Duration::from_secs(3600))).unwrap());
        }
        assert_eq!(revoked.len(), MAX_REVOKED);
        assert!(
            !revoked.contains(first),
            "the nearest to its expiry went first"
        );
    }
}

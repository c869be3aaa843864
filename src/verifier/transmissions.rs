//! PayPal's transmissions seen lately: a transmission id is accepted with one body only.
//!
//! PayPal signs a CRC-32 of the body, which four chosen bytes can force: a captured
//! delivery's headers verify any body of the same CRC. Remembering each transmission id
//! with a digest of its body refuses a second body under the same id for as long as the
//! captured headers can pass the timestamp check.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use sha2::Digest as _;

use crate::error::{VerifyError, VerifyErrorKind};

/// The most transmissions remembered; past it the oldest are forgotten first. Only
/// verified deliveries are remembered (PayPal's own rate), so this is reached only by a
/// flood PayPal itself sent.
const MAX: usize = 100_000;

/// Transmission ids with a digest of the body each was first seen with, until their
/// headers are stale. Shared by every clone of a verifier (one per process: see
/// `Scheme::paypal`'s `# Security`).
#[derive(Default)]
pub(crate) struct Transmissions {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Id → (digest of its body, forgotten at this unix second).
    bodies: HashMap<Box<str>, ([u8; 32], i64)>,
    /// Ids in the order they were first seen, with when each is forgotten.
    order: VecDeque<(i64, Box<str>)>,
}

impl Transmissions {
    /// Accepts `body` under transmission `id` unless the id came with another body in the
    /// last `keep_secs`; remembers it until `now + keep_secs`.
    pub(crate) fn admit(
        &self,
        id: &str,
        body: &[u8],
        now: i64,
        keep_secs: i64,
    ) -> Result<(), VerifyError> {
        let digest: [u8; 32] = sha2::Sha256::digest(body).into();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let State { bodies, order } = &mut *state;
        while let Some((until, _)) = order.front() {
            if *until > now && order.len() <= MAX {
                break;
            }
            let (until, old) = order.pop_front().expect("front exists");
            if bodies.get(&old).is_some_and(|(_, u)| *u == until) {
                bodies.remove(&old);
            }
        }
        match bodies.get(id) {
            // The same transmission again (a resent request): dedupe answers it.
            Some((seen, _)) if *seen == digest => Ok(()),
            Some(_) => Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "this transmission was already delivered with another body",
            )),
            None => {
                let until = now.saturating_add(keep_secs);
                bodies.insert(id.into(), (digest, until));
                order.push_back((until, id.into()));
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Transmissions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transmissions").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_body_per_transmission_until_it_is_forgotten() {
        let t = Transmissions::default();
        t.admit("tx-1", b"genuine", 1_000, 600).unwrap();
        t.admit("tx-1", b"genuine", 1_100, 600).unwrap();
        let e = t.admit("tx-1", b"forged", 1_599, 600).unwrap_err();
        assert_eq!(e.kind(), VerifyErrorKind::InvalidSignature);
        t.admit("tx-2", b"forged", 1_100, 600).unwrap();
        // Forgotten once its headers are stale anyway.
        t.admit("tx-1", b"forged", 1_600, 600).unwrap();
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_bound() {
        let t = Transmissions::default();
        for i in 0..=MAX {
            t.admit(&i.to_string(), b"a", 0, 600).unwrap();
        }
        t.admit("next", b"a", 0, 600).unwrap();
        let state = t.state.lock().unwrap();
        assert!(state.bodies.len() <= MAX + 1 && state.order.len() <= MAX + 1);
        assert!(!state.bodies.contains_key("0"));
    }
}

//! Microsoft Graph: a shared client state in each notification of the batch, no
//! signature. The batch is read with its client states compared on the way.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::malformed;
use crate::error::{VerifyError, VerifyErrorKind};
use crate::event::Event;
use crate::json::{parse, Field};
use crate::Verifier;

impl Verifier {
    /// Microsoft Graph: `{"value":[{…,"clientState":…},…]}`; every notification must
    /// carry one of the configured client states (a batch is all or nothing). No id and
    /// no timestamp are signed: deliveries are deduplicated on a digest of the body.
    ///
    /// Each notification's `clientState` is compared as soon as its object is read, and
    /// nothing of a notification is kept: a batch costs one client state of memory, and a
    /// forged one is refused at its first notification, not after the whole batch is built.
    pub(super) fn verify_graph(&self, body: Bytes) -> Result<Event, VerifyError> {
        let keys = self.secrets.keys();
        let matches = |state: &str| {
            keys.iter()
                .position(|key| key.token_matches(state.as_bytes()))
        };
        let batch = Batch::new(&matches);
        let parsed = parse(&body, Field("value", &batch));
        if batch.refused() {
            return Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "a notification's clientState matches no secret",
            ));
        }
        let (count, secret_index) = parsed
            .ok()
            .flatten()
            .ok_or(malformed("not a Microsoft Graph notification batch"))?;
        if count == 0 {
            return Err(malformed("an empty notification batch"));
        }
        Ok(Event::new(self.event(body, None, secret_index)))
    }
}

/// `[{…,"clientState":…},…]`: the number of notifications and the index of the
/// secret the last one matched. A notification whose client state matches none
/// stops the read (and [`refused`](Batch::refused) says so).
pub(super) struct Batch<'m> {
    matches: &'m dyn Fn(&str) -> Option<usize>,
    refused: Cell<bool>,
}

impl<'m> Batch<'m> {
    pub(super) fn new(matches: &'m dyn Fn(&str) -> Option<usize>) -> Self {
        Self {
            matches,
            refused: Cell::new(false),
        }
    }

    /// Whether a notification's client state matched no secret.
    pub(super) fn refused(&self) -> bool {
        self.refused.get()
    }
}

impl<'de> DeserializeSeed<'de> for &Batch<'_> {
    type Value = (usize, usize);

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for &Batch<'_> {
    type Value = (usize, usize);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of notifications")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut count, mut secret_index) = (0, 0);
        while let Some(state) = seq.next_element_seed(ClientState)? {
            match state.as_deref().and_then(self.matches) {
                Some(index) => secret_index = index,
                None => {
                    self.refused.set(true);
                    return Err(de::Error::custom("a clientState matches no secret"));
                }
            }
            count += 1;
        }
        Ok((count, secret_index))
    }
}

/// One notification's `clientState` (a string or `null`; given twice, an error),
/// everything else skipped unread.
struct ClientState;

impl<'de> DeserializeSeed<'de> for ClientState {
    type Value = Option<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ClientState {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a notification object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut state: Option<Option<String>> = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key != "clientState" {
                map.next_value::<IgnoredAny>()?;
            } else if state.is_some() {
                return Err(de::Error::custom("duplicate field"));
            } else {
                state = Some(map.next_value()?);
            }
        }
        Ok(state.flatten())
    }
}

//! The keys values are recorded under: the fixed ones, built at compile time, each
//! source's, built once on first use, and each inbox processor's, built with it.

use std::sync::OnceLock;
use std::time::Duration;

use ::metrics::{Key, Label, SharedString};

use super::catalog::{
    ATTEMPTS, BACKLOGGED, DEAD, DEPTH, DUPLICATES, HANDLER, HELD_BACK, IN_FLIGHT, LAG, REJECTED,
    STORE, UNAVAILABLE, VERIFICATION, VERIFIED,
};
use super::set;
use crate::metrics::{Attempt, Handler, HeldBack, Operation};
use crate::VerifyErrorKind;

/// A key of static parts: built at compile time.
macro_rules! static_key {
    ($name:expr, $label:literal => $value:literal) => {{
        static LABELS: [Label; 1] = [Label::from_static_parts($label, $value)];
        static KEY: Key = Key::from_static_parts($name, &LABELS);
        &KEY
    }};
    ($name:expr) => {{
        static KEY: Key = Key::from_static_name($name);
        &KEY
    }};
}

pub(in crate::metrics) fn operation_key(operation: Operation) -> &'static Key {
    match operation {
        Operation::Claim => static_key!(STORE, "operation" => "claim"),
        Operation::Renew => static_key!(STORE, "operation" => "renew"),
        Operation::Complete => static_key!(STORE, "operation" => "complete"),
        Operation::Release => static_key!(STORE, "operation" => "release"),
        Operation::Accept => static_key!(STORE, "operation" => "accept"),
        Operation::InboxClaim => static_key!(STORE, "operation" => "inbox_claim"),
        Operation::InboxRenew => static_key!(STORE, "operation" => "inbox_renew"),
        Operation::InboxFinish => static_key!(STORE, "operation" => "inbox_finish"),
        Operation::InboxCounts => static_key!(STORE, "operation" => "inbox_counts"),
    }
}

/// One processor's inbox keys (`processor` label), built together: a worker records
/// them from its first event on.
pub(in crate::metrics) struct ProcessorKeys {
    attempts: [Key; 6],
    held_back: [Key; 6],
    /// `queued`, `processing`, `paused`.
    depth: [Key; 3],
    dead: Key,
    lag: Key,
}

impl ProcessorKeys {
    pub(in crate::metrics) fn new(name: &str) -> Self {
        let name = SharedString::from_shared(std::sync::Arc::<str>::from(name));
        let key = |metric: &'static str, other: Option<(&'static str, &'static str)>| {
            let processor = Label::new("processor", name.clone());
            let other = other.map(|(k, v)| Label::from_static_parts(k, v));
            Key::from_parts(
                metric,
                [processor].into_iter().chain(other).collect::<Vec<_>>(),
            )
        };
        let outcomes = ["processed", "retry", "dead", "abandoned", "snoozed", "lost"];
        let rules = [
            "paused",
            "per_source",
            "per_type",
            "per_object",
            "rate",
            "pauses_unread",
        ];
        Self {
            attempts: outcomes.map(|o| key(ATTEMPTS, Some(("outcome", o)))),
            held_back: rules.map(|r| key(HELD_BACK, Some(("rule", r)))),
            depth: ["queued", "processing", "paused"].map(|s| key(DEPTH, Some(("state", s)))),
            dead: key(DEAD, None),
            lag: key(LAG, None),
        }
    }

    pub(in crate::metrics) fn attempt(&self, outcome: Attempt) -> &Key {
        &self.attempts[match outcome {
            Attempt::Processed => 0,
            Attempt::Retry => 1,
            Attempt::Dead => 2,
            Attempt::Abandoned => 3,
            Attempt::Snoozed => 4,
            Attempt::Lost => 5,
        }]
    }

    pub(in crate::metrics) fn held_back(&self, rule: HeldBack) -> &Key {
        &self.held_back[match rule {
            HeldBack::Paused => 0,
            HeldBack::PerSource => 1,
            HeldBack::PerType => 2,
            HeldBack::PerObject => 3,
            HeldBack::Rate => 4,
            HeldBack::PausesUnread => 5,
        }]
    }

    pub(in crate::metrics) fn gauges(
        &self,
        (queued, processing, paused): (u64, u64, u64),
        dead: u64,
        lag: Option<Duration>,
    ) {
        set(&self.depth[0], queued as f64);
        set(&self.depth[1], processing as f64);
        set(&self.depth[2], paused as f64);
        set(&self.dead, dead as f64);
        set(&self.lag, lag.map_or(0.0, |d| d.as_secs_f64()));
    }
}

/// A metric labelled with a source.
#[derive(Clone, Copy)]
pub(in crate::metrics) enum Slot {
    Verified,
    Rejected(VerifyErrorKind),
    Verification,
    Duplicate,
    InFlight,
    Unavailable,
    Backlogged,
    Handler(Handler),
}

/// How many rejection reasons have a slot of their own (every kind there is: see
/// the tests).
pub(super) const REASONS: usize = 13;
pub(super) const SLOTS: usize = 10 + REASONS;

impl Slot {
    pub(super) fn index(self) -> usize {
        match self {
            Slot::Verified => 0,
            Slot::Verification => 1,
            Slot::Duplicate => 2,
            Slot::InFlight => 3,
            Slot::Unavailable => 4,
            Slot::Handler(Handler::Success) => 5,
            Slot::Handler(Handler::Failure) => 6,
            Slot::Handler(Handler::Panic) => 7,
            // A kind added without a slot shares the last one's key: see the test.
            Slot::Backlogged => 8,
            Slot::Rejected(kind) => 9 + (kind as usize).min(REASONS),
        }
    }

    fn key(self, source: &SharedString) -> Key {
        let source = Label::new("source", source.clone());
        let (name, other) = match self {
            Slot::Verified => (VERIFIED, None),
            Slot::Verification => (VERIFICATION, None),
            Slot::Duplicate => (DUPLICATES, None),
            Slot::InFlight => (IN_FLIGHT, None),
            Slot::Unavailable => (UNAVAILABLE, None),
            Slot::Backlogged => (BACKLOGGED, None),
            Slot::Handler(outcome) => (
                HANDLER,
                Some(Label::from_static_parts(
                    "outcome",
                    match outcome {
                        Handler::Success => "success",
                        Handler::Failure => "failure",
                        Handler::Panic => "panic",
                    },
                )),
            ),
            Slot::Rejected(kind) => (
                REJECTED,
                Some(Label::from_static_parts("reason", kind.as_label())),
            ),
        };
        Key::from_parts(name, [source].into_iter().chain(other).collect::<Vec<_>>())
    }
}

/// A source's keys, each built the first time it is recorded.
pub(in crate::metrics) struct SourceKeys {
    source: SharedString,
    keys: [OnceLock<Key>; SLOTS],
}

impl SourceKeys {
    pub(in crate::metrics) fn new(source: &str) -> Self {
        Self {
            source: SharedString::from_shared(std::sync::Arc::<str>::from(source)),
            keys: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    pub(in crate::metrics) fn key(&self, slot: Slot) -> &Key {
        self.keys[slot.index()].get_or_init(|| slot.key(&self.source))
    }
}

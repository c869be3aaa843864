//! The keys values are recorded under: the fixed ones, built at compile time, and each
//! source's, built once on first use.

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

pub(in crate::metrics) fn held_back_key(rule: HeldBack) -> &'static Key {
    match rule {
        HeldBack::Paused => static_key!(HELD_BACK, "rule" => "paused"),
        HeldBack::PerSource => static_key!(HELD_BACK, "rule" => "per_source"),
        HeldBack::PerType => static_key!(HELD_BACK, "rule" => "per_type"),
        HeldBack::PerObject => static_key!(HELD_BACK, "rule" => "per_object"),
        HeldBack::Rate => static_key!(HELD_BACK, "rule" => "rate"),
    }
}

pub(in crate::metrics) fn attempt_key(outcome: Attempt) -> &'static Key {
    match outcome {
        Attempt::Processed => static_key!(ATTEMPTS, "outcome" => "processed"),
        Attempt::Retry => static_key!(ATTEMPTS, "outcome" => "retry"),
        Attempt::Dead => static_key!(ATTEMPTS, "outcome" => "dead"),
        Attempt::Abandoned => static_key!(ATTEMPTS, "outcome" => "abandoned"),
        Attempt::Snoozed => static_key!(ATTEMPTS, "outcome" => "snoozed"),
        Attempt::Lost => static_key!(ATTEMPTS, "outcome" => "lost"),
    }
}

pub(in crate::metrics) fn inbox_gauges(
    (queued, processing, paused): (u64, u64, u64),
    dead: u64,
    lag: Option<Duration>,
) {
    set(static_key!(DEPTH, "state" => "queued"), queued as f64);
    set(static_key!(DEPTH, "state" => "paused"), paused as f64);
    set(
        static_key!(DEPTH, "state" => "processing"),
        processing as f64,
    );
    set(static_key!(DEAD), dead as f64);
    set(static_key!(LAG), lag.map_or(0.0, |d| d.as_secs_f64()));
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

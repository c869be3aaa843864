use ::metrics::Unit;

use super::catalog::{Type, DESCRIPTIONS};
use super::keys::{Slot, REASONS, SLOTS};
use crate::VerifyErrorKind;

const KINDS: [VerifyErrorKind; REASONS] = [
    VerifyErrorKind::MissingHeader,
    VerifyErrorKind::MalformedHeader,
    VerifyErrorKind::InvalidSignature,
    VerifyErrorKind::TimestampTooOld,
    VerifyErrorKind::TimestampInFuture,
    VerifyErrorKind::BodyTooLarge,
    VerifyErrorKind::BodyRead,
    VerifyErrorKind::BodyTimeout,
    VerifyErrorKind::Misconfigured,
    VerifyErrorKind::UnknownTenant,
    VerifyErrorKind::SecretsUnavailable,
    VerifyErrorKind::StoreUnavailable,
    VerifyErrorKind::MethodNotAllowed,
];

#[test]
fn every_rejection_reason_has_a_slot_and_a_label_of_its_own() {
    let mut slots: Vec<usize> = KINDS.iter().map(|k| Slot::Rejected(*k).index()).collect();
    slots.sort();
    assert_eq!(slots, (9..9 + REASONS).collect::<Vec<_>>());
    assert!(slots.iter().all(|s| *s < SLOTS));
    let mut labels: Vec<&str> = KINDS.iter().map(|k| k.as_label()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), REASONS);
    for label in labels {
        assert!(
            label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "snake case: {label}"
        );
    }
}

#[test]
fn the_module_docs_list_every_metric_and_every_reason_with_prometheus_names() {
    let docs = include_str!("../../metrics.rs");
    for (name, kind, unit, _) in DESCRIPTIONS {
        assert!(
            docs.contains(&format!("| `{name}` |")),
            "{name} in the table"
        );
        assert!(name.starts_with("tower_webhook_"), "{name}");
        match kind {
            Type::Counter => assert!(name.ends_with("_total"), "{name}"),
            _ => assert!(!name.ends_with("_total"), "{name}"),
        }
        assert_eq!(unit == Unit::Seconds, name.ends_with("_seconds"), "{name}");
    }
    for kind in KINDS {
        assert!(docs.contains(&format!("`{}`", kind.as_label())), "{kind:?}");
    }
}

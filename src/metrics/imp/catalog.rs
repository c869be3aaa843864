//! Every metric the crate records: its name, type, unit and help text.

use ::metrics::Unit;

pub(super) const VERIFIED: &str = "tower_webhook_deliveries_verified_total";
pub(super) const REJECTED: &str = "tower_webhook_deliveries_rejected_total";
pub(super) const VERIFICATION: &str = "tower_webhook_verification_duration_seconds";
pub(super) const DUPLICATES: &str = "tower_webhook_duplicates_total";
pub(super) const IN_FLIGHT: &str = "tower_webhook_in_flight_conflicts_total";
pub(super) const UNAVAILABLE: &str = "tower_webhook_store_unavailable_total";
pub(super) const BACKLOGGED: &str = "tower_webhook_inbox_backlogged_total";
pub(super) const HANDLER: &str = "tower_webhook_handler_outcomes_total";
pub(super) const STORE: &str = "tower_webhook_store_operation_duration_seconds";
pub(super) const ATTEMPTS: &str = "tower_webhook_inbox_attempts_total";
pub(super) const HELD_BACK: &str = "tower_webhook_inbox_held_back_total";
pub(super) const DEPTH: &str = "tower_webhook_inbox_depth";
pub(super) const DEAD: &str = "tower_webhook_inbox_dead_rows";
pub(super) const LAG: &str = "tower_webhook_inbox_lag_seconds";
pub(super) const UNREADABLE: &str = "tower_webhook_inbox_unreadable_total";
pub(super) const INVALID: &str = "tower_webhook_inbox_invalid_total";

#[derive(Clone, Copy)]
pub(super) enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: its name, type, unit and help text (given to each recorder once).
pub(super) const DESCRIPTIONS: [(&str, Type, Unit, &str); 16] = [
    (
        VERIFIED,
        Type::Counter,
        Unit::Count,
        "Webhook deliveries whose signature and timestamp verified.",
    ),
    (
        REJECTED,
        Type::Counter,
        Unit::Count,
        "Webhook deliveries refused by the verify layer, by reason.",
    ),
    (
        VERIFICATION,
        Type::Histogram,
        Unit::Seconds,
        "Time to verify a collected delivery's signature and timestamp.",
    ),
    (
        DUPLICATES,
        Type::Counter,
        Unit::Count,
        "Deliveries of an event already handled or stored (answered 204).",
    ),
    (
        IN_FLIGHT,
        Type::Counter,
        Unit::Count,
        "Deliveries answered 409: another attempt is handling the event.",
    ),
    (
        UNAVAILABLE,
        Type::Counter,
        Unit::Count,
        "Deliveries answered 503: the store could not answer.",
    ),
    (
        BACKLOGGED,
        Type::Counter,
        Unit::Count,
        "Deliveries answered 503 unstored: the inbox lagged beyond its bound.",
    ),
    (
        HANDLER,
        Type::Counter,
        Unit::Count,
        "Handler runs behind a dedupe layer, by outcome (success, failure, panic).",
    ),
    (
        STORE,
        Type::Histogram,
        Unit::Seconds,
        "Store round trips, by operation, failed ones included.",
    ),
    (
        ATTEMPTS,
        Type::Counter,
        Unit::Count,
        "Inbox worker attempts, by outcome (processed, retry, dead, abandoned, snoozed, lost).",
    ),
    (
        HELD_BACK,
        Type::Counter,
        Unit::Count,
        "Events a worker held back, by rule (paused, per_source, per_type, per_object).",
    ),
    (
        DEPTH,
        Type::Gauge,
        Unit::Count,
        "Inbox rows queued or being processed, as last counted.",
    ),
    (
        DEAD,
        Type::Gauge,
        Unit::Count,
        "Inbox rows that gave up after the maximum attempts, as last counted.",
    ),
    (
        LAG,
        Type::Gauge,
        Unit::Seconds,
        "How long the inbox's longest-waiting due row has waited, as last counted.",
    ),
    (
        UNREADABLE,
        Type::Counter,
        Unit::Count,
        "Inbox routes ended dead unrun: the body is gone or does not open, by reason.",
    ),
    (
        INVALID,
        Type::Counter,
        Unit::Count,
        "Events stored invalid, refused by their type's JSON Schema: never processed.",
    ),
];

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ::metrics::{Key, KeyName, Level, Metadata, Recorder, SharedString};

use catalog::{Type, DESCRIPTIONS};

mod catalog; // every metric: its name, type, unit and help text
mod handled; // a handler's future, its outcome counted as it ends
mod keys; // the keys values are recorded under: fixed ones, and each source's
#[cfg(test)]
mod tests;

pub(super) use handled::Handled;
pub(super) use keys::{operation_key, ProcessorKeys, Slot, SourceKeys};

/// Who recorded (the crate's target; the facade lets recorders filter on it).
static METADATA: Metadata<'static> =
    Metadata::new("tower_webhook", Level::INFO, Some(module_path!()));

/// The recorder last described to, by address: each recorder — the global one, or a
/// test's local one — gets the help texts before its first value from this crate. A
/// recorder at the address of one dropped before it misses them: harmless.
static DESCRIBED: AtomicUsize = AtomicUsize::new(0);

fn with_recorder(record: impl FnOnce(&dyn Recorder)) {
    ::metrics::with_recorder(|recorder| {
        let address = recorder as *const dyn Recorder as *const () as usize;
        // A load on the hot path; a write only when the recorder changed.
        if DESCRIBED.load(Ordering::Relaxed) != address {
            DESCRIBED.store(address, Ordering::Relaxed);
            describe(recorder);
        }
        record(recorder);
    });
}

fn describe(recorder: &dyn Recorder) {
    for (name, kind, unit, help) in DESCRIPTIONS {
        let (name, help) = (KeyName::from_const_str(name), SharedString::const_str(help));
        match kind {
            Type::Counter => recorder.describe_counter(name, Some(unit), help),
            Type::Gauge => recorder.describe_gauge(name, Some(unit), help),
            Type::Histogram => recorder.describe_histogram(name, Some(unit), help),
        }
    }
}

pub(super) fn increment(key: &Key) {
    with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

pub(super) fn observe(key: &Key, elapsed: Duration) {
    with_recorder(|r| {
        r.register_histogram(key, &METADATA)
            .record(elapsed.as_secs_f64())
    });
}

/// A route ended dead unrun for `why` (rare: its key is built per call).
pub(super) fn unreadable(source: &str, why: super::Unreadable) {
    let labels = vec![
        ::metrics::Label::new("source", source.to_owned()),
        ::metrics::Label::from_static_parts("reason", why.as_str()),
    ];
    increment(&Key::from_parts(catalog::UNREADABLE, labels));
}

pub(super) fn invalid(source: &str) {
    let labels = vec![::metrics::Label::new("source", source.to_owned())];
    increment(&Key::from_parts(catalog::INVALID, labels));
}

fn set(key: &Key, value: f64) {
    with_recorder(|r| r.register_gauge(key, &METADATA).set(value));
}

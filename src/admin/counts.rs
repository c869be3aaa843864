//! `GET /counts`' answer, the SQL inbox's and JetStream's alike.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::inbox::Counts;

/// `GET /counts`' answer: the sum over the configured processors, and with more than one
/// processor counted, `"processors"`: each one's counts by name (one processor: the answer
/// before fan-out); `"orphaned"` names the ones counted that the queue is not configured
/// with (left out of the sum), only when there are any.
pub(super) fn answer(by: BTreeMap<String, Counts>, configured: impl Fn(&str) -> bool) -> Value {
    let orphaned: Vec<&String> = by
        .keys()
        .filter(|name| !configured(name.as_str()))
        .collect();
    let sum = by
        .iter()
        .filter(|(name, _)| configured(name.as_str()))
        .fold(Counts::default(), |sum, (_, c)| sum.plus(*c));
    let mut json = serde_json::to_value(sum).expect("counts serialize");
    if by.len() > 1 {
        json["processors"] = serde_json::to_value(&by).expect("counts serialize");
    }
    if !orphaned.is_empty() {
        json["orphaned"] = serde_json::to_value(orphaned).expect("names serialize");
    }
    json
}

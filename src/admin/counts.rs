//! `GET /counts`' answer, the SQL inbox's and JetStream's alike.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::inbox::Counts;

/// `GET /counts`' answer: the sum over the processors, and with more than one,
/// `"processors"`: each one's counts by name (one processor: the answer before fan-out).
pub(super) fn answer(by: BTreeMap<String, Counts>) -> Value {
    let sum = by.values().fold(Counts::default(), |sum, c| sum.plus(*c));
    let mut json = serde_json::to_value(sum).expect("counts serialize");
    if by.len() > 1 {
        json["processors"] = serde_json::to_value(&by).expect("counts serialize");
    }
    json
}

//! What the pages' query strings and forms accept. A browser sends an empty field as
//! `name=`: empty is absent. Times are RFC 3339, or a form's `datetime-local`
//! (`2026-12-01T09:30`), read as UTC.

use std::time::SystemTime;

use serde::Deserialize;

use crate::admin::AdminError;
use crate::inbox::{Cursor, DeadRows, EventSummary, Listing};

/// A field's text, `None` when empty.
pub(super) fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// A time from a form: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC.
pub(super) fn time(text: &str) -> Result<SystemTime, AdminError> {
    let has_offset =
        text.ends_with(['Z', 'z']) || text.get(19..).is_some_and(|t| t.contains(['+', '-']));
    let full = match text.len() {
        _ if has_offset => text.to_owned(),
        16 => format!("{text}:00Z"),
        _ => format!("{text}Z"),
    };
    time::OffsetDateTime::parse(&full, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| AdminError::bad_request("a time is RFC 3339, or YYYY-MM-DDTHH:MM in UTC"))
}

/// Which rows a list shows, and the filter over them: `GET /events?state=dead&source=…`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    pub(super) state: Option<String>,
    pub(super) source: Option<String>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) from: Option<String>,
    pub(super) before: Option<String>,
    pub(super) after: Option<String>,
    /// One processor's routes (with fan-out; absent: every processor's).
    pub(super) processor: Option<String>,
}

/// The dead or failing rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rows {
    Dead,
    Failing,
}

impl Rows {
    pub(super) fn listing(self) -> Listing {
        match self {
            Rows::Dead => Listing::dead(),
            Rows::Failing => Listing::failing(),
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Rows::Dead => "dead",
            Rows::Failing => "failing",
        }
    }
}

/// What a listed row must match.
#[derive(Debug, Default, Clone)]
pub(super) struct Filter {
    pub(super) source: Option<String>,
    pub(super) event_type: Option<String>,
    /// Received at or after.
    pub(super) from: Option<SystemTime>,
    /// Received before.
    pub(super) before: Option<SystemTime>,
    /// The route's processor (the listing is then that processor's alone).
    pub(super) processor: Option<String>,
}

impl Filter {
    pub(super) fn matches(&self, row: &EventSummary) -> bool {
        self.source.as_ref().is_none_or(|s| *s == row.source)
            && self
                .event_type
                .as_ref()
                .is_none_or(|t| row.event_type.as_ref() == Some(t))
            && self.from.is_none_or(|from| row.received_at >= from)
            && self.before.is_none_or(|before| row.received_at < before)
            && self.processor.as_ref().is_none_or(|p| *p == row.processor)
    }

    /// The source, type and window of a form or query string.
    pub(super) fn of(
        source: &Option<String>,
        event_type: &Option<String>,
        from: &Option<String>,
        before: &Option<String>,
    ) -> Result<Self, AdminError> {
        let filter = Filter {
            source: given(source).map(str::to_owned),
            event_type: given(event_type).map(str::to_owned),
            from: given(from).map(time).transpose()?,
            before: given(before).map(time).transpose()?,
            processor: None,
        };
        if let (Some(from), Some(before)) = (filter.from, filter.before) {
            if from >= before {
                return Err(AdminError::bad_request(
                    "the window's start must be before its end",
                ));
            }
        }
        Ok(filter)
    }
}

impl ListQuery {
    pub(super) fn rows(&self) -> Result<Rows, AdminError> {
        match given(&self.state) {
            None | Some("failing") => Ok(Rows::Failing),
            Some("dead") => Ok(Rows::Dead),
            Some(_) => Err(AdminError::bad_request("state is dead or failing")),
        }
    }

    pub(super) fn filter(&self) -> Result<Filter, AdminError> {
        let filter = Filter::of(&self.source, &self.event_type, &self.from, &self.before)?;
        Ok(Filter {
            processor: given(&self.processor).map(str::to_owned),
            ..filter
        })
    }

    pub(super) fn cursor(&self) -> Result<Option<Cursor>, AdminError> {
        given(&self.after)
            .map(|after| {
                after
                    .parse()
                    .map_err(|_| AdminError::bad_request("after is a next page's link"))
            })
            .transpose()
    }
}

/// `GET /event?source=…&id=…&view=…`: one event (the search form too: `id` alone looks
/// among the sources the page knows).
#[derive(Debug, Default, Deserialize)]
pub(super) struct EventQuery {
    pub(super) source: Option<String>,
    pub(super) id: Option<String>,
    pub(super) view: Option<String>,
}

/// `POST /requeue`: one event, every route of it or one `processor`'s.
#[derive(Debug, Deserialize)]
pub(super) struct OneEvent {
    pub(super) source: Option<String>,
    pub(super) id: Option<String>,
    pub(super) processor: Option<String>,
}

/// `POST /erase-body`: one event; `confirm=yes` once the operator saw what it does.
#[derive(Debug, Deserialize)]
pub(super) struct EraseForm {
    pub(super) source: Option<String>,
    pub(super) id: Option<String>,
    pub(super) confirm: Option<String>,
}

impl EraseForm {
    pub(super) fn confirmed(&self) -> bool {
        given(&self.confirm) == Some("yes")
    }
}

/// `POST /requeue-matching`: a type, a receipt window, dead rows only; `confirm=yes`
/// once the operator saw the count.
#[derive(Debug, Deserialize)]
pub(super) struct RequeueForm {
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) from: Option<String>,
    pub(super) before: Option<String>,
    pub(super) dead: Option<String>,
    /// One processor's routes (absent: every processor's).
    pub(super) processor: Option<String>,
    pub(super) confirm: Option<String>,
}

impl RequeueForm {
    pub(super) fn dead_only(&self) -> bool {
        given(&self.dead).is_some()
    }

    pub(super) fn confirmed(&self) -> bool {
        given(&self.confirm) == Some("yes")
    }
}

/// `POST /pause` and `POST /resume`: a source, a type, either or both (neither: all);
/// a processor too (absent: every processor).
#[derive(Debug, Deserialize)]
pub(super) struct PauseForm {
    pub(super) source: Option<String>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) processor: Option<String>,
}

/// `POST /delete-dead`: dead rows (of `source` and `type`, where given) dead for more than
/// `hours` (0: every dead row);
/// `confirm=yes` once the operator saw the count.
#[derive(Debug, Deserialize)]
pub(super) struct DeleteDeadForm {
    pub(super) source: Option<String>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) hours: Option<String>,
    pub(super) confirm: Option<String>,
}

impl DeleteDeadForm {
    /// The source and type it names, as a listing's filter and as the inbox's.
    pub(super) fn rows(&self) -> (Filter, DeadRows) {
        let (source, event_type) = (given(&self.source), given(&self.event_type));
        let filter = Filter {
            source: source.map(str::to_owned),
            event_type: event_type.map(str::to_owned),
            ..Filter::default()
        };
        let rows = source
            .into_iter()
            .fold(DeadRows::all(), DeadRows::with_source);
        let rows = event_type.into_iter().fold(rows, DeadRows::with_type);
        (filter, rows)
    }

    /// Hours, whole, 0 to ten years'.
    pub(super) fn hours(&self) -> Result<u64, AdminError> {
        given(&self.hours)
            .unwrap_or("0")
            .parse::<u64>()
            .ok()
            .filter(|h| *h <= 24 * 366 * 10)
            .ok_or(AdminError::bad_request(
                "hours is a whole number, 0 or more",
            ))
    }

    pub(super) fn confirmed(&self) -> bool {
        given(&self.confirm) == Some("yes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_are_rfc_3339_or_a_forms_local_time_in_utc() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        for (text, expected) in [
            ("2026-12-01T09:30:00Z", at(1_796_117_400)),
            ("2026-12-01T10:30:00+01:00", at(1_796_117_400)),
            ("2026-12-01T09:30", at(1_796_117_400)),
            ("2026-12-01T09:30:15", at(1_796_117_415)),
        ] {
            assert_eq!(time(text).unwrap(), expected, "{text}");
        }
        for bad in ["", "yesterday", "2026-12-01", "2026-13-01T09:30"] {
            assert!(time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_empty_field_is_absent_and_a_window_runs_forward() {
        let none = None;
        let empty = Some(String::new());
        let filter = Filter::of(&empty, &none, &empty, &none).unwrap();
        assert!(filter.source.is_none() && filter.from.is_none());
        let (from, before) = (
            Some("2026-12-02T00:00".to_owned()),
            Some("2026-12-01T00:00".to_owned()),
        );
        assert!(Filter::of(&none, &none, &from, &before).is_err());
    }
}

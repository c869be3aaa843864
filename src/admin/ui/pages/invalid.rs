//! The invalid events: refused by their type's JSON Schema at accept, never processed,
//! each with its errors (a JSON pointer and a message, never a value of the body).

use maud::{html, Markup};

use super::*;
use crate::inbox::StoredEvent;

/// Up to a page of them, by source and id; `more`: the page was full.
pub(in crate::admin::ui) fn invalid(base: &str, events: &[StoredEvent], more: bool) -> Markup {
    let main = html! {
        h1 { "Invalid events" }
        p.note {
            "Refused by their type's schema when accepted: answered 2xx, never processed nor "
            "retried. Fix the schema (or the code), then requeue them: "
            code { "POST /admin/requeue {\"invalid\": true}" } " or "
            code { "tower-webhook requeue --invalid --schemas DIR" } "."
        }
        @if events.is_empty() {
            p.muted { "No event is invalid." }
        } @else {
            table {
                thead { tr { th { "source" } th { "id" } th { "type" } th { "received" } th { "errors" } } }
                tbody {
                    @for e in events {
                        tr {
                            td { (e.summary.source) }
                            td { a href=(event_href(base, &e.summary.source, &e.summary.id)) { code { (e.summary.id) } } }
                            td { (e.summary.event_type.as_deref().unwrap_or("-")) }
                            td { (time_cell(e.summary.received_at)) }
                            td { (errors(e)) }
                        }
                    }
                }
            }
            @if more { p.muted { "Only the first " (events.len()) " are shown." } }
        }
    };
    layout(base, "Invalid", Here::Invalid, main)
}

/// An event's errors, one a line: `path: message` (`(body)` for the whole body).
pub(super) fn errors(e: &StoredEvent) -> Markup {
    html! {
        ul.errors {
            @for err in &e.validation_errors {
                li {
                    code { @if err.path.is_empty() { "(body)" } @else { (err.path) } }
                    " " (err.message)
                }
            }
        }
    }
}

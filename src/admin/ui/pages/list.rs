//! The failing and dead lists, filtered and paged, and the bulk actions' forms.

use maud::{html, Markup};

use super::*;
use crate::admin::ui::input::Rows;
use crate::admin::ui::scan::Scanned;
use crate::inbox::EventSummary;

/// The filter as the operator typed it, to fill the forms back in.
pub(in crate::admin::ui) struct Typed<'a> {
    pub(in crate::admin::ui) source: &'a str,
    pub(in crate::admin::ui) event_type: &'a str,
    pub(in crate::admin::ui) from: &'a str,
    pub(in crate::admin::ui) before: &'a str,
    /// One processor's routes (empty: every processor's).
    pub(in crate::admin::ui) processor: &'a str,
}

pub(in crate::admin::ui) fn list(
    base: &str,
    rows: Rows,
    typed: &Typed<'_>,
    processors: &[String],
    scanned: &Scanned,
) -> Markup {
    let (title, here) = match rows {
        Rows::Dead => ("Dead events", Here::Dead),
        Rows::Failing => ("Failing events", Here::Failing),
    };
    let next = scanned.next.as_ref().map(|cursor| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("state", rows.as_str())
            .append_pair("source", typed.source)
            .append_pair("type", typed.event_type)
            .append_pair("from", typed.from)
            .append_pair("before", typed.before);
        if !typed.processor.is_empty() {
            q.append_pair("processor", typed.processor);
        }
        q.append_pair("after", &cursor.to_string());
        format!("{base}/events?{}", q.finish())
    });
    let main = html! {
        h1 { (title) }
        section.card {
            form.filters method="get" action={ (base) "/events" } {
                input type="hidden" name="state" value=(rows.as_str());
                label { "source" input type="text" name="source" value=(typed.source) placeholder="any"; }
                label { "type" input type="text" name="type" value=(typed.event_type) placeholder="any"; }
                label { "received from (UTC)" input type="datetime-local" name="from" value=(typed.from); }
                label { "received before (UTC)" input type="datetime-local" name="before" value=(typed.before); }
                @if !processors.is_empty() { (processor_select(processors, typed.processor)) }
                button type="submit" { "Filter" }
                a href={ (base) "/events?state=" (rows.as_str()) } { "clear" }
            }
        }
        section.card {
            @if scanned.rows.is_empty() {
                p.muted { "No " (rows.as_str()) " event matches." }
            } @else {
                (summary_table(base, rows, !processors.is_empty(), &scanned.rows))
            }
            div.pager {
                span.muted {
                    (scanned.rows.len()) " shown"
                    @if scanned.cut { " (the filter read its budget of rows: there may be more further on)" }
                }
                @if let Some(next) = next { a href=(next) { "Next page →" } }
            }
        }
        @if rows == Rows::Dead {
            div.grid {
                (requeue_matching_form(base, typed, processors))
                (delete_dead_form(base, typed))
            }
        } @else {
            (requeue_matching_form(base, typed, processors))
        }
    };
    layout(base, title, here, main)
}

/// A select of the configured `processors` (and "any"), `chosen` selected.
fn processor_select(processors: &[String], chosen: &str) -> Markup {
    html! {
        label {
            "processor"
            select name="processor" {
                option value="" selected[chosen.is_empty()] { "any" }
                @for name in processors {
                    option value=(name) selected[chosen == name] { (name) }
                }
            }
        }
    }
}

/// The rows; `routed`: each is one processor's route, and says whose.
fn summary_table(base: &str, rows: Rows, routed: bool, events: &[EventSummary]) -> Markup {
    html! {
        table {
            thead {
                tr {
                    th { "event" } th { "source" }
                    @if routed { th { "processor" } }
                    th { "type" } th { "received" }
                    th { @if rows == Rows::Dead { "dead" } @else { "next attempt" } }
                    th.num { "attempts" } th { "last error" }
                }
            }
            tbody {
                @for e in events {
                    tr {
                        td { a.mono href=(event_href(base, &e.source, &e.id)) { (e.id) } }
                        td { code { (e.source) } }
                        @if routed { td.processor { code { (e.processor) } } }
                        td { @if let Some(t) = &e.event_type { code { (t) } } @else { span.muted { "—" } } }
                        td { (time_cell(e.received_at)) }
                        td {
                            @let when = if rows == Rows::Dead { e.dead_at } else { e.next_attempt_at };
                            @if let Some(t) = when { time title=(at(t)) { (at(t)) } }
                        }
                        td.num { (e.attempts) }
                        td.error { @if let Some(error) = &e.last_error { (error) } }
                    }
                }
            }
        }
    }
}

fn requeue_matching_form(base: &str, typed: &Typed<'_>, processors: &[String]) -> Markup {
    html! {
        section.card {
            h2 { "Requeue matching events" }
            form.row method="post" action={ (base) "/requeue-matching" } {
                label { "type" input type="text" name="type" value=(typed.event_type) placeholder="any"; }
                label { "received from (UTC)" input type="datetime-local" name="from" value=(typed.from); }
                label { "received before (UTC)" input type="datetime-local" name="before" value=(typed.before); }
                @if !processors.is_empty() { (processor_select(processors, typed.processor)) }
                label.check { input type="checkbox" name="dead" value="yes" checked; "dead only" }
                button type="submit" { "Count…" }
            }
            p.note { "Shows how many match and asks before it requeues. Not dead only: processed events of that type or window run again too (a replay)." }
            @if !typed.source.is_empty() {
                p.note { "It covers every source, not only " code { (typed.source) } "." }
            }
        }
    }
}

fn delete_dead_form(base: &str, typed: &Typed<'_>) -> Markup {
    html! {
        section.card #delete-dead {
            h2 { "Delete dead events" }
            form.row method="post" action={ (base) "/delete-dead" } {
                label { "source" input type="text" name="source" value=(typed.source) placeholder="any"; }
                label { "type" input type="text" name="type" value=(typed.event_type) placeholder="any"; }
                label { "dead for more than (hours)" input type="number" name="hours" min="0" value="0"; }
                button.danger type="submit" { "Count…" }
            }
            p.note { "Dead events were acknowledged to the provider and never processed: requeue or export them first. 0 hours: every dead event." }
            @if !typed.processor.is_empty() {
                p.note { "It covers every processor's dead routes, not only " code { (typed.processor) } "'s." }
            }
        }
    }
}

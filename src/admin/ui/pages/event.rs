//! One event: its fields, the actions on it, its routes (with fan-out), its body, headers
//! and attempts.

use maud::{html, Markup};

use super::*;
use crate::admin::ui::body::View;
use crate::inbox::{BodyState, RouteState, State, StoredEvent};

/// `routed`: show each processor's route, and whose each attempt was (fan-out); without
/// it, the page as before fan-out.
pub(in crate::admin::ui) fn event(
    base: &str,
    e: &StoredEvent,
    routed: bool,
    view: View,
    body: (String, &'static str),
    flash_message: Option<Markup>,
) -> Markup {
    let s = &e.summary;
    let main = html! {
        @if let Some(f) = flash_message { (f) }
        h1 { "Event " code { (s.id) } " " (state_badge(s.state)) }
        @if routed { (routes_section(base, e)) }
        div.columns {
            div.stack {
                (fields_section(e))
                (actions_section(base, e, routed))
                @if !routed { (attempts_section(e, false)) }
            }
            div.stack {
                @if !e.validation_errors.is_empty() {
                    section.card #validation {
                        h2 { "Why its schema refused it" }
                        (super::invalid::errors(e))
                    }
                }
                (body_section(base, e, view, body))
                (headers_section(e))
            }
        }
        // With a processor column the history needs the page's width.
        @if routed { (attempts_section(e, true)) }
    };
    layout(base, &s.id, Here::Other, main)
}

fn fields_section(e: &StoredEvent) -> Markup {
    let s = &e.summary;
    let maybe_time = |t: Option<SystemTime>| match t {
        Some(t) => html! { (at(t)) " (" (ago(t)) ")" },
        None => html! { span.muted { "—" } },
    };
    let maybe_text = |t: &Option<String>| match t {
        Some(t) => html! { code { (t) } },
        None => html! { span.muted { "—" } },
    };
    html! {
        section.card #fields {
            h2 { "Fields" }
            dl.fields {
                dt { "state" } dd { (state_badge(s.state)) }
                dt { "source" } dd { code { (s.source) } }
                dt { "id" } dd { code { (s.id) } }
                dt { "type" } dd { (maybe_text(&s.event_type)) }
                dt { "object" } dd { (maybe_text(&s.object_id)) }
                dt { "livemode" } dd {
                    @match e.livemode { Some(true) => { "live" } Some(false) => { "test" } None => { span.muted { "—" } } }
                }
                dt { "received" } dd { (maybe_time(Some(s.received_at))) }
                dt { "attempts" } dd { (s.attempts) }
                dt { "next attempt" } dd { (maybe_time(s.next_attempt_at)) }
                dt { "processed" } dd { (maybe_time(e.processed_at)) }
                dt { "dead" } dd { (maybe_time(s.dead_at)) }
                dt { "last error" } dd.error { @if let Some(error) = &s.last_error { (error) } @else { span.muted { "—" } } }
            }
        }
    }
}

fn actions_section(base: &str, e: &StoredEvent, routed: bool) -> Markup {
    let s = &e.summary;
    let processing = s.state == State::Processing;
    html! {
        section.card #actions {
            h2 { "Actions" }
            form.row method="post" action={ (base) "/requeue" } {
                input type="hidden" name="source" value=(s.source);
                input type="hidden" name="id" value=(s.id);
                button type="submit" disabled[processing] { "Requeue" }
                span.muted {
                    @if processing { "A worker is processing it now." }
                    @else if routed { "Every processor's route of it, due now with its attempts reset (processed ones run again: a replay). The routes above requeue one." }
                    @else if s.state == State::Processed { "It was processed: requeueing runs it again (a replay)." }
                    @else { "Due now, with its attempts reset." }
                }
            }
            @if e.body_state != BodyState::Erased {
                form.row method="post" action={ (base) "/erase-body" } {
                    input type="hidden" name="source" value=(s.source);
                    input type="hidden" name="id" value=(s.id);
                    button.danger type="submit" { "Erase body" }
                    span.muted { "Deletes its body, headers and error texts for good (asks to confirm first); routes that could still run go dead." }
                }
            }
        }
    }
}

fn body_section(
    base: &str,
    e: &StoredEvent,
    view: View,
    (text, kind): (String, &'static str),
) -> Markup {
    let s = &e.summary;
    let href = |v: &str| format!("{}&view={v}", event_href(base, &s.source, &s.id));
    let tab = |v: View, name: &str, label: &str| {
        html! { a class=[(view == v).then_some("here")] href=(href(name)) { (label) } }
    };
    let state = e.body_state;
    html! {
        section.card #body {
            @if state == BodyState::Stored {
                h2 { "Body " span.muted { "(" (e.body.len()) " bytes, shown as " (kind) ")" } }
            } @else {
                h2 { "Body" }
            }
            dl.fields {
                dt { "state" } dd { span class={ "state body-" (state.as_str()) } { (state.as_str()) } }
                dt { "key" } dd {
                    @if let Some(key_id) = &e.key_id { code { (key_id) } }
                    @else if state == BodyState::Stored { span.muted { "none: stored in clear" } }
                    @else { span.muted { "—" } }
                }
            }
            @match state {
                BodyState::Stored => {
                    div.tabs {
                        (tab(View::Pretty, "pretty", "pretty"))
                        (tab(View::Raw, "raw", "raw text"))
                        (tab(View::Base64, "base64", "base64"))
                    }
                    pre.body { (text) }
                }
                _ => p.muted { (body_gone(state, e.key_id.as_deref())) },
            }
        }
    }
}

/// Why there is no body to show (crate text: the key id at most, never a payload byte).
fn body_gone(state: BodyState, key_id: Option<&str>) -> String {
    const KEPT: &str = "its key stays, so a redelivery is still a duplicate.";
    match state {
        BodyState::Unreadable => format!(
            "Sealed under key {:?}, and no key of this inbox opens it: the key is not configured here, or the stored value was altered. It is never run: configure the key (second in the ring), then requeue it.",
            key_id.unwrap_or_default()
        ),
        BodyState::Expired => format!("Deleted by the body retention after it was processed; {KEPT}"),
        BodyState::Erased => format!("Erased on request; {KEPT}"),
        _ => "Its body row is gone, deleted outside the inbox: it is never run.".to_owned(),
    }
}

/// Each processor's route: its state, attempts, times and error, and a button that
/// requeues it alone (the other routes are left as they are).
fn routes_section(base: &str, e: &StoredEvent) -> Markup {
    let s = &e.summary;
    let time = |t: Option<SystemTime>| match t {
        Some(t) => html! { time title=(at(t)) { (at(t)) } },
        None => html! { span.muted { "—" } },
    };
    html! {
        section.card #routes {
            h2 { "Routes " span.muted { "(one per processor)" } }
            @if e.routes.is_empty() {
                p.muted { "No processor took it: no filter matched (a backfill of a processor makes its route)." }
            } @else {
                table {
                    thead {
                        tr {
                            th { "processor" } th { "state" } th.num { "attempts" }
                            th { "next attempt" } th { "processed" } th { "last error" } th {}
                        }
                    }
                    tbody {
                        @for r in &e.routes {
                            tr data-processor=(r.processor) {
                                td {
                                    code { (r.processor) }
                                    @if r.orphaned {
                                        " " span.state.orphaned title="No longer one of this inbox's processors: no worker of it runs this route" { "orphaned" }
                                    }
                                }
                                td { (state_badge(r.state)) }
                                td.num { (r.attempts) }
                                td { (time(r.next_attempt_at)) }
                                td { (time(r.processed_at)) }
                                td.error { @if let Some(error) = &r.last_error { (error) } @else { span.muted { "—" } } }
                                td { (route_requeue(base, s, r)) }
                            }
                        }
                    }
                }
                p.note { "Requeueing a route makes it due now with its attempts reset (a processed one runs again: a replay); the other processors' routes are left as they are." }
            }
        }
    }
}

/// The button that requeues `r` alone: a form posting its processor.
fn route_requeue(base: &str, s: &crate::inbox::EventSummary, r: &RouteState) -> Markup {
    if r.orphaned {
        return html! { span.muted { "no worker runs it" } };
    }
    let processing = r.state == State::Processing;
    html! {
        form.inline method="post" action={ (base) "/requeue" } {
            input type="hidden" name="source" value=(s.source);
            input type="hidden" name="id" value=(s.id);
            input type="hidden" name="processor" value=(r.processor);
            button.quiet type="submit" disabled[processing]
                title=(if processing { "A worker is processing it now" } else { "Requeue this route alone" }) {
                "Requeue"
            }
        }
    }
}

/// The request headers it was accepted with, as stored (credentials were never stored).
fn headers_section(e: &StoredEvent) -> Markup {
    html! {
        section.card #headers {
            h2 { "Headers" }
            @if e.headers.is_empty() {
                p.muted { "None stored: it came before the inbox kept them, or not through its accept service." }
            } @else {
                table {
                    thead { tr { th { "name" } th { "value" } } }
                    tbody {
                        @for (name, value) in &e.headers {
                            tr { td { code { (name) } } td.value { code { (value) } } }
                        }
                    }
                }
                p.note { "Credentials (Authorization, Cookie, API keys) are never stored." }
            }
        }
    }
}

/// Every attempt, oldest first, with its outcome, duration and error (and whose route's,
/// when `routed`).
fn attempts_section(e: &StoredEvent, routed: bool) -> Markup {
    html! {
        section.card #attempts {
            h2 { "Attempts" }
            @if e.attempts.is_empty() {
                p.muted { "None yet." }
            } @else {
                table {
                    thead { tr { @if routed { th { "processor" } } th.num { "#" } th { "started" } th.num { "took" } th { "outcome" } th { "error" } } }
                    tbody {
                        @for a in &e.attempts {
                            tr {
                                @if routed { td.processor { code { (a.processor) } } }
                                td.num { (a.attempt) }
                                td { (time_cell(a.started_at)) }
                                td.num { (took(a.duration())) }
                                td { span class={ "outcome " (a.outcome.as_str()) } { (a.outcome.as_str()) } }
                                td.error { @if let Some(error) = &a.error { (error) } @else { span.muted { "—" } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An attempt's duration: milliseconds under 10 s, else seconds.
fn took(d: std::time::Duration) -> String {
    match d.as_millis() {
        ms @ 0..10_000 => format!("{ms} ms"),
        _ => format!("{:.1} s", d.as_secs_f64()),
    }
}

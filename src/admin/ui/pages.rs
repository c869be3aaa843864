//! The markup. maud escapes every value spliced in with `(…)`; nothing here is
//! `PreEscaped` but the page's own constant text. Each section of a page is a function of
//! its own, so a new one (an event's stored headers, its attempts) is one more function.

use std::time::{Duration, SystemTime};

use maud::{html, Markup, DOCTYPE};

use super::body::View;
use super::input::Rows;
use super::scan::Scanned;
use crate::inbox::{Counts, EventSummary, Pause, StoredEvent};

/// Which part of the page the navigation marks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Here {
    Overview,
    Failing,
    Dead,
    Other,
}

/// The frame every page shares: the bar with the navigation and the search, then `main`.
pub(super) fn layout(base: &str, title: &str, here: Here, main: Markup) -> Markup {
    let nav = |href: String, text: &str, at: Here| {
        html! { a class=[(here == at).then_some("here")] href=(href) { (text) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · webhook inbox" }
                link rel="stylesheet" href={ (base) "/style.css" };
                script src={ (base) "/ui.js" } defer {}
            }
            body {
                header.top {
                    a.brand href=(home(base)) { "Webhook inbox" }
                    nav {
                        (nav(home(base).to_owned(), "Overview", Here::Overview))
                        (nav(format!("{base}/events?state=failing"), "Failing", Here::Failing))
                        (nav(format!("{base}/events?state=dead"), "Dead", Here::Dead))
                    }
                    form.search method="get" action={ (base) "/event" } role="search" {
                        input type="search" name="id" placeholder="event id" aria-label="event id" required;
                        input type="text" name="source" placeholder="source (optional)" aria-label="source";
                        button.quiet type="submit" { "Find" }
                    }
                }
                main { (main) }
            }
        }
    }
}

/// The overview's URL: the mount point itself (`/admin/ui`, not `/admin/ui/`, which a
/// nested router does not answer), or `/`.
pub(super) fn home(base: &str) -> &str {
    if base.is_empty() {
        "/"
    } else {
        base
    }
}

/// `2026-12-03 14:05:12 UTC`.
pub(super) fn at(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `850 ms`, `12 s`, `4 min`, `3 h`, `2 d`.
pub(super) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// How long ago `t` was (`just now` for the future: clocks differ).
fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!("{} ago", span(d)),
        Err(_) => "just now".into(),
    }
}

fn time_cell(t: SystemTime) -> Markup {
    html! { time title=(at(t)) { (ago(t)) } }
}

/// `/event?source=…&id=…`, percent-encoded.
pub(super) fn event_href(base: &str, source: &str, id: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("source", source)
        .append_pair("id", id)
        .finish();
    format!("{base}/event?{query}")
}

fn state_badge(state: crate::inbox::State) -> Markup {
    html! { span class={ "state " (state.as_str()) } { (state.as_str()) } }
}

/// What an action did, shown above a page.
pub(super) fn flash(message: &str, bad: bool) -> Markup {
    html! { div.flash.bad[bad] role="status" { (message) } }
}

// ---- The overview ---------------------------------------------------------------------

/// What the overview shows.
pub(super) struct Overview<'a> {
    pub(super) counts: &'a Counts,
    /// Failing and dead rows by source, from the listings' first rows.
    pub(super) by_source: &'a [(String, usize, usize)],
    /// Whether the listings had more rows than were read for `by_source`.
    pub(super) by_source_cut: bool,
    pub(super) pauses: &'a [Pause],
    /// Events processed a minute, oldest first: `None` where the inbox does not tell.
    pub(super) rate: Option<&'a [u64]>,
}

pub(super) fn overview(base: &str, o: &Overview<'_>, flash_message: Option<Markup>) -> Markup {
    let main = html! {
        @if let Some(f) = flash_message { (f) }
        h1 { "Overview" }
        (counts_section(o.counts))
        div.grid {
            (sources_section(base, o.by_source, o.by_source_cut))
            (rate_section(o.rate))
        }
        (pauses_section(base, o.pauses))
    };
    layout(base, "Overview", Here::Overview, main)
}

fn counts_section(c: &Counts) -> Markup {
    let cell = |class: &str, name: &str, n: u64| {
        html! { div class=(class) { dt { (name) } dd { (n) } } }
    };
    html! {
        section.card #counts {
            h2 { "Events by state" }
            dl.counts {
                (cell("queued", "queued", c.queued))
                (cell("processing", "processing", c.processing))
                (cell("processed", "processed", c.processed))
                (cell("dead", "dead", c.dead))
                (cell("paused", "paused", c.paused))
            }
            p.note {
                @match c.oldest_due {
                    Some(d) => { "The oldest due event has waited " strong { (span(d)) } "." }
                    None => { "No event is waiting." }
                }
                " Paused events are counted in queued too."
            }
        }
    }
}

fn sources_section(base: &str, rows: &[(String, usize, usize)], cut: bool) -> Markup {
    let list = |state: &str, source: &str| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("state", state)
            .append_pair("source", source)
            .finish();
        format!("{base}/events?{q}")
    };
    html! {
        section.card #sources {
            h2 { "Failing and dead by source" }
            @if rows.is_empty() {
                p.muted { "Nothing is failing or dead." }
            } @else {
                table {
                    thead { tr { th { "source" } th.num { "failing" } th.num { "dead" } } }
                    tbody {
                        @for (source, failing, dead) in rows {
                            tr {
                                td { code { (source) } }
                                td.num { a href=(list("failing", source)) { (failing) } }
                                td.num { a href=(list("dead", source)) { (dead) } }
                            }
                        }
                    }
                }
                @if cut { p.note { "From the newest rows of each list only." } }
            }
        }
    }
}

/// The processing rate: a bar a minute, inline SVG (no script).
fn rate_section(rate: Option<&[u64]>) -> Markup {
    html! {
        section.card #rate {
            h2 { "Processed per minute" }
            @match rate {
                Some(points) => (rate_chart(points)),
                None => {
                    (rate_chart(&[]))
                    p.note { "The rate appears here once the inbox counts processed events by minute." }
                }
            }
        }
    }
}

/// Bars for `points` (oldest first), scaled to the largest; an empty frame for none.
pub(super) fn rate_chart(points: &[u64]) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 140.0;
    const TOP: f64 = 18.0;
    const BOTTOM: f64 = 22.0;
    let max = points.iter().copied().max().unwrap_or(0);
    let slot = W / points.len().max(1) as f64;
    let total: u64 = points.iter().sum();
    let plot = H - TOP - BOTTOM;
    html! {
        svg.chart viewBox={ "0 0 " (W) " " (H) } role="img"
            aria-label={ (total) " events processed in the last " (points.len()) " minutes" } {
            line x1="0" y1=(H - BOTTOM) x2=(W) y2=(H - BOTTOM) stroke="#dde2ea" {}
            @for (i, n) in points.iter().enumerate() {
                @let h = if max == 0 { 0.0 } else { plot * *n as f64 / max as f64 };
                rect x=(format!("{:.1}", i as f64 * slot + slot * 0.15))
                    y=(format!("{:.1}", H - BOTTOM - h))
                    width=(format!("{:.1}", slot * 0.7)) height=(format!("{:.1}", h))
                    fill="#2456c7" rx="2" {
                    title { (n) " processed" }
                }
            }
            text x="0" y="13" font-size="13" fill="#5d6778" { "max " (max) "/min" }
            text x="0" y=(H - 6.0) font-size="13" fill="#5d6778" {
                @if points.is_empty() { "no data" } @else { (points.len()) " min ago" }
            }
            text x=(W) y=(H - 6.0) font-size="13" fill="#5d6778" text-anchor="end" { "now" }
        }
    }
}

fn pauses_section(base: &str, pauses: &[Pause]) -> Markup {
    let any = |part: &Option<String>| -> Markup {
        match part {
            Some(text) => html! { code { (text) } },
            None => html! { span.muted { "any" } },
        }
    };
    html! {
        section.card #pauses {
            h2 { "Paused" }
            @if pauses.is_empty() {
                p.muted { "Nothing is paused: workers start every due event." }
            } @else {
                table {
                    thead { tr { th { "source" } th { "type" } th { "since" } th {} } }
                    tbody {
                        @for pause in pauses {
                            tr {
                                td { (any(&pause.source)) }
                                td { (any(&pause.event_type)) }
                                td { (time_cell(pause.paused_at)) }
                                td {
                                    form.inline method="post" action={ (base) "/resume" } {
                                        input type="hidden" name="source" value=[pause.source.as_deref()];
                                        input type="hidden" name="type" value=[pause.event_type.as_deref()];
                                        button.quiet type="submit" { "Resume" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Pause" }
            form.row method="post" action={ (base) "/pause" } {
                label { "source" input type="text" name="source" placeholder="any"; }
                label { "type" input type="text" name="type" placeholder="any"; }
                button type="submit" { "Pause" }
            }
            p.note { "Workers start no matching event until it is resumed; deliveries are still accepted. Both empty: everything." }
        }
    }
}

// ---- Lists ----------------------------------------------------------------------------

/// The filter as the operator typed it, to fill the forms back in.
pub(super) struct Typed<'a> {
    pub(super) source: &'a str,
    pub(super) event_type: &'a str,
    pub(super) from: &'a str,
    pub(super) before: &'a str,
}

pub(super) fn list(base: &str, rows: Rows, typed: &Typed<'_>, scanned: &Scanned) -> Markup {
    let (title, here) = match rows {
        Rows::Dead => ("Dead events", Here::Dead),
        Rows::Failing => ("Failing events", Here::Failing),
    };
    let next = scanned.next.as_ref().map(|cursor| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("state", rows.as_str())
            .append_pair("source", typed.source)
            .append_pair("type", typed.event_type)
            .append_pair("from", typed.from)
            .append_pair("before", typed.before)
            .append_pair("after", &cursor.to_string())
            .finish();
        format!("{base}/events?{q}")
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
                button type="submit" { "Filter" }
                a href={ (base) "/events?state=" (rows.as_str()) } { "clear" }
            }
        }
        section.card {
            @if scanned.rows.is_empty() {
                p.muted { "No " (rows.as_str()) " event matches." }
            } @else {
                (summary_table(base, rows, &scanned.rows))
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
                (requeue_matching_form(base, typed))
                (delete_dead_form(base))
            }
        } @else {
            (requeue_matching_form(base, typed))
        }
    };
    layout(base, title, here, main)
}

fn summary_table(base: &str, rows: Rows, events: &[EventSummary]) -> Markup {
    html! {
        table {
            thead {
                tr {
                    th { "event" } th { "source" } th { "type" } th { "received" }
                    th { @if rows == Rows::Dead { "dead" } @else { "next attempt" } }
                    th.num { "attempts" } th { "last error" }
                }
            }
            tbody {
                @for e in events {
                    tr {
                        td { a.mono href=(event_href(base, &e.source, &e.id)) { (e.id) } }
                        td { code { (e.source) } }
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

fn requeue_matching_form(base: &str, typed: &Typed<'_>) -> Markup {
    html! {
        section.card {
            h2 { "Requeue matching events" }
            form.row method="post" action={ (base) "/requeue-matching" } {
                label { "type" input type="text" name="type" value=(typed.event_type) placeholder="any"; }
                label { "received from (UTC)" input type="datetime-local" name="from" value=(typed.from); }
                label { "received before (UTC)" input type="datetime-local" name="before" value=(typed.before); }
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

fn delete_dead_form(base: &str) -> Markup {
    html! {
        section.card {
            h2 { "Delete dead events" }
            form.row method="post" action={ (base) "/delete-dead" } {
                label { "dead for more than (hours)" input type="number" name="hours" min="0" value="0"; }
                button.danger type="submit" { "Count…" }
            }
            p.note { "Dead events were acknowledged to the provider and never processed: requeue or export them first. 0 hours: every dead event." }
        }
    }
}

/// A confirmation: what the action would touch, and the button that does it.
pub(super) fn confirm(
    base: &str,
    title: &str,
    what: Markup,
    action: &str,
    fields: &[(&str, String)],
    danger: bool,
) -> Markup {
    let main = html! {
        h1 { (title) }
        section.card {
            p { (what) }
            form.row method="post" action={ (base) (action) } {
                @for (name, value) in fields {
                    input type="hidden" name=(name) value=(value);
                }
                input type="hidden" name="confirm" value="yes";
                button.danger[danger] type="submit" { (title) }
                a href=(home(base)) { "Cancel" }
            }
        }
    };
    layout(base, title, Here::Other, main)
}

/// The answer of an action that has no page of its own.
pub(super) fn done(base: &str, title: &str, message: &str, back: &str) -> Markup {
    let main = html! {
        h1 { (title) }
        (flash(message, false))
        p { a href=(back) { "Back" } }
    };
    layout(base, title, Here::Other, main)
}

/// Several events with the id searched for, in different sources.
pub(super) fn found(base: &str, id: &str, keys: &[(String, String)]) -> Markup {
    let main = html! {
        h1 { "Events with id " code { (id) } }
        section.card {
            @if keys.is_empty() {
                p { "No event with that id in the sources this page knows (those with failing, dead or paused events). Give its source too." }
            } @else {
                ul {
                    @for (source, id) in keys {
                        li { a href=(event_href(base, source, id)) { code { (source) } " / " code { (id) } } }
                    }
                }
            }
        }
    };
    layout(base, "Search", Here::Other, main)
}

pub(super) fn error(base: &str, status: u16, message: &str) -> Markup {
    let main = html! {
        h1 { "Error " (status) }
        (flash(message, true))
        p { a href=(home(base)) { "Overview" } }
    };
    layout(base, "Error", Here::Other, main)
}

// ---- One event ------------------------------------------------------------------------

pub(super) fn event(
    base: &str,
    e: &StoredEvent,
    view: View,
    body: (String, &'static str),
    flash_message: Option<Markup>,
) -> Markup {
    let s = &e.summary;
    let main = html! {
        @if let Some(f) = flash_message { (f) }
        h1 { "Event " code { (s.id) } " " (state_badge(s.state)) }
        div.columns {
            div.stack {
                (fields_section(e))
                (actions_section(base, e))
                (attempts_section(e))
            }
            div.stack {
                (body_section(base, e, view, body))
                (headers_section(e))
            }
        }
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

fn actions_section(base: &str, e: &StoredEvent) -> Markup {
    let s = &e.summary;
    let processing = s.state == crate::inbox::State::Processing;
    html! {
        section.card #actions {
            h2 { "Actions" }
            form.row method="post" action={ (base) "/requeue" } {
                input type="hidden" name="source" value=(s.source);
                input type="hidden" name="id" value=(s.id);
                button type="submit" disabled[processing] { "Requeue" }
                span.muted {
                    @if processing { "A worker is processing it now." }
                    @else if s.state == crate::inbox::State::Processed { "It was processed: requeueing runs it again (a replay)." }
                    @else { "Due now, with its attempts reset." }
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
    html! {
        section.card #body {
            h2 { "Body " span.muted { "(" (e.body.len()) " bytes, shown as " (kind) ")" } }
            div.tabs {
                (tab(View::Pretty, "pretty", "pretty"))
                (tab(View::Raw, "raw", "raw text"))
                (tab(View::Base64, "base64", "base64"))
            }
            pre.body { (text) }
        }
    }
}

/// The request headers as stored with the event.
///
/// SEAM(stored headers): render `e.headers` here once `StoredEvent` has them (a table of
/// name and value; a value of `authorization`, `cookie` or `proxy-authorization` shown as
/// `(redacted)`).
fn headers_section(_e: &StoredEvent) -> Markup {
    html! {
        section.card #headers {
            h2 { "Headers" }
            p.muted { "This inbox does not store the request's headers." }
        }
    }
}

/// Every attempt, with its error and duration.
///
/// SEAM(attempt history): render `e.attempts` here once `StoredEvent` has them (a row
/// each: number, started, duration, error); until then, the last attempt the row keeps.
fn attempts_section(e: &StoredEvent) -> Markup {
    let s = &e.summary;
    html! {
        section.card #attempts {
            h2 { "Attempts" }
            @if s.attempts == 0 {
                p.muted { "None since it was received or last requeued." }
            } @else {
                table {
                    thead { tr { th.num { "attempts" } th { "last error" } } }
                    tbody {
                        tr {
                            td.num { (s.attempts) }
                            td.error { @if let Some(error) = &s.last_error { (error) } @else { span.muted { "—" } } }
                        }
                    }
                }
                p.note { "The inbox keeps the last attempt's error only." }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_in_the_largest_sensible_unit() {
        for (d, text) in [
            (Duration::from_millis(850), "850 ms"),
            (Duration::from_secs(12), "12 s"),
            (Duration::from_secs(600), "10 min"),
            (Duration::from_secs(3 * 3600), "3 h"),
            (Duration::from_secs(5 * 86_400), "5 d"),
        ] {
            assert_eq!(span(d), text);
        }
        assert_eq!(at(std::time::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }

    #[test]
    fn the_chart_has_a_bar_a_minute_scaled_to_the_largest() {
        let svg = rate_chart(&[0, 5, 10]).into_string();
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}");
        assert!(
            svg.contains("height=\"100.0\""),
            "the largest fills the plot: {svg}"
        );
        assert!(svg.contains("height=\"0.0\""), "{svg}");
        assert!(svg.contains("max 10/min"), "{svg}");
        assert!(rate_chart(&[]).into_string().contains("no data"));
    }
}

//! The markup. maud escapes every value spliced in with `(…)`; nothing here is
//! `PreEscaped` but the page's own constant text. Each section of a page is a function of
//! its own, so a new one is one more function. Here the layout and what every page
//! shares; a file for each page.

use std::time::{Duration, SystemTime};

use maud::{html, Markup, DOCTYPE};

use crate::admin::door::signed_in; // the door let this request in: it can sign out

mod event; // one event: fields, actions, body, headers, attempts
mod invalid; // the events their schema refused
mod list; // the failing and dead lists, and their bulk actions
mod overview; // counts, sources, the rate, pauses

pub(super) use self::event::event;
pub(super) use self::invalid::invalid;
pub(super) use self::list::{list, Typed};
pub(super) use self::overview::{overview, Overview};

/// Which part of the page the navigation marks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Here {
    Overview,
    Failing,
    Dead,
    Invalid,
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
                        (nav(format!("{base}/invalid"), "Invalid", Here::Invalid))
                    }
                    form.search method="get" action={ (base) "/event" } role="search" {
                        input type="search" name="id" placeholder="event id" aria-label="event id" required;
                        input type="text" name="source" placeholder="source (optional)" aria-label="source";
                        button.quiet type="submit" { "Find" }
                    }
                    @if signed_in() {
                        form.logout method="post" action={ (base) "/logout" } {
                            button.quiet type="submit" { "Sign out" }
                        }
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
}

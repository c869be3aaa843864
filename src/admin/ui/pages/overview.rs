//! The overview: counts by state (and by processor, with fan-out), failing and dead by
//! source, the rate, what is paused.

use maud::{html, Markup};

use super::*;
use crate::inbox::{Counts, Pause};

/// What the overview shows.
pub(in crate::admin::ui) struct Overview<'a> {
    /// The sum over the processors.
    pub(in crate::admin::ui) counts: &'a Counts,
    /// With more than one processor counted, each one's counts by name, and whether it
    /// is orphaned (not configured: its routes are left out of `counts`); empty with one.
    pub(in crate::admin::ui) by_processor: &'a [(String, Counts, bool)],
    /// With fan-out, the processors a pause can name (empty: one processor).
    pub(in crate::admin::ui) processors: &'a [String],
    /// Failing and dead rows by source, from the listings' first rows.
    pub(in crate::admin::ui) by_source: &'a [(String, usize, usize)],
    /// Whether the listings had more rows than were read for `by_source`.
    pub(in crate::admin::ui) by_source_cut: bool,
    pub(in crate::admin::ui) pauses: &'a [Pause],
    /// Events processed a minute, oldest first: `None` where the inbox does not tell.
    pub(in crate::admin::ui) rate: &'a [u64],
}

pub(in crate::admin::ui) fn overview(
    base: &str,
    o: &Overview<'_>,
    flash_message: Option<Markup>,
) -> Markup {
    let main = html! {
        @if let Some(f) = flash_message { (f) }
        h1 { "Overview" }
        (counts_section(o.counts))
        @if !o.by_processor.is_empty() { (processors_section(base, o.by_processor)) }
        div.grid {
            (sources_section(base, o.by_source, o.by_source_cut))
            (rate_section(o.rate))
        }
        (pauses_section(base, o.pauses, o.processors))
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
                (cell("invalid", "invalid", c.invalid))
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

/// Each processor's counts: a row a processor, its dead linked to its dead list.
fn processors_section(base: &str, by: &[(String, Counts, bool)]) -> Markup {
    let dead = |name: &str| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("state", "dead")
            .append_pair("processor", name)
            .finish();
        format!("{base}/events?{q}")
    };
    html! {
        section.card #processors {
            h2 { "Routes by processor" }
            table {
                thead {
                    tr {
                        th { "processor" } th.num { "queued" } th.num { "processing" }
                        th.num { "processed" } th.num { "dead" } th.num { "paused" } th { "oldest due" }
                    }
                }
                tbody {
                    @for (name, c, orphaned) in by {
                        tr data-processor=(name) {
                            td {
                                code { (name) }
                                @if *orphaned {
                                    " " span.state.orphaned title="No longer one of this inbox's processors: counted here, not in the totals above" { "orphaned" }
                                }
                            }
                            td.num.queued { (c.queued) }
                            td.num.processing { (c.processing) }
                            td.num.processed { (c.processed) }
                            td.num.dead { a href=(dead(name)) { (c.dead) } }
                            td.num.paused { (c.paused) }
                            td { @match c.oldest_due { Some(d) => { (span(d)) } None => { span.muted { "—" } } } }
                        }
                    }
                }
            }
            p.note { "Each event has a route per processor whose filter it matched: the counts above add up the configured processors'." }
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
fn rate_section(rate: &[u64]) -> Markup {
    html! {
        section.card #rate {
            h2 { "Processed per minute" }
            (rate_chart(rate))
            p.note { "The last " (rate.len()) " minutes by the database's clock; the last bar is the current minute." }
        }
    }
}

/// Bars for `points` (oldest first), scaled to the largest; an empty frame for none.
pub(in crate::admin::ui) fn rate_chart(points: &[u64]) -> Markup {
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

/// What is paused, each with a resume button, and the pause form; `processors` (with
/// fan-out) adds a processor to both.
fn pauses_section(base: &str, pauses: &[Pause], processors: &[String]) -> Markup {
    // A pause of one processor shows whose even without fan-out (the JSON API takes one).
    let whose = !processors.is_empty() || pauses.iter().any(|p| p.processor.is_some());
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
                    thead { tr { @if whose { th { "processor" } } th { "source" } th { "type" } th { "since" } th {} } }
                    tbody {
                        @for pause in pauses {
                            tr {
                                @if whose { td { (any(&pause.processor)) } }
                                td { (any(&pause.source)) }
                                td { (any(&pause.event_type)) }
                                td { (time_cell(pause.paused_at)) }
                                td {
                                    form.inline method="post" action={ (base) "/resume" } {
                                        @if let Some(processor) = &pause.processor {
                                            input type="hidden" name="processor" value=(processor);
                                        }
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
                @if !processors.is_empty() {
                    label {
                        "processor"
                        select name="processor" {
                            option value="" { "every" }
                            @for name in processors { option value=(name) { (name) } }
                        }
                    }
                }
                button type="submit" { "Pause" }
            }
            p.note { "Workers start no matching event until it is resumed; deliveries are still accepted. Both empty: everything." }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

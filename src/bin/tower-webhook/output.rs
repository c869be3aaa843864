//! What the commands print: JSON, or tables of text made safe for a terminal.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use tower_webhook::inbox::{BodyState, Counts, EventSummary, Page, Pause, StoredEvent};

pub(crate) fn json(value: &impl serde::Serialize) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("the inbox's types serialize");
    text.push('\n');
    text
}

fn rfc3339(t: SystemTime) -> String {
    let us = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_micros()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_micros()).unwrap_or(i128::MAX),
    };
    time::OffsetDateTime::from_unix_timestamp_nanos(us.saturating_mul(1000))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn or_dash(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), rfc3339)
}

/// Text from the database made safe for a terminal: control characters (an escape
/// sequence in a processor's error, say) shown escaped, not run. `keep_lines` keeps line
/// breaks and tabs (a body).
pub(crate) fn printable(text: &str, keep_lines: bool) -> String {
    text.chars()
        .flat_map(|c| {
            let keep = !c.is_control() || (keep_lines && matches!(c, '\n' | '\t'));
            let shown: Box<dyn Iterator<Item = char>> = if keep {
                Box::new(std::iter::once(c))
            } else {
                Box::new(c.escape_default())
            };
            shown
        })
        .collect()
}

/// At most `max` characters, an ellipsis for the rest.
fn cut(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// Rows under a header, each column as wide as its widest cell.
pub(crate) fn table<const N: usize>(
    header: &[&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let rows: Vec<[String; N]> = rows.into_iter().collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            text.push_str(cell);
            if i + 1 < N {
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, header.to_vec());
    for row in &rows {
        line(&mut out, row.iter().map(String::as_str).collect());
    }
    out
}

fn lag(oldest_due: Option<Duration>) -> String {
    oldest_due.map_or_else(|| "-".to_owned(), |d| format!("{:.3} s", d.as_secs_f64()))
}

/// The counts (the sum over the processors), and with fan-out a table of each
/// processor's.
pub(crate) fn counted(sum: &Counts, by: Option<&BTreeMap<String, Counts>>) -> String {
    let mut out = table(
        &["STATE", "ROWS"],
        [
            ["queued".to_owned(), sum.queued.to_string()],
            ["processing".to_owned(), sum.processing.to_string()],
            ["processed".to_owned(), sum.processed.to_string()],
            ["dead".to_owned(), sum.dead.to_string()],
            ["paused".to_owned(), sum.paused.to_string()],
            ["invalid".to_owned(), sum.invalid.to_string()],
        ],
    ) + &format!("oldest due: {}\n", lag(sum.oldest_due));
    if let Some(by) = by {
        let rows = by.iter().map(|(name, c)| {
            [
                printable(name, false),
                c.queued.to_string(),
                c.processing.to_string(),
                c.processed.to_string(),
                c.dead.to_string(),
                c.paused.to_string(),
                lag(c.oldest_due),
            ]
        });
        let header = [
            "PROCESSOR",
            "QUEUED",
            "PROCESSING",
            "PROCESSED",
            "DEAD",
            "PAUSED",
            "OLDEST-DUE",
        ];
        let _ = write!(out, "\n{}", table(&header, rows));
    }
    out
}

/// The pauses; a processor column when one of them holds a single processor.
pub(crate) fn paused(pauses: &[Pause]) -> String {
    let any = |part: &Option<String>| printable(part.as_deref().unwrap_or("any"), false);
    if pauses.iter().all(|p| p.processor.is_none()) {
        let rows = pauses.iter().map(|p| [any(&p.source), any(&p.event_type)]);
        return table(&["SOURCE", "TYPE"], rows);
    }
    let rows = pauses
        .iter()
        .map(|p| [any(&p.processor), any(&p.source), any(&p.event_type)]);
    table(&["PROCESSOR", "SOURCE", "TYPE"], rows)
}

/// A page of rows; with fan-out, whose route each one is.
pub(crate) fn listed(page: &Page, fanned_out: bool) -> String {
    let cells = |e: &EventSummary| {
        let when = match e.dead_at {
            Some(dead) => rfc3339(dead),
            None => or_dash(e.next_attempt_at),
        };
        [
            printable(&e.source, false),
            printable(&e.id, false),
            printable(e.event_type.as_deref().unwrap_or("-"), false),
            e.state.to_string(),
            e.attempts.to_string(),
            rfc3339(e.received_at),
            when,
            cut(printable(e.last_error.as_deref().unwrap_or("-"), false), 80),
        ]
    };
    let header = [
        "SOURCE",
        "ID",
        "TYPE",
        "STATE",
        "ATTEMPTS",
        "RECEIVED",
        "DEAD / NEXT ATTEMPT",
        "LAST ERROR",
    ];
    let mut out = match fanned_out {
        false => table(&header, page.events.iter().map(cells)),
        true => {
            let [source, id, rest @ ..] = header;
            let rows = page.events.iter().map(|e| {
                let [source, id, rest @ ..] = cells(e);
                let [t, s, a, r, w, l] = rest;
                [source, id, printable(&e.processor, false), t, s, a, r, w, l]
            });
            let [t, s, a, r, w, l] = rest;
            table(&[source, id, "PROCESSOR", t, s, a, r, w, l], rows)
        }
    };
    match &page.next {
        Some(next) => {
            let _ = writeln!(out, "more: --after {next}");
        }
        None => {
            let n = page.events.len();
            let rows = if n == 1 { "row" } else { "rows" };
            let _ = writeln!(out, "({n} {rows}, the last page)");
        }
    }
    out
}

/// One event; with fan-out, each processor's route and whose each attempt was.
pub(crate) fn shown(event: &StoredEvent, fanned_out: bool) -> String {
    let e = &event.summary;
    let text = |t: Option<&str>| printable(t.unwrap_or("-"), false);
    let livemode = event
        .livemode
        .map_or_else(|| "-".to_owned(), |l| l.to_string());
    let mut out = table(
        &["FIELD", "VALUE"],
        [
            ["source".to_owned(), printable(&e.source, false)],
            ["id".to_owned(), printable(&e.id, false)],
            ["type".to_owned(), text(e.event_type.as_deref())],
            ["object id".to_owned(), text(e.object_id.as_deref())],
            ["livemode".to_owned(), livemode],
            ["state".to_owned(), e.state.to_string()],
            ["attempts".to_owned(), e.attempts.to_string()],
            ["received".to_owned(), rfc3339(e.received_at)],
            ["next attempt".to_owned(), or_dash(e.next_attempt_at)],
            ["processed".to_owned(), or_dash(event.processed_at)],
            ["dead".to_owned(), or_dash(e.dead_at)],
            ["last error".to_owned(), text(e.last_error.as_deref())],
        ],
    );
    if fanned_out {
        let rows = event.routes.iter().map(|r| {
            [
                printable(&r.processor, false),
                r.state.to_string(),
                r.attempts.to_string(),
                or_dash(r.next_attempt_at),
                or_dash(r.processed_at),
                cut(text(r.last_error.as_deref()), 80),
            ]
        });
        let header = [
            "PROCESSOR",
            "STATE",
            "ATTEMPTS",
            "NEXT",
            "PROCESSED",
            "LAST-ERROR",
        ];
        let _ = write!(out, "\n{}", table(&header, rows));
    }
    if !event.validation_errors.is_empty() {
        // Why its schema refused it: a JSON pointer each, never a value of the body.
        let rows = (event.validation_errors.iter())
            .map(|e| [printable(&e.path, false), printable(&e.message, false)]);
        let _ = write!(out, "\n{}", table(&["PATH", "SCHEMA-ERROR"], rows));
    }
    if !event.attempts.is_empty() {
        let cells = |a: &tower_webhook::inbox::AttemptRecord| {
            [
                a.attempt.to_string(),
                rfc3339(a.started_at),
                format!("{:.1} ms", a.duration().as_secs_f64() * 1000.0),
                a.outcome.to_string(),
                text(a.error.as_deref()),
            ]
        };
        let header = ["ATTEMPT", "STARTED", "TOOK", "OUTCOME", "ERROR"];
        let attempts = match fanned_out {
            false => table(&header, event.attempts.iter().map(cells)),
            true => {
                let rows = event.attempts.iter().map(|a| {
                    let [n, started, took, outcome, error] = cells(a);
                    [
                        printable(&a.processor, false),
                        n,
                        started,
                        took,
                        outcome,
                        error,
                    ]
                });
                let [n, started, took, outcome, error] = header;
                table(&["PROCESSOR", n, started, took, outcome, error], rows)
            }
        };
        let _ = write!(out, "\n{attempts}");
    }
    if !event.headers.is_empty() {
        let _ = writeln!(out, "\nheaders (as stored, credentials left out):");
        for (name, value) in &event.headers {
            let _ = writeln!(
                out,
                "{}: {}",
                printable(name, false),
                printable(value, false)
            );
        }
    }
    if event.body_state != BodyState::Stored {
        // Why there is no body to show: erased, expired, or sealed under a key not given.
        let key = match (event.body_state, &event.key_id) {
            (BodyState::Unreadable, Some(id)) => {
                format!(" (sealed under key {:?})", printable(id, false))
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "\nbody: {}{key}", event.body_state.as_str());
        return out;
    }
    match std::str::from_utf8(&event.body) {
        Ok(body) => {
            let _ = writeln!(
                out,
                "\nbody ({} bytes):\n{}",
                body.len(),
                printable(body, true)
            );
        }
        Err(_) => {
            use base64::Engine as _;
            let body = base64::engine::general_purpose::STANDARD.encode(&event.body);
            let _ = writeln!(
                out,
                "\nbody ({} bytes, not UTF-8, as base64):\n{body}",
                event.body.len()
            );
        }
    }
    out
}

/// The invalid events: source, id, type, received, and their first error (of how many).
pub(crate) fn listed_invalid(events: &[StoredEvent]) -> String {
    let rows = events.iter().map(|event| {
        let e = &event.summary;
        let first = event
            .validation_errors
            .first()
            .map_or_else(String::new, |err| {
                let more = event.validation_errors.len() - 1;
                let path = if err.path.is_empty() {
                    "(body)"
                } else {
                    &err.path
                };
                let text = format!("{path}: {}", err.message);
                match more {
                    0 => text,
                    n => format!("{text} (+{n})"),
                }
            });
        [
            printable(&e.source, false),
            printable(&e.id, false),
            printable(e.event_type.as_deref().unwrap_or("-"), false),
            rfc3339(e.received_at),
            cut(printable(&first, false), 100),
        ]
    });
    table(&["SOURCE", "ID", "TYPE", "RECEIVED", "ERRORS"], rows)
}

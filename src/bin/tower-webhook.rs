//! `tower-webhook`: the inbox's operator calls from a shell (feature `cli`) — the same
//! ones `admin::router` answers over HTTP, with the same JSON under `--json`.
//!
//! ```text
//! tower-webhook --database-url postgres://… counts
//! tower-webhook list --state dead --limit 20          (DATABASE_URL from the environment)
//! tower-webhook show stripe evt_1
//! tower-webhook requeue --dead --type invoice.paid
//! ```
//!
//! Exit status: 0 done, 1 the database could not be opened or failed, 2 bad usage, 3 no
//! such event (`show`).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{ArgGroup, CommandFactory as _, Parser, Subcommand, ValueEnum};
use tower_webhook::inbox::{Cursor, EventSummary, Inbox, Listing, Page, Requeue, StoredEvent};
use tower_webhook::store::{PgStore, SqliteStore, StoreError, StoreErrorKind};

/// Operate a tower-webhook inbox: counts, dead and failing rows, one event, requeue.
///
/// The database is a PostgreSQL URL (postgres://user@host/db) or a SQLite file
/// (a path, or sqlite://path) the application already uses. The command creates no
/// file and runs no migration on PostgreSQL (a SQLite file gets the crate's migrations,
/// as the application's start would).
#[derive(Debug, Parser)]
#[command(name = "tower-webhook", version)]
struct Cli {
    /// The inbox's database: postgres://… or a SQLite path (sqlite://… too).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    database_url: Option<String>,

    /// Print JSON (the admin router's) instead of tables.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// How many rows are in each state, and the queue's lag.
    Counts,
    /// A page of the dead or failing rows, with their last error.
    List {
        /// dead: gave up after the maximum attempts; failing: queued again after a failed
        /// attempt.
        #[arg(long, value_enum)]
        state: Rows,
        /// At most this many rows (1 to 1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// The oldest first (default: the newest).
        #[arg(long)]
        oldest: bool,
        /// The page after this cursor (the previous page's "next").
        #[arg(long, value_parser = parse_cursor)]
        after: Option<Cursor>,
    },
    /// One event's row and its body (the provider's raw payload: customer data).
    Show {
        /// The event's source (the verifier's: the scheme's name unless set).
        source: String,
        /// The provider's event id.
        id: String,
    },
    /// Put rows back in the queue now, attempts reset; prints how many.
    ///
    /// Name the rows: one event (--id), the dead ones (--dead), or narrow by type and
    /// receipt window — alone, those match processed rows too (a replay). Rows a worker is
    /// processing now are left to it.
    #[command(group(ArgGroup::new("rows").required(true).multiple(true)
        .args(["id", "dead", "event_type", "from", "before", "all"])))]
    Requeue {
        /// One event, as SOURCE/ID (split at the first '/').
        #[arg(long, value_name = "SOURCE/ID", value_parser = parse_key, conflicts_with_all = ["dead", "all"])]
        id: Option<(String, String)>,
        /// Every dead row.
        #[arg(long, conflicts_with = "all")]
        dead: bool,
        /// Only rows of this event type.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
        /// Only rows received at or after this RFC 3339 time.
        #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
        from: Option<SystemTime>,
        /// Only rows received before this RFC 3339 time.
        #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
        before: Option<SystemTime>,
        /// Every row, processed ones too: replay everything.
        #[arg(long, conflicts_with_all = ["event_type", "from", "before"])]
        all: bool,
    },
    /// Stop the workers starting events of a source, a type, or both (neither: every
    /// event); accepts go on, and running events finish.
    Pause(Paused),
    /// End a pause, named as it was paused: its events start again, in order.
    Resume(Paused),
    /// What is paused.
    Pauses,
}

/// What `pause` and `resume` name.
#[derive(Debug, clap::Args)]
struct Paused {
    /// Only this source (default: any).
    #[arg(long)]
    source: Option<String>,
    /// Only this event type (default: any).
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Rows {
    Dead,
    Failing,
}

fn parse_cursor(s: &str) -> Result<Cursor, String> {
    s.parse()
        .map_err(|_| "not a cursor this command printed".to_owned())
}

fn parse_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((source, id)) if !source.is_empty() && !id.is_empty() => {
            Ok((source.to_owned(), id.to_owned()))
        }
        _ => Err("expected SOURCE/ID, such as stripe/evt_1".to_owned()),
    }
}

fn parse_time(s: &str) -> Result<SystemTime, String> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| "expected an RFC 3339 time, such as 2026-12-01T09:30:00Z".to_owned())
}

/// Why the command stopped.
enum Failure {
    /// Usage clap could not check: exit 2.
    Usage(String),
    /// The database could not be opened or failed: exit 1.
    Store(String),
    /// The store refused the input (a database URL that does not parse): exit 2, as
    /// usage, but with the URL's password redacted like a store's error.
    Refused(String),
    /// `show` of an event the inbox does not have: exit 3.
    NotFound,
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            // sqlx's errors repeat their cause in their own text.
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                let _ = write!(text, ": {cause_text}");
            }
            source = cause.source();
        }
        if e.kind() == StoreErrorKind::InvalidInput {
            Failure::Refused(text)
        } else {
            Failure::Store(text)
        }
    }
}

/// A failed connection: a URL that does not parse is the input's fault (exit 2), the
/// rest the server's (exit 1).
fn connect_error(e: sqlx::Error) -> StoreError {
    let kind = match e {
        sqlx::Error::Configuration(_) => StoreErrorKind::InvalidInput,
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::new("postgres connect", e).with_kind(kind)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.database_url.clone() else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "give the database with --database-url or DATABASE_URL",
            )
            .exit()
    };
    match run(&cli, &url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(text)) => {
            Cli::command()
                .error(clap::error::ErrorKind::ValueValidation, text)
                .exit();
        }
        Err(Failure::Store(text)) => {
            // A driver's error may quote the URL it was given: never its password.
            eprintln!("error: {}", redact(&text, &url));
            ExitCode::from(1)
        }
        Err(Failure::Refused(text)) => {
            eprintln!("error: {}", redact(&text, &url));
            ExitCode::from(2)
        }
        Err(Failure::NotFound) => {
            eprintln!("error: the inbox has no such event");
            ExitCode::from(3)
        }
    }
}

async fn run(cli: &Cli, url: &str) -> Result<(), Failure> {
    if let Command::Requeue {
        from: Some(from),
        before: Some(before),
        ..
    } = &cli.command
    {
        if from >= before {
            return Err(Failure::Usage("--from must be before --before".into()));
        }
    }
    let inbox = open(url).await?;
    let out = match &cli.command {
        Command::Counts => {
            let counts = inbox.counts().await?;
            if cli.json {
                json(&counts)
            } else {
                let lag = counts
                    .oldest_due
                    .map_or_else(|| "-".to_owned(), |d| format!("{:.3} s", d.as_secs_f64()));
                table(
                    &["STATE", "ROWS"],
                    [
                        ["queued".to_owned(), counts.queued.to_string()],
                        ["processing".to_owned(), counts.processing.to_string()],
                        ["processed".to_owned(), counts.processed.to_string()],
                        ["dead".to_owned(), counts.dead.to_string()],
                    ],
                ) + &format!("oldest due: {lag}\n")
            }
        }
        Command::List {
            state,
            limit,
            oldest,
            after,
        } => {
            let mut listing = match state {
                Rows::Dead => Listing::dead(),
                Rows::Failing => Listing::failing(),
            }
            .with_limit(usize::from(*limit));
            if *oldest {
                listing = listing.oldest_first();
            }
            if let Some(after) = after {
                listing = listing.after(after.clone());
            }
            let page = inbox.list(&listing).await?;
            if cli.json {
                json(&page)
            } else {
                listed(&page)
            }
        }
        Command::Show { source, id } => {
            let event = inbox.event(source, id).await?.ok_or(Failure::NotFound)?;
            if cli.json {
                json(&event)
            } else {
                shown(&event)
            }
        }
        Command::Requeue {
            id,
            dead,
            event_type,
            from,
            before,
            all: _,
        } => {
            let mut which = match (id, dead) {
                (Some((source, id)), _) => Requeue::id(source, id),
                (None, true) => Requeue::dead(),
                (None, false) => Requeue::all(),
            };
            if let Some(t) = event_type {
                which = which.with_type(t);
            }
            if let Some(from) = from {
                which = which.received_since(*from);
            }
            if let Some(before) = before {
                which = which.received_before(*before);
            }
            let n = inbox.requeue(which).await?;
            if cli.json {
                json(&serde_json::json!({ "requeued": n }))
            } else {
                format!("requeued {n}\n")
            }
        }
        Command::Pause(which) | Command::Resume(which) => {
            let (source, event_type) = (which.source.as_deref(), which.event_type.as_deref());
            let pausing = matches!(cli.command, Command::Pause(_));
            let changed = if pausing {
                inbox.pause(source, event_type).await?
            } else {
                inbox.resume(source, event_type).await?
            };
            let what = format!(
                "source {}, type {}",
                source.unwrap_or("any"),
                event_type.unwrap_or("any")
            );
            match (cli.json, pausing, changed) {
                (true, _, _) => json(&serde_json::json!({ "changed": changed })),
                (false, true, true) => format!("paused {what}\n"),
                (false, true, false) => format!("already paused: {what}\n"),
                (false, false, true) => format!("resumed {what}\n"),
                (false, false, false) => format!("not paused: {what}\n"),
            }
        }
        Command::Pauses => {
            let pauses = inbox.pauses().await?;
            if cli.json {
                json(&pauses)
            } else {
                let any = |part: &Option<String>| part.clone().unwrap_or_else(|| "any".into());
                let rows = pauses.iter().map(|p| [any(&p.source), any(&p.event_type)]);
                table(&["SOURCE", "TYPE"], rows)
            }
        }
    };
    print!("{out}");
    Ok(())
}

/// The inbox in the database `url` names, opened as it is.
async fn open(url: &str) -> Result<Inbox, Failure> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // One connection first: a pool retries until its timeout and then names only
        // the timeout, where this says why (refused, authentication, no such database).
        use sqlx::Connection as _;
        sqlx::PgConnection::connect(url)
            .await
            .map_err(connect_error)?
            .close()
            .await
            .map_err(connect_error)?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(connect_error)?;
        // Migrated by the application; an operator's command changes no schema.
        return Ok(Inbox::postgres(&PgStore::from_migrated_pool(pool)));
    }
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    if !Path::new(path).is_file() {
        return Err(Failure::Store(format!(
            "no SQLite database at {path} (give an existing file, or a postgres:// URL)"
        )));
    }
    // The store's own open: WAL and busy timeout as the application has them, and its
    // migrations (none to run on a file the application keeps current).
    Ok(Inbox::sqlite(&SqliteStore::open(path).await?))
}

fn json(value: &impl serde::Serialize) -> String {
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
fn printable(text: &str, keep_lines: bool) -> String {
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
fn table<const N: usize>(
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

fn listed(page: &Page) -> String {
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
    let mut out = table(
        &[
            "SOURCE",
            "ID",
            "TYPE",
            "STATE",
            "ATTEMPTS",
            "RECEIVED",
            "DEAD / NEXT ATTEMPT",
            "LAST ERROR",
        ],
        page.events.iter().map(cells),
    );
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

fn shown(event: &StoredEvent) -> String {
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

/// `text` with the URL's password, as written and percent-decoded, replaced by `***`.
fn redact(text: &str, url: &str) -> String {
    let Some(rest) = url.split_once("://").map(|(_, rest)| rest) else {
        return text.to_owned();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return text.to_owned();
    };
    let Some((_, password)) = userinfo.split_once(':') else {
        return text.to_owned();
    };
    if password.is_empty() {
        return text.to_owned();
    }
    let decoded = percent_decoded(password);
    let mut text = text.replace(password, "***");
    if !decoded.is_empty() {
        text = text.replace(&decoded, "***");
    }
    text
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_redacted_as_written_and_decoded() {
        let url = "postgres://operator:p%40ss-w0rd@db.internal:5432/inbox";
        assert_eq!(
            redact("failed for p%40ss-w0rd and p@ss-w0rd", url),
            "failed for *** and ***"
        );
        for url in [
            "postgres://operator@db/inbox",
            "webhooks.db",
            "postgres://:@db/x",
        ] {
            assert_eq!(redact("connection refused", url), "connection refused");
        }
    }

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("a\u{1b}[31mb\u{7}", false), "a\\u{1b}[31mb\\u{7}");
        assert_eq!(printable("line\nnext\tcol", false), "line\\nnext\\tcol");
        assert_eq!(printable("line\nnext\tcol\r", true), "line\nnext\tcol\\r");
        assert_eq!(printable("naïve ✓", false), "naïve ✓");
    }

    #[test]
    fn an_id_splits_at_the_first_slash() {
        assert_eq!(
            parse_key("stripe/evt_1/x").unwrap(),
            ("stripe".to_owned(), "evt_1/x".to_owned())
        );
        for bad in ["stripe", "/evt_1", "stripe/", ""] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}

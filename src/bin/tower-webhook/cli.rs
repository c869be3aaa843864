//! The command line: the global options, the commands and their arguments.

use std::time::SystemTime;

use clap::{ArgGroup, Parser, Subcommand, ValueEnum};
use tower_webhook::inbox::Cursor;

/// Operate a tower-webhook inbox: counts, dead and failing rows, one event, requeue.
///
/// The database is a PostgreSQL URL (postgres://user@host/db) or a SQLite file
/// (a path, or sqlite://path) the application already uses. The command creates no
/// file and runs no migration on PostgreSQL (a SQLite file gets the crate's migrations,
/// as the application's start would). An inbox that seals bodies needs its keys to show
/// them: WEBHOOK_ENCRYPTION_KEYS, as the application reads it (id:<base64>, comma-
/// separated), from the environment only, never an argument a process list would show.
#[derive(Debug, Parser)]
#[command(name = "tower-webhook", version)]
pub(crate) struct Cli {
    /// The inbox's database: postgres://… or a SQLite path (sqlite://… too).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub(crate) database_url: Option<String>,

    /// Print JSON (the admin router's) instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// How many rows are in each state, and the queue's lag.
    Counts,
    /// A page of the dead or failing rows, with their last error.
    List {
        /// dead: gave up after the maximum attempts; failing: queued again after a failed
        /// attempt; invalid: refused by their type's JSON Schema, never processed (by source
        /// and id; --limit only).
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
        /// Only this processor's routes (fan-out; default: every processor's).
        #[arg(long, value_name = "NAME")]
        processor: Option<String>,
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
        .args(["id", "dead", "event_type", "from", "before", "all", "invalid"])))]
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
        /// Only this processor's routes of those rows, the other processors' left as they
        /// are (fan-out; default: every processor's).
        #[arg(long, value_name = "NAME")]
        processor: Option<String>,
        /// The invalid events, checked again against the schemas in --schemas: the valid
        /// ones are routed and run, the rest stay invalid; prints how many of each.
        #[arg(long, requires = "schemas", conflicts_with_all = ["id", "dead", "event_type", "from", "before", "all", "processor"])]
        invalid: bool,
        /// The folder of `<event type>.json` schemas --invalid checks against (as the
        /// application loads it).
        #[arg(long, value_name = "DIR", requires = "invalid")]
        schemas: Option<std::path::PathBuf>,
    },
    /// Stop the workers starting events of a source, a type, or both (neither: every
    /// event), of every processor or one; accepts go on, and running events finish.
    Pause(Paused),
    /// End a pause, named as it was paused: its events start again, in order.
    Resume(Paused),
    /// What is paused.
    Pauses,
    /// Give a processor added later the events received in a window that it has no route
    /// of and its type globs (as the application registered them) take; prints how many
    /// routes it made. A processor with a predicate is backfilled through the application's
    /// /admin/backfill, which can evaluate it.
    Backfill {
        /// The processor, as the application names it.
        #[arg(long)]
        processor: String,
        /// Only events received at or after this RFC 3339 time.
        #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
        from: Option<SystemTime>,
        /// Only events received before this RFC 3339 time.
        #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
        before: Option<SystemTime>,
    },
    /// Rotation's last step: rewrite what older keys sealed, and what was stored in clear,
    /// under the current key (the first of WEBHOOK_ENCRYPTION_KEYS), a batch at a time;
    /// prints how many values it rewrote, and how many no listed key opens (left as they
    /// are: keep their key listed, or they stay unreadable). Safe beside the application;
    /// stopped, a rerun finishes. Remove an old key only once this rewrote everything.
    /// Payloads are compressed before sealing unless WEBHOOK_ENCRYPTION_COMPRESS=0.
    Rekey {
        /// Rows read, sealed again and written in one transaction (1 to 10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=10000))]
        batch: u16,
    },
    /// Erase one event's body: its body, stored headers and every error text of its
    /// routes and attempts are deleted, and its routes that could still run go dead, never
    /// run ("the body was erased before the event was processed"). Its key and outcomes
    /// stay: a redelivery is still a duplicate. Not undone; the database's free pages,
    /// write-ahead log and backups, and the provider's copy, are not reached.
    Erase {
        /// The event's source (as `show` takes it).
        source: String,
        /// The provider's event id.
        id: String,
        /// Yes, erase it (the body cannot be brought back).
        #[arg(long)]
        yes: bool,
    },
    /// Delete a processor the application no longer has (orphaned): its routes with their
    /// history, its counts, pauses and registry row; prints how many routes.
    DropProcessor {
        /// The processor.
        name: String,
        /// Yes, delete them (a processor still configured would find its routes gone).
        #[arg(long)]
        yes: bool,
    },
}

/// What `pause` and `resume` name.
#[derive(Debug, clap::Args)]
pub(crate) struct Paused {
    /// Only this processor's routes (fan-out; default: every processor's).
    #[arg(long, value_name = "NAME")]
    pub(crate) processor: Option<String>,
    /// Only this source (default: any).
    #[arg(long)]
    pub(crate) source: Option<String>,
    /// Only this event type (default: any).
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
}

impl Command {
    /// The processor `--processor` names, for the commands that take it.
    pub(crate) fn processor(&self) -> Option<&str> {
        match self {
            Command::List { processor, .. } | Command::Requeue { processor, .. } => {
                processor.as_deref()
            }
            Command::Pause(which) | Command::Resume(which) => which.processor.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Rows {
    Dead,
    Failing,
    /// Refused by their type's JSON Schema at accept: never processed.
    Invalid,
}

fn parse_cursor(s: &str) -> Result<Cursor, String> {
    s.parse()
        .map_err(|_| "not a cursor this command printed".to_owned())
}

pub(crate) fn parse_key(s: &str) -> Result<(String, String), String> {
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

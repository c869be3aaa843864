//! `tower-webhook`: the inbox's operator calls from a shell (feature `cli`) — the same
//! ones `admin::router` answers over HTTP, with the same JSON under `--json`.
//!
//! ```text
//! tower-webhook --database-url postgres://… counts
//! tower-webhook list --state dead --limit 20          (DATABASE_URL from the environment)
//! tower-webhook show stripe evt_1
//! tower-webhook requeue --dead --type invoice.paid
//! tower-webhook backfill --processor billing --from 2026-12-01T00:00:00Z
//! tower-webhook drop-processor legacy --yes
//! ```
//!
//! Exit status: 0 done, 1 the database could not be opened or failed, 2 bad usage, 3 no
//! such event (`show`).

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser};

use cli::Cli;
use commands::run;
use failure::Failure;
use redact::redact;

mod cli; // the command line: options, commands, arguments
mod commands; // each command, run against the inbox
mod database; // the inbox's database, opened from its URL
mod failure; // why the command stopped: the exit status
mod output; // JSON, or tables of terminal-safe text
mod processors; // fan-out: backfill a processor, drop one
mod redact; // the URL's password kept out of errors
#[cfg(test)]
mod tests;

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

//! Each command, run against the inbox and printed as a table or as JSON.

use tower_webhook::inbox::{Listing, Requeue};

use crate::cli::{Cli, Command, Rows};
use crate::database::open;
use crate::failure::Failure;
use crate::output::{json, listed, shown, table};

pub(crate) async fn run(cli: &Cli, url: &str) -> Result<(), Failure> {
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
                        ["paused".to_owned(), counts.paused.to_string()],
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

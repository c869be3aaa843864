//! Each command, run against the inbox and printed as a table or as JSON.

use tower_webhook::inbox::{Counts, Listing, Requeue, DEFAULT_PROCESSOR};
use tower_webhook::seal::KeyRing;

use crate::cli::{Cli, Command, Rows};
use crate::database::open;
use crate::failure::Failure;
use crate::output::{counted, json, listed, listed_invalid, paused, shown};
use crate::processors;

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
    if let Command::Erase {
        source,
        id,
        yes: false,
    } = &cli.command
    {
        return Err(Failure::Usage(format!(
            "erase deletes the body of {source} {id} for good: confirm with --yes"
        )));
    }
    let keys = keys()?;
    if matches!(cli.command, Command::Rekey { .. }) && keys.is_none() {
        return Err(Failure::Usage(
            "rekey needs the keys: set WEBHOOK_ENCRYPTION_KEYS, the new key first".into(),
        ));
    }
    let database = open(url).await?;
    let wanted = cli.command.processor();
    // The CLI does not know the application's processors, and the library refuses a
    // processor its inbox lacks: the inbox here has those with routes in the database.
    let routed = match (&cli.command, wanted) {
        (Command::Counts, _) | (_, Some(_)) => database.routed().await?,
        _ => Vec::new(),
    };
    if let Some(name) = wanted.filter(|name| !routed.iter().any(|r| r == name)) {
        let known = match routed.is_empty() {
            true => "none has".to_owned(),
            false => format!("{} have", routed.join(", ")),
        };
        return Err(Failure::Usage(format!(
            "no routes of the processor {name:?} in this database ({known} routes)"
        )));
    }
    let mut inbox = database.inbox_of(&routed)?;
    if let Some(keys) = keys {
        inbox = inbox.with_keys(keys);
    }
    let out = match &cli.command {
        Command::Backfill {
            processor,
            from,
            before,
        } => processors::backfill(&inbox, cli.json, processor, *from, *before).await?,
        Command::Rekey { batch } => {
            let done = inbox.rekey(usize::from(*batch)).await?;
            match (cli.json, done.unreadable) {
                (true, _) => json(&serde_json::json!({
                    "rekeyed": done.rekeyed,
                    "unreadable": done.unreadable,
                })),
                (false, 0) => format!("rekeyed {}\n", done.rekeyed),
                (false, n) => format!(
                    "rekeyed {}\nunreadable {n}: no key in WEBHOOK_ENCRYPTION_KEYS opens them (left as they are)\n",
                    done.rekeyed
                ),
            }
        }
        Command::Erase { source, id, .. } => {
            if !inbox.erase(source, id).await? {
                return Err(Failure::NotFound);
            }
            match cli.json {
                true => json(&serde_json::json!({ "erased": true })),
                false => format!("erased {source} {id}\n"),
            }
        }
        Command::DropProcessor { name, yes } => {
            processors::drop(&inbox, cli.json, name, *yes).await?
        }
        Command::Counts => {
            let by = inbox.counts_by_processor().await?;
            let mut sum = Counts::default();
            for c in by.values() {
                sum.queued += c.queued;
                sum.processing += c.processing;
                sum.processed += c.processed;
                sum.dead += c.dead;
                sum.paused += c.paused;
                sum.oldest_due = sum.oldest_due.max(c.oldest_due);
            }
            sum.invalid = inbox.invalid_count().await?;
            // One processor, `default`: the answer as before fan-out.
            let fanned_out = routed.iter().any(|name| name != DEFAULT_PROCESSOR);
            match (cli.json, fanned_out) {
                (true, false) => json(&sum),
                (true, true) => {
                    let mut answer = serde_json::to_value(sum).expect("counts serialize");
                    answer["processors"] = serde_json::to_value(&by).expect("counts serialize");
                    json(&answer)
                }
                (false, false) => counted(&sum, None),
                (false, true) => counted(&sum, Some(&by)),
            }
        }
        Command::List {
            state,
            limit,
            oldest,
            after,
            processor,
        } => {
            let mut listing = match state {
                Rows::Dead => Listing::dead(),
                Rows::Failing => Listing::failing(),
                Rows::Invalid if *oldest || after.is_some() || processor.is_some() => {
                    return Err(Failure::Usage("--state invalid takes --limit only".into()))
                }
                Rows::Invalid => {
                    let events = inbox.list_invalid(None, usize::from(*limit)).await?;
                    let out = match cli.json {
                        true => {
                            let rows: Vec<serde_json::Value> = (events.iter())
                                .map(|e| {
                                    let mut row =
                                        serde_json::to_value(&e.summary).expect("serializes");
                                    row["validation_errors"] =
                                        serde_json::to_value(&e.validation_errors)
                                            .expect("serializes");
                                    row
                                })
                                .collect();
                            json(&serde_json::json!({ "events": rows }))
                        }
                        false => listed_invalid(&events),
                    };
                    print!("{out}");
                    return Ok(());
                }
            }
            .with_limit(usize::from(*limit));
            if *oldest {
                listing = listing.oldest_first();
            }
            if let Some(after) = after {
                listing = listing.after(after.clone());
            }
            if let Some(name) = processor {
                listing = listing.with_processor(name);
            }
            let page = inbox.list(&listing).await?;
            // With fan-out each row is one processor's route: say whose (as the router).
            let fanned_out = page.events.iter().any(|e| e.processor != DEFAULT_PROCESSOR);
            match (cli.json, fanned_out) {
                (true, false) => json(&page),
                (true, true) => {
                    let mut answer = serde_json::to_value(&page).expect("a page serializes");
                    let rows = answer["events"].as_array_mut().into_iter().flatten();
                    for (row, event) in rows.zip(&page.events) {
                        row["processor"] = event.processor.clone().into();
                    }
                    json(&answer)
                }
                (false, _) => listed(&page, fanned_out),
            }
        }
        Command::Show { source, id } => {
            let mut event = inbox.event(source, id).await?.ok_or(Failure::NotFound)?;
            // The CLI does not know the application's processors: it calls none orphaned.
            for route in &mut event.routes {
                route.orphaned = false;
            }
            // With fan-out (a route of a processor but `default`), its routes and whose
            // each attempt was; else the event as before fan-out.
            let fanned_out = event
                .routes
                .iter()
                .any(|r| r.processor != DEFAULT_PROCESSOR);
            match (cli.json, fanned_out) {
                (true, false) => json(&event),
                (true, true) => {
                    let mut answer = serde_json::to_value(&event).expect("an event serializes");
                    answer["routes"] = serde_json::to_value(&event.routes).expect("serializes");
                    let history = answer["history"].as_array_mut().into_iter().flatten();
                    for (entry, attempt) in history.zip(&event.attempts) {
                        entry["processor"] = attempt.processor.clone().into();
                    }
                    json(&answer)
                }
                (false, _) => shown(&event, fanned_out),
            }
        }
        Command::Requeue {
            invalid: true,
            schemas: Some(dir),
            ..
        } => {
            let schemas = tower_webhook::schemas::Schemas::from_dir(dir)
                .map_err(|e| Failure::Usage(format!("--schemas: {e}")))?;
            let done = inbox
                .clone()
                .with_schemas(schemas)
                .requeue_invalid()
                .await?;
            let (n, left) = (done.queued, done.still_invalid);
            match cli.json {
                true => json(&serde_json::json!({ "requeued": n, "still_invalid": left })),
                false => format!("requeued {n}\nstill invalid {left}\n"),
            }
        }
        Command::Requeue {
            id,
            dead,
            event_type,
            from,
            before,
            all: _,
            processor,
            ..
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
            if let Some(name) = processor {
                which = which.with_processor(name);
            }
            let done = inbox.requeue_counted(which).await?;
            let (n, left) = (done.requeued, done.without_body);
            if cli.json {
                json(&serde_json::json!({ "requeued": n, "without_body": left }))
            } else if left > 0 {
                format!("requeued {n}\nleft out {left}: the body expired or was erased\n")
            } else {
                format!("requeued {n}\n")
            }
        }
        Command::Pause(which) | Command::Resume(which) => {
            let (source, event_type) = (which.source.as_deref(), which.event_type.as_deref());
            let pausing = matches!(cli.command, Command::Pause(_));
            let changed = match (pausing, which.processor.as_deref()) {
                (true, None) => inbox.pause(source, event_type).await?,
                (false, None) => inbox.resume(source, event_type).await?,
                (true, Some(p)) => inbox.pause_processor(p, source, event_type).await?,
                (false, Some(p)) => inbox.resume_processor(p, source, event_type).await?,
            };
            let whose = which
                .processor
                .as_ref()
                .map_or_else(String::new, |p| format!("processor {p}, "));
            let what = format!(
                "{whose}source {}, type {}",
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
                paused(&pauses)
            }
        }
    };
    print!("{out}");
    Ok(())
}

/// The inbox's keys from `WEBHOOK_ENCRYPTION_KEYS` (unset or empty: none). A malformed
/// entry is a usage error naming its position, never the key (`KeyRing::parse`'s text).
/// `WEBHOOK_ENCRYPTION_COMPRESS=0`, as the application sets it, makes a rekey reseal
/// payloads uncompressed.
fn keys() -> Result<Option<KeyRing>, Failure> {
    let compress = match std::env::var("WEBHOOK_ENCRYPTION_COMPRESS").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("1") => true,
        Ok("0") => false,
        Ok(_) | Err(_) => return Err(Failure::Usage("WEBHOOK_ENCRYPTION_COMPRESS: 0 or 1".into())),
    };
    match std::env::var("WEBHOOK_ENCRYPTION_KEYS") {
        Ok(value) if !value.trim().is_empty() => KeyRing::parse(&value)
            .map(|ring| {
                if compress {
                    ring
                } else {
                    ring.without_compression()
                }
            })
            .map(Some)
            .map_err(|e| Failure::Usage(format!("WEBHOOK_ENCRYPTION_KEYS: {e}"))),
        _ => Ok(None),
    }
}

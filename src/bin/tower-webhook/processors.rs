//! Fan-out's commands on processors: `backfill` (the processor's filter read from the
//! registry the application's inbox wrote) and `drop-processor`.

use std::time::SystemTime;

use tower_webhook::inbox::{Backfill, Inbox, ProcessorSpec};

use crate::failure::Failure;
use crate::output::json;

/// `backfill --processor NAME [--from] [--before]`: the processor's routes of the events
/// in the window, made by an inbox configured with it alone, its globs as registered.
pub(crate) async fn backfill(
    inbox: &Inbox,
    as_json: bool,
    processor: &str,
    from: Option<SystemTime>,
    before: Option<SystemTime>,
) -> Result<String, Failure> {
    if let (Some(from), Some(before)) = (from, before) {
        if from >= before {
            return Err(Failure::Usage("--from must be before --before".into()));
        }
    }
    let registered = inbox.registered_processors().await?;
    let Some(found) = registered.into_iter().find(|p| p.name == processor) else {
        return Err(Failure::Refused(format!(
            "no processor {processor:?} is registered (an application's inbox registers its processors with its first accept or worker)"
        )));
    };
    if found.has_predicate {
        // Only the application can evaluate its predicate.
        return Err(Failure::Refused(format!(
            "processor {processor:?} has a predicate: backfill it through the application's /admin/backfill"
        )));
    }
    let mut spec = ProcessorSpec::new(processor).map_err(|e| Failure::Refused(e.to_string()))?;
    if let Some(globs) = found.types {
        spec = spec
            .with_types(globs)
            .map_err(|e| Failure::Refused(e.to_string()))?;
    }
    let inbox = inbox
        .clone()
        .with_processors([spec])
        .map_err(|e| Failure::Refused(e.to_string()))?;
    let window = match (from, before) {
        (Some(from), Some(before)) => Backfill::received_between(from, before),
        (Some(from), None) => Backfill::received_since(from),
        (None, Some(before)) => Backfill::received_before(before),
        (None, None) => Backfill::all(),
    };
    let created = inbox.backfill(processor, window).await?;
    Ok(if as_json {
        json(&serde_json::json!({ "created": created }))
    } else {
        format!("created {created}\n")
    })
}

/// `drop-processor NAME --yes`.
pub(crate) async fn drop(
    inbox: &Inbox,
    as_json: bool,
    name: &str,
    yes: bool,
) -> Result<String, Failure> {
    if !yes {
        return Err(Failure::Usage(format!(
            "drop-processor deletes every route of {name:?} with its history: confirm with --yes"
        )));
    }
    ProcessorSpec::new(name).map_err(|e| Failure::Usage(e.to_string()))?;
    // The library refuses to drop a processor its inbox is configured with; this command
    // knows no application's set, so its inbox (which writes nothing else) is configured
    // with one other name: the operator's --yes stands for that check.
    let placeholder = if name == "cli" { "cli-" } else { "cli" };
    let inbox = inbox
        .clone()
        .with_processors([ProcessorSpec::new(placeholder).expect("a valid name")])
        .map_err(|e| Failure::Refused(e.to_string()))?;
    let deleted = inbox.drop_processor(name).await?;
    Ok(if as_json {
        json(&serde_json::json!({ "deleted": deleted }))
    } else {
        format!("deleted {deleted} routes of {name}\n")
    })
}

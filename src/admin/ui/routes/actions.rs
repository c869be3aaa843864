//! The forms' actions: each checked same-origin, then a few inbox calls, and a page that
//! says what changed (a bulk one counts first and acts only once confirmed).

use super::*;

pub(super) async fn requeue_one(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<OneEvent>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let (Some(source), Some(id)) = (given(&f.source), given(&f.id)) else {
        return Err(UiError::at(
            base,
            AdminError::bad_request("requeue takes a source and an id"),
        ));
    };
    if source.contains('\0') || id.contains('\0') {
        return Err(UiError::at(
            base,
            AdminError::bad_request("source and id contain no NUL"),
        ));
    }
    let mut which = Requeue::id(source, id);
    let route = given(&f.processor);
    if let Some(name) = route {
        which = which.with_processor(processor(&inbox, name).map_err(failed(&base))?);
    }
    let n = inbox.requeue(which).await.map_err(store(&base))?;
    let done = match (n, route) {
        (0, _) => "not-requeued",
        (_, Some(_)) => "requeued-route",
        (_, None) => "requeued",
    };
    let to = format!("{}&done={done}", event_href(&base, source, id));
    Ok(Redirect::to(&to).into_response())
}

/// Erases one event's body ([`Inbox::erase`]) once confirmed: the first post answers a
/// page saying what it does, with the form to confirm.
pub(super) async fn erase_body(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<EraseForm>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let (Some(source), Some(id)) = (given(&f.source), given(&f.id)) else {
        return Err(UiError::at(
            base,
            AdminError::bad_request("erase takes a source and an id"),
        ));
    };
    if source.contains('\0') || id.contains('\0') {
        return Err(UiError::at(
            base,
            AdminError::bad_request("source and id contain no NUL"),
        ));
    }
    if !f.confirmed() {
        let what = html! {
            "The body of " code { (source) } " " code { (id) } ", its stored request headers and every error text of its routes and attempts will be deleted; its routes that could still run go dead, never run. "
            "This cannot be undone. Its key and outcomes stay, so a redelivery is still a duplicate. "
            "Copies outside this database (backups, the write-ahead log, the provider's) are not reached."
        };
        let fields = [("source", source.to_owned()), ("id", id.to_owned())];
        let markup = pages::confirm(&base, "Erase body", what, "/erase-body", &fields, true);
        return Ok(page(StatusCode::OK, markup));
    }
    if !inbox.erase(source, id).await.map_err(store(&base))? {
        return Err(UiError::at(base, AdminError::not_found("no such event")));
    }
    let to = format!("{}&done=erased", event_href(&base, source, id));
    Ok(Redirect::to(&to).into_response())
}

/// How many `rows` match `filter` (at most [`COUNT_ROWS`] read), and whether there may
/// be more.
async fn count(inbox: &Inbox, rows: Rows, filter: &Filter) -> Result<(usize, bool), StoreError> {
    let Scanned { rows, cut, .. } = scan(inbox, rows, filter, None, usize::MAX, COUNT_ROWS).await?;
    Ok((rows.len(), cut))
}

/// `17`, or `at least 10000` where the count stopped at its budget.
fn how_many(n: usize, cut: bool) -> String {
    match cut {
        true => format!("at least {n}"),
        false => n.to_string(),
    }
}

pub(super) async fn requeue_matching(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<RequeueForm>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let filter = Filter {
        processor: given(&f.processor).map(str::to_owned),
        ..Filter::of(&None, &f.event_type, &f.from, &f.before).map_err(failed(&base))?
    };
    if let Some(name) = &filter.processor {
        processor(&inbox, name).map_err(failed(&base))?;
    }
    let narrowed = filter.event_type.is_some() || filter.from.is_some() || filter.before.is_some();
    if !f.dead_only() && !narrowed {
        let why = "name the rows: dead only, a type or a window (every event at once is the JSON API's `all`)";
        return Err(UiError::at(base, AdminError::bad_request(why)));
    }
    if filter.event_type.as_ref().is_some_and(|t| t.contains('\0')) {
        return Err(UiError::at(
            base,
            AdminError::bad_request("a type contains no NUL"),
        ));
    }
    let mut fields = vec![
        ("type", given(&f.event_type).unwrap_or_default().to_owned()),
        ("from", given(&f.from).unwrap_or_default().to_owned()),
        ("before", given(&f.before).unwrap_or_default().to_owned()),
        (
            "dead",
            if f.dead_only() {
                "yes".into()
            } else {
                String::new()
            },
        ),
    ];
    if let Some(name) = &filter.processor {
        fields.push(("processor", name.clone()));
    }
    if !f.confirmed() {
        let (dead, dead_cut) = count(&inbox, Rows::Dead, &filter)
            .await
            .map_err(store(&base))?;
        let what = if f.dead_only() {
            html! { strong { (how_many(dead, dead_cut)) } " dead events match. They will be due now, with their attempts reset." }
        } else {
            let (failing, failing_cut) = count(&inbox, Rows::Failing, &filter)
                .await
                .map_err(store(&base))?;
            html! {
                strong { (how_many(dead, dead_cut)) } " dead and "
                strong { (how_many(failing, failing_cut)) } " failing events match; "
                "queued and " strong { "processed" } " events of this type or window are requeued too (processed ones run again: a replay), and are not counted here."
            }
        };
        let markup = pages::confirm(&base, "Requeue", what, "/requeue-matching", &fields, false);
        return Ok(page(StatusCode::OK, markup));
    }
    let mut which = if f.dead_only() {
        Requeue::dead()
    } else {
        Requeue::all()
    };
    if let Some(event_type) = &filter.event_type {
        which = which.with_type(event_type);
    }
    if let Some(from) = filter.from {
        which = which.received_since(from);
    }
    if let Some(before) = filter.before {
        which = which.received_before(before);
    }
    if let Some(name) = &filter.processor {
        which = which.with_processor(name);
    }
    let n = inbox.requeue(which).await.map_err(store(&base))?;
    let message = format!("Requeued {n} event{}.", if n == 1 { "" } else { "s" });
    let back = format!("{base}/events?state=dead");
    Ok(page(
        StatusCode::OK,
        pages::done(&base, "Requeued", &message, &back),
    ))
}

pub(super) async fn delete_dead(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<DeleteDeadForm>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let hours = f.hours().map_err(failed(&base))?;
    let older_than = Duration::from_secs(hours * 3600);
    let (filter, named) = f.rows();
    if !f.confirmed() {
        let Scanned { rows, cut, .. } =
            scan(&inbox, Rows::Dead, &filter, None, usize::MAX, COUNT_ROWS)
                .await
                .map_err(store(&base))?;
        let cutoff = SystemTime::now().checked_sub(older_than);
        let n = rows
            .iter()
            .filter(|row| match (row.dead_at, cutoff) {
                (Some(dead_at), Some(cutoff)) => dead_at <= cutoff,
                _ => false,
            })
            .count();
        let what = html! {
            strong { (how_many(n, cut)) } " dead events"
            @if let Some(source) = &filter.source { " of " code { (source) } }
            @if let Some(event_type) = &filter.event_type { " of type " code { (event_type) } }
            " went dead more than " (hours) " hours ago. "
            "Deleting them cannot be undone: they were acknowledged to the provider and never processed. Their ids are kept (for the dedupe retention), so a captured delivery of one posted again is not run."
        };
        let fields = [
            ("hours", hours.to_string()),
            ("source", filter.source.clone().unwrap_or_default()),
            ("type", filter.event_type.clone().unwrap_or_default()),
        ];
        let markup = pages::confirm(
            &base,
            "Delete dead events",
            what,
            "/delete-dead",
            &fields,
            true,
        );
        return Ok(page(StatusCode::OK, markup));
    }
    let n = inbox
        .delete_dead(older_than, &named)
        .await
        .map_err(store(&base))?;
    let message = format!("Deleted {n} dead event{}.", if n == 1 { "" } else { "s" });
    let back = format!("{base}/events?state=dead");
    Ok(page(
        StatusCode::OK,
        pages::done(&base, "Deleted", &message, &back),
    ))
}

pub(super) async fn pause(
    origin: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<PauseForm>, FormRejection>,
) -> Result<Response, UiError> {
    set_paused(origin, &inbox, base, f, true).await
}

pub(super) async fn resume(
    origin: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<PauseForm>, FormRejection>,
) -> Result<Response, UiError> {
    set_paused(origin, &inbox, base, f, false).await
}

async fn set_paused(
    _: SameOrigin,
    inbox: &Inbox,
    base: String,
    f: Result<Form<PauseForm>, FormRejection>,
    paused: bool,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let (source, event_type) = (given(&f.source), given(&f.event_type));
    if source.is_some_and(|s| s.contains('\0')) || event_type.is_some_and(|t| t.contains('\0')) {
        return Err(UiError::at(
            base,
            AdminError::bad_request("source and type contain no NUL"),
        ));
    }
    let only = match given(&f.processor) {
        Some(name) => Some(processor(inbox, name).map_err(failed(&base))?),
        None => None,
    };
    let changed = match (only, paused) {
        (None, true) => inbox.pause(source, event_type).await,
        (None, false) => inbox.resume(source, event_type).await,
        (Some(p), true) => inbox.pause_processor(p, source, event_type).await,
        (Some(p), false) => inbox.resume_processor(p, source, event_type).await,
    }
    .map_err(store(&base))?;
    let done = match (paused, changed) {
        (true, true) => "paused",
        (true, false) => "already-paused",
        (false, true) => "resumed",
        (false, false) => "not-paused",
    };
    let to = format!("{}?done={done}", pages::home(&base));
    Ok(Redirect::to(&to).into_response())
}

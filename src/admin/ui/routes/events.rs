//! The failing and dead lists, one event's page, and the search by id alone.

use super::overview::by_source;
use super::*;

pub(super) async fn list(
    State(inbox): State<Inbox>,
    Base(base): Base,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, UiError> {
    let q = query(&base, q)?;
    let rows = q.rows().map_err(failed(&base))?;
    let filter = q.filter().map_err(failed(&base))?;
    if let Some(name) = &filter.processor {
        processor(&inbox, name).map_err(failed(&base))?;
    }
    let after = q.cursor().map_err(failed(&base))?;
    let scanned = scan(&inbox, rows, &filter, after, PAGE_ROWS, PAGE_BUDGET)
        .await
        .map_err(store(&base))?;
    let text = |field: &Option<String>| given(field).unwrap_or_default().to_owned();
    let (source, event_type, from, before, processor) = (
        text(&q.source),
        text(&q.event_type),
        text(&q.from),
        text(&q.before),
        text(&q.processor),
    );
    let typed = Typed {
        source: &source,
        event_type: &event_type,
        from: &from,
        before: &before,
        processor: &processor,
    };
    let processors = fanned_out(&inbox).unwrap_or_default();
    Ok(page(
        StatusCode::OK,
        pages::list(&base, rows, &typed, &processors, &scanned),
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct EventPage {
    #[serde(flatten)]
    event: EventQuery,
    #[serde(flatten)]
    done: Done,
}

pub(super) async fn event(
    State(inbox): State<Inbox>,
    Base(base): Base,
    q: Result<Query<EventPage>, QueryRejection>,
) -> Result<Response, UiError> {
    let EventPage { event: q, done } = query(&base, q)?;
    let Some(id) = given(&q.id) else {
        return Err(UiError::at(
            base,
            AdminError::bad_request("give an event id to find"),
        ));
    };
    let Some(source) = given(&q.source) else {
        return search(&inbox, &base, id).await;
    };
    match inbox.event(source, id).await.map_err(store(&base))? {
        Some(event) => {
            let view = View::of(given(&q.view));
            let shown = body::shown(&event.body, view);
            // One route of `default` is the page before fan-out; anything else shows
            // each route (an orphaned one too, on an inbox back to one processor).
            let routed = fanned_out(&inbox).is_some()
                || event
                    .routes
                    .iter()
                    .any(|r| r.orphaned || r.processor != DEFAULT_PROCESSOR);
            let markup = pages::event(&base, &event, routed, view, shown, done.flash());
            Ok(page(StatusCode::OK, markup))
        }
        None => Err(UiError::at(
            base,
            AdminError::not_found("no such event in the inbox"),
        )),
    }
}

/// An id without its source: tried in every source the page knows (those with failing,
/// dead or paused events); one found opens it, several are listed.
async fn search(inbox: &Inbox, base: &str, id: &str) -> Result<Response, UiError> {
    let (sources, _) = by_source(inbox).await.map_err(store(base))?;
    let mut sources: Vec<String> = sources.into_keys().collect();
    for pause in inbox.pauses().await.map_err(store(base))? {
        sources.extend(pause.source);
    }
    sources.sort();
    sources.dedup();
    let mut keys = Vec::new();
    for source in sources.into_iter().take(SEARCH_SOURCES) {
        if inbox
            .event(&source, id)
            .await
            .map_err(store(base))?
            .is_some()
        {
            keys.push((source, id.to_owned()));
        }
    }
    match keys.as_slice() {
        [(source, id)] => Ok(Redirect::to(&event_href(base, source, id)).into_response()),
        [] => Ok(page(StatusCode::NOT_FOUND, pages::found(base, id, &keys))),
        _ => Ok(page(StatusCode::OK, pages::found(base, id, &keys))),
    }
}

/// `/invalid`: the first page of the invalid events, by source and id.
pub(super) async fn invalid(
    State(inbox): State<Inbox>,
    Base(base): Base,
) -> Result<Response, UiError> {
    let mut events = (inbox.list_invalid(None, PAGE_ROWS + 1).await).map_err(store(&base))?;
    let more = events.len() > PAGE_ROWS;
    events.truncate(PAGE_ROWS);
    Ok(page(StatusCode::OK, pages::invalid(&base, &events, more)))
}

//! The pages and the forms' actions: each a few inbox calls, then a page (or, after an
//! action, a redirect to the page that shows its effect).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::{html, Markup};
use serde::Deserialize;

use super::body::{self, View};
use super::guard::{secure_headers, Base, SameOrigin};
use super::input::{
    given, DeleteDeadForm, EventQuery, Filter, ListQuery, OneEvent, PauseForm, RequeueForm, Rows,
};
use super::pages::{self, event_href, Overview, Typed};
use super::scan::{scan, Scanned};
use crate::admin::AdminError;
use crate::inbox::{Inbox, Requeue};
use crate::store::StoreError;

/// How many rows of each listing the overview reads to count by source (and the search
/// by id alone reads for the sources it tries).
const BY_SOURCE_ROWS: usize = 1000;

/// How many rows a count before a bulk action reads at most (beyond: "at least").
const COUNT_ROWS: usize = 10_000;

/// Rows a list page shows.
const PAGE_ROWS: usize = 50;

/// How many rows a filtered list page reads at most to fill itself.
const PAGE_BUDGET: usize = 5000;

/// How many sources a search by id alone tries.
const SEARCH_SOURCES: usize = 50;

pub(in crate::admin) fn router(inbox: Inbox) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/events", get(list))
        .route("/event", get(event))
        .route("/requeue", post(requeue_one))
        .route("/requeue-matching", post(requeue_matching))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route("/delete-dead", post(delete_dead))
        .route("/style.css", get(style))
        .route("/ui.js", get(script))
        .fallback(|Base(base): Base| async move {
            UiError::at(base, AdminError::not_found("no such page"))
        })
        .method_not_allowed_fallback(|Base(base): Base| async move {
            UiError::at(base, AdminError::method_not_allowed())
        })
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(inbox)
}

/// A failure, answered as a page with the error's status; the [`AdminError`] rides in
/// the response's extensions, as the JSON router's does.
pub(super) struct UiError {
    base: String,
    error: AdminError,
}

impl UiError {
    pub(super) fn at(base: String, error: AdminError) -> Self {
        Self { base, error }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let status = self.error.status();
        let markup = pages::error(&self.base, status.as_u16(), &self.error.to_string());
        let mut response = page(status, markup);
        response.extensions_mut().insert(self.error);
        response
    }
}

/// `error` as a [`UiError`] of the page at `base`.
fn failed(base: &str) -> impl Fn(AdminError) -> UiError + '_ {
    move |error| UiError::at(base.to_owned(), error)
}

/// A store error as a [`UiError`] of the page at `base`.
fn store(base: &str) -> impl Fn(StoreError) -> UiError + '_ {
    move |error| UiError::at(base.to_owned(), AdminError::store(error))
}

fn page(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

fn query<T>(base: &str, query: Result<Query<T>, QueryRejection>) -> Result<T, UiError> {
    query.map(|Query(q)| q).map_err(|_| {
        UiError::at(
            base.to_owned(),
            AdminError::bad_request("the query string does not parse"),
        )
    })
}

fn form<T>(base: &str, form: Result<Form<T>, FormRejection>) -> Result<T, UiError> {
    form.map(|Form(f)| f).map_err(|_| {
        UiError::at(
            base.to_owned(),
            AdminError::bad_request("the form does not parse"),
        )
    })
}

/// `?done=…`: what the action before the redirect did, one of a fixed few (the page never
/// prints text it was sent).
#[derive(Debug, Deserialize)]
struct Done {
    done: Option<String>,
}

impl Done {
    fn flash(&self) -> Option<Markup> {
        let (message, bad) = match given(&self.done)? {
            "paused" => ("Paused: workers start no matching event until it is resumed.", false),
            "already-paused" => ("That was paused already.", false),
            "resumed" => ("Resumed: its events start again.", false),
            "not-paused" => ("That was not paused (a pause of the whole source, or of the type in every source, still holds).", true),
            "requeued" => ("Requeued: due now, with its attempts reset.", false),
            "not-requeued" => ("Not requeued: a worker is processing it now, or it is gone.", true),
            _ => return None,
        };
        Some(pages::flash(message, bad))
    }
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/style.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/ui.js"),
    )
}

/// The processed events of each of the last minutes, oldest first; `None` where the
/// inbox does not count them.
///
/// SEAM(processed_per_minute): once `Inbox::processed_per_minute` lands, this is
/// `inbox.processed_per_minute(30).await.map(Some)` (adapted to its return type).
#[allow(clippy::unused_async)] // the seam's body will await
async fn processing_rate(_inbox: &Inbox) -> Result<Option<Vec<u64>>, StoreError> {
    Ok(None)
}

/// Failing and dead rows by source (`source → (failing, dead)`), from the first rows of
/// each listing; and whether a listing had more.
async fn by_source(inbox: &Inbox) -> Result<(BTreeMap<String, (usize, usize)>, bool), StoreError> {
    let everything = Filter::default();
    let mut sources = BTreeMap::<String, (usize, usize)>::new();
    let mut cut = false;
    for rows in [Rows::Failing, Rows::Dead] {
        let scanned = scan(
            inbox,
            rows,
            &everything,
            None,
            BY_SOURCE_ROWS,
            BY_SOURCE_ROWS,
        )
        .await?;
        cut |= scanned.next.is_some();
        for row in scanned.rows {
            let counts = sources.entry(row.source).or_default();
            match rows {
                Rows::Failing => counts.0 += 1,
                Rows::Dead => counts.1 += 1,
            }
        }
    }
    Ok((sources, cut))
}

async fn overview(
    State(inbox): State<Inbox>,
    Base(base): Base,
    done: Result<Query<Done>, QueryRejection>,
) -> Result<Response, UiError> {
    let done = query(&base, done)?;
    let counts = inbox.counts().await.map_err(store(&base))?;
    let pauses = inbox.pauses().await.map_err(store(&base))?;
    let (sources, cut) = by_source(&inbox).await.map_err(store(&base))?;
    let rate = processing_rate(&inbox).await.map_err(store(&base))?;
    let by_source: Vec<_> = sources.into_iter().map(|(s, (f, d))| (s, f, d)).collect();
    let overview = Overview {
        counts: &counts,
        by_source: &by_source,
        by_source_cut: cut,
        pauses: &pauses,
        rate: rate.as_deref(),
    };
    Ok(page(
        StatusCode::OK,
        pages::overview(&base, &overview, done.flash()),
    ))
}

async fn list(
    State(inbox): State<Inbox>,
    Base(base): Base,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, UiError> {
    let q = query(&base, q)?;
    let rows = q.rows().map_err(failed(&base))?;
    let filter = q.filter().map_err(failed(&base))?;
    let after = q.cursor().map_err(failed(&base))?;
    let scanned = scan(&inbox, rows, &filter, after, PAGE_ROWS, PAGE_BUDGET)
        .await
        .map_err(store(&base))?;
    let text = |field: &Option<String>| given(field).unwrap_or_default().to_owned();
    let (source, event_type, from, before) = (
        text(&q.source),
        text(&q.event_type),
        text(&q.from),
        text(&q.before),
    );
    let typed = Typed {
        source: &source,
        event_type: &event_type,
        from: &from,
        before: &before,
    };
    Ok(page(
        StatusCode::OK,
        pages::list(&base, rows, &typed, &scanned),
    ))
}

#[derive(Debug, Deserialize)]
struct EventPage {
    #[serde(flatten)]
    event: EventQuery,
    #[serde(flatten)]
    done: Done,
}

async fn event(
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
            let markup = pages::event(&base, &event, view, shown, done.flash());
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

async fn requeue_one(
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
    let n = inbox
        .requeue(Requeue::id(source, id))
        .await
        .map_err(store(&base))?;
    let done = if n == 0 { "not-requeued" } else { "requeued" };
    let to = format!("{}&done={done}", event_href(&base, source, id));
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

async fn requeue_matching(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<RequeueForm>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let filter = Filter::of(&None, &f.event_type, &f.from, &f.before).map_err(failed(&base))?;
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
    let fields = [
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
    let n = inbox.requeue(which).await.map_err(store(&base))?;
    let message = format!("Requeued {n} event{}.", if n == 1 { "" } else { "s" });
    let back = format!("{base}/events?state=dead");
    Ok(page(
        StatusCode::OK,
        pages::done(&base, "Requeued", &message, &back),
    ))
}

async fn delete_dead(
    _: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<DeleteDeadForm>, FormRejection>,
) -> Result<Response, UiError> {
    let f = form(&base, f)?;
    let hours = f.hours().map_err(failed(&base))?;
    let older_than = Duration::from_secs(hours * 3600);
    if !f.confirmed() {
        let Scanned { rows, cut, .. } = scan(
            &inbox,
            Rows::Dead,
            &Filter::default(),
            None,
            usize::MAX,
            COUNT_ROWS,
        )
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
            strong { (how_many(n, cut)) } " dead events went dead more than " (hours) " hours ago. "
            "Deleting them cannot be undone: they were acknowledged to the provider and never processed."
        };
        let fields = [("hours", hours.to_string())];
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
    let n = inbox.prune_dead(older_than).await.map_err(store(&base))?;
    let message = format!("Deleted {n} dead event{}.", if n == 1 { "" } else { "s" });
    let back = format!("{base}/events?state=dead");
    Ok(page(
        StatusCode::OK,
        pages::done(&base, "Deleted", &message, &back),
    ))
}

async fn pause(
    origin: SameOrigin,
    State(inbox): State<Inbox>,
    Base(base): Base,
    f: Result<Form<PauseForm>, FormRejection>,
) -> Result<Response, UiError> {
    set_paused(origin, &inbox, base, f, true).await
}

async fn resume(
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
    let changed = match paused {
        true => inbox.pause(source, event_type).await,
        false => inbox.resume(source, event_type).await,
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

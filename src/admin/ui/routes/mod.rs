//! The pages: each a few inbox calls, then a page; the forms' actions in `actions.rs`.

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

mod actions; // the forms' POSTs: requeue, pause and resume, delete dead events
use actions::{delete_dead, pause, requeue_matching, requeue_one, resume};

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
        include_str!("../assets/style.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/ui.js"),
    )
}

/// How many minutes the overview's chart spans.
const RATE_MINUTES: u32 = 30;

/// The events processed in each of the last [`RATE_MINUTES`], oldest first.
async fn processing_rate(inbox: &Inbox) -> Result<Vec<u64>, StoreError> {
    let minutes = inbox.processed_per_minute(RATE_MINUTES).await?;
    Ok(minutes.into_iter().map(|(_, n)| n).collect())
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
        rate: &rate,
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

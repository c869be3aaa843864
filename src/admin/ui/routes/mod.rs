//! The pages: each a few inbox calls, then a page; the overview in `overview.rs`, the
//! lists and one event's page in `events.rs`, the forms' actions in `actions.rs`.

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
    given, DeleteDeadForm, EraseForm, EventQuery, Filter, ListQuery, OneEvent, PauseForm,
    RequeueForm, Rows,
};
use super::pages::{self, event_href, Overview, Typed};
use super::scan::{scan, Scanned};
use crate::admin::input::processor;
use crate::admin::AdminError;
use crate::inbox::{Counts, Inbox, Requeue, DEFAULT_PROCESSOR};
use crate::store::StoreError;

mod actions; // the forms' POSTs: requeue, pause and resume, delete dead events, erase a body
mod events; // the lists, one event, the search by id
mod overview; // counts, sources, the rate, pauses
use actions::{delete_dead, erase_body, pause, requeue_matching, requeue_one, resume};
use events::{event, invalid, list};
use overview::overview;

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
        .route("/invalid", get(invalid))
        .route("/requeue", post(requeue_one))
        .route("/requeue-matching", post(requeue_matching))
        .route("/erase-body", post(erase_body))
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

/// With fan-out (more than one processor), their names, in the inbox's order: the pages
/// then name each row's processor; with one, `None` and the pages as before fan-out.
fn fanned_out(inbox: &Inbox) -> Option<Vec<String>> {
    let names: Vec<String> = inbox.processors().map(|p| p.name().to_owned()).collect();
    (names.len() > 1).then_some(names)
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
            "requeued-route" => ("Requeued that processor's route: due now, with its attempts reset; the other processors' routes are left as they are.", false),
            "not-requeued" => ("Not requeued: a worker is processing it now, it is gone, or its body expired or was erased.", true),
            "erased" => ("Erased: its body, headers and error texts are deleted; routes that could still run are dead.", false),
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

//! What the endpoints accept, checked into the inbox's own types: a query string into a
//! [`Listing`], a JSON body into a [`Requeue`]. Anything else is a 400 with a fixed
//! message that never echoes the input.

use std::time::SystemTime;

use serde::Deserialize;

use super::AdminError;
use crate::inbox::{Cursor, Inbox, Listing, Requeue};

/// `GET /events?state=dead|failing&order=newest|oldest&limit=1..1000&after=<cursor>&processor=<name>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    state: Option<String>,
    order: Option<String>,
    limit: Option<String>,
    after: Option<String>,
    processor: Option<String>,
}

/// `name`, when it is one of `inbox`'s processors; else a 400.
pub(super) fn processor<'a>(inbox: &Inbox, name: &'a str) -> Result<&'a str, AdminError> {
    match inbox.processors().any(|p| p.name() == name) {
        true => Ok(name),
        false => Err(AdminError::bad_request("no such processor")),
    }
}

/// The invalid events' listing: a page size and the key after which it starts.
pub(super) struct InvalidListing {
    pub(super) limit: usize,
    pub(super) after: Option<(String, String)>,
}

impl ListQuery {
    /// `state=invalid` (with `limit` and `after` alone): the invalid events, by source and
    /// id; `None` for another state.
    pub(super) fn invalid(&self) -> Result<Option<InvalidListing>, AdminError> {
        if self.state.as_deref() != Some("invalid") {
            return Ok(None);
        }
        if self.order.is_some() || self.processor.is_some() {
            return Err(AdminError::bad_request(
                "state=invalid takes limit and after only",
            ));
        }
        let limit = match &self.limit {
            None => Listing::DEFAULT_LIMIT,
            Some(limit) => limit
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=Listing::MAX_LIMIT).contains(n))
                .ok_or(AdminError::bad_request("limit must be 1 to 1000"))?,
        };
        let after = match &self.after {
            None => None,
            Some(after) => Some(
                invalid_cursor(after)
                    .ok_or(AdminError::bad_request("after must be a next cursor"))?,
            ),
        };
        Ok(Some(InvalidListing { limit, after }))
    }

    pub(super) fn listing(self, inbox: &Inbox) -> Result<Listing, AdminError> {
        let mut listing = match self.state.as_deref() {
            Some("dead") => Listing::dead(),
            Some("failing") => Listing::failing(),
            _ => {
                return Err(AdminError::bad_request(
                    "state must be dead, failing or invalid",
                ))
            }
        };
        match self.order.as_deref() {
            None | Some("newest") => {}
            Some("oldest") => listing = listing.oldest_first(),
            Some(_) => return Err(AdminError::bad_request("order must be newest or oldest")),
        }
        if let Some(limit) = self.limit {
            let limit = limit
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=Listing::MAX_LIMIT).contains(n))
                .ok_or(AdminError::bad_request("limit must be 1 to 1000"))?;
            listing = listing.with_limit(limit);
        }
        if let Some(after) = self.after {
            let cursor: Cursor = after
                .parse()
                .map_err(|_| AdminError::bad_request("after must be a next cursor"))?;
            listing = listing.after(cursor);
        }
        if let Some(name) = &self.processor {
            listing = listing.with_processor(processor(inbox, name)?);
        }
        Ok(listing)
    }
}

/// `GET /processed?minutes=1..1440` (default 15).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProcessedQuery {
    minutes: Option<String>,
}

impl ProcessedQuery {
    /// How many minutes to count.
    pub(super) fn minutes(self) -> Result<u32, AdminError> {
        match self.minutes {
            None => Ok(15),
            Some(minutes) => minutes
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1440).contains(n))
                .ok_or(AdminError::bad_request("minutes must be 1 to 1440")),
        }
    }
}

/// `POST /requeue`: which rows, by the fields of [`Requeue`]. `source` and `id` name one
/// event; `dead` every dead row; `type` and the receipt window narrow either (or every
/// row, processed ones included: replay); `all` alone every row. An empty body names
/// nothing and is refused, so a replay of everything is never an accident. `processor`
/// narrows any of them to that processor's routes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RequeueBody {
    source: Option<String>,
    id: Option<String>,
    #[serde(default)]
    dead: bool,
    #[serde(rename = "type")]
    event_type: Option<String>,
    received_from: Option<String>,
    received_before: Option<String>,
    #[serde(default)]
    all: bool,
    processor: Option<String>,
    /// The invalid events, checked again against the inbox's schemas (alone).
    #[serde(default)]
    invalid: bool,
}

impl RequeueBody {
    /// `{"invalid": true}`: whether the body asks for the invalid events (then alone).
    pub(super) fn invalid(&self) -> Result<bool, AdminError> {
        let other = self.source.is_some()
            || self.id.is_some()
            || self.dead
            || self.all
            || self.event_type.is_some()
            || self.received_from.is_some()
            || self.received_before.is_some()
            || self.processor.is_some();
        match (self.invalid, other) {
            (true, true) => Err(AdminError::bad_request("invalid stands alone")),
            (invalid, _) => Ok(invalid),
        }
    }

    pub(super) fn requeue(self, inbox: &Inbox) -> Result<Requeue, AdminError> {
        let only = match &self.processor {
            Some(name) => Some(processor(inbox, name)?.to_owned()),
            None => None,
        };
        let texts = [&self.source, &self.id, &self.event_type];
        if texts
            .iter()
            .any(|t| t.as_ref().is_some_and(|t| t.contains('\0')))
        {
            return Err(AdminError::bad_request(
                "source, id and type contain no NUL",
            ));
        }
        let narrowed = self.event_type.is_some()
            || self.received_from.is_some()
            || self.received_before.is_some();
        let mut requeue = match (self.source, self.id) {
            (Some(source), Some(id)) if !self.dead && !self.all => Requeue::id(&source, &id),
            (Some(_), Some(_)) => {
                return Err(AdminError::bad_request(
                    "an id names one event: not with dead or all",
                ))
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(AdminError::bad_request(
                    "an id needs its source, and a source its id",
                ))
            }
            (None, None) if self.dead && self.all => {
                return Err(AdminError::bad_request("dead or all, not both"))
            }
            (None, None) if self.dead => Requeue::dead(),
            (None, None) if self.all && !narrowed => Requeue::all(),
            (None, None) if self.all => {
                return Err(AdminError::bad_request(
                    "all stands alone: narrow with type or a window instead",
                ))
            }
            (None, None) if narrowed => Requeue::all(),
            (None, None) => return Err(AdminError::bad_request(
                "name the rows: source and id, dead, type, received_from, received_before, or all",
            )),
        };
        if let Some(event_type) = self.event_type {
            requeue = requeue.with_type(&event_type);
        }
        let from = self.received_from.map(|t| time(&t)).transpose()?;
        let before = self.received_before.map(|t| time(&t)).transpose()?;
        if let (Some(from), Some(before)) = (from, before) {
            if from >= before {
                return Err(AdminError::bad_request(
                    "received_from must be before received_before",
                ));
            }
        }
        if let Some(from) = from {
            requeue = requeue.received_since(from);
        }
        if let Some(before) = before {
            requeue = requeue.received_before(before);
        }
        if let Some(name) = only {
            requeue = requeue.with_processor(&name);
        }
        Ok(requeue)
    }
}

/// An RFC 3339 time (`2026-12-01T09:30:00Z`).
pub(crate) fn time(text: &str) -> Result<SystemTime, AdminError> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| {
            AdminError::bad_request("received_from and received_before are RFC 3339 times")
        })
}

/// The `next` of a page of invalid events: its last event's source and id, base64url.
pub(super) fn invalid_next(source: &str, id: &str) -> String {
    use base64::Engine as _;
    let key = serde_json::to_vec(&[source, id]).expect("strings serialize");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

fn invalid_cursor(after: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(after)
        .ok()?;
    let [source, id]: [String; 2] = serde_json::from_slice(&key).ok()?;
    Some((source, id))
}

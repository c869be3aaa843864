//! Invalid events (issue 36): a body its type's JSON Schema refused, kept apart and never
//! processed. [`Inbox::with_schemas`] checks each event at accept; an invalid one is
//! stored (its key, body and headers: a redelivery stays a duplicate) with **no route**,
//! so no worker ever claims or retries it, and its errors in `webhook_invalid`. Its state
//! is [`State::Invalid`](super::State::Invalid).
//!
//! Why at accept, in the request: it is the one place every event passes once, after
//! verification and before any route exists, so with fan-out it is checked once, not once
//! per processor; the answer is still 2xx (the provider retrying cannot fix a body), and a
//! route never made is one no claim, retry, pause or alert has to know about.

use serde::{Deserialize, Serialize};

#[cfg(feature = "schemas")]
use super::Accepted;
use super::{Inbox, RevalidatedCounts, StoredEvent};
use crate::store::{StoreError, StoreFuture};

/// How many invalid events a requeue or listing reads at a time.
const PAGE: usize = 200;

/// One error of an invalid event's body: where (a JSON pointer, `""` for the whole body)
/// and what, never the value itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ValidationError {
    /// The JSON pointer (RFC 6901) into the body.
    pub path: String,
    /// What is wrong, without the value.
    pub message: String,
}

/// What the inbox needs of its database for invalid events; both dialects.
pub(crate) trait Invalids: Send + Sync {
    /// Marks `(source, id)` invalid with `errors` (JSON); whether this made the mark.
    #[cfg_attr(not(feature = "schemas"), allow(dead_code))]
    fn mark(&self, source: String, id: String, errors: String) -> StoreFuture<bool>;
    /// Replaces a marked event's errors.
    #[cfg_attr(not(feature = "schemas"), allow(dead_code))]
    fn remark(&self, source: String, id: String, errors: String) -> StoreFuture<()>;
    /// Deletes the mark.
    fn unmark(&self, source: String, id: String) -> StoreFuture<()>;
    /// The marked event's errors (JSON), if it is marked.
    fn errors(&self, source: String, id: String) -> StoreFuture<Option<String>>;
    /// How many events are marked.
    fn count(&self) -> StoreFuture<u64>;
    /// Up to `limit` marked events after `after`, by (source, id).
    fn page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> StoreFuture<Vec<(String, String)>>;
}

impl Inbox {
    /// The inbox checking each accepted event's body against its type's schema
    /// ([`Schemas`](crate::schemas::Schemas)), once, before any route is made: an event
    /// that fails is still answered 2xx (a redelivery cannot fix it) and stored, with no
    /// route — never given to a processor, never retried — in the state
    /// [`invalid`](super::State::Invalid) with its errors
    /// ([`StoredEvent::validation_errors`]). Types without a schema go on as before,
    /// unless the schemas are [strict](crate::schemas::Schemas::strict).
    /// [`requeue_invalid`](Self::requeue_invalid) checks them again. An invalid event is
    /// kept until the inbox's `prune` deletes it past the retention, as it deletes an
    /// event with no route left to run (its mark goes with it).
    #[cfg(feature = "schemas")]
    #[must_use]
    pub fn with_schemas(mut self, schemas: crate::schemas::Schemas) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// Raises [`AlertKind::Invalid`](crate::alerts::AlertKind::Invalid) through `alerts`
    /// for each new invalid event (a duplicate of one raises nothing): a provider's
    /// payload changed shape, or a schema is out of date.
    #[cfg(all(feature = "schemas", feature = "alerts"))]
    #[must_use]
    pub fn with_alerts(mut self, alerts: crate::alerts::Alerts) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// The event's errors, when the inbox's schemas refuse it.
    #[cfg(feature = "schemas")]
    pub(super) fn refused_by_schema(
        &self,
        event: &crate::Event,
    ) -> Option<crate::schemas::Invalid> {
        let schemas = self.schemas.as_ref()?;
        schemas.validate(event).err()
    }

    /// Stores an event its schema refused: marked first, then stored with no route, so
    /// no moment shows it routable. A duplicate of an event already stored keeps its
    /// state (the mark just made is taken back).
    #[cfg(feature = "schemas")]
    pub(super) async fn accept_invalid(
        &self,
        d: crate::store::Delivery,
        event: &crate::Event,
        invalid: crate::schemas::Invalid,
    ) -> Result<Accepted, StoreError> {
        let (source, id) = (d.source().to_owned(), d.id().to_owned());
        let invalids = self.backend.invalids();
        let marked = invalids
            .mark(source.clone(), id.clone(), invalid.to_json())
            .await?;
        let accepted = self.backend.accept(d.with_routes(Vec::new())).await?;
        match accepted {
            Accepted::New => {
                crate::metrics::invalid_accepted(&source);
                #[cfg(all(feature = "schemas", feature = "alerts"))]
                if let Some(alerts) = &self.alerts {
                    alerts.invalid(&source, &id, event.event_type(), &invalid.to_string());
                }
                #[cfg(not(feature = "alerts"))]
                let _ = event;
            }
            _ if marked => invalids.unmark(source, id).await?,
            _ => {}
        }
        Ok(accepted)
    }

    /// How many events are invalid.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn invalid_count(&self) -> Result<u64, StoreError> {
        self.backend.invalids().count().await
    }

    /// Up to `limit` invalid events after the one `after` names (by source, then id),
    /// each whole with its [`validation_errors`](StoredEvent::validation_errors).
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn list_invalid(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let after = after.map(|(s, i)| (s.to_owned(), i.to_owned()));
        let keys = self
            .backend
            .invalids()
            .page(after, limit.clamp(1, 1000))
            .await?;
        let mut events = Vec::with_capacity(keys.len());
        for (source, id) in keys {
            if let Some(event) = self.event(&source, &id).await? {
                events.push(event);
            }
        }
        Ok(events)
    }

    /// The errors stored with `(source, id)`, when it is invalid.
    pub(super) async fn validation_errors(
        &self,
        source: &str,
        id: &str,
    ) -> Result<Option<Vec<ValidationError>>, StoreError> {
        let errors = (self.backend.invalids())
            .errors(source.to_owned(), id.to_owned())
            .await?;
        Ok(errors.map(|e| serde_json::from_str(&e).unwrap_or_default()))
    }

    /// Checks every invalid event again against the schemas this inbox has now: each one
    /// that passes gets a route for every processor whose filter takes it, queued now
    /// (each runs once), and is invalid no more; the others stay invalid, their errors
    /// today's. An inbox without schemas finds every one valid.
    ///
    /// # Errors
    ///
    /// When the database fails (the events handled until then stay so: call it again).
    pub async fn requeue_invalid(&self) -> Result<RevalidatedCounts, StoreError> {
        self.register().await?;
        let invalids = self.backend.invalids();
        let (mut done, mut after) = (RevalidatedCounts::default(), None);
        loop {
            let keys = invalids.page(after.take(), PAGE).await?;
            let full = keys.len() >= PAGE;
            after = keys.last().cloned();
            for (source, id) in keys {
                let Some(stored) = self.backend.event(source.clone(), id.clone()).await? else {
                    continue;
                };
                if stored.body_state != super::BodyState::Stored {
                    done.still_invalid += 1; // nothing to check: it stays as it is
                    continue;
                }
                let event = crate::Event::stored(crate::event::Stored {
                    source: source.clone(),
                    id: id.clone(),
                    event_type: stored.summary.event_type.clone(),
                    object_id: stored.summary.object_id.clone(),
                    livemode: stored.livemode,
                    timestamp: None,
                    body: stored.body.clone(),
                });
                #[cfg(feature = "schemas")]
                if let Some(errors) = self.refused_by_schema(&event) {
                    invalids.remark(source, id, errors.to_json()).await?;
                    done.still_invalid += 1;
                    continue;
                }
                let registry = self.backend.registry();
                for name in self.processors.routes(&event) {
                    registry
                        .backfill_routes(name, vec![(source.clone(), id.clone())])
                        .await?;
                }
                invalids.unmark(source, id).await?;
                done.queued += 1;
                self.wake.notify_waiters();
            }
            if !full {
                return Ok(done);
            }
        }
    }
}

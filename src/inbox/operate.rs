//! What an operator does with the SQL inbox, beside accepting: count, list and look at
//! its rows, requeue them, prune (pauses: `pause.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Counts, Cursor, Inbox, Listing, Page, State, StoredEvent};
use crate::metrics::{self, Operation};
use crate::store::{Retention, StoreError};

/// Which rows [`Inbox::requeue`] puts back in the queue.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Requeue {
    pub(crate) id: Option<(String, String)>,
    pub(crate) dead_only: bool,
    pub(crate) event_type: Option<String>,
    /// Received at or after, in milliseconds since the epoch.
    pub(crate) received_from: Option<i64>,
    /// Received before, in milliseconds since the epoch.
    pub(crate) received_before: Option<i64>,
    /// Only this processor's routes.
    pub(crate) processor: Option<String>,
}

/// What [`Inbox::requeue_counted`] did: the routes queued again, and those it left out
/// because their event's body is gone by a recorded reason ([`BodyState::Expired`]
/// by the body retention, or [`BodyState::Erased`]): run again, they could only end dead
/// again ("the body expired before …"), so they stay as they are and are counted here,
/// for the operator to see why.
///
/// [`BodyState::Expired`]: super::BodyState::Expired
/// [`BodyState::Erased`]: super::BodyState::Erased
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requeued {
    /// The routes queued again.
    pub requeued: u64,
    /// The matching routes left out: their event has no body any more.
    pub without_body: u64,
}

/// The most minutes [`Inbox::processed_per_minute`] counts: a day.
const MAX_RATE_MINUTES: u32 = 1440;

/// Which dead rows [`Inbox::delete_dead`] deletes: every one, or a source's, a type's.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DeadRows {
    pub(crate) source: Option<String>,
    pub(crate) event_type: Option<String>,
}

impl DeadRows {
    /// Every dead row (narrow it with the methods below).
    #[must_use]
    pub fn all() -> Self {
        Self::default()
    }

    /// Narrows to one source.
    #[must_use]
    pub fn with_source(mut self, source: &str) -> Self {
        self.source = Some(source.to_owned());
        self
    }

    /// Narrows to one event type.
    #[must_use]
    pub fn with_type(mut self, event_type: &str) -> Self {
        self.event_type = Some(event_type.to_owned());
        self
    }
}

/// Milliseconds since the epoch (0 before it: no row is older).
fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Requeue {
    /// Every row, processed ones too (replay all; narrow it with the methods below). Each
    /// processor's route of an event is a row: without
    /// [`with_processor`](Self::with_processor), every processor's.
    #[must_use]
    pub fn all() -> Self {
        Self::default()
    }

    /// One event, whatever its state (processed ones too: replay): every processor's route
    /// of it, unless narrowed to one [`with_processor`](Self::with_processor).
    #[must_use]
    pub fn id(source: &str, id: &str) -> Self {
        Self {
            id: Some((source.to_owned(), id.to_owned())),
            ..Self::default()
        }
    }

    /// Every dead row.
    #[must_use]
    pub fn dead() -> Self {
        Self {
            dead_only: true,
            ..Self::default()
        }
    }

    /// Narrows to one event type.
    #[must_use]
    pub fn with_type(mut self, event_type: &str) -> Self {
        self.event_type = Some(event_type.to_owned());
        self
    }

    /// Narrows to the routes of the processor `name`: the other processors' routes of the
    /// same events are left as they are (not run again).
    #[must_use]
    pub fn with_processor(mut self, name: &str) -> Self {
        self.processor = Some(name.to_owned());
        self
    }

    /// Narrows to rows received in `from..before` (an outage's window, say).
    #[must_use]
    pub fn received_between(self, from: SystemTime, before: SystemTime) -> Self {
        self.received_since(from).received_before(before)
    }

    /// Narrows to rows received at or after `from`.
    #[must_use]
    pub fn received_since(mut self, from: SystemTime) -> Self {
        self.received_from = Some(epoch_ms(from));
        self
    }

    /// Narrows to rows received before `before`.
    #[must_use]
    pub fn received_before(mut self, before: SystemTime) -> Self {
        self.received_before = Some(epoch_ms(before));
        self
    }
}

impl Inbox {
    /// Puts matching rows back in the queue now, with their attempts reset; returns how
    /// many. Rows a worker is processing now are left to it (requeue them once it is done).
    /// Rows of events whose body is gone — expired by the
    /// [body retention](Self::with_body_retention), or erased — are left out (they could
    /// only end dead again); [`requeue_counted`](Self::requeue_counted) counts them.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn requeue(&self, which: Requeue) -> Result<u64, StoreError> {
        Ok(self.requeue_counted(which).await?.requeued)
    }

    /// [`requeue`](Self::requeue), answering also how many matching rows it left out
    /// because their event's body is gone ([`Requeued::without_body`]).
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn requeue_counted(&self, which: Requeue) -> Result<Requeued, StoreError> {
        let done = self.backend.requeue(&which).await?;
        self.wake.notify_waiters();
        Ok(done)
    }

    /// Deletes processed rows processed more than `older_than` ago, and the keys that
    /// [`delete_dead`](Self::delete_dead) left that long ago; returns how many.
    /// Rows of events whose scheme signs no time stay too ([kept](crate::store::Delivery::is_kept):
    /// only the row refuses a replay; [`DedupeStore::prune_once`](crate::store::DedupeStore::prune_once)
    /// with the source deletes them). Dead rows stay (they were acknowledged to the provider and never processed: only
    /// [`prune_dead`](Self::prune_dead) deletes them). The [`Retention`] is at least 4
    /// days unless asked for less: a redelivery after its row is gone is stored and
    /// processed again.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn prune(&self, older_than: Retention) -> Result<u64, StoreError> {
        self.backend.prune(older_than.get(), None).await
    }

    /// Deletes dead rows that went dead more than `older_than` ago; returns how many. Their
    /// events were acknowledged and never processed: requeue or export them first. Each
    /// keeps its key (its body, headers, error and attempts go): the same delivery posted
    /// again is a duplicate (204, not stored, not run) until [`prune`](Self::prune) past
    /// the retention removes the key — a kept event's (no signed time) only
    /// [`prune_once`](crate::store::DedupeStore::prune_once) by name, as a processed one's.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn prune_dead(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.delete_dead(older_than, &DeadRows::all()).await
    }

    /// Deletes the dead rows `rows` names (a source, a type) that went dead more than
    /// `older_than` ago; returns how many. As [`prune_dead`](Self::prune_dead): requeue
    /// or export them first; their keys stay, so their deliveries are not run again.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn delete_dead(
        &self,
        older_than: Duration,
        rows: &DeadRows,
    ) -> Result<u64, StoreError> {
        self.backend.prune(older_than, Some(rows)).await
    }

    /// How many rows are in each state: with [processors](Inbox::with_processors), the
    /// sum of their routes' counts (`oldest_due` the longest wait of any). With the
    /// `metrics` feature, this also sets the inbox's gauges (depth, dead rows, lag: see
    /// [`crate::metrics`]); a running [`Worker`](super::Worker) calls it every poll
    /// interval for them.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn counts(&self) -> Result<Counts, StoreError> {
        let by = self.configured_counts().await?;
        let mut counts = by.into_values().fold(Counts::default(), Counts::plus);
        counts.invalid = self.invalid_count().await?;
        Ok(counts)
    }

    /// [`counts`](Self::counts) of each processor's routes, by name: each configured one,
    /// and each orphaned one (a processor this inbox is not configured with) that has
    /// routes — not in [`counts`](Self::counts)' sum; see
    /// [`drop_processor`](Self::drop_processor). With the `metrics` feature, this sets
    /// each configured processor's gauges (`processor` label).
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn counts_by_processor(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Counts>, StoreError> {
        let mut by = self.configured_counts().await?;
        for name in self.backend.registry().route_processors().await? {
            if by.contains_key(&name) {
                continue;
            }
            let read = self.backend.counts(Arc::from(name.as_str()));
            let counts = metrics::timed(Operation::InboxCounts, read).await?;
            if counts != Counts::default() {
                by.insert(name, counts);
            }
        }
        Ok(by)
    }

    /// The configured processors' counts, by name, their gauges set.
    async fn configured_counts(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Counts>, StoreError> {
        let mut by = std::collections::BTreeMap::new();
        for spec in self.processors.iter() {
            let read = self.backend.counts(Arc::from(spec.name()));
            let counts = metrics::timed(Operation::InboxCounts, read).await?;
            counts.set_gauges(spec.metrics());
            by.insert(spec.name().to_owned(), counts);
        }
        Ok(by)
    }

    /// One page of the dead or failing rows, with their last error (not their bodies:
    /// [`event`](Self::event)). A page costs its own size, read from the partial index of
    /// its rows, however long the queue or the history.
    ///
    /// ```no_run
    /// use tower_webhook::inbox::{Inbox, Listing};
    ///
    /// # async fn dead_rows(inbox: &Inbox) -> Result<(), tower_webhook::store::StoreError> {
    /// let mut listing = Listing::dead().with_limit(100);
    /// loop {
    ///     let page = inbox.list(&listing).await?;
    ///     for row in &page.events {
    ///         println!("{} {} {:?}", row.source, row.id, row.last_error);
    ///     }
    ///     let Some(next) = page.next else { break };
    ///     listing = listing.after(next);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn list(&self, listing: &Listing) -> Result<Page, StoreError> {
        let mut events = self.backend.list(listing).await?;
        let next = (events.len() > listing.limit).then(|| {
            events.truncate(listing.limit);
            let last = events.last().expect("a limit is at least 1");
            Cursor::of(last, listing.rows)
        });
        Ok(Page { events, next })
    }

    /// How many events were processed in each of the last `minutes` minutes, the oldest
    /// first: each minute by its start (whole minutes of the database's clock; the last
    /// is the current minute, still counting), 0 for a minute without any. For an
    /// operator's chart of the rate: read from the processed rows' index, it costs the
    /// rows processed in that window (ask for minutes, not days). At most 1 440 minutes
    /// (a day); 0 gives none. Rows pruned since are not counted.
    ///
    /// ```no_run
    /// # async fn chart(inbox: &tower_webhook::inbox::Inbox) -> Result<(), tower_webhook::store::StoreError> {
    /// for (minute, processed) in inbox.processed_per_minute(15).await? {
    ///     println!("{minute:?}: {processed}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn processed_per_minute(
        &self,
        minutes: u32,
    ) -> Result<Vec<(SystemTime, u64)>, StoreError> {
        let minutes = minutes.min(MAX_RATE_MINUTES);
        if minutes == 0 {
            return Ok(Vec::new());
        }
        let (current, counted) = self.backend.processed_per_minute(minutes).await?;
        Ok(crate::sql::per_minute(current, minutes, counted))
    }

    /// The inbox's event `(source, id)` with its body, whatever its state; `None` when the
    /// inbox has no such event (pruned, never received, a `DedupeLayer` key, or every route
    /// of it dead and deleted). With it, the request headers it was accepted with
    /// (credentials left out), each processor's route with its state (a processor this
    /// inbox lacks marked [`orphaned`](super::RouteState::orphaned)), and its attempts,
    /// each with its processor, outcome, error and duration: see [`StoredEvent`]. An event
    /// no processor took answers with no route, in [`State::Unrouted`](super::State).
    ///
    /// # Security
    ///
    /// The body is the provider's payload: customer data.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn event(&self, source: &str, id: &str) -> Result<Option<StoredEvent>, StoreError> {
        if source.contains('\0') || id.contains('\0') {
            return Ok(None); // no row has such a key, and databases refuse the text
        }
        let mut event = self.backend.event(source.to_owned(), id.to_owned()).await?;
        for route in event.iter_mut().flat_map(|e| e.routes.iter_mut()) {
            route.orphaned = self.processors.get(&route.processor).is_none();
        }
        if let Some(event) = event.as_mut().filter(|e| e.routes.is_empty()) {
            if let Some(errors) = self.validation_errors(source, id).await? {
                event.summary.state = State::Invalid;
                event.validation_errors = errors;
            }
        }
        Ok(event)
    }
}

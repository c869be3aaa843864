//! Fan-out's operations on the processors themselves (issue 33, docs/design/fan-out.md §3
//! and §4): the registry of the processors an inbox was configured with
//! (`webhook_processors`), a backfill that gives a processor added later the events it
//! missed, and the removal of a processor no longer configured (orphaned) with its routes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Inbox;
use crate::store::{StoreError, StoreErrorKind, StoreFuture};
use crate::Event;

/// How many events a backfill reads at a time.
const PAGE: usize = 500;

/// Which events [`Inbox::backfill`] looks at: by the time the inbox received them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backfill {
    /// Received at or after, in milliseconds since the epoch.
    pub(crate) received_from: Option<i64>,
    /// Received before, in milliseconds since the epoch.
    pub(crate) received_before: Option<i64>,
}

/// Milliseconds since the epoch (0 before it: no event is older).
fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Backfill {
    /// Every event the inbox holds.
    #[must_use]
    pub fn all() -> Self {
        Self::default()
    }

    /// The events received in `from..before`.
    #[must_use]
    pub fn received_between(from: SystemTime, before: SystemTime) -> Self {
        Self {
            received_from: Some(epoch_ms(from)),
            received_before: Some(epoch_ms(before)),
        }
    }

    /// The events received at or after `from`.
    #[must_use]
    pub fn received_since(from: SystemTime) -> Self {
        Self {
            received_from: Some(epoch_ms(from)),
            received_before: None,
        }
    }

    /// The events received before `before`.
    #[must_use]
    pub fn received_before(before: SystemTime) -> Self {
        Self {
            received_from: None,
            received_before: Some(epoch_ms(before)),
        }
    }
}

/// A processor as an inbox registered it (`webhook_processors`): what a tool without the
/// application's configuration knows of its filter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisteredProcessor {
    /// Its name.
    pub name: String,
    /// Its type globs; `None` when it takes every type.
    pub types: Option<Vec<String>>,
    /// Whether a predicate in the application filters its events too (only the
    /// application can evaluate it).
    pub has_predicate: bool,
    /// When an inbox first registered it.
    pub registered_at: SystemTime,
}

/// One processor as an inbox registers it: its name, its globs as a JSON array (`None`:
/// every type), whether it has a predicate.
pub(crate) type Registration = (String, Option<String>, bool);

/// Where a backfill's scan of the receipt-time index stands: the last event read (its
/// receipt time in the dialect's unit, its key).
#[derive(Debug, Clone)]
pub(crate) struct Position {
    pub(crate) at: i64,
    pub(crate) source: String,
    pub(crate) id: String,
}

/// An inbox event without a route of the processor being backfilled.
pub(crate) struct Candidate {
    pub(crate) position: Position,
    pub(crate) event: Event,
}

/// What fan-out's processor operations need of the database (beside [`super::backend::Backend`]).
pub(crate) trait Registry: Send + Sync {
    /// Inserts or updates these processors' rows (their `registered_at` kept).
    fn register(&self, processors: Vec<Registration>) -> StoreFuture<()>;
    /// Every registered processor, by name.
    fn registered(&self) -> StoreFuture<Vec<RegisteredProcessor>>;
    /// Up to `limit` inbox events with a body, received in `window`, after `after` in
    /// (receipt time, source, id) order, that have no route of `processor`.
    fn backfill_page(
        &self,
        processor: Arc<str>,
        window: Backfill,
        after: Option<Position>,
        limit: usize,
    ) -> StoreFuture<Vec<Candidate>>;
    /// A route of `processor` for each of these events that has none, queued now, with
    /// the event's own arrival and receipt time (its order among its object's events);
    /// how many it made. Wakes the workers of every process.
    fn backfill_routes(&self, processor: Arc<str>, keys: Vec<(String, String)>)
        -> StoreFuture<u64>;
    /// The names of the processors that may have routes: every one registered, and every
    /// one a route was ever made for (a superset: its counts say).
    fn route_processors(&self) -> StoreFuture<Vec<String>>;
    /// Deletes `name`'s routes (their history with them), counts, pauses and registry row
    /// in one transaction; how many routes.
    fn drop_processor(&self, name: String) -> StoreFuture<u64>;
}

/// `InvalidInput`, for a processor an inbox cannot act on.
fn refused(context: &'static str, name: &str) -> StoreError {
    StoreError::new(context, format!("{name:?}")).with_kind(StoreErrorKind::InvalidInput)
}

impl Inbox {
    /// Records this inbox's processors in `webhook_processors`, once per `Inbox` (its
    /// first accept, or its first worker's start): later calls cost an atomic read.
    pub(crate) async fn register(&self) -> Result<(), StoreError> {
        let registering = || {
            let rows = self.processors.iter().map(|spec| {
                let types = (!spec.types().is_empty())
                    .then(|| serde_json::to_string(spec.types()).expect("strings serialize"));
                (spec.name().to_owned(), types, spec.has_predicate())
            });
            self.backend.registry().register(rows.collect())
        };
        self.registered.get_or_try_init(registering).await?;
        Ok(())
    }

    /// The processors registered in the database by any inbox on it (each inbox registers
    /// its set with its first accept or worker), with their filters as configured then:
    /// what the command line's backfill reads.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn registered_processors(&self) -> Result<Vec<RegisteredProcessor>, StoreError> {
        self.backend.registry().registered().await
    }

    /// Gives the processor `processor` the events it has no route of, received in
    /// `window`, that its filter takes (type globs and predicate, evaluated here on each
    /// stored event): a route each, queued now, with the event's own arrival order (its
    /// place among its object's events under a per-object cap). Returns how many routes it
    /// made; a second call over the same window makes none. For a processor added to the
    /// set after events it should have had were accepted (routes are made with the event,
    /// for the processors configured then). Events whose body is gone (every route of
    /// them dead and deleted) are left out. Workers wake for the new routes as they are
    /// made, a page of events at a time.
    ///
    /// ```no_run
    /// # async fn run(inbox: &tower_webhook::inbox::Inbox) -> Result<(), tower_webhook::store::StoreError> {
    /// use std::time::{Duration, SystemTime};
    /// use tower_webhook::inbox::Backfill;
    ///
    /// let day_ago = SystemTime::now() - Duration::from_secs(86_400);
    /// let created = inbox.backfill("billing", Backfill::received_since(day_ago)).await?;
    /// println!("{created} routes for billing");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor this inbox is not configured with
    /// (its filter is this inbox's); otherwise when the database fails (the routes made
    /// until then stay: call it again).
    pub async fn backfill(&self, processor: &str, window: Backfill) -> Result<u64, StoreError> {
        let Some(spec) = self.processors.get(processor) else {
            return Err(refused("inbox backfill: no such processor", processor));
        };
        let (registry, name) = (self.backend.registry(), Arc::<str>::from(spec.name()));
        let (mut after, mut created) = (None, 0);
        loop {
            let page = registry
                .backfill_page(name.clone(), window, after.take(), PAGE)
                .await?;
            let full = page.len() >= PAGE;
            after = page.last().map(|c| c.position.clone());
            let keys: Vec<(String, String)> = page
                .into_iter()
                .filter(|c| spec.matches(&c.event))
                .map(|c| (c.position.source, c.position.id))
                .collect();
            if !keys.is_empty() {
                let made = registry.backfill_routes(name.clone(), keys).await?;
                if made > 0 {
                    self.wake.notify_waiters();
                }
                created += made;
            }
            if !full {
                return Ok(created);
            }
        }
    }

    /// Deletes the routes of `name`, a processor this inbox is not configured with (an
    /// orphaned one: removed from the set, its routes left), with their attempt history,
    /// its counts, its pauses and its registry row, in one transaction; returns how many
    /// routes. Its events stay, each with its other processors' routes (one left with
    /// none is shown unrouted, and pruned as a finished one past the retention).
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor this inbox is configured with
    /// (its workers would find their routes gone); otherwise when the database fails.
    pub async fn drop_processor(&self, name: &str) -> Result<u64, StoreError> {
        if self.processors.get(name).is_some() {
            return Err(refused(
                "inbox drop processor: configured in this inbox (remove it from with_processors first)",
                name,
            ));
        }
        self.backend
            .registry()
            .drop_processor(name.to_owned())
            .await
    }
}

/// A registry row as both databases read it: `types` a JSON array (or NULL), the time in
/// milliseconds since the epoch.
pub(crate) fn registered(
    (name, types, has_predicate, registered_ms): (String, Option<String>, bool, i64),
) -> Result<RegisteredProcessor, StoreError> {
    // A row no inbox wrote may hold anything: refused, never read as "every type".
    let types = types
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| {
            StoreError::new("inbox registry: types are not a JSON array of globs", e)
                .with_kind(StoreErrorKind::Other)
        })?;
    Ok(RegisteredProcessor {
        name,
        types,
        has_predicate,
        registered_at: UNIX_EPOCH + Duration::from_millis(registered_ms.unsigned_abs()),
    })
}

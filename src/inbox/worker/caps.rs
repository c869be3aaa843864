//! Caps per key: at most `n` events of one source, of one event type, or (where the
//! queue's claim cannot cap them) of one object running at once in a worker, and at most
//! a [`Rate`] of one source's events started. Each key with events running has a fair
//! semaphore, dropped when the last is done, and each paced source its own pacing; the
//! keys at their cap or out of turns are what a claim skips.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::super::rate::Pacing;
use super::super::Rate;

use crate::metrics::{self, HeldBack};
use crate::Event;

/// Each key's running events: a fair semaphore per key with events waiting or running.
pub(crate) struct Turns<K> {
    cap: usize,
    keys: Mutex<HashMap<K, Arc<Semaphore>>>,
}

impl<K: Hash + Eq + Clone> Turns<K> {
    pub(crate) fn new(cap: u32) -> Self {
        Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            keys: Mutex::default(),
        }
    }

    fn semaphore(&self, key: &K) -> Arc<Semaphore> {
        let mut keys = self.keys.lock().expect("not poisoned");
        let cap = self.cap;
        keys.entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(cap)))
            .clone()
    }

    /// Waits for one of `key`'s turns, in the order asked.
    pub(crate) async fn turn(&self, key: &K) -> OwnedSemaphorePermit {
        let permit = self
            .semaphore(key)
            .acquire_owned()
            .await
            .expect("never closed");
        self.forget_idle();
        permit
    }

    /// Takes a place in `key`'s line now: the turn if one is free, else the place, whose
    /// turn comes in the order the places were taken, whichever task awaits it and when.
    fn line_up(&self, key: &K) -> Result<OwnedSemaphorePermit, InLine> {
        let mut line = Box::pin(self.semaphore(key).acquire_owned());
        // Polled once here, which queues it; the task that awaits it later is woken instead.
        match line.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(turn) => Ok(turn.expect("never closed")),
            Poll::Pending => Err(Box::pin(async move { line.await.expect("never closed") })),
        }
    }

    /// One of `key`'s turns if one is free now.
    fn try_turn(&self, key: &K) -> Option<OwnedSemaphorePermit> {
        let permit = self.semaphore(key).try_acquire_owned().ok();
        self.forget_idle();
        permit
    }

    /// The keys with no turn free.
    fn full(&self) -> Vec<K> {
        let keys = self.keys.lock().expect("not poisoned");
        let full = keys.iter().filter(|(_, s)| s.available_permits() == 0);
        full.map(|(key, _)| key.clone()).collect()
    }

    /// Drops the semaphores no event holds or waits for.
    fn forget_idle(&self) {
        // Only the map holds an idle one: each waiter and each permit holds a clone.
        let mut keys = self.keys.lock().expect("not poisoned");
        keys.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
    }
}

/// The sources and event types a claim skips: their caps are reached in this worker.
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))] // JetStream reads in order
pub(crate) struct Skip {
    pub(crate) sources: Vec<String>,
    /// `""`: events without a type.
    pub(crate) types: Vec<String>,
    /// Events wait in the worker for their turns: a claim that would wait for new events
    /// waits only briefly, so the processors it holds meanwhile soon serve them.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) waiting: bool,
    /// The events (source, stored id) this worker runs or records now: never claimed
    /// again by it, whatever their lease says.
    pub(crate) held: Vec<(String, String)>,
}

/// A worker's caps per source, per event type and per object, and its rate per source.
#[derive(Default)]
pub(crate) struct Caps {
    sources: Option<Turns<String>>,
    types: Option<Turns<String>>,
    /// Per source and object id; only where the queue's claim does not cap objects.
    objects: Option<Turns<(String, String)>>,
    paced: Option<Paced>,
}

/// A place in a key's line (its turn, once it comes).
type InLine = Pin<Box<dyn Future<Output = OwnedSemaphorePermit> + Send>>;

/// An event's place in its object's line, kept while it waits for its turns (none: its
/// object is not lined up here).
#[derive(Default)]
pub(crate) struct Place(Option<InLine>);

/// Each source's pacing under one rate.
struct Paced {
    rate: Rate,
    sources: Mutex<HashMap<String, Pacing>>,
}

/// Past this many sources paced, the idle ones are forgotten as others come.
const PACED_SOURCES: usize = 1024;

impl Paced {
    /// Takes one of `source`'s turns if one is due now.
    fn try_take(&self, source: &str) -> bool {
        let mut sources = self.sources.lock().expect("not poisoned");
        if sources.len() >= PACED_SOURCES && !sources.contains_key(source) {
            // A source whose turns are all due again is as good as new: forgotten.
            let now = Instant::now();
            sources.retain(|_, pacing| pacing.next() > now);
        }
        let pacing = sources
            .entry(source.to_owned())
            .or_insert_with(|| Pacing::new(self.rate));
        if pacing.allowed(1) == 0 {
            return false;
        }
        pacing.take(1);
        true
    }

    /// When `source` has a turn again.
    fn next(&self, source: &str) -> Instant {
        let sources = self.sources.lock().expect("not poisoned");
        sources.get(source).map_or_else(Instant::now, Pacing::next)
    }

    /// When the first source with no turn now has one again.
    fn next_turn(&self) -> Option<Instant> {
        let sources = self.sources.lock().expect("not poisoned");
        let out = sources.values().filter(|pacing| pacing.allowed(1) == 0);
        out.map(Pacing::next).min()
    }

    /// The sources with no turn now.
    fn out_of_turns(&self) -> Vec<String> {
        let sources = self.sources.lock().expect("not poisoned");
        let out = sources.iter().filter(|(_, pacing)| pacing.allowed(1) == 0);
        out.map(|(source, _)| source.clone()).collect()
    }
}

/// An event's turns under the caps, held until its processor ends.
pub(crate) type Turn = Vec<OwnedSemaphorePermit>;

impl Caps {
    pub(crate) fn new(
        (per_source, per_type, per_object): (Option<u32>, Option<u32>, Option<u32>),
        rate_per_source: Option<Rate>,
    ) -> Self {
        Self {
            sources: per_source.map(Turns::new),
            types: per_type.map(Turns::new),
            objects: per_object.map(Turns::new),
            paced: rate_per_source.map(|rate| Paced {
                rate,
                sources: Mutex::default(),
            }),
        }
    }

    pub(crate) fn any(&self) -> bool {
        self.sources.is_some()
            || self.types.is_some()
            || self.objects.is_some()
            || self.paced.is_some()
    }

    /// Whether objects are capped here (the queue's claim does not cap them).
    pub(crate) fn lines_up_objects(&self) -> bool {
        self.objects.is_some()
    }

    /// Whether `event`'s object has a cap here (an event whose retry keeps its turn).
    pub(crate) fn holds_object(&self, event: &Event) -> bool {
        self.objects.is_some() && event.object_id().is_some()
    }

    /// What a claim skips now.
    pub(crate) fn skip(&self) -> Skip {
        let mut sources = self.sources.as_ref().map(Turns::full).unwrap_or_default();
        if let Some(paced) = &self.paced {
            sources.extend(paced.out_of_turns());
        }
        Skip {
            sources,
            types: self.types.as_ref().map(Turns::full).unwrap_or_default(),
            waiting: false,
            held: Vec::new(),
        }
    }

    /// When a source out of turns under its rate has one again (`None`: none is).
    pub(crate) fn next_turn(&self) -> Option<Instant> {
        self.paced.as_ref().and_then(Paced::next_turn)
    }

    /// `event`'s turns if all are free now; otherwise its place in its object's line
    /// (taken now, so that an object's events run in the order they were claimed) and
    /// no other turn, the rule that held it back counted.
    pub(crate) fn try_turn(
        &self,
        event: &Event,
        metrics: &metrics::Processor,
    ) -> Result<Turn, Place> {
        let mut object = None;
        if let (Some(objects), Some(id)) = (&self.objects, event.object_id()) {
            match objects.line_up(&(event.source().to_owned(), id.to_owned())) {
                Ok(turn) => object = Some(turn),
                Err(line) => {
                    metrics::held_back(metrics, HeldBack::PerObject);
                    return Err(Place(Some(line)));
                }
            }
        }
        // The object's turn, taken, is kept for the wait: it was this event's in line.
        let wait = |object: Option<OwnedSemaphorePermit>| {
            Place(object.map(|turn| Box::pin(std::future::ready(turn)) as InLine))
        };
        let mut turn = Vec::new();
        if let Some(sources) = &self.sources {
            let Some(taken) = sources.try_turn(&event.source().to_owned()) else {
                metrics::held_back(metrics, HeldBack::PerSource);
                return Err(wait(object));
            };
            turn.push(taken);
        }
        if let Some(types) = &self.types {
            let Some(taken) = types.try_turn(&type_key(event)) else {
                metrics::held_back(metrics, HeldBack::PerType);
                return Err(wait(object));
            };
            turn.push(taken);
        }
        // Last: a turn of the rate taken is never given back.
        if let Some(paced) = &self.paced {
            if !paced.try_take(event.source()) {
                metrics::held_back(metrics, HeldBack::Rate);
                return Err(wait(object));
            }
        }
        turn.extend(object);
        Ok(turn)
    }

    /// Waits for `event`'s turns: its object's first (from its `place` in line), then its
    /// source's, then its type's (one order for every event: no two wait for each
    /// other's).
    pub(crate) async fn turn(&self, event: &Event, place: Place) -> Turn {
        let mut turn = Vec::new();
        if let Some(line) = place.0 {
            turn.push(line.await);
        }
        if let Some(sources) = &self.sources {
            turn.push(sources.turn(&event.source().to_owned()).await);
        }
        if let Some(types) = &self.types {
            turn.push(types.turn(&type_key(event)).await);
        }
        if let Some(paced) = &self.paced {
            while !paced.try_take(event.source()) {
                tokio::time::sleep_until(paced.next(event.source())).await;
            }
        }
        turn
    }
}

/// The type's key: `""` for an event without one.
fn type_key(event: &Event) -> String {
    event.event_type().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(source: &str, ty: &str) -> Event {
        Event::of_type(source, ty)
    }

    #[test]
    fn a_full_key_is_skipped_until_a_turn_is_given_back() {
        let caps = Caps::new((Some(2), Some(3), None), None);
        let counted = || metrics::Processor::new("test");
        let a = caps.try_turn(&event("a", "x"), &counted()).ok().unwrap();
        let b = caps.try_turn(&event("a", "y"), &counted()).ok().unwrap();
        assert!(
            caps.try_turn(&event("a", "z"), &counted()).is_err(),
            "a is at its cap"
        );
        assert_eq!(caps.skip().sources, ["a"]);
        let c = caps.try_turn(&event("b", "x"), &counted()).ok().unwrap();
        let d = caps.try_turn(&event("c", "x"), &counted()).ok().unwrap();
        assert!(caps.skip().types.contains(&"x".to_owned()));
        assert!(
            caps.try_turn(&event("d", "x"), &counted()).is_err(),
            "x is at its cap"
        );
        assert!(caps.skip().sources == ["a"], "a refused turn takes nothing");
        drop((a, b, c, d));
        let skip = caps.skip();
        assert!(skip.sources.is_empty() && skip.types.is_empty());
    }

    /// An object capped at 1: its events lined up as they were claimed get their turns
    /// in that order, though each awaits its turn in its own task, spawned in the reverse
    /// order; another object's event is not held back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_objects_events_get_their_turns_in_the_order_they_lined_up() {
        let caps = Arc::new(Caps::new((None, None, Some(1)), None));
        let counted = || metrics::Processor::new("test");
        let about = |object| Event::about("a", object);
        let running = caps.try_turn(&about("o_1"), &counted()).ok().unwrap();
        let places: Vec<Place> = (0..6)
            .map(|_| caps.try_turn(&about("o_1"), &counted()).err().unwrap())
            .collect();
        assert!(
            caps.try_turn(&about("o_2"), &counted()).is_ok(),
            "another object runs"
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = tokio::task::JoinSet::new();
        for (i, place) in places.into_iter().enumerate().rev() {
            let (caps, order) = (caps.clone(), order.clone());
            waiting.spawn(async move {
                let turn = caps.turn(&about("o_1"), place).await;
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
                drop(turn);
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            order.lock().unwrap().is_empty(),
            "none beside the running one"
        );
        drop(running);
        while waiting.join_next().await.is_some() {}
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    }
}

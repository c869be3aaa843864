//! Pause and resume on RabbitMQ: every pause and resume is a record appended (confirmed)
//! to the stream queue `<queue>-pauses`, which each [`Amqp`] replays from its start and
//! then tails, so a pause holds for every worker of the queue, in every process, and
//! survives restarts of both.
//!
//! Why a stream: it is RabbitMQ 3.10's only queue every consumer can read whole, in one
//! order, without taking messages from the others, and it is replicated and on disk as
//! a quorum queue is; the order makes concurrent pauses and resumes settle alike
//! everywhere. A stream does not say how long it is (its `message_count` is 0), so each
//! record is also counted by a message left in the quorum queue `<queue>-pauses-seq`
//! (one confirmed publish to the fanout exchange `<queue>-pauses`, bound to both: two
//! publishes could fail between them and leave the count short for good):
//! before a worker starts the deliveries it pulled, it reads that count (one passive
//! declare per claim) and waits until it has replayed as many records — a pause that
//! returned before a message was pulled holds it.
//!
//! A worker that pulls a paused event *parks* it: publishes it (confirmed) to the quorum
//! queue `<queue>-paused` (with fan-out, its processor's: `<queue>-<name>-paused`, moved
//! back into that processor's queue) with the attempts it has had, then acknowledges it. When a
//! pause ends, every worker's task moves the parked events no pause holds any more back
//! into the queue, in the order they were parked (each a confirmed publish, then its
//! acknowledgement: never lost; one moved twice, its acknowledgement lost, is claimed
//! once in the worker's store). The order holds for one worker moving them back; the
//! workers of several processes moving back at once may interleave theirs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use tokio::sync::watch;

use super::connection::{close, late};
use super::{Amqp, Inner};
use crate::inbox::Pause;
use crate::store::{StoreError, StoreErrorKind};

/// A rule: the processor, the source and the event type it pauses (`None`: any).
type Rule = (Option<String>, Option<String>, Option<String>);

/// How long a pause, a resume or a worker waits for the records to be replayed.
const CAUGHT_UP: Duration = Duration::from_secs(10);
/// How long the count's passive declare, the stream consumer's set-up and its
/// acknowledgements may wait for the broker (a record's publish waits the confirm
/// timeout, `publish::confirmed`).
const CONFIRM: Duration = Duration::from_secs(5);

/// The record's headers.
const OP: &str = "op";
const PROCESSOR: &str = "processor";
const SOURCE: &str = "source";
const TYPE: &str = "type";
const AT: &str = "at";
const NONCE: &str = "nonce";
const OFFSET: &str = "x-stream-offset";

impl Amqp {
    /// The pauses as replayed here (the worker's).
    pub(crate) fn pause_log(&self) -> &Log {
        &self.inner.pauses
    }

    /// The quorum queue paused events are parked in: `<queue>-paused` (`default`'s; with
    /// fan-out each processor parks in its own, [`paused_queue_of`](Self::paused_queue_of)).
    #[must_use]
    pub fn paused_queue(&self) -> &str {
        &self.inner.names.paused_queue
    }

    /// Pauses the events of `source` of type `event_type` (`None`: any source, any type;
    /// both `None`: every event): no worker of this queue, in any process, starts one
    /// pulled after this returned until it is [resumed](Self::resume). Accepts go on; a
    /// worker parks each paused event it pulls in `<queue>-paused` (see the
    /// [module docs](super)), and events already running finish. Returns `false` when it
    /// was paused already.
    ///
    /// # Errors
    ///
    /// When the broker cannot be reached, or does not confirm the record in time (the
    /// pause may then have been recorded: [`pauses`](Self::pauses) says).
    pub async fn pause(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.record("pause", None, source, event_type).await
    }

    /// Ends the pause of exactly that source and type (as [`pause`](Self::pause) took
    /// them); the workers then move the events it parked back into the queue, in the
    /// order they were parked (a pause of the whole source, or of the type in every
    /// source, still holds them). Returns `false` when there was no such pause.
    ///
    /// # Errors
    ///
    /// As [`pause`](Self::pause)'s.
    pub async fn resume(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.record("resume", None, source, event_type).await
    }

    /// Pauses the events of `source` of type `event_type` (`None`: any) for `processor`
    /// alone (with [fan-out](super::AmqpBuilder::with_processors)): its workers park them
    /// in its parked queue, the other processors run them. [`pause`](Self::pause) pauses
    /// for every processor. Returns `false` when it was paused already.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor not configured; otherwise as
    /// [`pause`](Self::pause)'s.
    pub async fn pause_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.record("pause", Some(processor), source, event_type)
            .await
    }

    /// Ends `processor`'s own pause of exactly that source and type (as
    /// [`pause_processor`](Self::pause_processor) took them); its workers then move the
    /// events it parked back into its queue. Returns `false` when there was no such pause.
    ///
    /// # Errors
    ///
    /// As [`pause_processor`](Self::pause_processor)'s.
    pub async fn resume_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.record("resume", Some(processor), source, event_type)
            .await
    }

    fn configured(&self, processor: &str) -> Result<(), StoreError> {
        match self.has_processor(processor) {
            true => Ok(()),
            false => Err(StoreError::new(
                "amqp pause",
                format!("no processor {processor:?} is configured"),
            )
            .with_kind(StoreErrorKind::InvalidInput)),
        }
    }

    /// What is paused now (as every pause and resume that returned left it), sorted by
    /// processor (every processor's first), source and type.
    ///
    /// # Errors
    ///
    /// When the broker cannot be reached, or the records are not replayed in time.
    pub async fn pauses(&self) -> Result<Vec<Pause>, StoreError> {
        let log = &self.inner.pauses;
        log.sync(self).await?;
        let state = log.shared.state.lock().expect("not poisoned");
        let pauses = state
            .rules
            .iter()
            .map(|((processor, source, event_type), at)| Pause {
                processor: processor.clone(),
                source: source.clone(),
                event_type: event_type.clone(),
                paused_at: *at,
            });
        Ok(pauses.collect())
    }

    /// Appends a record, counts it, and waits until this process replayed it: whether it
    /// changed what is paused, as of its place in the stream.
    async fn record(
        &self,
        op: &str,
        processor: Option<&str>,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        let log = &self.inner.pauses;
        log.start(self);
        let nonce = nonce();
        let mut headers = FieldTable::default();
        headers.insert(OP.into(), text(op));
        if let Some(processor) = processor {
            headers.insert(PROCESSOR.into(), text(processor));
        }
        if let Some(source) = source.filter(|s| !s.is_empty()) {
            headers.insert(SOURCE.into(), text(source));
        }
        if let Some(event_type) = event_type.filter(|t| !t.is_empty()) {
            headers.insert(TYPE.into(), text(event_type));
        }
        let at = UNIX_EPOCH.elapsed().unwrap_or_default().as_millis();
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        headers.insert(AT.into(), AMQPValue::LongLongInt(at));
        headers.insert(NONCE.into(), text(&nonce));
        log.shared
            .state
            .lock()
            .expect("not poisoned")
            .outcomes
            .insert(nonce.clone(), None);
        let recorded = async {
            let names = &self.inner.names;
            // One publish, routed to both: a record is never stored without its count.
            let to = (names.pauses_stream.as_str(), ""); // the exchange of that name
            let properties = BasicProperties::default().with_headers(headers);
            super::publish::confirmed(self, "amqp pause", to, &[], properties).await?;
            let mut applied = log.shared.outcome.subscribe();
            let outcome = || {
                let state = log.shared.state.lock().expect("not poisoned");
                state.outcomes.get(&nonce).copied().flatten()
            };
            let waited = tokio::time::timeout(CAUGHT_UP, async {
                loop {
                    if let Some(changed) = outcome() {
                        return changed;
                    }
                    let _ = applied.changed().await;
                }
            });
            waited.await.map_err(|_| late("amqp pause"))
        };
        let recorded = recorded.await;
        (log.shared.state.lock().expect("not poisoned").outcomes).remove(&nonce);
        recorded
    }
}

/// The pauses as one [`Amqp`] (and its clones) sees them: replayed from the stream by a
/// task started with the first pause, resume, listing or worker.
#[derive(Default)]
pub(crate) struct Log {
    shared: Arc<Shared>,
    /// A channel kept for the passive declares that read the records' count.
    counting: tokio::sync::Mutex<Option<lapin::Channel>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The records replayed: the next record's offset in the stream.
    applied: watch::Sender<u64>,
    /// Bumped each time a record was applied (a pause, resume or listing waits on it).
    outcome: watch::Sender<u64>,
    /// Bumped when a pause ended, or a parked event may be one no pause holds: the
    /// workers then move what is parked back.
    resumed: watch::Sender<u64>,
    /// Whether the replaying task runs.
    started: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    rules: BTreeMap<Rule, SystemTime>,
    /// The records awaited by a pause or resume of this process: whether each changed
    /// what is paused, once replayed.
    outcomes: std::collections::HashMap<String, Option<bool>>,
}

impl Log {
    /// Starts replaying the stream, once.
    fn start(&self, amqp: &Amqp) {
        if self.shared.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&amqp.inner);
        tokio::spawn(follow(weak, self.shared.clone()));
    }

    /// Waits until every record counted when this is called is replayed here.
    pub(crate) async fn sync(&self, amqp: &Amqp) -> Result<(), StoreError> {
        self.start(amqp);
        let counted = self.counted(amqp).await?;
        let mut applied = self.shared.applied.subscribe();
        let caught_up = async {
            applied
                .wait_for(|applied| *applied >= counted)
                .await
                .is_ok()
        };
        match tokio::time::timeout(CAUGHT_UP, caught_up).await {
            Ok(true) => Ok(()),
            _ => Err(late("amqp pauses")),
        }
    }

    /// How many records were appended (as far as their pauses and resumes returned).
    async fn counted(&self, amqp: &Amqp) -> Result<u64, StoreError> {
        let mut kept = self.counting.lock().await;
        let channel = match kept.as_ref() {
            Some(channel) if channel.status().connected() => channel.clone(),
            _ => {
                let channel = amqp.channel().await?;
                *kept = Some(channel.clone());
                channel
            }
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let seq = amqp.inner.names.pauses_seq.as_str();
        let declared = channel.queue_declare(seq.into(), passive, FieldTable::default());
        match tokio::time::timeout(CONFIRM, declared).await {
            Ok(Ok(declared)) => Ok(declared.message_count().into()),
            Ok(Err(e)) => {
                *kept = None;
                Err(StoreError::new("amqp pauses", e).with_kind(StoreErrorKind::Unavailable))
            }
            Err(_) => {
                *kept = None;
                Err(late("amqp pauses"))
            }
        }
    }

    /// Whether a pause holds back `processor`'s run of an event of `source` of type
    /// `event_type`, as far as replayed: a pause of every processor's, or of its own.
    pub(crate) fn covers(&self, processor: &str, source: &str, event_type: Option<&str>) -> bool {
        let state = self.shared.state.lock().expect("not poisoned");
        if state.rules.is_empty() {
            return false;
        }
        let source = Some(source.to_owned());
        let ty = event_type.map(str::to_owned);
        [None, Some(processor.to_owned())].into_iter().any(|p| {
            [
                (None, None),
                (source.clone(), None),
                (None, ty.clone()),
                (source.clone(), ty.clone()),
            ]
            .into_iter()
            .any(|(s, t)| state.rules.contains_key(&(p.clone(), s, t)))
        })
    }

    /// Told when a pause ended (or a parked event may be one no pause holds).
    pub(crate) fn resumed(&self) -> watch::Receiver<u64> {
        self.shared.resumed.subscribe()
    }

    /// A parked event may be one no pause holds (resumed while it was parked).
    pub(crate) fn poke(&self) {
        self.shared.resumed.send_modify(|n| *n += 1);
    }
}

/// Replays the stream from its start, then tails it, for as long as its [`Amqp`] lives;
/// consuming again from the next record after the connection came back.
async fn follow(inner: Weak<Inner>, shared: Arc<Shared>) {
    let mut again = Duration::from_millis(100);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        // Any processor's handle: the records are the queue's, every processor's.
        let lane = strong.lanes[0].clone();
        let amqp = Amqp {
            inner: strong,
            lane,
        };
        let next = *shared.applied.borrow();
        let opened = consume(&amqp, next).await;
        drop(amqp); // only the weak reference while tailing: the last clone's drop ends it
        match opened {
            Ok((channel, mut consumer)) => {
                again = Duration::from_millis(100);
                loop {
                    let next = tokio::time::timeout(Duration::from_secs(1), consumer.next());
                    match next.await {
                        Ok(Some(Ok(delivery))) => {
                            apply(&shared, &delivery);
                            let ack = delivery.acker.ack(BasicAckOptions::default());
                            let _ = tokio::time::timeout(CONFIRM, ack).await;
                        }
                        Ok(Some(Err(_)) | None) => break,
                        Err(_) => {
                            if inner.strong_count() == 0 {
                                let cancel = channel
                                    .basic_cancel(consumer.tag(), BasicCancelOptions::default());
                                let _ = tokio::time::timeout(CONFIRM, cancel).await;
                                close(&channel, "done").await;
                                return;
                            }
                            if !channel.status().connected() {
                                break;
                            }
                        }
                    }
                }
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::debug!(target: "tower_webhook", "amqp pauses are not replayed yet: {_error}");
            }
        }
        tokio::time::sleep(again).await;
        again = (again * 2).min(Duration::from_secs(1));
    }
}

/// A channel and a consumer on the stream from offset `next`.
async fn consume(amqp: &Amqp, next: u64) -> Result<(lapin::Channel, lapin::Consumer), StoreError> {
    let err = |e| StoreError::new("amqp pauses", e);
    let channel = amqp.channel().await?;
    // A stream's consumer must have a prefetch, and acknowledges to be sent more. Both
    // calls bounded: lapin may never answer on a connection that died under them.
    let qos = channel.basic_qos(256, BasicQosOptions::default());
    tokio::time::timeout(CONFIRM, qos)
        .await
        .map_err(|_| late("amqp pauses"))?
        .map_err(err)?;
    let mut args = FieldTable::default();
    let offset = i64::try_from(next).unwrap_or(i64::MAX);
    args.insert(OFFSET.into(), AMQPValue::LongLongInt(offset));
    let consume = channel.basic_consume(
        amqp.inner.names.pauses_stream.as_str().into(),
        "".into(),
        BasicConsumeOptions::default(),
        args,
    );
    let consumer = tokio::time::timeout(CONFIRM, consume)
        .await
        .map_err(|_| late("amqp pauses"))?
        .map_err(err)?;
    Ok((channel, consumer))
}

/// Applies a record to the pauses (a record replayed again after a reconnect is skipped).
fn apply(shared: &Shared, delivery: &Delivery) {
    let headers = delivery.properties.headers().clone().unwrap_or_default();
    let Some(offset) = integer(&headers, OFFSET).and_then(|o| u64::try_from(o).ok()) else {
        return;
    };
    if offset < *shared.applied.borrow() {
        return;
    }
    let rule = (
        text_of(&headers, PROCESSOR),
        text_of(&headers, SOURCE),
        text_of(&headers, TYPE),
    );
    let millis = integer(&headers, AT).and_then(|at| u64::try_from(at).ok());
    let at = UNIX_EPOCH + Duration::from_millis(millis.unwrap_or(0));
    let mut state = shared.state.lock().expect("not poisoned");
    let (changed, ended) = match text_of(&headers, OP).as_deref() {
        Some("pause") if !state.rules.contains_key(&rule) => {
            state.rules.insert(rule, at);
            (true, false)
        }
        Some("resume") => {
            let ended = state.rules.remove(&rule).is_some();
            (ended, ended)
        }
        _ => (false, false),
    };
    if let Some(nonce) = text_of(&headers, NONCE) {
        if let Some(outcome) = state.outcomes.get_mut(&nonce) {
            *outcome = Some(changed);
        }
    }
    drop(state);
    shared.applied.send_replace(offset + 1);
    shared.outcome.send_modify(|n| *n += 1);
    if ended {
        shared.resumed.send_modify(|n| *n += 1);
    }
}

/// A record's own name: this process, a counter and the time.
fn nonce() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos();
    format!("{}-{n}-{nanos}", std::process::id())
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn text_of(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn integer(headers: &FieldTable, name: &str) -> Option<i64> {
    Some(match *headers.inner().get(name)? {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n,
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::Timestamp(n) => i64::try_from(n).ok()?,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_covers_its_source_its_type_or_both() {
        let log = Log::default();
        let rule =
            |s: Option<&str>, t: Option<&str>| (None, s.map(str::to_owned), t.map(str::to_owned));
        let add = |r: Rule| {
            log.shared.state.lock().unwrap().rules.insert(r, UNIX_EPOCH);
        };
        assert!(!log.covers("default", "stripe", Some("a")));
        add(rule(Some("stripe"), Some("a")));
        assert!(log.covers("default", "stripe", Some("a")));
        assert!(!log.covers("default", "stripe", Some("b")));
        assert!(!log.covers("default", "github", Some("a")));
        add(rule(None, Some("b")));
        assert!(log.covers("default", "github", Some("b")));
        assert!(!log.covers("default", "github", None));
        add(rule(Some("github"), None));
        assert!(log.covers("default", "github", None));
        add(rule(None, None));
        assert!(log.covers("default", "x", None));
    }

    #[test]
    fn a_processors_pause_covers_its_events_alone() {
        let log = Log::default();
        let own = (Some("email".to_owned()), Some("stripe".to_owned()), None);
        log.shared
            .state
            .lock()
            .unwrap()
            .rules
            .insert(own, UNIX_EPOCH);
        assert!(log.covers("email", "stripe", Some("a")));
        assert!(!log.covers("default", "stripe", Some("a")));
        assert!(!log.covers("email", "github", Some("a")));
    }
}

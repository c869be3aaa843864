//! Pause and resume on JetStream: the pauses are kept in a key-value bucket
//! (`<stream>-pauses`) that every worker watches, so a pause holds for every worker of
//! the stream, in every process.
//!
//! A worker that pulls a paused event *parks* it: publishes it to `<stream>-paused` (with
//! the attempts it has had) and takes it out of the stream. Nothing is redelivered while
//! the pause lasts, so a paused backlog costs no deliveries and no attempts. When a pause
//! ends, the workers publish the parked events it no longer holds back into the stream,
//! in the order they were parked; events that arrive after the resume may start before
//! them.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::kv::{self, CreateErrorKind, Operation};
use async_nats::jetstream::{stream, Message};
use base64::Engine as _;
use futures_util::StreamExt;
use tokio::sync::Notify;

use super::{event_of, header, settle, JetStream};
use crate::inbox::Pause;
use crate::store::{StoreError, StoreErrorKind};
use crate::Event;

/// A rule: the source and the event type it pauses (`None`: any).
type Rule = (Option<String>, Option<String>);

/// A pause: the processor it holds (`None`: every one), and its rule.
type Held = (Option<String>, Rule);

impl JetStream {
    /// The stream paused events are parked in: `<stream>-paused`.
    #[must_use]
    pub fn paused_stream(&self) -> String {
        format!("{}-paused", self.inner.stream)
    }

    /// Pauses the events of `source` of type `event_type` (`None`: any source, any type;
    /// both `None`: every event): no worker of this stream starts one until it is
    /// [resumed](Self::resume). Accepts go on; a worker parks each paused event it pulls
    /// (see the [module docs](super)), and events already running finish. Returns `false`
    /// when it was paused already.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn pause(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.hold(None, source, event_type).await
    }

    /// Pauses for `processor` alone (`None`: every processor).
    pub(super) async fn hold(
        &self,
        processor: Option<&str>,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        let key = held_key(&(part(processor), (part(source), part(event_type))));
        let now = UNIX_EPOCH.elapsed().unwrap_or_default().as_millis();
        match self.inner.pauses.create(key, now.to_string().into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(StoreError::new("jetstream pause", e)),
        }
    }

    /// Ends the pause of exactly that source and type (as [`pause`](Self::pause) took
    /// them); the workers then publish the events it parked back into the stream, in the
    /// order they were parked (a pause of the whole source, or of the type in every
    /// source, still holds them). Returns `false` when there was no such pause.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn resume(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.release(None, source, event_type).await
    }

    /// Ends a pause for `processor` alone (`None`: of every processor).
    pub(super) async fn release(
        &self,
        processor: Option<&str>,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        let key = held_key(&(part(processor), (part(source), part(event_type))));
        let err = |e| StoreError::new("jetstream resume", e);
        let held = self.inner.pauses.get(&key).await.map_err(err)?;
        if held.is_none() {
            return Ok(false);
        }
        self.inner
            .pauses
            .delete(&key)
            .await
            .map_err(|e| StoreError::new("jetstream resume", e))?;
        Ok(true)
    }

    /// What is paused now: pauses of every processor, and of one (their
    /// [`processor`](Pause::processor)).
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn pauses(&self) -> Result<Vec<Pause>, StoreError> {
        let err =
            |e: Box<dyn std::error::Error + Send + Sync>| StoreError::new("jetstream pauses", e);
        let mut keys = self.inner.pauses.keys().await.map_err(|e| err(e.into()))?;
        let mut pauses = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| err(e.into()))?;
            let entry = self.inner.pauses.entry(&key).await;
            let (Some((processor, rule)), Ok(Some(entry))) = (held_of(&key), entry) else {
                continue;
            };
            if entry.operation != Operation::Put {
                continue;
            }
            let ms = std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|v| v.parse().ok());
            pauses.push(Pause {
                processor,
                source: rule.0,
                event_type: rule.1,
                paused_at: UNIX_EPOCH + Duration::from_millis(ms.unwrap_or(0)),
            });
        }
        let key = |p: &Pause| (p.processor.clone(), p.source.clone(), p.event_type.clone());
        pauses.sort_by_key(key);
        Ok(pauses)
    }
}

/// `None` for an empty part, as the SQL inbox reads it.
fn part(part: Option<&str>) -> Option<String> {
    part.filter(|p| !p.is_empty()).map(str::to_owned)
}

/// A rule's key in the bucket: each part base64url (`_` for any), joined by a dot — a key
/// holds only `[-/_=.a-zA-Z0-9]`, and a source or type may hold anything.
fn rule_key((source, event_type): &Rule) -> String {
    let encode = |part: &Option<String>| match part {
        Some(part) => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(part),
        None => "_".to_owned(),
    };
    format!("{}.{}", encode(source), encode(event_type))
}

/// A pause's key: its rule's, and for one processor's, `.<processor>` (a processor's name
/// is a key's characters without the dot).
fn held_key((processor, rule): &Held) -> String {
    match processor {
        Some(processor) => format!("{}.{processor}", rule_key(rule)),
        None => rule_key(rule),
    }
}

fn held_of(key: &str) -> Option<Held> {
    let (processor, rule) = match key.matches('.').count() {
        2 => {
            let (rule, processor) = key.rsplit_once('.')?;
            (Some(processor.to_owned()), rule)
        }
        _ => (None, key),
    };
    Some((processor, rule_of(rule)?))
}

fn rule_of(key: &str) -> Option<Rule> {
    let decode = |part: &str| match part {
        "_" => Some(None),
        part => {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part)
                .ok()?;
            String::from_utf8(bytes).ok().map(Some)
        }
    };
    let (source, event_type) = key.split_once('.')?;
    Some((decode(source)?, decode(event_type)?)).filter(|_| !event_type.contains('.'))
}

/// The pauses as a worker sees them: read when it opens, then kept by a watcher.
#[derive(Clone, Default)]
pub(super) struct Paused {
    rules: Arc<RwLock<HashSet<Held>>>,
    /// The processor whose workers these are: its pauses and every processor's hold.
    processor: Arc<str>,
    /// Told when a pause ended (or a parked event may be one no pause holds): the
    /// workers then publish what it parked back.
    pub(super) ended: Arc<Notify>,
}

impl Paused {
    pub(super) fn of(processor: &str) -> Self {
        Self {
            processor: processor.into(),
            ..Self::default()
        }
    }

    /// Whether a pause holds `event` back.
    pub(super) fn covers(&self, event: &Event) -> bool {
        let rules = self.rules.read().expect("not poisoned");
        if rules.is_empty() {
            return false;
        }
        let (source, ty) = (Some(event.source().to_owned()), event.event_type());
        let ty = ty.map(str::to_owned);
        let rule = [
            (None, None),
            (source.clone(), None),
            (None, ty.clone()),
            (source, ty),
        ];
        let mine = Some(self.processor.to_string());
        let held = [None, mine]
            .into_iter()
            .flat_map(|p| rule.clone().map(|r| (p.clone(), r)));
        held.into_iter().any(|held| rules.contains(&held))
    }

    /// Reads the pauses now in force.
    pub(super) async fn load(&self, js: &JetStream) -> Result<(), StoreError> {
        let rules = js.pauses().await?;
        let rules = rules
            .into_iter()
            .map(|p| (p.processor, (p.source, p.event_type)));
        *self.rules.write().expect("not poisoned") = rules.collect();
        Ok(())
    }

    /// Keeps the pauses up to date from the bucket's changes, watching again after a
    /// pause when the watch ends (NATS went away).
    pub(super) async fn watch(self, js: JetStream) {
        loop {
            if let Ok(mut changes) = js.inner.pauses.watch_all().await {
                // Read once more: what changed before the watch began is not missed.
                let _ = self.load(&js).await;
                self.ended.notify_one();
                while let Some(Ok(change)) = changes.next().await {
                    let Some(rule) = held_of(&change.key) else {
                        continue;
                    };
                    let mut rules = self.rules.write().expect("not poisoned");
                    if change.operation == Operation::Put {
                        rules.insert(rule);
                    } else {
                        rules.remove(&rule);
                        self.ended.notify_one();
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Publishes parked events back into the stream whenever a pause ends (and once at
    /// the start, for what a stopped worker left): a worker's task beside it.
    pub(super) async fn unparking(self, js: JetStream) {
        loop {
            if let Err(_error) = self.unpark(&js).await {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "jetstream worker could not publish parked events back: {_error}");
                tokio::time::sleep(settle::BURY_AGAIN).await;
                continue;
            }
            self.ended.notified().await;
        }
    }

    /// Publishes the parked events no pause holds back any more into the stream, in the
    /// order they were parked, each taken out of the parked stream once stored. Each
    /// republish is named after its parked message, so workers doing this at once store
    /// it once (within the stream's duplicate window).
    pub(super) async fn unpark(&self, js: &JetStream) -> Result<u64, StoreError> {
        let err =
            |e: Box<dyn std::error::Error + Send + Sync>| StoreError::new("jetstream unpark", e);
        let context = &js.inner.context;
        let mut parked = context
            .get_stream(js.lane.paused_stream(&js.inner.stream))
            .await
            .map_err(|e| err(e.into()))?;
        if parked
            .info()
            .await
            .map_err(|e| err(e.into()))?
            .state
            .messages
            == 0
        {
            return Ok(0);
        }
        let reader = parked
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .map_err(|e| err(e.into()))?;
        let mut moved = 0;
        loop {
            let mut batch = reader
                .fetch()
                .max_messages(256)
                .messages()
                .await
                .map_err(|e| err(e.into()))?;
            let mut read = 0;
            while let Some(message) = batch.next().await {
                let message = message.map_err(err)?;
                read += 1;
                let read = event_of(js, message.headers.as_ref(), message.payload.clone());
                // One that does not open goes back too: buried at its pull, where it shows.
                let Some(event) = read.about() else { continue };
                if self.covers(event) {
                    continue;
                }
                let Ok(info) = message.info().map(|i| i.stream_sequence) else {
                    continue;
                };
                back(js, &message, info).await?;
                if js.inner.fan_out {
                    // The message it was parked from stays in the stream, acknowledged:
                    // recorded once by its parked copy, whoever published it back.
                    js.lane.pass(&format!("parked.{info}")).await?;
                }
                let _ = parked.delete_message(info).await;
                moved += 1;
            }
            if read == 0 {
                return Ok(moved);
            }
        }
    }
}

/// Parks `message` (its event paused): moved to the parked stream with the attempts it
/// has had.
pub(super) async fn park(
    js: &JetStream,
    message: &Message,
    attempts: u32,
    until: tokio::time::Instant,
) -> Result<(), StoreError> {
    let mut headers = message.headers.clone().unwrap_or_default();
    headers.insert(header::PRIOR_ATTEMPTS, attempts.to_string());
    let parked = js.lane.paused_stream(&js.inner.stream);
    settle::move_out(js, message, &parked, headers, until).await
}

/// Publishes a parked message back into the stream, named after its place in the parked
/// stream (`parked_seq`) and, with fan-out, addressed to its processor alone; `false` when
/// the stream had it already.
async fn back(js: &JetStream, message: &Message, parked_seq: u64) -> Result<bool, StoreError> {
    let mut headers = message.headers.clone().unwrap_or_default();
    let id = headers
        .get(async_nats::header::NATS_MESSAGE_ID)
        .map(|id| id.as_str().to_owned())
        .unwrap_or_default();
    let id = match js.inner.fan_out {
        false => format!("{id}:parked:{parked_seq}"),
        true => {
            headers.insert(header::PROCESSOR, js.lane.name());
            format!("{id}:parked:{}:{parked_seq}", js.lane.name())
        }
    };
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
    let from = js.lane.paused_stream(&js.inner.stream);
    settle::publish(js, message, (&from, &js.inner.stream), headers).await
}

/// The bucket `config` names, made when it is missing. Its stream is made here as
/// async-nats would make it (`KV_<bucket>`): async-nats's own call first reads the
/// account's limits, in a form servers before 2.10 do not answer.
pub(super) async fn bucket(
    context: &async_nats::jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, StoreError> {
    let stream = stream::Config {
        name: format!("KV_{}", config.bucket),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: config.history.max(1),
        max_age: config.max_age,
        storage: config.storage,
        num_replicas: config.num_replicas.max(1),
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    let err = |e: Box<dyn std::error::Error + Send + Sync>| {
        StoreError::new("jetstream bucket", e).with_kind(StoreErrorKind::Unavailable)
    };
    context
        .get_or_create_stream(stream)
        .await
        .map_err(|e| err(e.into()))?;
    context
        .get_key_value(&config.bucket)
        .await
        .map_err(|e| err(e.into()))
}

/// A bucket's name for `stream`: the stream's name with what a bucket's may not hold
/// replaced.
pub(super) fn bucket_name(stream: &str, what: &str) -> String {
    let stream: String = stream
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{stream}-{what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_keys_hold_any_source_and_type() {
        for rule in [
            (None, None),
            (Some("stripe".to_owned()), None),
            (None, Some("invoice.paid".to_owned())),
            (Some("a b/c*>".to_owned()), Some("ü.x".to_owned())),
        ] {
            let key = rule_key(&rule);
            assert!(key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c)));
            assert_eq!(rule_of(&key), Some(rule.clone()));
            assert_eq!(held_of(&key), Some((None, rule.clone())));
            let mine = (Some("billing-2_x".to_owned()), rule);
            assert_eq!(held_of(&held_key(&mine)), Some(mine));
        }
        assert_eq!(bucket_name("web.hooks+1", "pauses"), "web_hooks_1-pauses");
    }

    #[test]
    fn a_pause_covers_its_source_its_type_or_both() {
        let paused = Paused::of("default");
        let event = Event::of_type;
        assert!(!paused.covers(&event("stripe", "a")));
        paused
            .rules
            .write()
            .unwrap()
            .insert((None, (Some("stripe".to_owned()), Some("a".to_owned()))));
        assert!(paused.covers(&event("stripe", "a")));
        assert!(!paused.covers(&event("stripe", "b")));
        assert!(!paused.covers(&event("github", "a")));
        paused
            .rules
            .write()
            .unwrap()
            .insert((None, (None, Some("b".to_owned()))));
        assert!(paused.covers(&event("github", "b")));
        let other = (Some("billing".to_owned()), (None, Some("c".to_owned())));
        paused.rules.write().unwrap().insert(other);
        assert!(
            !paused.covers(&event("github", "c")),
            "another processor's pause"
        );
        let mine = (Some("default".to_owned()), (None, Some("c".to_owned())));
        paused.rules.write().unwrap().insert(mine);
        assert!(paused.covers(&event("github", "c")));
        paused.rules.write().unwrap().insert((None, (None, None)));
        assert!(paused.covers(&event("github", "d")));
    }
}

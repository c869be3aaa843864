//! The worker's side of the objects' lines (`../turn.rs`, `with_per_object(1)`): each pull
//! written down before its messages run, each message waiting until it is the first of
//! its object's line, and leaving the line once settled; at the start, what a killed
//! worker pulled but never wrote down.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::RawMessageErrorKind;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::super::{event_of, turn};
use super::{Pulled, Stream};
use crate::inbox::worker::Claimed;
use crate::metrics::{self, HeldBack};
use crate::store::{retry_until, StoreError};

/// At most this many of the last messages delivered are read at the start where the
/// consumer sets no `max_ack_pending`.
const CATCH_UP: u64 = 10_000;

/// How often the frontier is written at most: a frontier behind only costs the next
/// worker's start more reading.
const FRONTIER_EVERY: Duration = Duration::from_secs(1);

/// How often a waiting message looks at its line at most (its worker's own settles wake
/// it at once; another worker's are seen here).
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// The lines as this worker knows them, and its waiters per line, woken when it settles
/// one of the line's events.
pub(super) struct Lines {
    book: turn::Book,
    waiting: Mutex<HashMap<String, Arc<Notify>>>,
    /// The last sequence whose pull is written down, and when the frontier was last written.
    written: AtomicU64,
    advanced: Mutex<Option<Instant>>,
}

impl Lines {
    pub(super) fn new(bucket: kv::Store) -> Self {
        Self {
            book: turn::Book::new(bucket),
            waiting: Mutex::default(),
            written: AtomicU64::new(0),
            advanced: Mutex::default(),
        }
    }

    fn waiter(&self, key: &str) -> Arc<Notify> {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        waiting.entry(key.to_owned()).or_default().clone()
    }

    fn wake(&self, key: &str) {
        let woken = self.waiting.lock().expect("not poisoned").remove(key);
        if let Some(waiting) = woken {
            waiting.notify_waiters();
        }
    }
}

impl Stream {
    /// The key of `event`'s line, where this worker keeps lines and the event has an object.
    pub(super) fn line_of(&self, event: &crate::Event) -> Option<String> {
        let object = event.object_id().filter(|_| self.lines.is_some())?;
        let consumer = self.jetstream.consumer();
        Some(turn::key(consumer, event.source(), object))
    }

    /// At the start: writes down the last messages delivered that no line holds and none has
    /// left — a worker killed between a pull and writing it down left them so; none of them
    /// started — and moves the frontier to the last delivered.
    pub(super) async fn catch_up(&self, consumer: &PullConsumer) -> Result<(), StoreError> {
        let Some(lines) = &self.lines else {
            return Ok(());
        };
        let name = self.jetstream.consumer();
        let info = consumer.cached_info();
        let delivered = info.delivered.stream_sequence;
        // Below the frontier every pull was written down; below the floor every message was
        // acknowledged.
        let from = match lines.book.frontier(name).await? {
            Some(frontier) => frontier.max(info.ack_floor.stream_sequence) + 1,
            None => delivered + 1, // the first worker with lines: nothing was written down
        };
        // A killed worker leaves at most its last claim's pulls unwritten: the last messages
        // delivered, fewer than the consumer lets be pending.
        let bound = u64::try_from(info.config.max_ack_pending)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(CATCH_UP);
        let from = from.max((delivered + 1).saturating_sub(bound));
        if delivered >= from {
            let err = |e| StoreError::new("jetstream turns", e);
            let js = &self.jetstream.inner;
            let stream = js.context.get_stream_no_info(&*js.stream).await;
            let stream = stream.map_err(err)?;
            let mut behind: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for seq in from..=delivered {
                let message = match stream.get_raw_message(seq).await {
                    Ok(message) => message,
                    Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => continue,
                    Err(e) => return Err(StoreError::new("jetstream turns", e)),
                };
                // One that does not open is buried at its pull: in no line.
                let event = event_of(&self.jetstream, Some(&message.headers), message.payload);
                let event = event.event();
                let lane = &self.jetstream.lane;
                let taken = event.filter(|e| lane.takes(Some(&message.headers), e));
                if let Some(key) = taken.as_ref().and_then(|e| self.line_of(e)) {
                    behind.entry(key).or_default().push(seq);
                }
            }
            for (key, seqs) in behind {
                // Not one that left its line already: settled, its ack lost with the worker.
                let behind = |line: &mut Vec<u64>, left| {
                    line.extend(seqs.iter().filter(|&&s| s > left));
                };
                lines.book.change(&key, behind).await?;
            }
        }
        lines.book.advance(name, delivered).await
    }

    /// Writes a pull's messages down in their objects' lines (one change per object, all at
    /// once), then moves the frontier past them. A message not written down here is
    /// written down before it runs (`wait_in_line`).
    pub(super) async fn write_down(&self, rows: &[Claimed<Pulled>]) {
        let Some(lines) = &self.lines else { return };
        let mut by_key: BTreeMap<&str, Vec<&Pulled>> = BTreeMap::new();
        for row in rows {
            if let Some(key) = &row.held.line {
                by_key.entry(key).or_default().push(&row.held);
            }
        }
        if by_key.is_empty() {
            return;
        }
        let written = by_key.into_iter().map(|(key, pulled)| async move {
            let seqs: Vec<u64> = pulled.iter().map(|p| p.seq).collect();
            let written = lines.book.change(key, |line, _| line.extend(&seqs)).await;
            for pulled in &pulled {
                pulled.written.store(written.is_ok(), Ordering::Relaxed);
                // First as written: it need not read its line again before it runs.
                let first = matches!(&written, Ok(line) if line.first() == Some(&pulled.seq));
                pulled.first.store(first, Ordering::Relaxed);
            }
            written.is_ok()
        });
        let all = futures_util::future::join_all(written).await;
        let last = rows.iter().map(|row| row.held.seq).max();
        if let (true, Some(last)) = (all.into_iter().all(|ok| ok), last) {
            lines.written.fetch_max(last, Ordering::Relaxed);
        }
        let due = {
            let mut advanced = lines.advanced.lock().expect("not poisoned");
            let due = advanced.is_none_or(|at| at.elapsed() >= FRONTIER_EVERY);
            if due {
                *advanced = Some(Instant::now());
            }
            due
        };
        if due {
            let written = lines.written.load(Ordering::Relaxed);
            let _ = lines.book.advance(self.jetstream.consumer(), written).await;
        }
    }

    /// Waits until the message is the first of its object's line (renewed meanwhile by the
    /// caller); `true` at once for a message in none. `false`: it has waited an `ack_wait`
    /// for an event this worker does not hold (another worker's, or a killed one's that
    /// JetStream has not delivered again yet), and is to be handed back uncounted, so that
    /// waiting messages never fill the worker while the one they wait for cannot get in.
    pub(super) async fn wait_in_line(&self, pulled: &Pulled) -> bool {
        let (Some(lines), Some(key)) = (&self.lines, &pulled.line) else {
            return true;
        };
        if pulled.first.swap(false, Ordering::Relaxed) {
            return true;
        }
        let (since, mut look) = (Instant::now(), Duration::from_millis(50));
        let mut counted = false;
        loop {
            let waiter = lines.waiter(key);
            let woken = waiter.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            let first = match pulled.written.load(Ordering::Relaxed) {
                true => lines.book.first(key).await,
                false => {
                    let written = lines
                        .book
                        .change(key, |line, _| line.push(pulled.seq))
                        .await;
                    pulled.written.store(written.is_ok(), Ordering::Relaxed);
                    written.map(|line| line.first().copied())
                }
            };
            match first {
                // First — or out of the line: settled meanwhile by another delivery of it
                // (its claim in the store then finds the event done).
                Ok(first) if first.is_none_or(|first| first >= pulled.seq) => return true,
                Ok(Some(first)) if !self.holding.holds(first) => {
                    if self.settled(first).await {
                        // Its worker settled it but did not take it out (the bucket was out
                        // of reach): taken out here.
                        let out = lines
                            .book
                            .change(key, |line, _| line.retain(|&s| s != first));
                        let _ = out.await;
                        continue;
                    }
                    if since.elapsed() >= self.ack_wait {
                        return false;
                    }
                }
                // Held here: its settle wakes this one. The bucket out of reach: looked at
                // again.
                _ => {}
            }
            if !counted {
                metrics::held_back(self.jetstream.lane.metrics(), HeldBack::PerObject);
                counted = true;
            }
            tokio::select! {
                () = woken => look = Duration::from_millis(50),
                () = tokio::time::sleep(look) => look = (look * 2).min(LOOK_AGAIN),
            }
        }
    }

    /// Whether the message at `seq` is settled: at or below the consumer's acknowledgement
    /// floor, or gone from the stream (dead, parked, or aged out).
    async fn settled(&self, seq: u64) -> bool {
        let consumer = self.consumer.lock().expect("not poisoned").clone();
        if let Some(mut consumer) = consumer {
            if let Ok(info) = consumer.info().await {
                if info.ack_floor.stream_sequence >= seq {
                    return true;
                }
            }
        }
        let js = &self.jetstream.inner;
        let Ok(stream) = js.context.get_stream_no_info(&*js.stream).await else {
            return false;
        };
        let gone = stream.get_raw_message(seq).await;
        matches!(gone, Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound)
    }

    /// Takes the message out of its object's line — it is settled for good: processed, dead
    /// or parked — before its message is acknowledged, so that a line never holds a
    /// message no one will deliver again. `false` when the bucket did not take it by
    /// `until`.
    pub(super) async fn leave_line(&self, pulled: &Pulled, until: Instant) -> bool {
        let (Some(lines), Some(key)) = (&self.lines, &pulled.line) else {
            return true;
        };
        let seq = pulled.seq;
        let left = retry_until(until, || {
            lines.book.change(key, |line, _| line.retain(|&s| s != seq))
        });
        let left = left.await.is_ok();
        lines.wake(key);
        left
    }
}

//! The count of messages a processor acknowledged unrun: `skipped.<name>` in
//! `<stream>-held`, which its `processed` count is the stream less.
//!
//! Passes are added up in memory and written by one task at a time (compare-and-set), so
//! that a burst costs few writes. The task is spawned, not awaited by the worker: a worker
//! aborted mid-write cannot drop a batch, and a write that failed (NATS away) is tried
//! again until it lands. A reader in the same process adds what is not written yet, so its
//! counts are exact for this process's workers; another process's passes show once written
//! (within milliseconds, or once NATS is back).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;

/// One processor's passes in this process.
pub(super) struct Passes {
    key: String,
    /// Counted here, and how many of those the bucket holds.
    added: AtomicU64,
    written: AtomicU64,
    /// A flush task runs; and, within it, a write is under way.
    flushing: AtomicBool,
    writing: AtomicBool,
}

impl Passes {
    pub(super) fn new(processor: &str) -> Self {
        Self {
            key: key(processor),
            added: AtomicU64::new(0),
            written: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            writing: AtomicBool::new(false),
        }
    }

    /// Counts one pass; written by a flush task (this one's, or the one running).
    pub(super) fn count(self: &Arc<Self>, held: &kv::Store) {
        self.added.fetch_add(1, SeqCst);
        if !self.flushing.swap(true, SeqCst) {
            let (this, held) = (self.clone(), held.clone());
            tokio::spawn(async move { this.flush(&held).await });
        }
    }

    /// Writes what is unwritten until nothing is, backing off while writes fail.
    async fn flush(&self, held: &kv::Store) {
        let mut wait = Duration::from_millis(50);
        loop {
            let (upto, written) = (self.added.load(SeqCst), self.written.load(SeqCst));
            if upto > written {
                self.writing.store(true, SeqCst);
                let added = add(held, &self.key, upto - written).await;
                if added {
                    self.written.store(upto, SeqCst);
                }
                self.writing.store(false, SeqCst);
                if !added {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
            self.flushing.store(false, SeqCst);
            // A pass counted since `upto` whose caller saw the flag still set is this
            // task's to write; one that saw it cleared started a task of its own.
            if self.added.load(SeqCst) == upto || self.flushing.swap(true, SeqCst) {
                return;
            }
        }
    }

    /// The count as the bucket holds it plus this process's passes not written yet:
    /// read between writes, so that none is counted twice or missed.
    pub(super) async fn read(&self, held: &kv::Store) -> u64 {
        for _ in 0..100 {
            if self.writing.load(SeqCst) {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            let written = self.written.load(SeqCst);
            let stored = held.get(&self.key).await.ok().flatten();
            if self.writing.load(SeqCst) || self.written.load(SeqCst) != written {
                continue; // a write landed meanwhile: read again
            }
            let unwritten = self.added.load(SeqCst).saturating_sub(written);
            return stored.map_or(0, |v| read_u64(&v)) + unwritten;
        }
        // Writes all along (a flood of passes): the bucket's count, behind by a write.
        let stored = held.get(&self.key).await.ok().flatten();
        stored.map_or(0, |v| read_u64(&v))
    }
}

fn key(processor: &str) -> String {
    format!("skipped.{processor}")
}

/// Adds `n` to the count at `key`; `false` when the bucket did not take it.
async fn add(held: &kv::Store, key: &str, n: u64) -> bool {
    for _ in 0..16 {
        let written = match held.entry(key).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                let now = read_u64(&entry.value) + n;
                held.update(key, now.to_string().into(), entry.revision)
                    .await
                    .is_ok()
            }
            Ok(Some(entry)) => {
                // Purged or deleted: written again from 0.
                held.update(key, n.to_string().into(), entry.revision)
                    .await
                    .is_ok()
            }
            Ok(None) => held.create(key, n.to_string().into()).await.is_ok(),
            Err(_) => return false,
        };
        if written {
            return true;
        }
    }
    false
}

fn read_u64(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

//! An object's turn across workers (`with_per_object(1)`). A worker writes down the
//! messages of each object it pulls — their stream sequences, in order: the object's
//! *line* — in the bucket `<stream>-held` under `turn.<consumer>.<object>` before any of
//! them runs. An event runs only while it is the first of its line, and leaves the line
//! only once it is settled for good — processed (just before its acknowledgement), dead
//! or parked (once moved out of the stream) — never when it is handed back, waits out a
//! retry, or its worker dies. So the next worker — after a graceful restart or a crash,
//! however JetStream orders the redeliveries among new messages — finds the object's
//! earlier event still in line and waits for it.
//!
//! A line, not only the turn's holder: when the holder leaves, the turn must go to the
//! object's earliest unsettled event, which may be in no worker yet (a killed worker's,
//! waiting out its lease); a holder alone would go to whichever later event asked first.
//!
//! A worker killed between a pull and writing it down leaves messages no line holds: the
//! next one, before its first pull, reads the last messages delivered and writes down
//! those no line holds and none has left. A line's events leave it in its order (only the
//! first runs), so a line keeps the last sequence that left it (`left`): a message at or
//! below it was settled. The worker writes down, at most once a second, the last stream
//! sequence whose pull it wrote down (the consumer's *frontier*, `turn.<consumer>`), so
//! the next one reads back only from there.
//!
//! A line's value: `<left>;<seq>,<seq>,…`.
//!
//! Every change is a compare-and-set on the key's revision: workers of one consumer never
//! lose each other's changes.

use std::collections::HashMap;
use std::sync::Mutex;

use async_nats::jetstream::kv::{self, Operation, UpdateErrorKind};
use base64::Engine as _;
use sha2::Digest;

use crate::store::StoreError;

/// Past this length an object's part of the key is a digest instead (a key is a subject,
/// and a subject's length is bounded).
const LONGEST_NAME: usize = 128;

/// The key of `object`'s line (of `source`) under `consumer`: base64url (no padding) of
/// `<len>:<source>:<object>` — readable, and within the keys' charset — or, for a long
/// one, `h=` and its SHA-256 in hex (`=` is never in the unpadded base64).
pub(super) fn key(consumer: &str, source: &str, object: &str) -> String {
    let name = format!("{}:{source}:{object}", source.len());
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let encoded = b64.encode(&name);
    let name = match encoded.len() <= LONGEST_NAME {
        true => encoded,
        false => format!("h={}", hex::encode(sha2::Sha256::digest(name.as_bytes()))),
    };
    format!("{}.{name}", frontier_key(consumer))
}

/// The key of the consumer's frontier: `turn.<consumer>` (base64url: a consumer's name
/// may hold characters no key can).
pub(super) fn frontier_key(consumer: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!("turn.{}", b64.encode(consumer))
}

/// A key's sequences as last written, the last that left it, and its revision (0: never
/// written).
#[derive(Clone, Default)]
struct Line {
    seqs: Vec<u64>,
    left: u64,
    revision: u64,
}

/// Past this many keys remembered, the book forgets them all (and reads them again).
const REMEMBERED: usize = 10_000;

/// The lines in the bucket as this worker last wrote or read them: each change is written
/// on the revision it knows, in one round trip, and read again only when another worker
/// wrote meanwhile (the compare-and-set fails) — or, for a key it never saw, written as
/// new and read when it was not.
pub(super) struct Book {
    bucket: kv::Store,
    known: Mutex<HashMap<String, Line>>,
}

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
    StoreError::new("jetstream turns", e)
}

impl Book {
    pub(super) fn new(bucket: kv::Store) -> Self {
        Self {
            bucket,
            known: Mutex::default(),
        }
    }

    fn remember(&self, key: &str, line: Option<Line>) {
        let mut known = self.known.lock().expect("not poisoned");
        match line {
            Some(line) => {
                if known.len() >= REMEMBERED {
                    known.clear();
                }
                known.insert(key.to_owned(), line);
            }
            None => drop(known.remove(key)),
        }
    }

    async fn read(&self, key: &str) -> Result<Line, StoreError> {
        let line = match self.bucket.entry(key).await.map_err(err)? {
            Some(entry) if entry.operation == Operation::Put => {
                let value = std::str::from_utf8(&entry.value).unwrap_or_default();
                let (left, seqs) = value.split_once(';').unwrap_or(("0", value));
                Line {
                    seqs: seqs.split(',').filter_map(|s| s.parse().ok()).collect(),
                    left: left.parse().unwrap_or(0),
                    revision: entry.revision,
                }
            }
            // Deleted or purged (by hand): empty, written again on its marker's revision.
            Some(entry) => Line {
                revision: entry.revision,
                ..Line::default()
            },
            None => Line::default(),
        };
        self.remember(key, Some(line.clone()));
        Ok(line)
    }

    /// The first sequence of the line at `key` (`None`: empty), read now.
    pub(super) async fn first(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.read(key).await?.seqs.first().copied())
    }

    /// Changes the line at `key` by `change` (given its sequences in order, and the last
    /// that left it), compare-and-set; returns the line as written (or found, when
    /// `change` changed nothing). A sequence taken out is the line's last to have left.
    pub(super) async fn change(
        &self,
        key: &str,
        change: impl Fn(&mut Vec<u64>, u64),
    ) -> Result<Vec<u64>, StoreError> {
        let known = self.known.lock().expect("not poisoned").get(key).cloned();
        let mut read = false;
        let mut line = known.unwrap_or_default();
        loop {
            let mut seqs = line.seqs.clone();
            change(&mut seqs, line.left);
            seqs.sort_unstable();
            seqs.dedup();
            let out = line.seqs.iter().filter(|s| seqs.binary_search(s).is_err());
            let left = out.copied().max().unwrap_or(0).max(line.left);
            if seqs == line.seqs {
                if read {
                    return Ok(seqs);
                }
                // Nothing to change in the line as remembered: made sure of.
                (line, read) = (self.read(key).await?, true);
                continue;
            }
            // An empty line stays (not purged): it keeps `left`, and its revision is known.
            let value: Vec<String> = seqs.iter().map(u64::to_string).collect();
            let value = format!("{left};{}", value.join(","));
            let written = self.bucket.update(key, value.into(), line.revision);
            match written.await {
                Ok(revision) => {
                    let (seqs, line) = (
                        seqs.clone(),
                        Line {
                            seqs,
                            left,
                            revision,
                        },
                    );
                    self.remember(key, Some(line));
                    return Ok(seqs);
                }
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                    (line, read) = (self.read(key).await?, true);
                }
                Err(e) => {
                    self.remember(key, None);
                    return Err(err(e));
                }
            }
        }
    }

    /// The consumer's frontier (`None`: never written).
    pub(super) async fn frontier(&self, consumer: &str) -> Result<Option<u64>, StoreError> {
        let line = self.read(&frontier_key(consumer)).await?;
        Ok((line.revision > 0).then(|| line.seqs.first().copied().unwrap_or(0)))
    }

    /// Moves the consumer's frontier up to `seq` (never down: another worker's may be
    /// ahead).
    pub(super) async fn advance(&self, consumer: &str, seq: u64) -> Result<(), StoreError> {
        let key = frontier_key(consumer);
        let advanced = self.change(&key, |seqs, _| match seqs.first() {
            Some(&at) if at >= seq => {}
            _ => *seqs = vec![seq],
        });
        advanced.await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unambiguous_and_in_the_charset() {
        let a = key("tower-webhook", "a:b", "c");
        assert_ne!(a, key("tower-webhook", "a", "b:c"));
        assert_ne!(a, key("other", "a:b", "c"));
        let long = key("tower-webhook", "stripe", &"x".repeat(500));
        for k in [&a, &long] {
            assert!(k.starts_with("turn.dG93ZXItd2ViaG9vaw."), "{k}");
            let ok = |c: char| c.is_ascii_alphanumeric() || "-/_=.".contains(c);
            assert!(k.chars().all(ok), "{k}");
        }
        assert!(long.len() < 100, "a long object id is digested: {long}");
    }
}

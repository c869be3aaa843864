//! Group commit: concurrent writes gathered into one statement (PostgreSQL) or one
//! transaction (SQLite), each caller answered with its own outcome.
//!
//! No timer: a write goes out at once when a slot is free, and while every slot is busy
//! the writes that arrive wait in the queue and go out together in the next batch. A lone
//! request is never delayed; under load, batches grow with the load (up to a cap).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::StoreError;

/// Runs one batch: one result per item, in order.
pub(crate) type Run<T, R> = Arc<
    dyn Fn(Vec<T>) -> Pin<Box<dyn Future<Output = Vec<Result<R, StoreError>>> + Send>>
        + Send
        + Sync,
>;

struct Job<T, R> {
    item: T,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

/// A queue of writes and the task that runs them in batches: at most `slots` batches in
/// flight, each of at most `max` writes. The task starts with the first write (inside
/// the caller's runtime) and ends when the last handle is dropped.
pub(crate) struct Batcher<T, R> {
    queue: OnceLock<mpsc::UnboundedSender<Job<T, R>>>,
    max: usize,
    slots: usize,
    run: Run<T, R>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    pub(crate) fn new(max: usize, slots: usize, run: Run<T, R>) -> Self {
        Self {
            queue: OnceLock::new(),
            max: max.max(1),
            slots: slots.max(1),
            run,
        }
    }

    /// Writes `item` in the next batch and returns its own outcome.
    pub(crate) async fn write(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.queue.get_or_init(|| self.start());
        queue
            .send(Job { item, reply })
            .map_err(|_| StoreError::new("batch", "the writer has stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::new("batch", "the writer stopped before answering"))?
    }

    fn start(&self) -> mpsc::UnboundedSender<Job<T, R>> {
        let (queue, mut jobs) = mpsc::unbounded_channel::<Job<T, R>>();
        let (max, slots, run) = (
            self.max,
            Arc::new(Semaphore::new(self.slots)),
            self.run.clone(),
        );
        tokio::spawn(async move {
            loop {
                // A free slot first: while none is, arriving writes gather in the queue.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = jobs.recv().await else {
                    return; // every handle dropped and the queue drained
                };
                let mut batch = vec![first];
                while batch.len() < max {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<T>, Vec<_>) =
                    batch.into_iter().map(|j| (j.item, j.reply)).unzip();
                let running = run(items);
                tokio::spawn(async move {
                    let results = running.await;
                    for (reply, result) in replies.into_iter().zip(results) {
                        // The caller may have gone (its request was dropped): the write
                        // happened all the same, and its guard releases what it claimed.
                        let _ = reply.send(result);
                    }
                    drop(slot);
                });
            }
        });
        queue
    }
}

impl<T, R> std::fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("max", &self.max)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

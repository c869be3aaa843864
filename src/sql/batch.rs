//! Group commit: concurrent writes gathered into one statement (PostgreSQL) or one
//! transaction (SQLite), each caller answered with its own outcome.
//!
//! No timer: a write goes out at once when no batch is in flight, and while one is, the
//! writes that arrive wait in the queue and go out together in the next batch, when the
//! one in flight is done — or at once, in a slot of its own, if they fill a batch or the
//! one in flight is held up past [`STALLED`] (a row lock, a backend off the CPU: never
//! behind it for long). A commit is most of what a small batch costs the database
//! (PostgreSQL: two batches of half the size cost nearly twice one), so batches are as
//! large as the load makes them.
//! A lone request is never delayed; under load, batches grow with the load, up to a count
//! and a size: a batch's bodies are copied into one statement, and a database connection
//! keeps the largest buffer it ever sent, so the size cap bounds the memory a storm of
//! large bodies leaves behind.
//!
//! Two lanes: a batch takes the [`Lane::Urgent`] writes first (renewals, outcomes,
//! releases, a worker's claim: each keeps or ends a lease already running, and there are
//! at most as many as attempts in flight), then the [`Lane::Front`] ones (new claims and
//! accepts: as many as a storm sends). An urgent write waits for the batch in flight and
//! goes in the next, never behind the front door's backlog.
//!
//! The task that runs the batches lives on the runtime of the write that started it; when
//! that runtime ends, the next write starts another on its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::store::StoreError;

/// Which queue a write waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Keeps or ends a lease already running: goes in the next batch.
    Urgent,
    /// New work from the front door (claims, accepts): after the urgent writes.
    Front,
}

/// At most this many writes go in one batch.
pub(crate) const MAX_BATCH: usize = 64;

/// A batch takes no more writes once their bodies add up to this: 64 bodies of 1 KiB
/// still go together, four of 256 KiB do.
pub(crate) const MAX_BATCH_BYTES: usize = 1 << 20;

/// A batch still in flight after this long waits on something other than its commit (a
/// lock, a slow disk, a database backend the machine took off the CPU): the next goes
/// beside it, full or not. A batch here takes 1.1–1.4 ms (p90 1.5–2.1 ms) under load, so
/// only a slow one passes 2 ms (1 ms, passed by typical ones, split batches: 0.89×).
const STALLED: Duration = Duration::from_millis(2);

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

/// The two queues a writer task reads.
struct Queues<T, R> {
    urgent: mpsc::UnboundedSender<Job<T, R>>,
    front: mpsc::UnboundedSender<Job<T, R>>,
    waiting: Arc<Waiting>,
}

impl<T, R> Clone for Queues<T, R> {
    fn clone(&self) -> Self {
        Self {
            urgent: self.urgent.clone(),
            front: self.front.clone(),
            waiting: self.waiting.clone(),
        }
    }
}

/// The writes in the queues, not yet taken into a batch.
struct Waiting {
    count: AtomicUsize,
    bytes: AtomicUsize,
    max: usize,
    max_bytes: usize,
    /// Told when they fill a batch.
    filled: Notify,
}

impl Waiting {
    fn new(max: usize, max_bytes: usize) -> Self {
        Self {
            count: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max,
            max_bytes,
            filled: Notify::new(),
        }
    }

    /// Counted before it is sent, so the task never takes one not yet counted.
    fn add(&self, size: usize) {
        self.count.fetch_add(1, Relaxed);
        self.bytes.fetch_add(size, Relaxed);
        if self.full() {
            self.filled.notify_one();
        }
    }

    fn take(&self, size: usize) {
        self.count.fetch_sub(1, Relaxed);
        self.bytes.fetch_sub(size, Relaxed);
    }

    fn full(&self) -> bool {
        self.count.load(Relaxed) >= self.max || self.bytes.load(Relaxed) >= self.max_bytes
    }
}

/// A queue of writes and the task that runs them in batches: at most `slots` batches in
/// flight (past the first, only full ones or ones behind a stalled batch), each of at
/// most `max` writes. The task starts with the first write (inside the caller's runtime),
/// again with the first write after its runtime ended, and ends when the last handle is
/// dropped.
pub(crate) struct Batcher<T, R> {
    queues: Mutex<Option<Queues<T, R>>>,
    /// Which lane a write waits in.
    lane: fn(&T) -> Lane,
    max: usize,
    /// A batch takes no more writes once their sizes add up to this.
    max_bytes: usize,
    /// A write's size (its body's length).
    size: fn(&T) -> usize,
    slots: usize,
    run: Run<T, R>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// At most `max` writes a batch, and none added once their `size`s reach `max_bytes`;
    /// every write in the front lane.
    pub(crate) fn new(
        max: usize,
        max_bytes: usize,
        size: fn(&T) -> usize,
        slots: usize,
        run: Run<T, R>,
    ) -> Self {
        Self {
            queues: Mutex::new(None),
            lane: |_| Lane::Front,
            max: max.max(1),
            max_bytes,
            size,
            slots: slots.max(1),
            run,
        }
    }

    /// The same, each write in the lane `lane` says.
    pub(crate) fn with_lanes(mut self, lane: fn(&T) -> Lane) -> Self {
        self.lane = lane;
        self
    }

    /// Writes `item` in the next batch and returns its own outcome.
    pub(crate) async fn write(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        let lane = (self.lane)(&item);
        let queues = self.queues();
        let queue = match lane {
            Lane::Urgent => &queues.urgent,
            Lane::Front => &queues.front,
        };
        queues.waiting.add((self.size)(&item));
        queue
            .send(Job { item, reply })
            .map_err(|_| StoreError::new("batch", "the writer has stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::new("batch", "the writer stopped before answering"))?
    }

    /// The running task's queues, or a new task's when there is none (first write) or
    /// its runtime has ended (the task was dropped with it, and its queues closed).
    fn queues(&self) -> Queues<T, R> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        match &*queues {
            Some(q) if !q.urgent.is_closed() => q.clone(),
            _ => queues.insert(self.start()).clone(),
        }
    }

    fn start(&self) -> Queues<T, R> {
        let (urgent, mut urgent_jobs) = mpsc::unbounded_channel::<Job<T, R>>();
        let (front, mut front_jobs) = mpsc::unbounded_channel::<Job<T, R>>();
        let (max, max_bytes, size, run) = (self.max, self.max_bytes, self.size, self.run.clone());
        let (total, slots) = (self.slots, Arc::new(Semaphore::new(self.slots)));
        let waiting = Arc::new(Waiting::new(max, max_bytes));
        let task_waiting = waiting.clone();
        tokio::spawn(async move {
            let waiting = task_waiting;
            loop {
                // A free slot first: while none is, arriving writes gather in the queue.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                // Another batch in flight: wait for it, unless the writes waiting fill one,
                // or it is held up past its commit (a row lock another transaction holds, a
                // backend off the CPU: the writes behind it must not wait for that).
                let behind = || slots.available_permits() + 1 < total && !waiting.full();
                if behind() {
                    let stalled = tokio::time::sleep(STALLED); // only here: one slot, no timer
                    tokio::pin!(stalled);
                    while behind() {
                        tokio::select! {
                            () = waiting.filled.notified() => {}
                            () = &mut stalled => break,
                            others = slots.acquire_many(total as u32 - 1) => match others {
                                Ok(others) => drop(others),
                                Err(_) => return,
                            },
                        }
                    }
                }
                let first = tokio::select! {
                    biased;
                    Some(job) = urgent_jobs.recv() => job,
                    Some(job) = front_jobs.recv() => job,
                    else => return, // every handle dropped and the queues drained
                };
                let mut bytes = size(&first.item);
                waiting.take(bytes);
                let mut batch = vec![first];
                // The urgent writes first, then the front door's.
                for jobs in [&mut urgent_jobs, &mut front_jobs] {
                    while batch.len() < max && bytes < max_bytes {
                        match jobs.try_recv() {
                            Ok(job) => {
                                let n = size(&job.item);
                                waiting.take(n);
                                bytes += n;
                                batch.push(job);
                            }
                            Err(_) => break,
                        }
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
        Queues {
            urgent,
            front,
            waiting,
        }
    }
}

impl<T, R> std::fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("max", &self.max)
            .field("max_bytes", &self.max_bytes)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::Notify;

    use super::*;

    type Batches = Arc<Mutex<Vec<Vec<usize>>>>;

    /// A run that records each batch and answers each write with twice its number; the
    /// first batch stays in flight (its slot busy) until the gate is opened.
    fn first_batch_held() -> (Batches, Arc<Notify>, Run<usize, usize>) {
        let batches: Batches = Arc::default();
        let gate = Arc::new(Notify::new());
        let run: Run<usize, usize> = {
            let (batches, gate) = (batches.clone(), gate.clone());
            Arc::new(move |items: Vec<usize>| {
                let (batches, gate) = (batches.clone(), gate.clone());
                Box::pin(async move {
                    let first = batches.lock().unwrap().is_empty();
                    batches.lock().unwrap().push(items.clone());
                    if first {
                        gate.notified().await;
                    }
                    items.into_iter().map(|n| Ok(n * 2)).collect()
                })
            })
        };
        (batches, gate, run)
    }

    /// Writes that arrive while the one slot is busy go out together, up to the count and
    /// the size caps; each gets its own answer.
    #[tokio::test]
    async fn a_backlog_goes_out_in_batches_capped_by_count_and_size() {
        let (batches, gate, run) = first_batch_held();
        let batcher = Arc::new(Batcher::new(4, 1000, |n: &usize| *n, 1, run));
        let write = |n: usize| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.write(n).await.unwrap() })
        };
        let first = write(1);
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let sizes = [10, 10, 10, 10, 10, 400, 400, 400, 400, 5];
        let rest: Vec<_> = sizes.iter().map(|&n| write(n)).collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gate.notify_one();
        assert_eq!(first.await.unwrap(), 2);
        for (answer, n) in rest.into_iter().zip(sizes) {
            assert_eq!(answer.await.unwrap(), n * 2, "its own answer");
        }
        assert_eq!(
            *batches.lock().unwrap(),
            vec![
                vec![1],
                vec![10, 10, 10, 10],    // the count cap
                vec![10, 400, 400, 400], // past 1000 bytes: no more
                vec![400, 5],
            ]
        );
    }

    /// While a batch is in flight, an urgent write that arrives after a backlog of front
    /// writes goes out first in the next batch.
    #[tokio::test]
    async fn urgent_writes_go_before_the_front_backlog() {
        let (batches, gate, run) = first_batch_held();
        // Even numbers are urgent.
        let lanes = |n: &usize| {
            if n.is_multiple_of(2) {
                Lane::Urgent
            } else {
                Lane::Front
            }
        };
        let batcher = Arc::new(Batcher::new(4, 1000, |_| 1, 1, run).with_lanes(lanes));
        let write = |n: usize| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.write(n).await.unwrap() })
        };
        let first = write(1);
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let mut rest: Vec<_> = [3, 5, 7, 9, 11].into_iter().map(write).collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        rest.push(write(2));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gate.notify_one();
        first.await.unwrap();
        for answer in rest {
            answer.await.unwrap();
        }
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![1], vec![2, 3, 5, 7], vec![9, 11]]
        );
    }

    /// With slots to spare, writes that arrive while a batch is in flight still wait for
    /// it — unless they fill a batch, or it is held up past `STALLED`: then the next goes
    /// out beside it. (The clock is paused: it moves only when every task waits.)
    #[tokio::test(start_paused = true)]
    async fn a_second_batch_goes_out_beside_the_first_only_when_full_or_the_first_stalls() {
        let (batches, gate, run) = first_batch_held();
        let batcher = Arc::new(Batcher::new(4, 1000, |_| 1, 2, run));
        let write = |n: usize| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.write(n).await.unwrap() })
        };
        // Lets every task run as far as it can without moving the clock (its ticks are
        // whole milliseconds, STALLED only two).
        let settle = || async {
            for _ in 0..64 {
                tokio::task::yield_now().await;
            }
        };
        let first = write(1);
        settle().await;
        let mut rest: Vec<_> = [2, 3].into_iter().map(write).collect();
        settle().await;
        assert_eq!(
            batches.lock().unwrap().len(),
            1,
            "a free slot, but 2 and 3 wait"
        );
        rest.extend([4, 5].into_iter().map(write));
        settle().await;
        assert_eq!(*batches.lock().unwrap(), vec![vec![1], vec![2, 3, 4, 5]]);
        rest.push(write(6));
        settle().await;
        assert_eq!(
            batches.lock().unwrap().len(),
            2,
            "6 waits for the first batch"
        );
        tokio::time::sleep(STALLED).await;
        settle().await;
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![1], vec![2, 3, 4, 5], vec![6]],
            "the first held past STALLED: 6 goes beside it"
        );
        gate.notify_one();
        assert_eq!(first.await.unwrap(), 2);
        for answer in rest {
            answer.await.unwrap();
        }
    }

    /// The writer's task dies with the runtime it was started on; the next write, on
    /// another runtime, starts it again there.
    #[test]
    fn the_writer_starts_again_on_the_next_runtime() {
        let run: Run<usize, usize> = Arc::new(|items: Vec<usize>| {
            Box::pin(async move { items.into_iter().map(Ok).collect() })
        });
        let batcher = Batcher::new(4, 1000, |_| 1, 1, run);
        for n in 0..3 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            assert_eq!(runtime.block_on(batcher.write(n)).unwrap(), n);
        }
    }
}

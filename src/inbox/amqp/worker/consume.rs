//! The consumer: a channel of the supervised connection with the worker's prefetch
//! (`basic.qos`) and a consumer with manual acknowledgements on the queue, its deliveries
//! handed to the worker's claims. When the channel dies (the connection was lost, the
//! broker restarted), a new one is made as soon as a connection is up again — lapin's own
//! recovery is not used. At the stop signal the consumer is cancelled; the channel stays
//! open for the running events' outcomes until the worker closes it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::{mpsc, watch};

use super::super::connection::{answered, close};
use super::super::Amqp;
use crate::inbox::process::hurry_up;
use crate::store::StoreError;

/// How often the consumer looks at its channel's state between deliveries.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The first wait before asking for a channel again; doubled up to 1 s.
const AGAIN: Duration = Duration::from_millis(100);

/// The consumer's task and the channel it consumes on.
pub(super) struct Consumer {
    task: tokio::task::JoinHandle<()>,
    channel: Arc<Mutex<Option<lapin::Channel>>>,
}

impl Consumer {
    /// Starts consuming `amqp`'s queue with `prefetch`; its deliveries come out of the
    /// receiver.
    pub(super) fn start(
        amqp: &Amqp,
        prefetch: u16,
        stopped: watch::Receiver<bool>,
    ) -> (Self, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(usize::from(prefetch).max(1));
        let channel = Arc::new(Mutex::new(None));
        let task = tokio::spawn(consume(
            amqp.clone(),
            prefetch,
            tx,
            stopped,
            channel.clone(),
        ));
        (Self { task, channel }, rx)
    }

    /// Waits (up to 2 s) for the consumer to be cancelled after the stop signal: its last
    /// deliveries are in the receiver then.
    pub(super) async fn cancelled(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !self.task.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Closes the channel: what it still holds unacknowledged goes back to the queue.
    /// Bounded: a channel whose connection died without lapin seeing it (after a broker
    /// restart) never answers its close, and a shutdown must not wait for it.
    pub(super) async fn close(self) {
        let channel = self.channel.lock().expect("not poisoned").take();
        if let Some(channel) = channel {
            let close = channel.close(200, "worker stopped".into());
            let _ = tokio::time::timeout(CLOSE_WAIT, close).await;
        }
    }
}

impl Drop for Consumer {
    /// Stopped without `close` (the worker was aborted, as by a crash): the task ends and
    /// the channel closes, so its unacknowledged deliveries go back, counted.
    fn drop(&mut self) {
        self.task.abort();
        let channel = self.channel.lock().ok().and_then(|mut c| c.take());
        if let (Some(channel), Ok(runtime)) = (channel, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move { close(&channel, "worker stopped").await });
        }
    }
}

/// The longest a stopping worker waits for the broker to answer a cancel or a close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Consumes until stopped: a channel, its prefetch, a consumer; again after it died.
async fn consume(
    amqp: Amqp,
    prefetch: u16,
    tx: mpsc::Sender<Delivery>,
    mut stopped: watch::Receiver<bool>,
    slot: Arc<Mutex<Option<lapin::Channel>>>,
) {
    let mut again = AGAIN;
    loop {
        if *stopped.borrow() {
            return;
        }
        let (channel, mut consumer) = match open(&amqp, prefetch).await {
            Ok(opened) => opened,
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::debug!(target: "tower_webhook", "amqp worker has no consumer yet: {_error}");
                tokio::select! {
                    () = tokio::time::sleep(again) => {}
                    () = hurry_up(&mut stopped) => return,
                    () = tx.closed() => return,
                }
                again = (again * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        again = AGAIN;
        // The old channel, if any, is dropped with its deliveries' acknowledgements: they
        // come back to the queue.
        let old = slot.lock().expect("not poisoned").replace(channel.clone());
        if let Some(old) = old {
            tokio::spawn(async move { close(&old, "replaced").await });
        }
        loop {
            tokio::select! {
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        if tx.send(delivery).await.is_err() {
                            return; // the worker is gone
                        }
                    }
                    // Cancelled by the broker (the queue deleted), or the channel died.
                    Some(Err(_)) | None => break,
                },
                () = hurry_up(&mut stopped) => {
                    let tag = consumer.tag();
                    let cancel = channel.basic_cancel(tag, BasicCancelOptions::default());
                    let _ = tokio::time::timeout(CLOSE_WAIT, cancel).await;
                    // What was sent before the cancel took effect: to the worker, which
                    // hands it back.
                    let late = Duration::from_millis(200);
                    while let Ok(Some(Ok(delivery))) = tokio::time::timeout(late, consumer.next()).await {
                        if tx.send(delivery).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
                () = tx.closed() => return,
                () = tokio::time::sleep(WATCH_EVERY) => {
                    if !channel.status().connected() {
                        break;
                    }
                }
            }
        }
        #[cfg(feature = "tracing")]
        tracing::warn!(target: "tower_webhook", "amqp worker lost its consumer: consuming again once the broker is back");
        tokio::select! {
            () = tokio::time::sleep(AGAIN) => {}
            () = hurry_up(&mut stopped) => return,
        }
    }
}

/// A channel with `prefetch` and a consumer on the worker's processor's queue (manual
/// acknowledgements).
async fn open(amqp: &Amqp, prefetch: u16) -> Result<(lapin::Channel, lapin::Consumer), StoreError> {
    let err = |e| StoreError::new("amqp consume", e);
    let channel = amqp.channel().await?;
    let consumer = async {
        let qos = channel.basic_qos(prefetch, BasicQosOptions::default());
        answered("amqp consume", qos).await?.map_err(err)?;
        let consume = channel.basic_consume(
            amqp.lane().queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        answered("amqp consume", consume).await?.map_err(err)
    };
    match consumer.await {
        Ok(consumer) => Ok((channel, consumer)),
        Err(error) => {
            // Closed, not dropped: a consume answered after its timeout would otherwise
            // hold up to `prefetch` deliveries on a channel nobody reads.
            tokio::spawn(async move { close(&channel, "consume failed").await });
            Err(error)
        }
    }
}

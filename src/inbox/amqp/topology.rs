//! The exchanges and quorum queues: declared when missing, checked when present.
//!
//! - The exchange is a durable **topic** exchange: each event's routing key is
//!   `<source>.<type>` (the type's dots kept as words), so other queues of the platform can
//!   bind to `stripe.#` or `*.invoice.paid`; the inbox's queue is bound with `#` (every event).
//! - The queue is a quorum queue (replicated, confirms once a majority has it on disk) with
//!   `x-delivery-limit`, and dead-letters at least once (`x-dead-letter-strategy`, RabbitMQ
//!   3.10+, which needs `x-overflow: reject-publish`) to the **direct** exchange
//!   `<exchange>-dead` with the routing key `<queue>`, bound to the quorum queue
//!   `<queue>-dead`: several queues on one exchange keep their dead apart.
//! - Pauses (`pause.rs`): the quorum queue `<queue>-paused` parked events wait in, the
//!   stream queue `<queue>-pauses` of the pauses and resumes, and the quorum queue
//!   `<queue>-pauses-seq` counting them, both bound to the **fanout** exchange
//!   `<queue>-pauses` a record is published to (the parked queue is reached through the
//!   default exchange).

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::ExchangeKind;

use super::connection::{answered, close};
use crate::store::{StoreError, StoreErrorKind};

/// The names of what the inbox uses on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The topic exchange events are published to.
    pub(crate) exchange: String,
    /// The quorum queue bound to it with `#`.
    pub(crate) queue: String,
    /// `<exchange>-dead`: the direct exchange the queue dead-letters to.
    pub(crate) dead_exchange: String,
    /// `<queue>-dead`: the quorum queue bound to the dead exchange with `<queue>`.
    pub(crate) dead_queue: String,
    /// `<queue>-invalid`: the quorum queue bound to the dead exchange with its own name,
    /// holding the events their schema refused (declared with schemas only).
    pub(crate) invalid_queue: String,
    /// `<queue>-paused`: the quorum queue paused events are parked in (`pause.rs`).
    pub(crate) paused_queue: String,
    /// `<queue>-pauses`: the stream queue of the pauses and resumes, every worker's log,
    /// and the fanout exchange of that name a record is published to once, bound to the
    /// stream and the count alike (exchanges and queues have names of their own).
    pub(crate) pauses_stream: String,
    /// `<queue>-pauses-seq`: a quorum queue holding a message per record of the stream,
    /// its length the stream's (a stream does not say its own).
    pub(crate) pauses_seq: String,
}

impl Names {
    pub(crate) fn new(exchange: &str, queue: &str) -> Self {
        Self {
            exchange: exchange.to_owned(),
            queue: queue.to_owned(),
            dead_exchange: format!("{exchange}-dead"),
            dead_queue: format!("{queue}-dead"),
            invalid_queue: format!("{queue}-invalid"),
            paused_queue: format!("{queue}-paused"),
            pauses_stream: format!("{queue}-pauses"),
            pauses_seq: format!("{queue}-pauses-seq"),
        }
    }
}

/// The routing key the queue is bound to the exchange with: every event.
pub(crate) const EVERY_EVENT: &str = "#";

/// A processor's queue `queue`'s arguments (`default`'s: the queue's): `limits` are its
/// delivery limit and max length, if any; it dead-letters with its own name as the key.
pub(crate) fn queue_arguments(
    names: &Names,
    queue: &str,
    limits: (u32, Option<u32>),
) -> FieldTable {
    let (delivery_limit, max_length) = limits;
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), text("quorum"));
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(delivery_limit.into()),
    );
    args.insert("x-dead-letter-exchange".into(), text(&names.dead_exchange));
    args.insert("x-dead-letter-routing-key".into(), text(queue));
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    args.insert("x-overflow".into(), text("reject-publish"));
    if let Some(n) = max_length {
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(n.into()));
    }
    args
}

/// The delivery limit of the queues the crate holds messages in (dead, parked, invalid,
/// the pauses' count): past any count a message reaches there.
pub(crate) const HELD_DELIVERY_LIMIT: i64 = i32::MAX as i64;

/// A quorum queue that holds messages: with an explicit delivery limit, since RabbitMQ
/// 4.0–4.2 puts 20 on a quorum queue without one and counts each time a message was
/// held unacknowledged and handed back (a listing, a parked event a pause still holds),
/// dropping it at 20 (these queues have no dead-letter exchange).
fn quorum() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), text("quorum"));
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(HELD_DELIVERY_LIMIT),
    );
    args
}

/// The pauses' log: a stream queue, read whole by every worker (`pause.rs`).
fn stream() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), text("stream"));
    args
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Declares (or checks) the exchanges, every processor's queue and dead queue (`lanes`),
/// and their bindings; `invalid`, the invalid queue too. Each step on a channel of its
/// own: a refused declare closes its channel.
pub(crate) async fn declare(
    connection: &super::connection::Connection,
    names: &Names,
    lanes: &[std::sync::Arc<super::processors::Lane>],
    limits: (u32, Option<u32>),
    invalid: bool,
) -> Result<(), StoreError> {
    let exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    for (name, kind) in [
        (&names.exchange, ExchangeKind::Topic),
        (&names.dead_exchange, ExchangeKind::Direct),
        (&names.pauses_stream, ExchangeKind::Fanout),
    ] {
        let channel = connection.channel().await?;
        let declared =
            channel.exchange_declare(name.as_str().into(), kind, exchange, FieldTable::default());
        answered("amqp topology", declared)
            .await?
            .map_err(|e| refused("exchange", name, &e))?;
        close(&channel, "done").await;
    }
    let mut queues = Vec::new();
    for lane in lanes {
        let arguments = queue_arguments(names, &lane.queue, limits);
        queues.push((&lane.queue, arguments));
        queues.push((&lane.dead_queue, quorum()));
        queues.push((&lane.paused_queue, quorum()));
    }
    queues.push((&names.pauses_stream, stream()));
    queues.push((&names.pauses_seq, quorum()));
    if invalid {
        queues.push((&names.invalid_queue, quorum()));
    }
    for (name, arguments) in queues {
        let channel = connection.channel().await?;
        let declared = channel.queue_declare(name.as_str().into(), durable(), arguments);
        answered("amqp topology", declared)
            .await?
            .map_err(|e| refused("queue", name, &e))?;
        close(&channel, "done").await;
    }
    let mut bindings = Vec::new();
    for lane in lanes {
        bindings.push((&lane.queue, &names.exchange, EVERY_EVENT));
        let key = lane.queue.as_str();
        bindings.push((&lane.dead_queue, &names.dead_exchange, key));
    }
    bindings.push((&names.pauses_stream, &names.pauses_stream, ""));
    bindings.push((&names.pauses_seq, &names.pauses_stream, ""));
    if invalid {
        let key = names.invalid_queue.as_str();
        bindings.push((&names.invalid_queue, &names.dead_exchange, key));
    }
    for (queue, exchange, key) in bindings {
        let channel = connection.channel().await?;
        let bound = channel.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        );
        answered("amqp topology", bound).await?.map_err(|e| {
            StoreError::new(
                "amqp topology",
                format!("cannot bind queue '{queue}' to exchange '{exchange}': {e}"),
            )
        })?;
        close(&channel, "done").await;
    }
    Ok(())
}

/// A declare the broker refused: an existing exchange or queue with other settings
/// (`PRECONDITION_FAILED`: RabbitMQ's text names the argument that differs) is a
/// configuration error, anything else as it came.
fn refused(what: &str, name: &str, error: &lapin::Error) -> StoreError {
    let text = error.to_string();
    if text.contains("PRECONDITION_FAILED") || text.contains("inequivalent") {
        StoreError::new(
            "amqp topology",
            format!(
                "the {what} '{name}' exists with other settings than this configuration's \
                 ({text}): delete it, or configure another name"
            ),
        )
        .with_kind(StoreErrorKind::Other)
    } else {
        StoreError::new(
            "amqp topology",
            format!("cannot declare the {what} '{name}': {text}"),
        )
    }
}

/// How many messages `queue` has ready (a passive declare).
pub(crate) async fn message_count(
    channel: &lapin::Channel,
    queue: &str,
) -> Result<u32, StoreError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let declared = channel.queue_declare(queue.into(), passive, FieldTable::default());
    let declared = answered("amqp counts", declared).await?;
    let declared = declared.map_err(|e| StoreError::new("amqp counts", e))?;
    Ok(declared.message_count())
}

/// Deletes the queues — `queues` (the processors' and their dead queues), the invalid
/// queue — and the exchanges.
pub(crate) async fn delete(
    channel: &lapin::Channel,
    names: &Names,
    queues: &std::collections::BTreeSet<String>,
) -> Result<(), StoreError> {
    let err = |e| StoreError::new("amqp delete", e);
    let pauses = [
        &names.pauses_stream,
        &names.pauses_seq,
        &names.invalid_queue,
    ];
    for queue in queues.iter().chain(pauses) {
        // Deleting a queue that does not exist succeeds (the invalid queue, without schemas).
        let deleted = channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
        answered("amqp delete", deleted).await?.map_err(err)?;
    }
    for exchange in [&names.exchange, &names.dead_exchange, &names.pauses_stream] {
        let deleted =
            channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default());
        answered("amqp delete", deleted).await?.map_err(err)?;
    }
    Ok(())
}

//! An event as a message — its routing key, properties and headers — published on the
//! confirm-mode channel, and the broker's confirm read strictly: success is an `Ack` with
//! nothing returned, and nothing else.

use std::time::SystemTime;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use lapin::Confirmation;
use sha2::{Digest, Sha256};

use super::Amqp;
use crate::metrics::{self, Operation};
use crate::store::{StoreError, StoreErrorKind};
use crate::Event;

pub(crate) use crate::inbox::message::header;
use crate::inbox::message::word;

/// AMQP's short strings (routing keys, message ids) hold at most 255 bytes.
const SHORT: usize = 255;

/// Publishes `event` and waits for its confirm, within the confirm timeout.
pub(super) async fn accept(
    amqp: &Amqp,
    event: &Event,
    sent: &crate::span::TraceContext,
) -> Result<(), StoreError> {
    let (routing_key, mut headers) = message(event)?;
    let payload = payload(amqp, event, &mut headers)?;
    let (exchange, routing_key) = match invalid(amqp, event, &mut headers) {
        // Refused by its schema: to `<queue>-invalid` through the dead exchange, never to
        // the exchange whose queues run it.
        Some(invalid_queue) => (&amqp.inner.names.dead_exchange, invalid_queue.into()),
        None => (&amqp.inner.names.exchange, routing_key),
    };
    #[cfg(feature = "otel")]
    let trusted = amqp.inner.trusted_traceparent;
    #[cfg(not(feature = "otel"))]
    let trusted = false;
    let (span, trace) = crate::span::accept(event, sent, trusted);
    if let Some(traceparent) = trace.traceparent() {
        headers.insert(header::TRACEPARENT.into(), text(traceparent));
    }
    if let Some(tracestate) = trace.tracestate() {
        headers.insert(header::TRACESTATE.into(), text(tracestate));
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2) // persistent
        .with_message_id(message_id(event.source(), event.dedupe_id()).into())
        .with_app_id("tower-webhook".into())
        .with_headers(headers);
    if let Some(seconds) = timestamp(event) {
        properties = properties.with_timestamp(seconds);
    }
    let to = (exchange.as_str(), routing_key.as_str());
    let publish = confirmed(amqp, "amqp publish", to, &payload, properties);
    let published = metrics::timed(Operation::Accept, publish);
    crate::span::held(span, published).await
}

/// The payload published for `event`: its body, or with a ring its body sealed, the key
/// id and nonce added to `headers` (`inbox/message.rs`).
fn payload(
    amqp: &Amqp,
    event: &Event,
    headers: &mut FieldTable,
) -> Result<bytes::Bytes, StoreError> {
    #[cfg(feature = "seal")]
    if let Some(ring) = amqp.keys() {
        let (payload, key_id, nonce) = crate::inbox::message::seal(ring, event, "amqp seal")?;
        headers.insert(header::KEY_ID.into(), text(&key_id));
        headers.insert(header::NONCE.into(), text(&nonce));
        return Ok(payload);
    }
    let _ = (amqp, &headers);
    Ok(event.body().clone())
}

/// With schemas, when `event`'s refuses it: the invalid queue's name (its routing key on
/// the dead exchange), its errors added to `headers`.
fn invalid<'a>(amqp: &'a Amqp, event: &Event, headers: &mut FieldTable) -> Option<&'a str> {
    #[cfg(feature = "schemas")]
    if let Some(Err(invalid)) = amqp.inner.schemas.as_ref().map(|s| s.validate(event)) {
        let errors = invalid.to_json();
        headers.insert(header::VALIDATION_ERRORS.into(), text(&errors));
        metrics::invalid_accepted(event.source());
        return Some(&amqp.inner.names.invalid_queue);
    }
    let _ = (amqp, event, headers);
    None
}

/// Every publish of the crate's (an event, a retry, a parked or dead copy, a pause's
/// record): `payload` with `properties`, persistent, to `exchange` (`""`, the default
/// exchange: `routing_key` names a queue) on the publishing channel, `mandatory`. `Ok`
/// only on an `Ack` with nothing returned, all of it within the confirm timeout: a
/// channel that will not open on a connection gone quiet is as late as a confirm that
/// will not come. `what` names the errors.
pub(super) async fn confirmed(
    amqp: &Amqp,
    what: &'static str,
    (exchange, routing_key): (&str, &str),
    payload: &[u8],
    properties: BasicProperties,
) -> Result<(), StoreError> {
    let err = |e| StoreError::new(what, e);
    let publish = async {
        let channel = amqp.inner.connection.publisher().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let properties = properties.with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                payload,
                properties,
            )
            .await
            .map_err(err)?;
        confirmed_or_not(what, confirm.await.map_err(err)?)
    };
    match tokio::time::timeout(amqp.inner.confirm_timeout, publish).await {
        Ok(published) => published,
        Err(_) => Err(StoreError::new(
            what,
            "no confirm from the broker within the confirm timeout",
        )),
    }
}

/// Success only on an `Ack` with nothing returned: lapin reports a `mandatory` message
/// the broker could not route as an `Ack` carrying it back.
fn confirmed_or_not(what: &'static str, confirmation: Confirmation) -> Result<(), StoreError> {
    let refused = match confirmation {
        Confirmation::Ack(None) => return Ok(()),
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => format!(
            "the broker returned the message unroutable: {} {} (no queue bound for its \
             routing key)",
            returned.reply_code, returned.reply_text
        ),
        Confirmation::Nack(None) => "the broker refused the message (nack)".to_owned(),
        Confirmation::NotRequested => "the channel is not in confirm mode".to_owned(),
    };
    Err(StoreError::new(what, refused))
}

/// `message_id` for `(source, id)`: the source's length first (`6:stripe:evt_1`), as
/// JetStream's `Nats-Msg-Id`; past AMQP's 255 bytes, `sha256:` and that text's digest.
pub(crate) fn message_id(source: &str, id: &str) -> String {
    let whole = format!("{}:{source}:{id}", source.len());
    if whole.len() <= SHORT {
        whole
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(whole.as_bytes())))
    }
}

/// `<source>.<type>`, the type's dots kept as words (`stripe.invoice.paid`); an event
/// without a type: `<source>._`. At most 255 bytes.
pub(crate) fn routing_key(event: &Event) -> String {
    let mut key = word(event.source());
    match event.event_type() {
        Some(ty) => {
            for part in ty.split('.').take(8) {
                let part = word(part);
                if key.len() + 1 + part.len() > SHORT {
                    break;
                }
                key.push('.');
                key.push_str(&part);
            }
        }
        None => key.push_str("._"),
    }
    key
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn timestamp(event: &Event) -> Option<u64> {
    event
        .timestamp()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
}

/// The routing key and headers an event is published with.
fn message(event: &Event) -> Result<(ShortString, FieldTable), StoreError> {
    let id = event.dedupe_id();
    // Refused, not encoded, as JetStream's: the platform's own consumers read these
    // headers too, and no provider's id holds a line break.
    if [event.source(), id]
        .iter()
        .any(|v| v.contains(['\r', '\n']))
    {
        return Err(StoreError::message(
            "amqp accept: a source or event id with a line break cannot be a header",
        )
        .with_kind(StoreErrorKind::InvalidInput));
    }
    let mut headers = FieldTable::default();
    headers.insert(header::SOURCE.into(), text(event.source()));
    headers.insert(header::ID.into(), text(id));
    let mut optional = |name: &'static str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty() && !v.contains(['\r', '\n'])) {
            headers.insert(name.into(), text(&value));
        }
    };
    optional(header::TYPE, event.event_type().map(str::to_owned));
    optional(header::OBJECT_ID, event.object_id().map(str::to_owned));
    optional(header::LIVEMODE, event.livemode().map(|l| l.to_string()));
    optional(
        header::TIMESTAMP,
        timestamp(event).map(|seconds| seconds.to_string()),
    );
    Ok((routing_key(event).into(), headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_do_not_collide_and_fit() {
        assert_eq!(message_id("stripe", "evt_1"), "6:stripe:evt_1");
        assert_ne!(message_id("a:b", "c"), message_id("a", "b:c"));
        let long = message_id("stripe", &"x".repeat(1000));
        assert!(long.starts_with("sha256:") && long.len() <= SHORT);
    }

    #[test]
    fn routing_key_words_are_never_empty_and_never_wildcards() {
        assert_eq!(word("stripe/acme"), "stripe_acme");
        assert_eq!(word("a b*c#d.e"), "a_b_c_d_e");
        assert_eq!(word(""), "_");
        assert_eq!(word(&"x".repeat(100)).len(), 64);
    }
}

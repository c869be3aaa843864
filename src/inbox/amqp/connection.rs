//! The one connection to the broker, supervised by the crate rather than lapin's recovery
//! (which does not always come back after a broker restart: lapin #450): a task owns it
//! and, when it errors or closes, connects again after 100 ms, doubling up to 1 s between
//! tries, until the last [`Connection`] handle is dropped. Channels are handed out on the
//! connection of the moment: a fresh one ([`Connection::channel`]), or the publishing
//! channel in confirm mode, kept and replaced when it broke.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::uri::AMQPUri;
use tokio::sync::{watch, Mutex};

use crate::store::StoreError;

/// The first wait before connecting again; doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long one connection attempt may take (TCP, the handshake, the vhost).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long opening a channel (and putting it in confirm mode) may take.
const CHANNEL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any other request to the broker may take (a declare, bind, delete, get,
/// qos, consume, cancel or close): RabbitMQ's own `channel_operation_timeout`. A broker
/// that stops answering fails the call (and the caller's test) instead of hanging it.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the supervisor looks at the connection's state between its events.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The heartbeat asked for unless the URL sets one (`?heartbeat=`), in seconds: a
/// connection gone silent (no reset: a partition) is found dead within about twice that,
/// and connected again; RabbitMQ's own default is 60 s.
const HEARTBEAT_SECS: u16 = 10;

/// A connection that is up now, numbered: a channel of an older one is stale.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) connection: Arc<lapin::Connection>,
    pub(crate) generation: u64,
}

/// The supervised connection. Cloning shares it; the supervisor stops and the connection
/// closes when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    /// The broker's address, password included: never printed.
    uri: AMQPUri,
    /// The broker's URL without its password, for `Debug` and errors.
    redacted: String,
    current: watch::Receiver<Option<Live>>,
    /// The publishing channel, in confirm mode, and the connection it is on.
    publisher: Mutex<Option<(u64, lapin::Channel)>>,
    /// Dropped with the last handle: the supervisor's signal to stop.
    _stop: watch::Sender<()>,
}

impl Connection {
    /// Connects to `url` (an error when that fails: nothing is supervised yet), then hands
    /// the connection to its supervisor.
    pub(crate) async fn start(url: &str) -> Result<Self, StoreError> {
        let redacted = redact(url);
        let uri = parse(url).map_err(|e| {
            StoreError::new("amqp connect", format!("{e}: {redacted}"))
                .with_kind(crate::store::StoreErrorKind::InvalidInput)
        })?;
        let first = connect(&uri).await.map_err(|e| {
            StoreError::new(
                "amqp connect",
                format!("cannot connect to the broker at {redacted}: {e}"),
            )
        })?;
        // Up before `start` returns: the topology is declared on it next.
        let first = Live {
            connection: Arc::new(first),
            generation: 1,
        };
        let (current, watched) = watch::channel(Some(first.clone()));
        let (stop, stopped) = watch::channel(());
        tokio::spawn(supervise(uri.clone(), first, current, stopped));
        Ok(Self {
            shared: Arc::new(Shared {
                uri,
                redacted,
                current: watched,
                publisher: Mutex::new(None),
                _stop: stop,
            }),
        })
    }

    /// The broker's URL, its password left out.
    pub(crate) fn redacted_url(&self) -> &str {
        &self.shared.redacted
    }

    /// The connection up now, if any.
    pub(crate) fn live(&self) -> Option<Live> {
        self.shared.current.borrow().clone()
    }

    /// Waits until a connection is up (at once when one is), and returns it.
    #[allow(dead_code)] // the worker's (issue 37, part 3)
    pub(crate) async fn connected(&self) -> Live {
        let mut current = self.shared.current.clone();
        loop {
            if let Some(live) = current.borrow_and_update().clone() {
                return live;
            }
            if current.changed().await.is_err() {
                // The supervisor is gone only once every handle is: not while `self` is.
                std::future::pending::<()>().await;
            }
        }
    }

    /// A connection of its own, apart from the supervised one, for work that may leave
    /// its channels unusable (passive declares of queues that may not exist: lapin keeps
    /// the error of a channel the broker closed, and fails the next channel it numbers
    /// so). Close it when done.
    pub(crate) async fn apart(&self) -> Result<lapin::Connection, StoreError> {
        connect(&self.shared.uri).await.map_err(|e| {
            let redacted = &self.shared.redacted;
            StoreError::new(
                "amqp connect",
                format!("cannot connect to the broker at {redacted}: {e}"),
            )
        })
    }

    /// A fresh channel on the connection up now: fails at once when there is none.
    pub(crate) async fn channel(&self) -> Result<lapin::Channel, StoreError> {
        let live = self.live().ok_or_else(no_connection)?;
        open(&live.connection).await
    }

    /// The publishing channel, in confirm mode: the one kept while it and its connection
    /// are up, else a new one. Fails at once when there is no connection.
    pub(crate) async fn publisher(&self) -> Result<lapin::Channel, StoreError> {
        let live = self.live().ok_or_else(no_connection)?;
        let mut kept = self.shared.publisher.lock().await;
        if let Some((generation, channel)) = kept.as_ref() {
            if *generation == live.generation && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        *kept = None;
        let channel = open(&live.connection).await?;
        let confirm = channel.confirm_select(ConfirmSelectOptions::default());
        match tokio::time::timeout(CHANNEL_TIMEOUT, confirm).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StoreError::new("amqp confirm mode", e)),
            Err(_) => return Err(StoreError::message("amqp confirm mode: timed out")),
        }
        *kept = Some((live.generation, channel.clone()));
        Ok(channel)
    }
}

/// `request`'s own result, or [`late`] when the broker did not answer it within
/// [`ANSWER_TIMEOUT`].
pub(crate) async fn answered<T>(
    what: &'static str,
    request: impl std::future::Future<Output = T>,
) -> Result<T, StoreError> {
    tokio::time::timeout(ANSWER_TIMEOUT, request)
        .await
        .map_err(|_| late(what))
}

/// Closes `channel`, waiting for the broker's answer at most [`ANSWER_TIMEOUT`].
pub(crate) async fn close(channel: &lapin::Channel, reason: &str) {
    let _ = answered("amqp close", channel.close(200, reason.into())).await;
}

/// A request the broker did not answer in time.
pub(crate) fn late(what: &'static str) -> StoreError {
    StoreError::new(what, "no answer from the broker in time")
        .with_kind(crate::store::StoreErrorKind::Unavailable)
}

fn no_connection() -> StoreError {
    StoreError::message("amqp: no connection to the broker")
}

async fn open(connection: &lapin::Connection) -> Result<lapin::Channel, StoreError> {
    match tokio::time::timeout(CHANNEL_TIMEOUT, connection.create_channel()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(StoreError::new("amqp channel", e)),
        Err(_) => Err(StoreError::message("amqp channel: timed out")),
    }
}

/// The URL as lapin connects to it: an IPv4 host kept (lapin's parser takes only a
/// domain name, and puts `localhost` in place of an address), the heartbeat
/// [`HEARTBEAT_SECS`] unless set. Its error never quotes the URL (lapin's would, with its
/// password).
fn parse(url: &str) -> Result<AMQPUri, String> {
    let mut uri: AMQPUri = url
        .parse()
        .map_err(|_| "not an AMQP URL (amqp://user:password@host:port/vhost)".to_owned())?;
    if let Some(ip) = ipv4_host(url) {
        uri.authority.host = ip.to_string();
    }
    uri.query.heartbeat.get_or_insert(HEARTBEAT_SECS);
    Ok(uri)
}

/// The host of `scheme://[userinfo@]host[:port][/…]`, when it is an IPv4 address.
fn ipv4_host(url: &str) -> Option<std::net::Ipv4Addr> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let host = host_port.split(':').next()?;
    host.parse().ok()
}

async fn connect(uri: &AMQPUri) -> Result<lapin::Connection, String> {
    // No `enable_auto_recover`: the supervisor below reconnects.
    let properties =
        lapin::ConnectionProperties::default().with_connection_name("tower-webhook".into());
    let connecting = lapin::Connection::connect_uri(uri.clone(), properties);
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        // lapin's errors name the host, never the URL's password.
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CONNECT_TIMEOUT:?}")),
    }
}

/// Owns the connection: publishes it, waits for it to break, connects again with a capped
/// backoff; stops (closing it) once `stop`'s sender is dropped.
async fn supervise(
    uri: AMQPUri,
    first: Live,
    current: watch::Sender<Option<Live>>,
    mut stop: watch::Receiver<()>,
) {
    let mut generation = first.generation;
    let mut next = Some(first.connection);
    let mut backoff = MIN_BACKOFF;
    loop {
        let connection = match next.take() {
            Some(connection) => connection,
            None => {
                let attempt = tokio::select! {
                    _ = stop.changed() => return,
                    attempt = connect(&uri) => attempt,
                };
                match attempt {
                    Ok(connection) => {
                        generation += 1;
                        Arc::new(connection)
                    }
                    Err(_error) => {
                        #[cfg(feature = "tracing")]
                        tracing::debug!(target: "tower_webhook", "amqp: reconnecting: {_error}");
                        tokio::select! {
                            _ = stop.changed() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
        };
        backoff = MIN_BACKOFF;
        let events = connection.events_listener();
        current.send_replace(Some(Live {
            connection: connection.clone(),
            generation,
        }));
        #[cfg(feature = "tracing")]
        if generation > 1 {
            tracing::info!(target: "tower_webhook", "amqp: connected to the broker again");
        }
        tokio::select! {
            _ = stop.changed() => {
                current.send_replace(None);
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    connection.close(200, "shutting down".into()),
                )
                .await;
                return;
            }
            () = broken(&connection, events) => {}
        }
        current.send_replace(None);
        #[cfg(feature = "tracing")]
        tracing::warn!(target: "tower_webhook", "amqp: the connection to the broker was lost");
        drop(connection);
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(MIN_BACKOFF) => {}
        }
    }
}

/// Returns once the connection errored or closed.
async fn broken(
    connection: &lapin::Connection,
    events: impl futures_util::Stream<Item = lapin::Event> + Send,
) {
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            // A channel's error (a passive declare of a missing queue: 404) is an event
            // too: the connection's state below says whether it was the connection's.
            event = events.next() => if event.is_none() {
                return;
            },
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        if !connection.status().connected() {
            return;
        }
    }
}

/// `url` with its password replaced by `***`: `amqp://guest:***@host:5672/%2f`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, redact};

    #[test]
    fn an_address_stays_the_host_and_the_heartbeat_is_short_unless_set() {
        let uri = parse("amqp://guest:guest@10.1.2.3:5673/%2f").unwrap();
        assert_eq!(uri.authority.host, "10.1.2.3");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.vhost, "/");
        assert_eq!(uri.query.heartbeat, Some(super::HEARTBEAT_SECS));
        let uri = parse("amqp://u:p@rabbit.internal/v?heartbeat=30").unwrap();
        assert_eq!(uri.authority.host, "rabbit.internal");
        assert_eq!(uri.query.heartbeat, Some(30));
    }

    #[test]
    fn a_bad_url_is_refused_without_quoting_it() {
        for bad in [
            "mailto:s3cret",
            "amqp://u:s3cret@host:notaport/",
            "http://u:s3cret@h/",
        ] {
            let error = parse(bad).unwrap_err();
            assert!(!error.contains("s3cret"), "{error}");
        }
    }

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact("amqp://guest:s3cret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact("amqp://u:p@ss@host/v?heartbeat=10"),
            "amqp://u:***@host/v?heartbeat=10"
        );
        assert_eq!(redact("amqp://host:5672"), "amqp://host:5672");
        assert_eq!(redact("amqp://user@host"), "amqp://user@host");
        assert_eq!(redact("s3cret"), "<not a URL>");
    }
}

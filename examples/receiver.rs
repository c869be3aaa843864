//! A webhook receiver, configured by environment: `cargo run --example receiver -- --help`
//! lists every variable (the README has the same table).
//!
//! On SIGTERM or Ctrl-C it stops accepting, waits for the handlers still running (those
//! whose client hung up included) and for the worker, for at most `WEBHOOK_DRAIN_SECS`,
//! stops and releases what is left (its retry runs at once), and exits 0.
//!
//! It serves `POST /webhooks` (and `GET` for Meta's handshake) and prints
//! `handled <event id>` each time its handler runs: once per event, however often the
//! provider delivers it (an event without an id prints the digest it is deduplicated on).
//! `GET /metrics` answers the crate's metrics in Prometheus's text format (deliveries
//! verified and rejected by reason, duplicates, 409s, 503s, handler outcomes, latencies,
//! and in inbox mode the worker's attempts, depth and lag: see `tower_webhook::metrics`),
//! through `metrics-exporter-prometheus` on the same port.
//! Set-up handshakes (Slack, Zoom, Discord, Twitch, Meta, Microsoft Graph, SNS) are
//! answered by the layer. With a 1 s lease and a 3 s
//! delay, a duplicate sent during the run gets 409 (the lease is renewed while the
//! handler runs), and a client that hangs up mid-run and retries later gets 204: the id
//! is printed once.
//!
//! ```text
//! cargo run --example receiver
//! ```

mod support;

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::Arc;

use axum::routing::post_service;
use tower::ServiceBuilder;
use tower_webhook::admin::OperatorDoor;
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Accept, Backpressure, Inbox, Rate, Worker, WorkerHandle};
use tower_webhook::seal::KeyRing;
use tower_webhook::store::{DedupeStore, PgStore, RedisStore, SqliteStore};
use tower_webhook::verify::Certificates;
use tower_webhook::{DedupeLayer, Event, PublicUrl, Verifier, VerifyWebhookLayer};

/// A webhook receiver, configured by environment (`--help` lists it).
#[derive(clap::Parser)]
#[command(name = "receiver", after_help = ENVIRONMENT)]
#[command(
    about = "A webhook receiver: verifies each delivery, then handles each event once \
    (in the request, or in an inbox and its worker), and drains on SIGTERM or Ctrl-C."
)]
struct Args {}

/// The environment contract, one variable a line: default, the modes it applies to, and
/// what it does. The README's table says the same.
const ENVIRONMENT: &str = "\
Environment (variable [default] (modes): what it does):
  WEBHOOK_SCHEME [standard] (all): the provider's scheme: standard, stripe, github,
      slack, shopify, discord, sendgrid, paddle, zoom, meta, intercom, twitch, twilio,
      twilio-sha256, square, hubspot, linear, mailgun, microsoft-graph, sns, paypal
  WEBHOOK_SECRETS [a development secret, printed] (all): secrets and public keys in the
      provider's own format, comma-separated, the first current; for sns and paypal, PEM
      certificates to pin (without them each delivery's certificate is fetched over HTTPS
      from the provider's hosts)
  WEBHOOK_SNS_TOPICS [-] (all, sns): the topic ARNs to accept, comma-separated
  WEBHOOK_PAYPAL_WEBHOOK_ID [-] (all, paypal): the webhook id PayPal signs
  WEBHOOK_VERIFY_TOKEN [-] (all): Meta's verify token, for its GET ?hub.challenge
  WEBHOOK_PUBLIC_URL [-] (all): the URL Twilio, Square or HubSpot sign, as configured there
  WEBHOOK_TOLERANCE_SECS [the scheme's: 300 for most] (all): timestamp tolerance, both ways
  BIND [127.0.0.1:3000] (all): the address to listen on
  DATABASE_URL [-] (all): a postgres:// or redis:// URL to deduplicate in (redis: not in
      inbox mode); unset, the SQLite file WEBHOOK_SQLITE
  WEBHOOK_SQLITE [webhooks.db] (all): the embedded SQLite file
  WEBHOOK_LEASE_SECS [60] (all): how long a claim holds between renewals (DedupeLayer's
      claims and the workers' leases; on SQLite, under 20 s shortens the busy timeout)
  WEBHOOK_HANDLER_DELAY_MS [0] (all): how long the handler waits after its effect
  WEBHOOK_DRAIN_SECS [30] (all): how long a shutdown waits for running handlers and the
      worker before it releases what is left
  WEBHOOK_HEADER_TIMEOUT_SECS [10] (all): a connection that has not sent a request's
      headers within this is closed (a slow client, or an idle keep-alive connection)
  WEBHOOK_BODY_TIMEOUT_SECS [10] (all): how long a body may take to arrive (then 408)
  WEBHOOK_MODE [dedupe] (all): dedupe (the handler runs in the request, behind
      DedupeLayer), inbox (stored in the SQLite or PostgreSQL inbox, 204 at once, a worker
      handles), nats (published to NATS JetStream, 204 once acknowledged, behind
      DedupeLayer on the store above; a JetStream worker handles) or amqp (published to
      a RabbitMQ quorum queue, 204 once the broker confirmed it, behind DedupeLayer on
      the store above; a RabbitMQ worker handles)
  NATS_URL [nats://127.0.0.1:4222] (nats): the NATS server
  NATS_STREAM [webhooks] (nats): the JetStream stream
  AMQP_URL [amqp://guest:guest@127.0.0.1:5672/%2f] (amqp): the RabbitMQ broker
  AMQP_EXCHANGE [webhooks] (amqp): the topic exchange events are published to
      (dead-lettering to <exchange>-dead), declared when missing
  AMQP_QUEUE [webhooks] (amqp): the quorum queue bound to it (dead queue <queue>-dead),
      declared when missing, checked when present
  WEBHOOK_PROCESSORS [default] (inbox, nats, amqp): the processors each event fans out
      to, comma-separated, each `name` or `name=glob|glob` (event types; `*` matches any
      run of characters), e.g. billing=invoice.*,email: a worker each (amqp: a queue
      each, <queue>-<name>, default's <queue>), printing `handled <event id> <processor>`;
      unset, one processor (default) of every type, printing `handled <event id>`
  WEBHOOK_FAIL_PROCESSORS [-] (inbox, nats, amqp): processors (comma-separated) whose
      every attempt fails; a name that is not a processor refuses to start
  WEBHOOK_PROCESSOR_DELAY_MS [-] (inbox, nats, amqp): name:ms,... how much longer the named
      processors take, on top of WEBHOOK_HANDLER_DELAY_MS
  WEBHOOK_WORKER_CONCURRENCY [32] (inbox, nats, amqp): events each processor's worker runs
      at once; 0 runs no worker in this process (it only accepts)
  WEBHOOK_PER_OBJECT [no cap] (inbox, nats, amqp): events of one object each processor runs at
      once, the first ones in arrival order
  WEBHOOK_RATE [no limit] (inbox, nats, amqp): N/s or N/min events each processor starts,
      evenly spaced
  WEBHOOK_MAX_LAG_SECS [off] (inbox, nats): backpressure: while the oldest queued event
      is older, deliveries get 503 and Retry-After and are not stored (GitHub's spared);
      set in amqp mode, the receiver refuses to start
  WEBHOOK_ADMIN_TOKEN [off] (inbox, nats, amqp): at least 16 characters; serves the
      operator API under /admin (Authorization: Bearer <token>; amqp: GET /admin/counts,
      POST /admin/pause and /admin/resume, GET /admin/pauses) and, in inbox mode, the
      operator's page at /admin/ui (open /admin/ui?token=<token> once to sign in); set
      but shorter or empty, the receiver refuses to start
  WEBHOOK_FAIL_TYPES [-] (inbox, nats, amqp): event types (comma-separated) whose every attempt
      fails, in every processor, to make a dead event on purpose
  WEBHOOK_MAX_ATTEMPTS [5] (inbox, nats, amqp): attempts before an event is dead for a processor
      (the first retry after 1 s, each wait doubling)
  WEBHOOK_ENCRYPTION_KEYS [-] (inbox, nats): `id:<base64 of 32 bytes>` entries,
      comma-separated, the first seals, every one opens: inbox, each body, its stored
      headers and the processors' errors are stored sealed; nats, each body is published
      sealed (the stream holds no body in clear); a malformed entry stops the receiver at
      start, naming its position; set in dedupe mode, the receiver refuses to start
  WEBHOOK_ENCRYPTION_COMPRESS [1] (with WEBHOOK_ENCRYPTION_KEYS): 1: a payload of 128 bytes
      or more is LZ4-compressed before it is sealed when that makes it shorter (a
      ciphertext's length then says how compressible its payload was: SECURITY.md); 0:
      sealed as it is; either opens both
  WEBHOOK_BODY_RETENTION_SECS [off: bodies kept with their events] (inbox): a processed
      event's body, stored headers and error texts are deleted this long after its last
      processor finished, checked every minute (sooner for a short retention); its key
      stays, so a redelivery is still a duplicate; set in nats mode (a stream keeps
      messages for its own max_age) or dedupe mode, the receiver refuses to start

  OTEL_EXPORTER_OTLP_ENDPOINT [off] (all): export the spans over OTLP/HTTP to this URL
      (`/v1/traces` appended): per delivery a PRODUCER span for the accept, per attempt
      a CONSUMER span, each with messaging.message.id; unset, nothing is exported
  OTEL_EXPORTER_OTLP_PROTOCOL [http/protobuf] (all): http/protobuf or http/json; any
      other stops the receiver at start
  OTEL_SERVICE_NAME [unknown_service] (all): the exported spans' service.name
  OTEL_BSP_SCHEDULE_DELAY [5000] (all): milliseconds between exports of batched spans
  OTEL_BSP_MAX_EXPORT_BATCH_SIZE [2048], OTEL_BSP_MAX_QUEUE_SIZE [16384] (all): spans an
      export carries, and spans held before new ones are dropped (the SDK's own defaults,
      512 and 2048, export four times as often under a steady load)
  WEBHOOK_TRUST_TRACEPARENT [0] (inbox, nats, amqp): 1: a verified delivery's `traceparent`
      header is the accept span's parent; else it is only linked (a sender's trace id
      never joins ours unless trusted); 1 in dedupe mode refuses to start
  WEBHOOK_SCHEMAS [off] (inbox, nats): a folder of `<event type>.json` JSON Schemas (and
      `<source>/<event type>.json`); each event is checked at accept, and one that fails
      is answered 204, never processed, kept `invalid` with its errors (GET
      /admin/events?state=invalid; POST /admin/requeue {\"invalid\": true} checks again;
      nats: kept in the stream <stream>-invalid, listed and requeued the same); a schema that does not compile stops the
      receiver at start, naming its file; set in dedupe mode, the receiver refuses to start

It serves POST /webhooks and GET /metrics, and prints `handled <event id>` each time its
handler runs; in inbox, nats and amqp mode also `finished <event id>` when it returns, and
`failed <event id>` when it fails (with WEBHOOK_PROCESSORS, ` <processor>` after the id).";

pub fn app(verify: VerifyWebhookLayer, dedupe: DedupeLayer, delay: Duration) -> Router {
    Router::new().route(
        "/webhooks",
        post(move |event: Event| handle(event, delay))
            // Only Meta's handshake comes as a GET; the layer answers it.
            .get(|| async { http::StatusCode::METHOD_NOT_ALLOWED })
            .layer(ServiceBuilder::new().layer(verify).layer(dedupe)),
    )
}

/// The store `DATABASE_URL` names, or the embedded SQLite file; and its description.
pub async fn store_from_env(
    lease: Duration,
) -> Result<(Arc<dyn DedupeStore>, String), Box<dyn std::error::Error>> {
    Ok(match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            (Arc::new(PgStore::connect(&url).await?), "PostgreSQL".into())
        }
        Ok(url) if url.starts_with("redis://") => {
            (Arc::new(RedisStore::connect(&url).await?), "Redis".into())
        }
        Ok(url) if !url.is_empty() => {
            return Err(
                format!("DATABASE_URL: use a postgres:// or redis:// URL, not {url:?}").into(),
            )
        }
        _ => {
            let (store, description) = sqlite_from_env(lease).await?;
            (Arc::new(store), description)
        }
    })
}

/// The embedded SQLite file `WEBHOOK_SQLITE`, with a busy timeout of at most a quarter of
/// `lease`: the store keeps only leases of four busy timeouts (a renewal may wait that long
/// for another process's write lock), so a short lease is made safe this way — a process
/// that holds the file's lock longer (the `tower-webhook` command) costs a 503, not a lease.
async fn sqlite_from_env(
    lease: Duration,
) -> Result<(SqliteStore, String), Box<dyn std::error::Error>> {
    let path = std::env::var("WEBHOOK_SQLITE").unwrap_or_else(|_| "webhooks.db".into());
    let description = format!("SQLite at {path}");
    let busy = (lease / 4).min(Duration::from_secs(5));
    Ok((
        SqliteStore::open(path).await?.with_busy_timeout(busy),
        description,
    ))
}

/// The inbox `DATABASE_URL` names (PostgreSQL), or the embedded SQLite file's; and its
/// description.
async fn inbox_from_env(
    lease: Duration,
) -> Result<(Inbox, Arc<dyn DedupeStore>, String), Box<dyn std::error::Error>> {
    Ok(match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = PgStore::connect(&url).await?;
            (
                Inbox::postgres(&store),
                Arc::new(store),
                "PostgreSQL".into(),
            )
        }
        Ok(url) if !url.is_empty() => {
            return Err(format!(
                "DATABASE_URL: the inbox lives in SQL: use a postgres:// URL, not {url:?}"
            )
            .into())
        }
        _ => {
            let (store, description) = sqlite_from_env(lease).await?;
            (Inbox::sqlite(&store), Arc::new(store), description)
        }
    })
}

async fn handle(event: Event, delay: Duration) -> http::StatusCode {
    // The effect: one line per event.
    support::processors::print_line("handled", event.id().unwrap_or(event.dedupe_id()));
    tokio::time::sleep(delay).await; // the effect is done; the answer is slow
    http::StatusCode::NO_CONTENT
}

/// The worker with `WEBHOOK_RATE`'s rate and `WEBHOOK_PER_OBJECT`'s cap, where set
/// (either worker: they share the methods, not a trait).
macro_rules! with_flow_control {
    ($worker:expr, $rate:expr, $per_object:expr) => {{
        let worker = match $rate {
            Some(rate) => $worker.with_rate(rate),
            None => $worker,
        };
        match $per_object {
            Some(n) => worker.with_per_object(n)?,
            None => worker,
        }
    }};
}

/// A whole number from the environment, or `default`.
fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name}: not a whole number")),
        Err(_) => Ok(default),
    }
}

/// Installs the Prometheus recorder, before any layer records; its handle renders the
/// scrape. Latencies are histograms: verification from 5 µs (an HMAC over a small body
/// takes a few), store round trips from 100 µs to 5 s.
fn prometheus() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let verification = [
        5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01,
    ];
    let store = [
        1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tower_webhook_verification_duration_seconds".into()),
            &verification,
        )?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &store)?
        .install_recorder()?;
    // Without the exporter's own listener, upkeep (draining histograms) is ours to run.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Runs the inbox's body expiry on a tick: a minute, or a quarter of a shorter retention
/// (at least a second), so a body outlives its retention by at most that. Every replica
/// may run it: one batch at a time goes, each from where the last ended.
fn expire_bodies_every(inbox: Inbox, retention: Duration) {
    let tick = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut every = tokio::time::interval(tick);
        loop {
            every.tick().await;
            match inbox.expire_bodies(500).await {
                Ok(0) => {}
                Ok(n) => eprintln!("expired the bodies of {n} processed events"),
                Err(e) => eprintln!("body expiry failed: {e}"),
            }
        }
    });
}

/// `GET /metrics`: the scrape, in Prometheus's text format.
/// The operator API (`admin`) under `/admin` when there is a token, behind the door's
/// bearer check.
fn with_admin(router: Router, admin: Router, door: Option<&OperatorDoor>) -> Router {
    let Some(door) = door else { return router };
    router.nest("/admin", admin.layer(door.bearer()))
}

/// The operator's web page (`admin::ui`) under `/admin/ui` when there is a token, behind
/// the door's sign-in (`?token=` once, then a session cookie; `POST /admin/ui/logout`).
fn with_operators_page(router: Router, inbox: &Inbox, door: Option<&OperatorDoor>) -> Router {
    let Some(door) = door else { return router };
    let page = tower_webhook::admin::ui(inbox.clone()).layer(door.sign_in());
    // `nest_service` also answers `/admin/ui/` (the door redirects it to `/admin/ui`).
    router.nest_service("/admin/ui", page)
}

/// `WEBHOOK_ADMIN_TOKEN`: the operators' door when it is set, refused under 16 bytes (an
/// empty one, what `WEBHOOK_ADMIN_TOKEN=${UNSET}` gives, would otherwise open everything).
fn admin_door_from_env() -> Result<Option<OperatorDoor>, String> {
    match std::env::var("WEBHOOK_ADMIN_TOKEN") {
        Ok(token) => OperatorDoor::new(token)
            .map(Some)
            .map_err(|e| format!("WEBHOOK_ADMIN_TOKEN: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err("WEBHOOK_ADMIN_TOKEN: not UTF-8".into()),
    }
}

fn metrics_route(router: Router, handle: PrometheusHandle) -> Router {
    router.route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move {
                let content_type = "text/plain; version=0.0.4; charset=utf-8";
                ([(http::header::CONTENT_TYPE, content_type)], text)
            }
        }),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse(); // --help and -h print the contract and exit 0
    let otel = support::otel::install()?;
    let metrics = prometheus()?;
    let (scheme, secrets, dev) = support::scheme_and_secrets()?;
    // Only when set: the scheme's own window (Twitch, Linear, SNS) is the default.
    let tolerance = match std::env::var("WEBHOOK_TOLERANCE_SECS") {
        Ok(_) => Some(Duration::from_secs(env_number(
            "WEBHOOK_TOLERANCE_SECS",
            300,
        )?)),
        Err(_) => None,
    };
    let lease = Duration::from_secs(env_number("WEBHOOK_LEASE_SECS", 60)?);
    let delay = Duration::from_millis(env_number("WEBHOOK_HANDLER_DELAY_MS", 0)?);
    let drain_bound = Duration::from_secs(env_number("WEBHOOK_DRAIN_SECS", 30)?);
    let body_timeout = Duration::from_secs(env_number("WEBHOOK_BODY_TIMEOUT_SECS", 10)?);
    let header_timeout = match env_number("WEBHOOK_HEADER_TIMEOUT_SECS", 10)? {
        0 => return Err("WEBHOOK_HEADER_TIMEOUT_SECS: at least 1".into()),
        secs => Duration::from_secs(secs),
    };
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let scheme_name = scheme.name().to_owned();
    let public_url = match std::env::var("WEBHOOK_PUBLIC_URL") {
        Ok(url) => Some(PublicUrl::exact(&url)?),
        Err(_) => None,
    };
    let configure = move |mut verifier: Verifier| {
        if let Some(tolerance) = tolerance {
            verifier = verifier.with_tolerance(tolerance);
        }
        if let Some(url) = public_url {
            verifier = verifier.with_public_url(url);
        }
        verifier
    };
    let fetching = support::uses_certificates(&scheme) && secrets.is_empty();
    let verify = if fetching {
        let certificates = Certificates::new(scheme, support::https_get()?)?;
        VerifyWebhookLayer::from_certificates(certificates.with_verifier(configure))
    } else {
        VerifyWebhookLayer::new(configure(Verifier::new(scheme, &secrets)?))
    };

    // The workers' handler in the queue modes, one worker per processor: the same effect,
    // once per event and processor, and a line when it ends (`support::processors`).
    // `WEBHOOK_FAIL_TYPES`' types fail every attempt instead.
    let shared = support::processors::Shared {
        fail_types: Arc::new(
            std::env::var("WEBHOOK_FAIL_TYPES")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        delay,
    };
    let plan = support::processors::Plan::from_env()?;
    let max_attempts = u32::try_from(env_number("WEBHOOK_MAX_ATTEMPTS", 5)?)
        .map_err(|_| "WEBHOOK_MAX_ATTEMPTS: too large")?;
    // 32: a no-op processor drains 2.5-3x faster than at 8, which processed a fifth to a
    // third of a storm while it ran (BENCHMARKS.md, issue 38). Lower it for a processor a
    // downstream limits.
    let workers = usize::try_from(env_number("WEBHOOK_WORKER_CONCURRENCY", 32)?)?;
    let per_object = match std::env::var("WEBHOOK_PER_OBJECT") {
        Ok(n) => Some(
            n.parse::<u32>()
                .map_err(|_| format!("WEBHOOK_PER_OBJECT: {n:?}"))?,
        ),
        Err(_) => None,
    };
    let rate: Option<Rate> = match std::env::var("WEBHOOK_RATE") {
        Ok(rate) => Some(rate.parse().map_err(|e| format!("WEBHOOK_RATE: {e}"))?),
        Err(_) => None,
    };
    let admin_door = admin_door_from_env()?;
    // Unset or 1: a payload LZ4-compressed first when that shortens it (KeyRing::without_compression).
    let compress = match std::env::var("WEBHOOK_ENCRYPTION_COMPRESS").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("1") => true,
        Ok("0") => false,
        Ok(_) | Err(_) => return Err("WEBHOOK_ENCRYPTION_COMPRESS: 0 or 1".into()),
    };
    // Unset: bodies published in clear. The error names an entry by position, never a key.
    let keys = match std::env::var("WEBHOOK_ENCRYPTION_KEYS") {
        Ok(keys) if compress => Some(KeyRing::parse(&keys)?),
        Ok(keys) => Some(KeyRing::parse(&keys)?.without_compression()),
        Err(_) => None,
    };
    let seals = matches!(
        std::env::var("WEBHOOK_MODE").as_deref(),
        Ok("nats" | "inbox")
    );
    if keys.is_some() && !seals {
        return Err(
            "WEBHOOK_ENCRYPTION_KEYS: only inbox and nats mode seal the bodies they store".into(),
        );
    }
    let body_retention = match std::env::var("WEBHOOK_BODY_RETENTION_SECS") {
        Ok(_) if std::env::var("WEBHOOK_MODE").as_deref() != Ok("inbox") => {
            return Err(
                "WEBHOOK_BODY_RETENTION_SECS: inbox mode only (in nats mode the \
                stream's max_age is the bodies' retention)"
                    .into(),
            )
        }
        Ok(_) => Some(Duration::from_secs(env_number(
            "WEBHOOK_BODY_RETENTION_SECS",
            0,
        )?)),
        Err(_) => None,
    };
    let trust_traceparent = match std::env::var("WEBHOOK_TRUST_TRACEPARENT").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("0") => false,
        Ok("1")
            if matches!(
                std::env::var("WEBHOOK_MODE").as_deref(),
                Ok("inbox" | "nats" | "amqp")
            ) =>
        {
            true
        }
        Ok("1") => {
            return Err(
                "WEBHOOK_TRUST_TRACEPARENT: only inbox, nats and amqp mode accept into a queue"
                    .into(),
            )
        }
        Ok(_) | Err(_) => return Err("WEBHOOK_TRUST_TRACEPARENT: 0 or 1".into()),
    };
    let amqp_mode = std::env::var("WEBHOOK_MODE").as_deref() == Ok("amqp");
    if amqp_mode && std::env::var_os("WEBHOOK_MAX_LAG_SECS").is_some() {
        return Err(
            "WEBHOOK_MAX_LAG_SECS: not in amqp mode (RabbitMQ does not say how long \
            its oldest message has waited)"
                .into(),
        );
    }
    // Unset: no event is checked. A schema that does not compile names its file.
    let schemas = match std::env::var("WEBHOOK_SCHEMAS") {
        Ok(_)
            if !matches!(
                std::env::var("WEBHOOK_MODE").as_deref(),
                Ok("inbox" | "nats")
            ) =>
        {
            return Err("WEBHOOK_SCHEMAS: only inbox and nats mode keep invalid events".into())
        }
        Ok(dir) => Some(
            tower_webhook::schemas::Schemas::from_dir(&dir)
                .map_err(|e| format!("WEBHOOK_SCHEMAS: {e}"))?,
        ),
        Err(_) => None,
    };
    // Each mode's store also remembers PayPal's transmissions for every replica on it.
    let (mode, store, store_name) = match std::env::var("WEBHOOK_MODE").as_deref() {
        Ok("inbox") => {
            let (inbox, store, name) = inbox_from_env(lease).await?;
            let inbox = match &plan.specs {
                Some(specs) => inbox.with_processors(specs.iter().cloned())?,
                None => inbox,
            };
            let inbox = match keys {
                Some(keys) => inbox.with_keys(keys),
                None => inbox,
            }
            .with_trusted_traceparent(trust_traceparent);
            let inbox = match schemas {
                Some(schemas) => inbox.with_schemas(schemas),
                None => inbox,
            };
            if let Some(retention) = body_retention {
                expire_bodies_every(inbox.clone().with_body_retention(retention), retention);
            }
            let mut running = Vec::new();
            for processor in plan.names().iter().filter(|_| workers > 0) {
                let handler = plan.handler(processor, &shared);
                let worker = Worker::processor(&inbox, processor, handler)?;
                running.push(
                    with_flow_control!(worker, rate, per_object)
                        .with_concurrency(workers)?
                        .with_max_attempts(max_attempts)?
                        .with_lease(lease)?
                        .with_grace(drain_bound)
                        .spawn(),
                );
            }
            (Mode::Inbox(inbox, running), store, name)
        }
        Ok("nats") => {
            let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
            let stream = std::env::var("NATS_STREAM").unwrap_or_else(|_| "webhooks".into());
            let client = async_nats::ConnectOptions::new()
                // As `JetStream::connect`: a server that came back is found soon.
                .reconnect_delay_callback(|n| Duration::from_millis(50) * n.min(5) as u32)
                .connect(&url)
                .await?;
            let mut builder =
                JetStream::builder(client, &stream).with_trusted_traceparent(trust_traceparent);
            if let Some(specs) = &plan.specs {
                builder = builder.with_processors(specs.iter().cloned())?;
            }
            if let Some(keys) = keys {
                builder = builder.with_keys(keys);
            }
            if let Some(schemas) = schemas {
                builder = builder.with_schemas(schemas);
            }
            let jetstream = builder.build().await?;
            let (store, name) = store_from_env(lease).await?;
            // Its claims make each event's effect once, also when NATS crashed.
            let mut running = Vec::new();
            for processor in plan.names().iter().filter(|_| workers > 0) {
                let handler = plan.handler(processor, &shared);
                let worker = match plan.specs {
                    None => JetStreamWorker::from_arc(&jetstream, store.clone(), handler),
                    Some(_) => {
                        let claims = support::processors::SharedStore(store.clone());
                        JetStreamWorker::processor(&jetstream, processor, claims, handler)?
                    }
                };
                running.push(
                    with_flow_control!(worker, rate, per_object)
                        .with_concurrency(workers)?
                        .with_max_attempts(max_attempts)?
                        .with_lease(lease)?
                        .with_grace(drain_bound)
                        .spawn(),
                );
            }
            let dedupe = DedupeLayer::from_arc(store.clone()).with_lease(lease)?;
            let name = format!("NATS JetStream stream {stream} at {url}, deduplicated in {name}");
            (Mode::Nats(jetstream, dedupe, running), store, name)
        }
        Ok("amqp") => {
            let url = std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
            let exchange = std::env::var("AMQP_EXCHANGE").unwrap_or_else(|_| "webhooks".into());
            let queue = std::env::var("AMQP_QUEUE").unwrap_or_else(|_| "webhooks".into());
            let mut builder = Amqp::builder(&url)
                .with_exchange(&exchange)?
                .with_queue(&queue)?
                .with_trusted_traceparent(trust_traceparent);
            if let Some(specs) = &plan.specs {
                // A queue per processor: `<queue>-<name>` (`default`'s is `<queue>`).
                builder = builder.with_processors(specs.iter().cloned())?;
            }
            let amqp = builder.build().await?;
            let (store, name) = store_from_env(lease).await?;
            // Its claims make each event's effect once, also when an acknowledgement was
            // lost with the connection.
            let mut running = Vec::new();
            for processor in plan.names().iter().filter(|_| workers > 0) {
                let handler = plan.handler(processor, &shared);
                let worker =
                    AmqpWorker::from_arc_processor(&amqp, processor, store.clone(), handler)?;
                running.push(
                    with_flow_control!(worker, rate, per_object)
                        .with_concurrency(workers)?
                        .with_max_attempts(max_attempts)?
                        .with_lease(lease)?
                        .with_grace(drain_bound)
                        .spawn(),
                );
            }
            let dedupe = DedupeLayer::from_arc(store.clone()).with_lease(lease)?;
            // The URL's password is not printed.
            let broker = redacted(&url);
            let name = format!(
                "RabbitMQ exchange {exchange} and quorum queue {queue} at {broker}, \
                deduplicated in {name}"
            );
            (Mode::Amqp(amqp, dedupe, running), store, name)
        }
        Ok("dedupe") | Ok("") | Err(_) => {
            let (store, name) = store_from_env(lease).await?;
            let dedupe = DedupeLayer::from_arc(store.clone()).with_lease(lease)?;
            (Mode::Dedupe(dedupe), store, name)
        }
        Ok(other) => {
            return Err(format!("WEBHOOK_MODE: dedupe, inbox, nats or amqp, not {other:?}").into())
        }
    };

    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let addr = listener.local_addr()?;
    // Before the address is printed: whoever reads it may send SIGTERM at once.
    let shutdown = support::signal::shutdown_signal();
    eprintln!("receiving {scheme_name} webhooks on http://{addr}/webhooks");
    let handles = match &plan.specs {
        None => "a worker handles".to_owned(),
        Some(_) => format!(
            "a worker per processor handles: {}",
            plan.names().join(", ")
        ),
    };
    match &mode {
        Mode::Dedupe(_) => eprintln!("deduplicating in {store_name}"),
        Mode::Inbox(_, running) if !running.is_empty() => {
            eprintln!("storing in the inbox in {store_name}; {handles}")
        }
        Mode::Nats(_, _, running) | Mode::Amqp(_, _, running) if !running.is_empty() => {
            eprintln!("publishing to {store_name}; {handles}")
        }
        Mode::Inbox(..) | Mode::Nats(..) | Mode::Amqp(..) => {
            eprintln!("accepting into {store_name}; no worker in this process")
        }
    }
    if dev {
        eprintln!(
            "no WEBHOOK_SECRETS: using a development secret. Send a signed test delivery with\n  \
             WEBHOOK_SCHEME={scheme_name} cargo run --example send -- http://{addr}/webhooks"
        );
    }
    if fetching {
        eprintln!("fetching {scheme_name} signing certificates from the provider's hosts");
    }
    eprintln!("metrics on http://{addr}/metrics");
    let mut verify = verify
        .with_body_timeout(body_timeout)
        .with_transmission_store_arc(store);
    if let Ok(token) = std::env::var("WEBHOOK_VERIFY_TOKEN") {
        verify = verify.with_verify_token(token);
    }
    let drain = match &mode {
        Mode::Dedupe(dedupe) | Mode::Nats(_, dedupe, _) | Mode::Amqp(_, dedupe, _) => {
            Some(dedupe.drain())
        }
        Mode::Inbox(..) => None,
    };
    let max_lag = match std::env::var("WEBHOOK_MAX_LAG_SECS") {
        Ok(secs) => Some(Duration::from_secs(
            secs.parse()
                .map_err(|_| format!("WEBHOOK_MAX_LAG_SECS: {secs:?}"))?,
        )),
        Err(_) => None,
    };
    let pushing_back = |accept: Accept| match max_lag {
        Some(max_lag) => accept.with_backpressure(Backpressure::max_lag(max_lag)),
        None => accept,
    };
    let (router, running) = match mode {
        Mode::Dedupe(dedupe) => (app(verify, dedupe, delay), Vec::new()),
        Mode::Inbox(inbox, running) => {
            let route = post_service(pushing_back(inbox.accept_service()))
                .get(|| async { http::StatusCode::METHOD_NOT_ALLOWED })
                .layer(verify);
            let router = Router::new().route("/webhooks", route);
            let admin = tower_webhook::admin::router(inbox.clone());
            let router = with_operators_page(router, &inbox, admin_door.as_ref());
            (with_admin(router, admin, admin_door.as_ref()), running)
        }
        Mode::Nats(jetstream, dedupe, running) => {
            let route = post_service(pushing_back(jetstream.accept_service()))
                .get(|| async { http::StatusCode::METHOD_NOT_ALLOWED })
                .layer(ServiceBuilder::new().layer(verify).layer(dedupe));
            let router = Router::new().route("/webhooks", route);
            let admin = tower_webhook::admin::jetstream_router(jetstream.clone());
            (with_admin(router, admin, admin_door.as_ref()), running)
        }
        Mode::Amqp(amqp, dedupe, running) => {
            let route = post_service(pushing_back(amqp.accept_service()))
                .get(|| async { http::StatusCode::METHOD_NOT_ALLOWED })
                .layer(ServiceBuilder::new().layer(verify).layer(dedupe));
            let router = Router::new().route("/webhooks", route);
            let admin = amqp_admin(amqp);
            (with_admin(router, admin, admin_door.as_ref()), running)
        }
    };
    let router = metrics_route(router, metrics);
    let (signalled, signal) = tokio::sync::oneshot::channel();
    let server = support::connections::serve_until(listener, router, header_timeout, async move {
        shutdown.await;
        let _ = signalled.send(());
    });
    let mut server = tokio::spawn(server);
    if signal.await.is_err() {
        // The server ended without a signal: it panicked.
        server.await?;
        return Err("the server stopped".into());
    }
    // Stop accepting; the running handlers, the connections and the worker get the bound.
    eprintln!("shutting down: draining for at most {drain_bound:?}");
    let deadline = tokio::time::Instant::now() + drain_bound;
    let stop_workers = async {
        // All at once, each with the bound as its grace.
        let stopping: Vec<_> = running
            .into_iter()
            .map(|worker| tokio::spawn(worker.shutdown()))
            .collect();
        for worker in stopping {
            let _ = worker.await;
        }
    };
    let drain_handlers = async {
        if tokio::time::timeout_at(deadline, &mut server)
            .await
            .is_err()
        {
            server.abort(); // clients still connected past the bound: cut off
        }
        match drain {
            Some(drain) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                Some(drain.wait(left).await)
            }
            None => None,
        }
    };
    let ((), drained) = tokio::join!(stop_workers, drain_handlers);
    if let Some(drained) = drained {
        eprintln!(
            "drained: {} finished, {} stopped and released, {} left to their lease",
            drained.finished(),
            drained.released(),
            drained.unreleased()
        );
    }
    if let Some(otel) = otel {
        // The last attempts' spans, still batched: flushed before the exit (a blocking call).
        tokio::task::spawn_blocking(move || otel.shutdown()).await?;
    }
    Ok(())
}

/// Where verified deliveries go.
#[allow(clippy::large_enum_variant)] // one value, built once
enum Mode {
    Dedupe(DedupeLayer),
    /// A worker per processor: none where this process only accepts.
    Inbox(Inbox, Vec<WorkerHandle>),
    Nats(JetStream, DedupeLayer, Vec<WorkerHandle>),
    /// Published to RabbitMQ behind the dedupe layer; its worker, unless it only accepts.
    Amqp(Amqp, DedupeLayer, Vec<WorkerHandle>),
}

/// The operator API of a RabbitMQ inbox, as the other modes' answer it: `GET /counts`
/// (`Amqp::counts`: the queues, the delay queues, the dead queues and the parked events'
/// `paused`; with more than one processor, `"processors"`: each one's,
/// `Amqp::counts_by_processor`), `POST /pause` and `POST /resume` (`?source=…&type=…&processor=…`, each optional:
/// `{"changed": bool}`, as `Amqp::pause` and `Amqp::resume` answer) and `GET /pauses`.
fn amqp_admin(amqp: Amqp) -> Router {
    use axum::extract::{Query, State};
    use axum::routing::post;

    /// `?source=…&type=…&processor=…` (no processor: every processor's).
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rule {
        source: Option<String>,
        #[serde(rename = "type")]
        event_type: Option<String>,
        processor: Option<String>,
    }
    type Answer =
        Result<axum::Json<serde_json::Value>, (http::StatusCode, axum::Json<serde_json::Value>)>;
    fn failed(
        what: &str,
        e: &dyn std::fmt::Display,
    ) -> (http::StatusCode, axum::Json<serde_json::Value>) {
        eprintln!("{what} failed: {e}");
        let error = serde_json::json!({"error": "the broker did not answer"});
        (http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(error))
    }
    async fn hold(
        amqp: Amqp,
        rule: Result<Query<Rule>, axum::extract::rejection::QueryRejection>,
        pause: bool,
    ) -> Answer {
        let bad = |why: &str| {
            (
                http::StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({"error": why})),
            )
        };
        let Ok(Query(rule)) = rule else {
            return Err(bad(
                "the query takes source, type and processor, once each, all optional",
            ));
        };
        if let Some(processor) = rule.processor.as_deref() {
            if !amqp.has_processor(processor) {
                return Err(bad("no such processor"));
            }
        }
        let (source, event_type) = (rule.source.as_deref(), rule.event_type.as_deref());
        let changed = match (rule.processor.as_deref(), pause) {
            (None, true) => amqp.pause(source, event_type).await,
            (None, false) => amqp.resume(source, event_type).await,
            (Some(name), true) => amqp.pause_processor(name, source, event_type).await,
            (Some(name), false) => amqp.resume_processor(name, source, event_type).await,
        };
        let changed = changed.map_err(|e| failed(if pause { "pause" } else { "resume" }, &e))?;
        Ok(axum::Json(serde_json::json!({"changed": changed})))
    }
    Router::new()
        .route(
            "/counts",
            get(|State(amqp): State<Amqp>| async move {
                let counted = async {
                    let mut json = serde_json::to_value(amqp.counts().await?)?;
                    if amqp.processors().count() > 1 {
                        let by = amqp.counts_by_processor().await?;
                        json["processors"] = serde_json::to_value(by)?;
                    }
                    Ok::<_, Box<dyn std::error::Error>>(json)
                };
                let counts = counted.await.map_err(|e| failed("counts", &*e))?;
                Ok::<_, (http::StatusCode, axum::Json<serde_json::Value>)>(axum::Json(counts))
            }),
        )
        .route(
            "/pause",
            post(|State(amqp): State<Amqp>, rule| hold(amqp, rule, true)),
        )
        .route(
            "/resume",
            post(|State(amqp): State<Amqp>, rule| hold(amqp, rule, false)),
        )
        .route(
            "/pauses",
            get(|State(amqp): State<Amqp>| async move {
                let pauses = amqp.pauses().await.map_err(|e| failed("pauses", &e))?;
                Ok::<_, (http::StatusCode, axum::Json<serde_json::Value>)>(axum::Json(
                    serde_json::json!(pauses),
                ))
            }),
        )
        .with_state(amqp)
}

/// `url` without its password (`amqp://guest:***@host:5672/%2f`), for a line on stderr.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn a_broker_url_is_printed_without_its_password() {
        for (url, printed) in [
            (
                "amqp://guest:s3cret@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("amqp://u:p@ss@host/v@h", "amqp://u:***@host/v@h"),
            ("amqp://127.0.0.1:5672/%2f", "amqp://127.0.0.1:5672/%2f"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redacted(url), printed);
        }
    }
}

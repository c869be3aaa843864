//! The inbox's operator surface over HTTP: an axum [`Router`](axum::Router) of JSON
//! endpoints to mount in your server, **behind the [`OperatorDoor`]** (the operators'
//! token, checked and throttled) or your own authorization.
//!
//! [`router`] answers, under wherever you mount it:
//!
//! | request | answer |
//! |---|---|
//! | `GET /counts` | `{"queued": 3, "processing": 1, "processed": 1200, "dead": 2, "paused": 0, "invalid": 0, "oldest_due_ms": 850}` ([`Inbox::counts`]) |
//! | `GET /events?state=dead` | `{"events": [{"source", "id", "type", "object_id", "state", "attempts", "received_at", "next_attempt_at", "dead_at", "last_error"}, …], "next": "<cursor>"}` ([`Inbox::list`]) |
//! | `GET /events/{source}/{id}` | one event's row with `"livemode"`, `"processed_at"`, `"body"`, `"body_encoding"`, `"headers"` and `"history"` ([`Inbox::event`]) |
//! | `GET /processed?minutes=15` | `{"minutes": [{"start": "2026-12-03T15:04:00Z", "processed": 12}, …]}` ([`Inbox::processed_per_minute`]) |
//! | `POST /requeue` | `{"requeued": 2, "without_body": 0}` ([`Inbox::requeue_counted`]: rows of events whose body expired or was erased are left out and counted apart) |
//! | `POST /pause?source=stripe&type=invoice.paid` | `{"changed": true}` ([`Inbox::pause`]) |
//! | `POST /resume?source=stripe&type=invoice.paid` | `{"changed": true}` ([`Inbox::resume`]) |
//! | `GET /pauses` | `[{"source": "stripe", "type": null, "paused_at": "…"}, …]` ([`Inbox::pauses`]) |
//! | `POST /backfill` | `{"created": 120}` ([`Inbox::backfill`]) |
//! | `POST /rekey` | `{"rekeyed": 4200, "unreadable": 0}` ([`Inbox::rekey`], feature `seal`) |
//! | `DELETE /events/{source}/{id}/body` | `{"erased": true}`, 404 for no such event ([`Inbox::erase`]: body, headers and error texts deleted, routes that could run dead) |
//! | `POST /erase` | `{"subject": "cus_1"}` → `{"erased": 3}` ([`Inbox::erase_subject`], feature `seal`; 409 without keys) |
//!
//! - `GET /events` takes `state=dead` (newest dead first) or `state=failing` (rows queued
//!   again after a failed attempt, newest received first), `order=oldest` for the other
//!   way, `limit=1..1000` (default 50) and `after=<next>` for the following page: `next`
//!   is `null` on the last one. Each page is read from the partial index of its rows, so
//!   it costs its own size, not the history's.
//! - `GET /events/{source}/{id}`: percent-encode each segment (`/` as `%2F`). The body is
//!   its text when it is UTF-8 (`"body_encoding": "utf-8"`), else base64
//!   (`"body_encoding": "base64"`). `"headers"` are the request headers the inbox's
//!   accept stored, as `[name, value]` pairs in the request's order (`[]` when none
//!   were: credentials are never stored, see [`Accept`](crate::inbox::Accept));
//!   `"history"` is every attempt, oldest first, as `{"attempt", "started_at",
//!   "finished_at", "duration_ms", "outcome", "error"}` (outcome `processed`, `failed`,
//!   `dead`, `snoozed`, `abandoned` or `crashed`; the newest 100 of each route at most)
//!   — beside `"attempts"`, the count since the last requeue. Any state; 404 when the
//!   inbox has no such event.
//! - `GET /processed` counts the events processed in each of the last `minutes` minutes
//!   (`1..1440`, default 15), the oldest first, each by its start; the last is the
//!   current minute, still counting. For a chart of the rate.
//! - `POST /requeue` takes a JSON object (`Content-Type: application/json`):
//!   `{"source": "stripe", "id": "evt_1"}` for one event (processed ones too: replay),
//!   `{"dead": true}` for every dead row, `"type"` and an RFC 3339 receipt window
//!   (`"received_from"`, at or after; `"received_before"`) to narrow either — or alone,
//!   every row of that type or window, processed ones included — and `{"all": true}` for
//!   every row. An empty object names nothing and is refused. Rows a worker is processing
//!   now are left to it. `{"invalid": true}` (alone) checks the invalid events again
//!   against the inbox's schemas ([`Inbox::requeue_invalid`]): `{"requeued": n,
//!   "still_invalid": m}`, the valid ones routed and run.
//! - `GET /events?state=invalid` (with `limit` and `after`): the events their type's
//!   schema refused, by source and id, each row with `"validation_errors"`
//!   (`[{"path", "message"}]`); `GET /events/{source}/{id}` of one has them too.
//! - `POST /pause` and `POST /resume` take `source` and `type`, each optional (absent:
//!   any; neither: the whole inbox). While paused, no worker starts a matching event;
//!   accepts go on. `changed` is `false` when it was paused (or not paused) already.
//! - Fan-out ([`Inbox::with_processors`]): `GET /events`, `POST /pause` and
//!   `POST /resume` take `processor` (absent: every processor) and `POST /requeue` a
//!   `"processor"` field, narrowing to that processor's routes (the others' are left as
//!   they are); a processor the inbox does not have is a 400. With more than one
//!   processor, `GET /counts` adds `"processors"` (each one's counts by name), listing
//!   rows and history entries carry `"processor"`, `GET /events/{source}/{id}` adds
//!   `"routes"`: `[{"processor", "state", "attempts", "last_error", "next_attempt_at",
//!   "processed_at", "dead_at"}, …]` (its top-level state is its most urgent route's),
//!   and `GET /pauses` rows of one processor carry `"processor"`. With one, every answer
//!   is as above. `GET /counts` counts orphaned processors too (routes of a processor the
//!   inbox is no longer configured with, left out of the sum) and names them in
//!   `"orphaned": [names]`, only when there are any ([`Inbox::drop_processor`]).
//! - `POST /backfill` takes `{"processor": name, "received_from"?, "received_before"?}`
//!   (an RFC 3339 receipt window, each end optional) and makes that processor's routes of
//!   the events in the window it has none of and its filter takes: `{"created": n}`, 0
//!   the second time; a processor the inbox does not have is a 400.
//! - `POST /rekey` (feature `seal`) takes `{"batch"?: 1..10000}` (`{}`: 100) and rewrites
//!   what older keys sealed, or what was stored in clear, under the inbox's current key
//!   ([`Inbox::rekey`]): `{"rekeyed": n, "unreadable": m}`, `m` values no configured key
//!   opens (left as they are). 409 when the inbox has no keys. It runs to the end before
//!   answering; stopped (a timeout, a restart), the next call finishes what is left.
//!
//! Times are RFC 3339 in UTC. Failures are `{"error": "<a fixed short message>"}`: 400
//! for input that does not parse or is out of range (unknown parameters and fields
//! included, and input the database refused), 404 for an unknown event or endpoint, 405
//! for a wrong method, 409 for a rekey without keys, 503 when the database did not answer, 500 when it failed otherwise
//! (its error goes to `tracing`, never into the response). The response carries an
//! [`AdminError`] in its extensions.
//!
//! # Security
//!
//! **The router does no authorization of its own. Never expose it unauthenticated.**
//! `GET /events/{source}/{id}` returns raw webhook payloads: your customers' data (names,
//! addresses, payment details). `POST /requeue` runs your processor again on events it
//! already handled. Mount it behind a door: the crate's [`OperatorDoor`], built from the
//! operators' token (at least 16 bytes, compared in constant time, wrong tries
//! throttled per address), whose [`bearer`](OperatorDoor::bearer) layer lets through
//! `Authorization: Bearer <token>` only — best on a listener of its own, bound to an
//! internal interface (a second `axum::serve` on `127.0.0.1` or a private network)
//! rather than beside the public webhook route:
//!
//! ```
//! use axum::body::Body;
//! use axum::http::{self, header, StatusCode};
//! use axum::Router;
//! use tower::ServiceExt as _;
//! use tower_webhook::admin::{self, OperatorDoor};
//! use tower_webhook::inbox::Inbox;
//! use tower_webhook::store::SqliteStore;
//!
//! # fn token_from_your_secret_store() -> String { "kX9f2c7b1e0a4d6f8e3b5a7c9d1f3e5a".into() }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = std::env::temp_dir().join(format!("tower-webhook-admin-doc-{}.db", std::process::id()));
//! let inbox = Inbox::sqlite(&SqliteStore::open(&path).await?);
//! let token = token_from_your_secret_store();
//! let door = OperatorDoor::new(&token)?; // a ConfigError under 16 bytes
//! let app: Router = Router::new()
//!     // .route("/webhooks", …): the rest of your application
//!     .nest("/admin", admin::router(inbox).layer(door.bearer()));
//!
//! let ask = |token: &str| {
//!     http::Request::get("/admin/counts")
//!         .header(header::AUTHORIZATION, format!("Bearer {token}"))
//!         .body(Body::empty())
//! };
//! assert_eq!(app.clone().oneshot(ask("a guess")?).await?.status(), StatusCode::UNAUTHORIZED);
//! assert_eq!(app.oneshot(ask(&token)?).await?.status(), StatusCode::OK);
//! # let _ = std::fs::remove_file(&path);
//! # Ok(())
//! # }
//! ```
//!
//! Serve the application with `into_make_service_with_connect_info::<SocketAddr>()`, so
//! the door counts wrong tries per client address (without it, all clients share one
//! count). A layer applied to the router covers every route of it, its 404 fallback
//! included. An identity-aware proxy or mTLS in front of an internal listener does as
//! well. `POST /requeue` requires `Content-Type: application/json`, which a browser's
//! cross-site form cannot send without a CORS preflight; even so, if your authorization
//! is a cookie, add CSRF protection.
//!
//! The same calls from a shell: the `tower-webhook` command (feature `cli`); in a
//! browser: [`ui`] (feature `admin-ui`), a web page to mount beside this router.
//!
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`router`]: crate#features\n[`Inbox::counts`]: crate#features\n[`Inbox::list`]: crate#features\n[`Inbox::event`]: crate#features\n[`Inbox::processed_per_minute`]: crate#features\n[`Inbox::requeue_counted`]: crate#features\n[`Inbox::pause`]: crate#features\n[`Inbox::resume`]: crate#features\n[`Inbox::pauses`]: crate#features\n[`Inbox::backfill`]: crate#features\n[`Inbox::erase`]: crate#features\n[`Inbox::requeue_invalid`]: crate#features\n[`Inbox::with_processors`]: crate#features\n[`Inbox::drop_processor`]: crate#features"
)]
#![cfg_attr(
    not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
    doc = "[`ui`]: crate#features"
)]
#![cfg_attr(feature = "seal", doc = "[`Inbox::rekey`]: crate::inbox::Inbox::rekey")]
#![cfg_attr(not(feature = "seal"), doc = "[`Inbox::rekey`]: crate#features")]
#![cfg_attr(
    feature = "seal",
    doc = "[`Inbox::erase_subject`]: crate::inbox::Inbox::erase_subject"
)]
#![cfg_attr(
    not(feature = "seal"),
    doc = "[`Inbox::erase_subject`]: crate#features"
)]

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "nats"))]
mod backfill; // `POST /backfill`'s body, the SQL inbox's and JetStream's
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "nats"))]
mod counts; // `GET /counts`: the sum, and each processor's
mod door; // who may operate: the token, the throttle, the page's sessions
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod erasure; // `DELETE /events/{source}/{id}/body`, `POST /erase`: bodies erased on request
mod error;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod input; // what the SQL inbox's endpoints accept
#[cfg(feature = "nats")]
mod jetstream; // a JetStream inbox's endpoints
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "nats"))]
mod pause; // counts and pausing, the SQL inbox's and JetStream's
#[cfg(all(feature = "seal", any(feature = "sqlite", feature = "postgres")))]
mod rekey; // `POST /rekey`: rotation's last step
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod routes; // the SQL inbox's endpoints
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
mod ui; // the operator's web page

pub use self::door::{
    Bearer, BearerLayer, OperatorDoor, OperatorToken, ResponseFuture, MIN_TOKEN_BYTES,
};
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
pub use self::door::{SignIn, SignInLayer};
pub use self::error::{AdminError, AdminErrorKind};

#[cfg(all(doc, any(feature = "sqlite", feature = "postgres")))]
use crate::inbox::Inbox;

/// The operator endpoints over `inbox` (the table in the [module docs](self)), to mount
/// under a prefix with [`Router::nest`](axum::Router::nest) behind the
/// [`OperatorDoor`]'s [`bearer`](OperatorDoor::bearer) layer (or your own authorization).
/// Cloning the inbox shares it: the router and your workers use one pool.
///
/// # Security
///
/// No authorization of its own, and it serves raw webhook payloads: see the
/// [module docs](self#security).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn router(inbox: crate::inbox::Inbox) -> axum::Router {
    routes::router(inbox)
}

/// The operator's web page over `inbox` (feature `admin-ui`): HTML to browse and fix the
/// inbox, mounted beside [`router`] with
/// [`Router::nest_service`](axum::Router::nest_service), behind the
/// [`OperatorDoor`]'s [`sign_in`](OperatorDoor::sign_in) (a browser opens
/// `/admin/ui?token=<token>` once and holds a session cookie; every page then has a
/// "Sign out" button) or your own authorization.
///
/// It answers, under wherever you mount it (`/admin/ui` below):
///
/// | page | what it shows or does |
/// |---|---|
/// | `GET /` | counts by state, the oldest due event's wait, failing and dead events by source, the processing rate, what is paused (resume buttons) and a form to pause a source or type |
/// | `GET /events?state=failing\|dead` | failing or dead events, filtered by `source`, `type` and a receipt window (`from`, `before`), 50 a page (`after`: the next page) |
/// | `GET /event?source=…&id=…` | one event: its state, fields, last error, and its body as text (JSON indented; `view=raw` as received, `view=base64`); `id` alone looks in the sources with failing, dead or paused events |
/// | `POST /requeue` | requeues one event (`source`, `id`) |
/// | `POST /requeue-matching` | requeues a `type`, a window (`from`, `before`), `dead` only: first a count, then `confirm=yes` |
/// | `POST /pause`, `POST /resume` | pauses or resumes a `source`, a `type`, or both |
/// | `POST /delete-dead` | deletes events dead for more than `hours`, of `source` and `type` where given ([`Inbox::delete_dead`]): first a count, then `confirm=yes` |
///
/// The pages, their stylesheet and a small script (it refreshes the overview's counts
/// every 10 s; everything works without it) are compiled into the crate: nothing is
/// fetched from elsewhere. Times are shown and read in UTC.
///
/// ```
/// use axum::Router;
/// use tower_webhook::admin::{self, OperatorDoor};
/// use tower_webhook::inbox::Inbox;
/// use tower_webhook::store::SqliteStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("tower-webhook-ui-doc-{}.db", std::process::id()));
/// let inbox = Inbox::sqlite(&SqliteStore::open(&path).await?);
/// let door = OperatorDoor::new("kX9f2c7b1e0a4d6f8e3b5a7c9d1f3e5a")?;
/// let operators: Router = Router::new()
///     // `nest_service` answers `/admin/ui/` too (`nest` does not)
///     .nest_service("/admin/ui", admin::ui(inbox.clone()).layer(door.sign_in()))
///     .nest("/admin", admin::router(inbox).layer(door.bearer()));
/// # let _ = std::fs::remove_file(&path);
/// # let _ = operators;
/// # Ok(())
/// # }
/// ```
///
/// # Security
///
/// **No authorization of its own**: it shows raw webhook payloads and requeues events,
/// as [`router`] does (see the [module docs](self#security)); mount it behind the door's
/// [`sign_in`](OperatorDoor::sign_in) or your own.
/// Beyond that it is safe in a browser by default:
///
/// - every POST is refused (403) when the browser says it came from another site
///   (`Sec-Fetch-Site`, else `Origin` against `Host`): a page elsewhere cannot make an
///   operator's browser requeue, pause or delete, whatever cookie authorizes it;
/// - every value is escaped, and a body is shown as text: a stored body holding
///   `<script>` is printed, never run; and every response carries a strict
///   `Content-Security-Policy` (the page's own stylesheet and script only, no inline
///   script, no framing), `X-Content-Type-Options: nosniff`, `Referrer-Policy:
///   no-referrer` and `Cache-Control: no-store`;
/// - it shows no secret: the inbox keeps none (signing secrets stay in the verifier).
///
/// Failures are pages with the status [`router`] would answer (a 403 for a cross-site
/// POST), with an [`AdminError`] in the response's extensions.
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
pub fn ui(inbox: crate::inbox::Inbox) -> axum::Router {
    ui::router(inbox)
}

/// The operator endpoints a JetStream inbox has: `GET /counts`, `POST /pause`,
/// `POST /resume` and `GET /pauses`, as in the table above (see
/// [`JetStream::pause`](crate::inbox::jetstream::JetStream::pause)), and for fan-out
/// ([`with_processors`](crate::inbox::jetstream::JetStreamBuilder::with_processors)):
/// `/counts` adds `"processors": {"<name>": {…the same counts…}}` when more than one is
/// configured, `/pause` and `/resume` take `processor` (absent: every processor; one not
/// configured is a 400), and `POST /backfill` with the JSON body `{"processor": name,
/// "received_from"?, "received_before"?}` (RFC 3339) runs
/// [`JetStream::backfill`](crate::inbox::jetstream::JetStream::backfill) and answers
/// `{"created": n}` (400 for a processor not configured). With the feature `schemas`
/// (a stream [`with_schemas`](crate::inbox::jetstream::JetStreamBuilder)), its invalid
/// events as the SQL inbox's: `GET /events?state=invalid` (with `limit=1..1000`, default
/// 50, and `after=<next>`) lists the messages of `<stream>-invalid`, oldest first, each
/// row as `router`'s with `"state": "invalid"`, `"attempts": 0` and `"validation_errors"`
/// (`[{"path", "message"}]`), and `POST /requeue {"invalid": true}` checks them again
/// against the schemas (`JetStream::requeue_invalid`): `{"requeued": n,
/// "still_invalid": m}`; another state or requeue is a 400. Its other events are listed
/// and requeued with NATS's own tools. Mount it as [`router`]'s, behind the door's
/// [`bearer`](OperatorDoor::bearer) or your own authorization.
///
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`router`]: crate#features"
)]
#[cfg(feature = "nats")]
pub fn jetstream_router(jetstream: crate::inbox::jetstream::JetStream) -> axum::Router {
    jetstream::router(jetstream)
}

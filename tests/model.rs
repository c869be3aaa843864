//! The reference models, run side by side with every real store.
//!
//! - [`dedupe_store`] (model A): the `DedupeStore` contract — claim, renew, complete,
//!   release, prune, fencing tokens, lease expiry, `Once` keys beside event keys — on
//!   memory, SQLite, PostgreSQL and Redis;
//! - [`inbox`] (model B): the SQL inbox — accept, the worker's claims and outcomes,
//!   attempts, backoff, dead rows, requeue, a late outcome fenced out, claims, renewals
//!   and outcomes answered past two thirds of the lease — on SQLite and PostgreSQL, with
//!   one processor or three (fan-out: a worker each, at once; one with a type filter, one
//!   with a predicate; per-route scripts, crashes, requeues of a route or of one
//!   processor's dead; every route's state, attempts, calls and effects exact), and with
//!   a key ring on the inbox (feature `seal`: SQLite with one processor, PostgreSQL with
//!   three; the same states, each body read back whole under the ring's key);
//! - [`layer`] (model C): `DedupeLayer` end to end behind a fault wrapper over every
//!   store, checked against README's Guarantees table, and a storm per store;
//! - [`crash`] (model C′): `DedupeLayer` across process crashes (a runtime of its own
//!   shut down mid-handler, a new one on the same store), on every store;
//! - [`jetstream`] (model D): `JetStreamWorker` on the real NATS server, its
//!   consumer-side claim on every store behind the fault wrapper, with one processor or
//!   three (fan-out, one with a type filter; a route per admitted event and processor):
//!   duplicates inside and past the stream's duplicate window, processors that fail,
//!   panic or outlive the lease, store faults (answers past two thirds of the lease among
//!   them), pauses of one processor or all, one processor's worker aborted mid-event and
//!   replaced, `counts_by_processor`;
//! - [`once`] (model E): `Once::run` on every store behind the fault wrapper: concurrent
//!   callers, actions that fail, panic or outlive the lease, callers dropped mid-run;
//!   [`once_in`] (model E′): `Once::run_in` in the event's PostgreSQL transaction;
//! - [`latest`] (model F): the ordering guard `latest::advance` on SQLite and PostgreSQL,
//!   sequential and concurrent, commits and rollbacks, against the newest time per
//!   (namespace, object);
//! - [`order`] (model H): `with_per_object(1)` — one object's events one at a time, in
//!   arrival order — across failures, snoozes, crashes and graceful restarts, on SQLite,
//!   PostgreSQL and JetStream;
//! - [`clock`] (model G): clock jumps where the crate's clock can be replaced — SQLite's
//!   leases and the verifier's timestamp tolerance (PostgreSQL and Redis lease on the
//!   server's clock, which a test cannot step).
//!
//! `proptest-state-machine` drives them: a reference state machine beside the system
//! under test, random operation sequences, and shrinking to a minimal failing sequence
//! (chosen over a deterministic simulation because the stores under test are real
//! servers on real clocks, which a simulator cannot own).
//!
//! Each test prints its seed; `TOWER_WEBHOOK_MODEL_SEED=<seed>` replays it,
//! `TOWER_WEBHOOK_MODEL_CASES=<n>` runs n cases per store, `TOWER_WEBHOOK_SOAK=1` ten
//! times the CI budget. Failures are kept in `tests/proptest-regressions/` and replayed
//! first on every run. RELIABILITY.md has the figures.

mod common;

#[path = "model/clock.rs"]
mod clock;
#[path = "model/crash.rs"]
mod crash;
#[path = "model/dedupe_store.rs"]
mod dedupe_store;
#[path = "model/inbox.rs"]
mod inbox;
#[path = "model/jetstream.rs"]
mod jetstream;
#[path = "model/latest.rs"]
mod latest;
#[path = "model/layer.rs"]
mod layer;
#[path = "model/once.rs"]
mod once;
#[path = "model/once_in.rs"]
mod once_in;
#[path = "model/order.rs"]
mod order;
#[path = "model/run.rs"]
mod run;

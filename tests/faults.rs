//! Exactly once under every fault: deterministic fault injection around the memory store.
//!
//! [`FaultStore`] (in `tests/common`, generic over the store) wraps a [`MemoryStore`] here and, on a script set per operation (claim,
//! renew, complete, release), fails a call, lets it land only once a [`Gate`] the test
//! holds opens, answers it only once the gate opens (the effect has landed), or lets it
//! land and loses the acknowledgement. It counts the calls per operation. Gates, not
//! sleeps, decide where each test stands; the only real time is the stores' wall-clock
//! leases, and every wait on it is a bounded polling loop.
//!
//! What it proves, for `DedupeLayer` (statuses and handler runs) and for `Once::run`
//! (outcomes and action runs):
//!
//! - dropping the caller's future at every await point — while the claim is answered
//!   late, before a claim lands, while the handler runs, while a renewal is on the wire,
//!   before "done" lands, while the answer to "done" is late — never runs the effect
//!   twice, never loses it: across the dropped attempt and the redeliveries it runs
//!   exactly once (a redelivery gets 204 / `Ran::Already` if it had started, and runs it
//!   if it had not);
//! - a completion whose acknowledgement was lost is retried and answered as done: a 2xx
//!   with no [`ClaimLost`], and the redelivery is a 204;
//! - a completion the store never hears before the lease ends is reported
//!   (`ClaimLost::Unrecorded`, `Ran::Lost`), and the key frees itself with the lease;
//! - renewals keep a claim for many leases; without them, a redelivery takes the key over
//!   after the lease and the first attempt's response says so (`ClaimLost::TakenOver`);
//! - a failing claim is a 503 with `Retry-After` (a `OnceError` of kind `Store`) and runs nothing;
//!   a claim whose acknowledgement was lost is released at once, not left to its lease;
//!   a failing release leaves the key to its lease;
//! - the memory store completes idempotently under one token and fences a stale renewal.

mod common;

use std::fmt::Debug;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::fault_store::{Fault, FaultStore, Gate, Op};
use common::{at, request, verifier, NOW};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::ClaimLost;
use tower_webhook::once::{IdempotencyKey, Once, OnceErrorKind, Ran};
use tower_webhook::response::{Rejection, RejectionKind};
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, MemoryStore, Renewed, StoreErrorKind, Token,
};
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const EVENT_ID: &str = "evt_fault";
const ORDER: &str = "order-7";
/// The bound on every wait: far above what a step takes, and it keeps a test that hangs
/// from hanging the suite.
const BOUND: Duration = Duration::from_secs(2);
/// A lease no test outlives: a claim that is not released by hand stays put.
const LONG_LEASE: Duration = Duration::from_secs(60);

// The faulty store: [`common::fault_store`], around a [`MemoryStore`] here.

// ---- helpers ----

/// `future`, or a panic naming `what` after [`BOUND`].
async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(BOUND, future).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: not within {BOUND:?}"),
    }
}

/// Waits until the abandoned claim of a future dropped mid-claim has been released (the
/// release runs on a task of its own once the claim's answer comes).
async fn abandoned_claim_released(store: &FaultStore) {
    within("the abandoned claim to be released", async {
        while store.calls(Op::Release) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Polls `future` until `point` is reached, then drops it there: a client that hung up, a
/// timeout that fired, a worker stopped mid-event.
async fn drop_at<F>(future: F, point: impl Future<Output = ()>)
where
    F: Future,
    F::Output: Debug,
{
    let mut future = pin!(future);
    within("reaching the drop point", async {
        tokio::select! {
            biased;
            () = point => {}
            output = &mut future => panic!("finished before the drop point: {output:?}"),
        }
    })
    .await;
    // `future` is dropped here, mid-flight.
}

/// Where a caller's future is dropped, and what the first attempt waits on there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    /// The claim has landed; its answer is late.
    ClaimAnswer,
    /// The claim is on the wire and has not landed.
    ClaimLanding,
    /// The handler (action) has started and runs.
    Work,
    /// The handler runs and a renewal of its claim is on the wire.
    Renew,
    /// The handler has succeeded; "done" is on the wire and has not landed.
    CompleteLanding,
    /// The handler has succeeded; "done" has landed, its answer is late.
    CompleteAnswer,
}

impl Point {
    /// Whether the effect had started when the future was dropped.
    fn started(self) -> bool {
        !matches!(self, Point::ClaimAnswer | Point::ClaimLanding)
    }

    /// Long, so a claim left behind would block every redelivery of the test; short
    /// where a renewal must come soon.
    fn lease(self) -> Duration {
        match self {
            Point::Renew => Duration::from_millis(600),
            _ => LONG_LEASE,
        }
    }

    /// The gate the first attempt's handler (action) waits on.
    fn work(self, stall: &Gate) -> Gate {
        match self {
            Point::Work => stall.clone(),
            Point::Renew => Gate::closed(),
            _ => Gate::opened(),
        }
    }

    /// Arms `store` so the first attempt's call at this point stops on `stall`.
    fn arm(self, store: &FaultStore, stall: &Gate) {
        let (op, fault) = match self {
            Point::ClaimAnswer => (Op::Claim, Fault::AnswerLate(stall.clone())),
            Point::ClaimLanding => (Op::Claim, Fault::LandLate(stall.clone())),
            Point::Work => return,
            Point::Renew => (Op::Renew, Fault::LandLate(stall.clone())),
            Point::CompleteLanding => (Op::Complete, Fault::LandLate(stall.clone())),
            Point::CompleteAnswer => (Op::Complete, Fault::AnswerLate(stall.clone())),
        };
        store.script(op, [fault]);
    }
}

// ---- DedupeLayer ----

type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, std::io::Error>;

/// Verify + dedupe on a [`FaultStore`] + a handler that counts its runs as it starts and
/// obeys `x-behave`: `ok`, `wait` (until the `work` gate opens), `fail` (a 500).
struct Webhooks {
    store: FaultStore,
    svc: Svc,
    effects: Arc<AtomicUsize>,
    work: Gate,
}

impl Webhooks {
    fn new(lease: Duration, work: Gate) -> Self {
        let store = FaultStore::new();
        let effects = Arc::new(AtomicUsize::new(0));
        let handler = service_fn({
            let (effects, work) = (effects.clone(), work.clone());
            move |req: Request<Full<Bytes>>| {
                let (effects, work) = (effects.clone(), work.clone());
                async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    assert!(req.extensions().get::<Event>().is_some(), "verified first");
                    match req.headers()["x-behave"].to_str().unwrap() {
                        "wait" => work.pass().await,
                        "fail" => {
                            return Ok::<_, std::io::Error>(
                                Response::builder()
                                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                        _ => {}
                    }
                    Ok(Response::new(Full::new(Bytes::from_static(b"handled"))))
                }
            }
        });
        let svc = ServiceBuilder::new()
            .layer(VerifyWebhookLayer::new(verifier(
                Scheme::standard(),
                &[SECRET],
            )))
            .layer(
                DedupeLayer::from_arc(Arc::new(store.clone()))
                    .with_lease(lease)
                    .unwrap(),
            )
            .service(handler);
        type Body = tower_webhook::response::ResponseBody<
            tower_webhook::response::ResponseBody<Full<Bytes>>,
        >;
        let svc = BoxCloneSyncService::new(ServiceExt::<Request<Full<Bytes>>>::then(
            svc,
            |result: Result<Response<Body>, std::io::Error>| async move {
                let (parts, body) = result?.into_parts();
                let bytes = body.collect().await.expect("a whole body").to_bytes();
                Ok(Response::from_parts(parts, bytes))
            },
        ));
        Self {
            store,
            svc,
            effects,
            work,
        }
    }

    /// A signed delivery of the test's event, sent; `'static`, to be spawned or dropped.
    fn send(&self, behave: &'static str) -> impl Future<Output = Response<Bytes>> + Send {
        let body = format!(r#"{{"type":"order.paid","data":{{"id":"{EVENT_ID}"}}}}"#);
        let mut headers: HeaderMap = Scheme::standard()
            .sign([SECRET], EVENT_ID, at(NOW), body.as_bytes())
            .unwrap();
        headers.insert("x-behave", HeaderValue::from_static(behave));
        let svc = self.svc.clone();
        async move { svc.oneshot(request(headers, body)).await.unwrap() }
    }

    /// Redelivers until the answer is no longer 409 (the key is no longer held).
    async fn settle(&self) -> Response<Bytes> {
        within("the key to be let go", async {
            loop {
                let response = self.send("ok").await;
                if response.status() != StatusCode::CONFLICT {
                    return response;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }
}

/// Drops a delivery's response future at `point`, then redelivers: while the first
/// attempt is stalled there, and after it goes on.
async fn dedupe_dropped_at(point: Point) {
    let stall = Gate::closed();
    let work = point.work(&stall);
    let hooks = Webhooks::new(point.lease(), work.clone());
    point.arm(&hooks.store, &stall);

    drop_at(hooks.send("wait"), stall.arrived(1)).await;
    let started = usize::from(point.started());
    assert_eq!(
        hooks.effects(),
        started,
        "{point:?}: started before the drop?"
    );

    // A redelivery while the dropped attempt is still stalled there.
    let meanwhile = hooks.send("ok").await.status();
    let expected = match point {
        // The claim landed (its answer is late): the key is held.
        Point::ClaimAnswer => StatusCode::CONFLICT,
        // Nothing landed: the redelivery claims the key and runs the handler.
        Point::ClaimLanding => StatusCode::OK,
        // The handler runs (or "done" has not landed): the key is held.
        Point::Work | Point::Renew | Point::CompleteLanding => StatusCode::CONFLICT,
        // "Done" landed: the event is handled.
        Point::CompleteAnswer => StatusCode::NO_CONTENT,
    };
    assert_eq!(meanwhile, expected, "{point:?}: redelivered while stalled");

    stall.open();
    work.open();
    if !point.started() {
        abandoned_claim_released(&hooks.store).await;
    }
    let after = hooks.settle().await;
    let expected = match point {
        // The dropped attempt's claim was released: the handler runs now, once.
        Point::ClaimAnswer => StatusCode::OK,
        _ => StatusCode::NO_CONTENT,
    };
    assert_eq!(after.status(), expected, "{point:?}: redelivered after");
    assert_eq!(
        hooks.send("ok").await.status(),
        StatusCode::NO_CONTENT,
        "{point:?}: and once more"
    );
    assert_eq!(
        hooks.effects(),
        1,
        "{point:?}: the handler ran exactly once"
    );
}

#[tokio::test]
async fn dedupe_dropped_while_the_claim_answer_is_late_releases_it_and_the_redelivery_runs_once() {
    dedupe_dropped_at(Point::ClaimAnswer).await;
}

#[tokio::test]
async fn dedupe_dropped_before_the_claim_lands_lets_the_redelivery_run_once_and_the_late_claim_changes_nothing(
) {
    dedupe_dropped_at(Point::ClaimLanding).await;
}

#[tokio::test]
async fn dedupe_dropped_while_the_handler_runs_finishes_it_and_never_reruns_it() {
    dedupe_dropped_at(Point::Work).await;
}

#[tokio::test]
async fn dedupe_dropped_while_a_renewal_is_on_the_wire_never_reruns_the_handler() {
    dedupe_dropped_at(Point::Renew).await;
}

#[tokio::test]
async fn dedupe_dropped_before_done_lands_still_records_it_and_never_reruns_the_handler() {
    dedupe_dropped_at(Point::CompleteLanding).await;
}

#[tokio::test]
async fn dedupe_dropped_while_the_done_answer_is_late_never_reruns_the_handler() {
    dedupe_dropped_at(Point::CompleteAnswer).await;
}

#[tokio::test]
async fn dedupe_complete_whose_ack_was_lost_is_retried_and_answers_2xx_without_claim_lost() {
    let hooks = Webhooks::new(LONG_LEASE, Gate::opened());
    hooks.store.script(Op::Complete, [Fault::LoseAck]);
    let response = within("the handler's answer", hooks.send("ok")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "handled");
    assert_eq!(response.extensions().get::<ClaimLost>(), None);
    assert_eq!(
        hooks.store.calls(Op::Complete),
        2,
        "the lost acknowledgement, then the retry"
    );
    let again = hooks.send("ok").await;
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        again.extensions().get::<Rejection>().map(Rejection::kind),
        Some(RejectionKind::Duplicate)
    );
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_complete_failing_until_the_lease_ends_reports_unrecorded_and_the_key_frees_itself()
{
    let lease = Duration::from_millis(300);
    let hooks = Webhooks::new(lease, Gate::opened());
    hooks.store.always(Op::Complete, Fault::Fail);
    let response = within("the handler's answer", hooks.send("ok")).await;
    assert_eq!(response.status(), StatusCode::OK, "the handler's own 2xx");
    assert_eq!(
        response.extensions().get::<ClaimLost>(),
        Some(&ClaimLost::Unrecorded)
    );
    assert!(
        hooks.store.calls(Op::Complete) >= 2,
        "retried while the lease lasted: {}",
        hooks.store.calls(Op::Complete)
    );
    // As `Unrecorded` says: nothing is done, the key frees itself with its lease, and a
    // later redelivery runs the handler again.
    hooks.store.heal(Op::Complete);
    let retried = hooks.settle().await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(retried.extensions().get::<ClaimLost>(), None);
    assert_eq!(hooks.effects(), 2);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn dedupe_without_renewals_a_redelivery_takes_over_after_the_lease_and_the_first_reports_taken_over(
) {
    let lease = Duration::from_millis(300);
    let hooks = Webhooks::new(lease, Gate::closed());
    hooks.store.always(Op::Renew, Fault::Fail);
    let first = tokio::spawn(hooks.send("wait"));
    within("the first handler to start", hooks.work.arrived(1)).await;
    assert_eq!(
        hooks.send("ok").await.status(),
        StatusCode::CONFLICT,
        "held while the lease lasts"
    );
    // The store hears no renewal: once the lease runs out, a redelivery takes the key.
    let second = hooks.settle().await;
    assert_eq!(second.status(), StatusCode::OK, "taken over");
    assert_eq!(second.extensions().get::<ClaimLost>(), None);
    assert!(hooks.store.calls(Op::Renew) >= 1, "renewals were tried");
    assert_eq!(hooks.effects(), 2);

    hooks.work.open();
    let first = within("the first handler's answer", first).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK, "the handler's own 2xx");
    assert_eq!(
        first.extensions().get::<ClaimLost>(),
        Some(&ClaimLost::TakenOver)
    );
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 2);
}

#[tokio::test]
async fn dedupe_renewals_keep_the_claim_for_four_leases_so_duplicates_get_409_and_it_runs_once() {
    let lease = Duration::from_millis(400);
    let hooks = Webhooks::new(lease, Gate::closed());
    let first = tokio::spawn(hooks.send("wait"));
    within("the handler to start", hooks.work.arrived(1)).await;
    let until = Instant::now() + lease * 4;
    let mut duplicates = 0;
    while Instant::now() < until {
        let duplicate = hooks.send("ok").await;
        assert_eq!(
            duplicate.status(),
            StatusCode::CONFLICT,
            "after {duplicates}"
        );
        assert!(duplicate.headers().contains_key("retry-after"));
        duplicates += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(duplicates >= 4, "{duplicates}");
    assert!(
        hooks.store.calls(Op::Renew) >= 4,
        "renewed every third of the lease: {}",
        hooks.store.calls(Op::Renew)
    );
    hooks.work.open();
    let first = within("the handler's answer", first).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.extensions().get::<ClaimLost>(), None);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_a_renewal_outage_shorter_than_the_lease_never_costs_the_claim() {
    // Two renewals in a row go unanswered: retried at once with a short backoff, the
    // claim is renewed well before its lease ends, and no duplicate ever takes it over.
    let lease = Duration::from_millis(600);
    let hooks = Webhooks::new(lease, Gate::closed());
    hooks.store.script(Op::Renew, [Fault::Fail, Fault::Fail]);
    let first = tokio::spawn(hooks.send("wait"));
    within("the handler to start", hooks.work.arrived(1)).await;
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        assert_eq!(hooks.send("ok").await.status(), StatusCode::CONFLICT);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        hooks.store.calls(Op::Renew) >= 3,
        "two failed, then retried"
    );
    hooks.work.open();
    let first = within("the handler's answer", first).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.extensions().get::<ClaimLost>(), None);
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_a_done_slower_than_the_lease_keeps_the_claim_renewed_so_no_retry_runs_beside_it() {
    let lease = Duration::from_millis(300);
    let hooks = Webhooks::new(lease, Gate::opened());
    let slow_done = Gate::closed();
    hooks
        .store
        .script(Op::Complete, [Fault::LandLate(slow_done.clone())]);
    let first = tokio::spawn(hooks.send("ok"));
    within("done to be on the wire", slow_done.arrived(1)).await;
    // "done" takes four leases to land; the renewals go on and hold the key meanwhile.
    let until = Instant::now() + lease * 4;
    while Instant::now() < until {
        let retry = hooks.send("ok").await;
        assert_eq!(
            retry.status(),
            StatusCode::CONFLICT,
            "held while done lands"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        hooks.store.calls(Op::Renew) >= 3,
        "renewed while done was on the wire"
    );
    slow_done.open();
    let first = within("the handler's answer", first).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.extensions().get::<ClaimLost>(), None);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_claim_failing_is_a_503_with_retry_after_and_the_handler_never_runs() {
    let hooks = Webhooks::new(LONG_LEASE, Gate::opened());
    hooks.store.always(Op::Claim, Fault::Fail);
    for _ in 0..3 {
        let response = hooks.send("ok").await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "5");
        assert_eq!(
            response
                .extensions()
                .get::<Rejection>()
                .map(Rejection::kind),
            Some(RejectionKind::StoreUnavailable)
        );
    }
    assert_eq!(hooks.store.calls(Op::Claim), 3);
    assert_eq!(hooks.effects(), 0);
    // The store is back: the provider's retry runs the handler, once.
    hooks.store.heal(Op::Claim);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::OK);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_claim_refused_as_invalid_input_is_a_500_without_retry_after_and_the_handler_never_runs(
) {
    let hooks = Webhooks::new(LONG_LEASE, Gate::opened());
    hooks.store.always(Op::Claim, Fault::Refuse);
    let response = hooks.send("ok").await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(
        response
            .extensions()
            .get::<Rejection>()
            .map(Rejection::kind),
        Some(RejectionKind::StoreRefused)
    );
    assert_eq!(response.body(), "webhook store refused the event");
    assert_eq!(hooks.store.calls(Op::Claim), 1);
    assert_eq!(hooks.effects(), 0);
}

#[tokio::test]
async fn dedupe_claim_whose_ack_was_lost_is_a_503_and_released_so_the_retry_runs_at_once() {
    let hooks = Webhooks::new(LONG_LEASE, Gate::opened());
    hooks.store.script(Op::Claim, [Fault::LoseAck]);
    let response = hooks.send("ok").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hooks.effects(), 0);
    // The claim landed under a 60 s lease; released, the retry runs well before that.
    let retried = hooks.settle().await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(hooks.store.calls(Op::Release) >= 1);
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
}

#[tokio::test]
async fn dedupe_release_failing_after_a_failed_handler_is_retried_while_the_lease_lasts() {
    let hooks = Webhooks::new(Duration::from_millis(300), Gate::opened());
    hooks.store.always(Op::Release, Fault::Fail);
    let failed = hooks.send("fail").await;
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.extensions().get::<ClaimLost>(), None);
    assert!(hooks.store.calls(Op::Release) >= 1);
    assert_eq!(
        hooks.send("ok").await.status(),
        StatusCode::CONFLICT,
        "not released yet: the store refuses"
    );
    hooks.store.heal(Op::Release);
    let retried = hooks.settle().await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(hooks.effects(), 2, "the failed attempt, then the retry");
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn dedupe_claim_whose_ack_was_lost_is_released_once_the_store_is_back() {
    // The outage that swallowed the claim's answer swallows the first releases too.
    let hooks = Webhooks::new(LONG_LEASE, Gate::opened());
    hooks.store.script(Op::Claim, [Fault::LoseAck]);
    hooks.store.script(Op::Release, [Fault::Fail, Fault::Fail]);
    let response = hooks.send("ok").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Released by the background retries well before the 60 s lease: the retry runs.
    let retried = hooks.settle().await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(
        hooks.store.calls(Op::Release) >= 3,
        "two failed, then one that landed"
    );
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
}

/// A claim that lands, then is answered only after its lease has run out (a slow
/// store), while a redelivery takes the free key, runs and completes it.
async fn claim_answered_after_its_lease_ran_out() -> (Webhooks, Response<Bytes>) {
    let hooks = Webhooks::new(Duration::from_millis(300), Gate::opened());
    let late = Gate::closed();
    hooks
        .store
        .script(Op::Claim, [Fault::AnswerLate(late.clone())]);
    let first = tokio::spawn(hooks.send("ok"));
    within("the first claim to land", late.arrived(1)).await;
    assert_eq!(hooks.send("ok").await.status(), StatusCode::CONFLICT);
    let second = hooks.settle().await;
    assert_eq!(second.status(), StatusCode::OK, "the lease ran out: taken");
    assert_eq!(hooks.send("ok").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(hooks.effects(), 1);
    late.open();
    let first = within("the late-answered attempt", first).await.unwrap();
    (hooks, first)
}

#[tokio::test]
async fn dedupe_claim_answered_after_its_lease_ran_out_never_reruns_the_handler_silently() {
    let (hooks, first) = claim_answered_after_its_lease_ran_out().await;
    if hooks.effects() > 1 {
        assert_eq!(
            first.extensions().get::<ClaimLost>(),
            Some(&ClaimLost::TakenOver),
            "a second run must say its claim was lost"
        );
    }
}

#[tokio::test]
async fn dedupe_claim_answered_after_its_lease_ran_out_does_not_run_the_handler() {
    let (hooks, first) = claim_answered_after_its_lease_ran_out().await;
    assert_eq!(
        hooks.effects(),
        1,
        "the late answer came after the lease: the key may be (and is) another's"
    );
    assert!(!first.status().is_success(), "{}", first.status());
}

// ---- Once ----

type Action = Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

/// An action that counts its runs as it starts, then waits for `gate` if given.
fn action(effects: &Arc<AtomicUsize>, gate: Option<Gate>) -> impl FnOnce(IdempotencyKey) -> Action {
    let effects = effects.clone();
    move |_key| {
        Box::pin(async move {
            effects.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = gate {
                gate.pass().await;
            }
            Ok(())
        })
    }
}

/// Runs again until the key is no longer in progress.
async fn settle_once(once: &Once, effects: &Arc<AtomicUsize>) -> Ran<()> {
    within("the key to be let go", async {
        loop {
            match once.run(ORDER, action(effects, None)).await {
                Ok(Ran::InProgress { .. }) => {}
                Ok(ran) => return ran,
                Err(e) => panic!("{e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Drops a `Once::run` future at `point`, then runs the key again: while the first
/// attempt is stalled there, and after it goes on.
async fn once_dropped_at(point: Point) {
    let store = FaultStore::new();
    let once = Once::new(store.clone(), "fulfil")
        .with_lease(point.lease())
        .unwrap();
    let effects = Arc::new(AtomicUsize::new(0));
    let stall = Gate::closed();
    let work = point.work(&stall);
    point.arm(&store, &stall);

    drop_at(
        once.run(ORDER, action(&effects, Some(work.clone()))),
        stall.arrived(1),
    )
    .await;
    let started = usize::from(point.started());
    assert_eq!(effects.load(Ordering::SeqCst), started, "{point:?}");

    let meanwhile = once.run(ORDER, action(&effects, None)).await.unwrap();
    match point {
        Point::ClaimAnswer | Point::Work | Point::Renew | Point::CompleteLanding => {
            assert!(
                matches!(meanwhile, Ran::InProgress { .. }),
                "{point:?}: {meanwhile:?}"
            );
        }
        Point::ClaimLanding => assert_eq!(meanwhile, Ran::Now(()), "{point:?}"),
        Point::CompleteAnswer => assert_eq!(meanwhile, Ran::Already, "{point:?}"),
    }

    stall.open();
    work.open();
    if !point.started() {
        abandoned_claim_released(&store).await;
    }
    let after = settle_once(&once, &effects).await;
    let expected = match point {
        Point::ClaimAnswer => Ran::Now(()),
        _ => Ran::Already,
    };
    assert_eq!(after, expected, "{point:?}");
    assert_eq!(
        once.run(ORDER, action(&effects, None)).await.unwrap(),
        Ran::Already,
        "{point:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "{point:?}: the action ran exactly once"
    );
}

#[tokio::test]
async fn once_dropped_while_the_claim_answer_is_late_releases_it_and_the_next_run_runs_once() {
    once_dropped_at(Point::ClaimAnswer).await;
}

#[tokio::test]
async fn once_dropped_before_the_claim_lands_lets_the_next_run_run_once_and_the_late_claim_changes_nothing(
) {
    once_dropped_at(Point::ClaimLanding).await;
}

#[tokio::test]
async fn once_dropped_while_the_action_runs_finishes_it_and_never_reruns_it() {
    once_dropped_at(Point::Work).await;
}

#[tokio::test]
async fn once_dropped_while_a_renewal_is_on_the_wire_never_reruns_the_action() {
    once_dropped_at(Point::Renew).await;
}

#[tokio::test]
async fn once_dropped_before_done_lands_still_records_it_and_never_reruns_the_action() {
    once_dropped_at(Point::CompleteLanding).await;
}

#[tokio::test]
async fn once_dropped_while_the_done_answer_is_late_never_reruns_the_action() {
    once_dropped_at(Point::CompleteAnswer).await;
}

#[tokio::test]
async fn once_complete_whose_ack_was_lost_is_retried_and_reports_ran_now() {
    let store = FaultStore::new();
    store.script(Op::Complete, [Fault::LoseAck]);
    let once = Once::new(store.clone(), "fulfil");
    let effects = Arc::new(AtomicUsize::new(0));
    let ran = within("the action", once.run(ORDER, action(&effects, None))).await;
    assert_eq!(
        ran.unwrap(),
        Ran::Now(()),
        "not Lost: the retry answered Done"
    );
    assert_eq!(store.calls(Op::Complete), 2);
    assert_eq!(
        once.run(ORDER, action(&effects, None)).await.unwrap(),
        Ran::Already
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn once_complete_failing_until_the_lease_ends_reports_ran_lost() {
    let store = FaultStore::new();
    store.always(Op::Complete, Fault::Fail);
    let once = Once::new(store.clone(), "fulfil")
        .with_lease(Duration::from_millis(300))
        .unwrap();
    let effects = Arc::new(AtomicUsize::new(0));
    let ran = within("the action", once.run(ORDER, action(&effects, None))).await;
    assert_eq!(ran.unwrap(), Ran::Lost(()));
    assert!(
        store.calls(Op::Complete) >= 2,
        "retried while the lease lasted"
    );
    store.heal(Op::Complete);
    assert_eq!(settle_once(&once, &effects).await, Ran::Now(()));
    assert_eq!(effects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn once_claim_failing_is_a_store_error_and_the_action_never_runs() {
    let store = FaultStore::new();
    store.script(Op::Claim, [Fault::Fail]);
    let once = Once::new(store.clone(), "fulfil");
    let effects = Arc::new(AtomicUsize::new(0));
    let failed = once.run(ORDER, action(&effects, None)).await;
    let failed = failed.unwrap_err();
    assert_eq!(failed.kind(), OnceErrorKind::Store, "{failed:?}");
    assert!(failed.action().is_none());
    assert_eq!(
        failed.store_error().unwrap().kind(),
        StoreErrorKind::Unavailable
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert_eq!(
        once.run(ORDER, action(&effects, None)).await.unwrap(),
        Ran::Now(())
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

// ---- the stores underneath ----

#[tokio::test]
async fn memory_store_completing_twice_under_one_token_answers_done_both_times() {
    let store = MemoryStore::new();
    let d = Delivery::new("standard", "evt_twice");
    let Claim::New(token) = store
        .claim(d.clone(), Token::new(), LONG_LEASE)
        .await
        .unwrap()
    else {
        panic!("a first claim is new")
    };
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done
    );
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done,
        "a retried completion under the same token"
    );
    assert_eq!(
        store.complete(d.clone(), Token::new()).await.unwrap(),
        Completed::Fenced,
        "but not under another token"
    );
    assert_eq!(
        store.claim(d, Token::new(), LONG_LEASE).await.unwrap(),
        Claim::Done
    );
}

#[tokio::test]
async fn memory_store_renewal_after_a_takeover_is_fenced() {
    let store = MemoryStore::new();
    let d = Delivery::new("standard", "evt_fenced");
    let old = Token::new();
    let lease = Duration::from_millis(50);
    assert_eq!(
        store.claim(d.clone(), old, lease).await.unwrap(),
        Claim::New(old)
    );
    assert_eq!(
        store.renew(d.clone(), old, lease).await.unwrap(),
        Renewed::Held
    );
    let new = Token::new();
    within("the old lease to run out", async {
        while !matches!(
            store.claim(d.clone(), new, LONG_LEASE).await.unwrap(),
            Claim::New(_)
        ) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        store.renew(d.clone(), old, LONG_LEASE).await.unwrap(),
        Renewed::Fenced
    );
    assert_eq!(
        store.complete(d.clone(), old).await.unwrap(),
        Completed::Fenced
    );
    store.release(d.clone(), old).await.unwrap();
    assert_eq!(
        store.renew(d.clone(), new, LONG_LEASE).await.unwrap(),
        Renewed::Held,
        "the stale attempt changed nothing"
    );
}

#[tokio::test]
async fn fault_store_injects_what_it_is_told() {
    let store = FaultStore::new();
    let d = |id: &str| Delivery::new("standard", id);
    store.script(
        Op::Claim,
        [Fault::Fail, Fault::LoseAck, Fault::LandLate(Gate::closed())],
    );
    assert!(store.claim(d("a"), Token::new(), LONG_LEASE).await.is_err());
    assert_eq!(store.inner().len(), 0, "a failed call changes nothing");
    assert!(store.claim(d("b"), Token::new(), LONG_LEASE).await.is_err());
    assert_eq!(store.inner().len(), 1, "a lost acknowledgement landed");
    let late = store.claim(d("c"), Token::new(), LONG_LEASE);
    assert_eq!(store.inner().len(), 1, "a late call has not landed yet");
    drop(late);
    assert_eq!(
        store.inner().len(),
        1,
        "dropped before its gate: never lands"
    );
    let gate = Gate::closed();
    store.script(Op::Claim, [Fault::AnswerLate(gate.clone())]);
    let mut answer = tokio::spawn(store.claim(d("e"), Token::new(), LONG_LEASE));
    within("the late answer to wait", gate.arrived(1)).await;
    assert_eq!(store.inner().len(), 2, "a late answer's call landed");
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut answer)
            .await
            .is_err(),
        "and waits for its gate"
    );
    gate.open();
    assert!(matches!(
        within("the late answer", answer).await.unwrap().unwrap(),
        Claim::New(_)
    ));
    assert_eq!(gate.arrivals(), 1);
    assert!(matches!(
        store.claim(d("f"), Token::new(), LONG_LEASE).await.unwrap(),
        Claim::New(_)
    ));
    assert_eq!(store.calls(Op::Claim), 5);
    store.always(Op::Renew, Fault::Fail);
    for _ in 0..2 {
        assert!(store.renew(d("f"), Token::new(), LONG_LEASE).await.is_err());
    }
    store.heal(Op::Renew);
    assert_eq!(
        store.renew(d("f"), Token::new(), LONG_LEASE).await.unwrap(),
        Renewed::Fenced
    );
    assert_eq!(store.calls(Op::Renew), 3);
}

#[tokio::test]
async fn once_a_done_slower_than_the_lease_keeps_the_claim_renewed_so_no_other_run_runs() {
    let lease = Duration::from_millis(300);
    let store = FaultStore::new();
    let once = Once::new(store.clone(), "fulfil")
        .with_lease(lease)
        .unwrap();
    let effects = Arc::new(AtomicUsize::new(0));
    let slow_done = Gate::closed();
    store.script(Op::Complete, [Fault::LandLate(slow_done.clone())]);
    let first = tokio::spawn({
        let (once, effects) = (once.clone(), effects.clone());
        async move { once.run(ORDER, action(&effects, None)).await }
    });
    within("done to be on the wire", slow_done.arrived(1)).await;
    let until = Instant::now() + lease * 4;
    while Instant::now() < until {
        let other = once.run(ORDER, action(&effects, None)).await.unwrap();
        assert!(matches!(other, Ran::InProgress { .. }), "{other:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    slow_done.open();
    let first = within("the first run", first).await.unwrap().unwrap();
    assert_eq!(first, Ran::Now(()));
    assert_eq!(settle_once(&once, &effects).await, Ran::Already);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

//! Rotation's rekey (issue 34 step 3, `docs/design/payload-protection.md` §9), on SQLite
//! and PostgreSQL, each on a fresh database:
//!
//! - rotation: accepted under k1, an inbox with [k2, k1] reads them, rekey rewrites every
//!   body (headers and subject with it) and error text and counts them, and then an
//!   inbox with k2 alone reads every event whole; a rerun has nothing to do;
//! - resumption: a rekey stopped after its first batch leaves the rest, a second run
//!   finishes, a third answers 0;
//! - rows stored in clear (before the inbox had keys) are sealed by rekey, and read back
//!   the same;
//! - a row sealed under a key the ring lacks is skipped and counted, never deleted or
//!   changed;
//! - two rekeys at once (two replicas) rewrite each row once: the compare-and-set;
//! - `POST /admin/rekey` answers the counts, refuses a bad batch (400) and an inbox
//!   without keys (409), changing nothing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{BodyState, Inbox, Rekeyed, Worker};
use tower_webhook::seal::{Aad, Column, Key, KeyRing};
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use common::seed::SECRET;
use common::sql_db::Db;

fn ring(keys: &[(&str, u8)]) -> KeyRing {
    KeyRing::new(keys.iter().map(|(id, b)| Key::new(*id, [*b; 32]).unwrap())).unwrap()
}

/// Every stored value rekey rewrites: body rows, routes' errors, attempts' errors.
async fn values(db: &Db) -> u64 {
    let n = db.number("SELECT count(*) FROM webhook_bodies").await
        + db.number("SELECT count(*) FROM webhook_routes WHERE processing_error IS NOT NULL")
            .await
        + db.number("SELECT count(*) FROM webhook_attempts WHERE error IS NOT NULL")
            .await;
    n.unsigned_abs()
}

/// How many body rows are sealed under `key` (`None`: in clear).
async fn bodies_under(db: &Db, key: Option<&str>) -> u64 {
    let rows = body_rows(db).await;
    rows.iter().filter(|r| r.1.as_deref() == key).count() as u64
}

/// Every body row: event id, key id, body, headers in clear, subject's parts.
async fn body_rows(db: &Db) -> Vec<BodyRow> {
    db.rows(
        "SELECT event_id, key_id, body, headers, sealed_subject, subject_nonce,
            subject_digest FROM webhook_bodies ORDER BY event_id",
    )
    .await
}

/// Every error text stored, routes' and attempts'.
async fn errors(db: &Db) -> Vec<String> {
    db.texts(
        "SELECT processing_error FROM webhook_routes WHERE processing_error IS NOT NULL
        UNION ALL SELECT error FROM webhook_attempts WHERE error IS NOT NULL",
    )
    .await
}

/// Gives `id`'s body row a subject sealed under `ring`'s current key, with its digest
/// (what step 5's `with_subject` will write at accept).
async fn seal_subject(db: &Db, ring: &KeyRing, id: &str, subject: &str) {
    let sealed = ring
        .seal(
            &Aad::new("standard", id, Column::Subject),
            subject.as_bytes(),
        )
        .unwrap();
    let digest = ring.subject_digests(subject)[0].1;
    let (c, n, d) = (
        hex::encode(sealed.ciphertext()),
        hex::encode(sealed.nonce()),
        hex::encode(digest),
    );
    let sql = match db {
        Db::Sqlite(..) => format!(
            "UPDATE webhook_bodies SET sealed_subject = x'{c}', subject_nonce = x'{n}',
             subject_digest = x'{d}' WHERE event_id = '{id}'"
        ),
        Db::Pg(..) => format!(
            "UPDATE webhook_bodies SET sealed_subject = '\\x{c}', subject_nonce = '\\x{n}',
             subject_digest = '\\x{d}' WHERE event_id = '{id}'"
        ),
    };
    assert_eq!(db.run(&sql).await, 1);
}

/// A body row as stored: event id, key id, body, clear headers, subject's ciphertext,
/// nonce and digest.
type BodyRow = (
    String,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

fn body(id: &str) -> String {
    format!(r#"{{"type":"order.paid","id":"{id}","email":"ada@example.com"}}"#)
}

/// Posts a signed delivery of `id` with [`body`] and the header `x-customer: ada`.
async fn deliver(inbox: &Inbox, id: &str) {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(common::verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(inbox.accept_service());
    let mut headers = Scheme::standard()
        .sign([SECRET], id, common::at(common::NOW), body(id).as_bytes())
        .unwrap();
    headers.insert("x-customer", "ada".parse().unwrap());
    let req: http::Request<Full<Bytes>> = common::request(headers, body(id));
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 204);
}

const ERROR: &str = "invalid type: string \"ada@example.com\", expected u64";

/// Accepts `ids` and runs them until every one but `evt_fail` is processed and
/// `evt_fail` has failed (its route and attempt hold [`ERROR`]).
async fn accept_and_run(inbox: &Inbox, ids: &[&str]) {
    for id in ids {
        deliver(inbox, id).await;
    }
    let seen = Arc::new(Mutex::new(0));
    let counted = seen.clone();
    let running = Worker::new(inbox, move |e: Event, _| {
        *counted.lock().unwrap() += 1;
        let fail = e.id() == Some("evt_fail");
        async move {
            match fail {
                true => Err(ERROR.to_owned()),
                false => Ok(()),
            }
        }
    })
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    let processed = (ids.len() - 1) as u64;
    common::seed::eventually("all processed, evt_fail failed", async || {
        let failing = inbox.event("standard", "evt_fail").await.unwrap().unwrap();
        inbox.counts().await.unwrap().processed == processed && failing.summary.last_error.is_some()
    })
    .await;
    running.shutdown().await;
}

/// Every event of `ids` reads back whole through `inbox`: body, header, and for
/// `evt_fail` its error on the route and every attempt.
async fn reads_whole(inbox: &Inbox, ids: &[&str]) {
    for id in ids {
        let event = inbox.event("standard", id).await.unwrap().unwrap();
        assert_eq!(event.body_state, BodyState::Stored, "{id}");
        assert_eq!(event.body, body(id), "{id}");
        assert!(
            event
                .headers
                .contains(&("x-customer".to_owned(), "ada".to_owned())),
            "{id}: {:?}",
            event.headers
        );
        if *id == "evt_fail" {
            assert_eq!(event.summary.last_error.as_deref(), Some(ERROR));
            assert!(!event.attempts.is_empty());
            for attempt in &event.attempts {
                assert_eq!(attempt.error.as_deref(), Some(ERROR));
            }
        }
    }
}

fn answer(rekeyed: u64, unreadable: u64) -> Rekeyed {
    let mut answer = Rekeyed::default();
    answer.rekeyed = rekeyed;
    answer.unreadable = unreadable;
    answer
}

const IDS: [&str; 3] = ["evt_a", "evt_b", "evt_fail"];

/// Accepted and failed under k1; [k2, k1] reads them and rekeys every value; then k2
/// alone reads every event whole, and the subject opens under k2 with k2's digest.
async fn rotation(db: Db) {
    let (k1, k21, k2) = (
        ring(&[("k1", 1)]),
        ring(&[("k2", 2), ("k1", 1)]),
        ring(&[("k2", 2)]),
    );
    accept_and_run(&db.inbox().with_keys(k1.clone()), &IDS).await;
    seal_subject(&db, &k1, "evt_a", "cust_1").await;
    let rotated = db.inbox().with_keys(k21);
    reads_whole(&rotated, &IDS).await;
    let values = values(&db).await;
    assert!(
        values >= 5,
        "3 bodies, a route's error, an attempt's: {values}"
    );

    assert_eq!(rotated.rekey(2).await.unwrap(), answer(values, 0));
    assert_eq!(bodies_under(&db, Some("k2")).await, 3);
    let errors = errors(&db).await;
    assert!(
        errors.iter().all(|e| e.starts_with("sealed:v1:k2:")),
        "{errors:?}"
    );
    let rows = body_rows(&db).await;
    let a = &rows[0];
    assert_eq!(a.0, "evt_a");
    assert_eq!(
        a.6.as_deref(),
        Some(&k2.subject_digests("cust_1")[0].1[..]),
        "the subject's digest is k2's"
    );
    let opened = k2.open_parts(
        &Aad::new("standard", "evt_a", Column::Subject),
        "k2",
        a.5.as_deref().unwrap(),
        a.4.as_deref().unwrap(),
    );
    assert_eq!(opened.unwrap(), b"cust_1");

    reads_whole(&db.inbox().with_keys(k2.clone()), &IDS).await;
    assert_eq!(
        db.inbox().with_keys(k2).rekey(2).await.unwrap(),
        answer(0, 0)
    );
    db.drop_database().await;
}

/// A rekey with batch 2 stopped once its first batch is written leaves the rest; a
/// second run finishes it; a third has nothing to do.
async fn resumed(db: Db) {
    let ids: Vec<String> = (0..30).map(|i| format!("evt_{i:02}")).collect();
    let inbox = db.inbox().with_keys(ring(&[("k1", 1)]));
    for id in &ids {
        deliver(&inbox, id).await;
    }
    let rotated = db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)]));
    {
        let mut run = std::pin::pin!(rotated.rekey(2));
        loop {
            tokio::select! {
                biased;
                _ = &mut run => panic!("the run was to be stopped before its end"),
                () = tokio::task::yield_now() => {}
            }
            if bodies_under(&db, Some("k2")).await >= 2 {
                break; // dropped here: stopped
            }
        }
    }
    // One read, one snapshot: a batch the writer still holds may land any time.
    let rows = body_rows(&db).await;
    let under = |key: &str| rows.iter().filter(|r| r.1.as_deref() == Some(key)).count();
    let first = under("k2");
    assert!((2..30).contains(&first), "stopped after {first}");
    assert_eq!(under("k1"), 30 - first, "the rest left");
    // A batch the stopped run had handed to the writer may land after it was dropped:
    // SQLite's writer takes writes in order, so one more through it lands after that one
    // (PostgreSQL rolls a dropped transaction back; a commit already sent ends meanwhile).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rotated.pause(Some("flush"), None).await.unwrap());
    assert!(rotated.resume(Some("flush"), None).await.unwrap());
    let first = bodies_under(&db, Some("k2")).await;
    let second = rotated.rekey(2).await.unwrap();
    assert_eq!(second, answer(30 - first, 0));
    assert_eq!(bodies_under(&db, Some("k2")).await, 30);
    assert_eq!(rotated.rekey(2).await.unwrap(), answer(0, 0));
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    reads_whole(&db.inbox().with_keys(ring(&[("k2", 2)])), &ids).await;
    db.drop_database().await;
}

/// Accepted and failed without keys (in clear); rekey with k1 seals bodies, headers and
/// errors, which read back the same.
async fn clear_rows_sealed(db: Db) {
    accept_and_run(&db.inbox(), &IDS).await;
    assert_eq!(bodies_under(&db, None).await, 3);
    let values = values(&db).await;
    let keyed = db.inbox().with_keys(ring(&[("k1", 1)]));
    assert_eq!(keyed.rekey(100).await.unwrap(), answer(values, 0));
    assert_eq!(bodies_under(&db, Some("k1")).await, 3);
    let rows = body_rows(&db).await;
    assert!(rows.iter().all(|r| r.3.is_none()), "no header in clear");
    assert!(
        rows.iter()
            .all(|r| !String::from_utf8_lossy(r.2.as_deref().unwrap()).contains("ada@")),
        "no body in clear"
    );
    let errors = errors(&db).await;
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("sealed:v1:k1:") && !e.contains("ada@")),
        "{errors:?}"
    );
    reads_whole(&keyed, &IDS).await;
    assert_eq!(keyed.rekey(100).await.unwrap(), answer(0, 0));
    db.drop_database().await;
}

/// A row under k0, which the ring lacks: skipped and counted on every run, never deleted
/// nor changed; the row beside it rekeyed.
async fn unreadable_skipped(db: Db) {
    deliver(&db.inbox().with_keys(ring(&[("k0", 9)])), "evt_lost").await;
    deliver(&db.inbox().with_keys(ring(&[("k1", 1)])), "evt_kept").await;
    let before = body_rows(&db).await;
    let rotated = db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)]));
    assert_eq!(rotated.rekey(1).await.unwrap(), answer(1, 1));
    assert_eq!(rotated.rekey(1).await.unwrap(), answer(0, 1));
    let after = body_rows(&db).await;
    assert_eq!(after[0].0, "evt_kept");
    assert_eq!(after[0].1.as_deref(), Some("k2"));
    assert_eq!(after[1], before[1], "evt_lost as it was");
    assert_eq!(after[1].1.as_deref(), Some("k0"));
    db.drop_database().await;
}

/// Two replicas rekey at once: each row is rewritten once in all (the compare-and-set
/// makes the loser of a row skip it), and every row opens under the new key.
async fn two_at_once(db: Db) {
    let ids: Vec<String> = (0..40).map(|i| format!("evt_{i:02}")).collect();
    let inbox = db.inbox().with_keys(ring(&[("k1", 1)]));
    for id in &ids {
        deliver(&inbox, id).await;
    }
    let (one, two) = (
        db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)])),
        db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)])),
    );
    let (a, b) = tokio::join!(one.rekey(4), two.rekey(4));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.rekeyed + b.rekeyed, 40, "{a:?} {b:?}");
    assert_eq!((a.unreadable, b.unreadable), (0, 0));
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    reads_whole(&db.inbox().with_keys(ring(&[("k2", 2)])), &ids).await;
    db.drop_database().await;
}

/// `POST /rekey` through `admin::router`: its status and JSON.
async fn post_rekey(inbox: &Inbox, body: &'static str) -> (http::StatusCode, serde_json::Value) {
    use http_body_util::BodyExt;
    let request = http::Request::post("/rekey")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = tower_webhook::admin::router(inbox.clone())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// The admin route: 409 without keys and 400 for a bad body, nothing changed; then the
/// counts, and a second call's.
async fn admin_route(db: Db) {
    use serde_json::json;
    deliver(&db.inbox().with_keys(ring(&[("k1", 1)])), "evt_a").await;
    deliver(&db.inbox().with_keys(ring(&[("k0", 9)])), "evt_lost").await;
    let before = body_rows(&db).await;
    let (status, body) = post_rekey(&db.inbox(), "{}").await;
    assert_eq!(status, http::StatusCode::CONFLICT);
    assert_eq!(
        body,
        json!({"error": "the inbox has no encryption keys: set WEBHOOK_ENCRYPTION_KEYS (Inbox::with_keys)"})
    );
    let rotated = db.inbox().with_keys(ring(&[("k2", 2), ("k1", 1)]));
    for bad in [
        r#"{"batch": 0}"#,
        r#"{"batch": 10001}"#,
        r#"{"size": 2}"#,
        "[]",
    ] {
        let (status, _) = post_rekey(&rotated, bad).await;
        assert_eq!(status, http::StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(body_rows(&db).await, before, "nothing changed");
    let answer = post_rekey(&rotated, r#"{"batch": 1}"#).await;
    assert_eq!(
        answer,
        (http::StatusCode::OK, json!({"rekeyed": 1, "unreadable": 1}))
    );
    let again = post_rekey(&rotated, "{}").await;
    assert_eq!(
        again,
        (http::StatusCode::OK, json!({"rekeyed": 0, "unreadable": 1}))
    );
    db.drop_database().await;
}

#[tokio::test]
async fn sqlite_the_admin_route_rekeys_and_refuses_an_inbox_without_keys() {
    admin_route(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_the_admin_route_rekeys_and_refuses_an_inbox_without_keys() {
    admin_route(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_rotation_rekeys_every_value_then_the_new_key_alone_reads_all() {
    rotation(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_rotation_rekeys_every_value_then_the_new_key_alone_reads_all() {
    rotation(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_a_stopped_rekey_is_finished_by_the_next_run() {
    resumed(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_stopped_rekey_is_finished_by_the_next_run() {
    resumed(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_rows_stored_in_clear_are_sealed_by_rekey() {
    clear_rows_sealed(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_rows_stored_in_clear_are_sealed_by_rekey() {
    clear_rows_sealed(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_a_row_no_key_opens_is_skipped_and_counted_never_changed() {
    unreadable_skipped(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_a_row_no_key_opens_is_skipped_and_counted_never_changed() {
    unreadable_skipped(Db::postgres().await).await;
}

#[tokio::test]
async fn sqlite_two_rekeys_at_once_rewrite_each_row_once() {
    two_at_once(Db::sqlite().await).await;
}

#[tokio::test]
async fn postgres_two_rekeys_at_once_rewrite_each_row_once() {
    two_at_once(Db::postgres().await).await;
}

#[tokio::test]
async fn rekey_without_keys_is_refused() {
    let db = Db::sqlite().await;
    let err = db.inbox().rekey(10).await.unwrap_err();
    assert_eq!(
        err.kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    db.drop_database().await;
}

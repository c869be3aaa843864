//! `admin::router` end to end over a real inbox on SQLite and PostgreSQL holding dead,
//! failing, queued and processed rows: each endpoint's status and JSON, pages by cursor
//! in both orders, bodies as text or base64, bad input a 400 that changes nothing, an
//! unknown event a 404, a database that does not answer a 503 without its text, and a
//! requeue whose rows a worker then processes.

mod common;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use common::seed::{body, deliver, eventually, seed, DEAD_ERROR, FAILING_ERROR};
use http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use tower_webhook::admin::{self, AdminError, AdminErrorKind};
use tower_webhook::inbox::{Attempt, Inbox, ProcessorSpec, Worker};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::Event;

/// What the router answered.
struct Answer {
    status: StatusCode,
    json: Value,
    error: Option<AdminError>,
}

async fn send(inbox: &Inbox, request: Request<Body>) -> Answer {
    let response = admin::router(inbox.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    assert_eq!(
        response.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/json",
        "every answer is JSON"
    );
    let error = response.extensions().get::<AdminError>().cloned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).expect("a JSON body");
    Answer {
        status,
        json,
        error,
    }
}

async fn get(inbox: &Inbox, uri: &str) -> Answer {
    send(inbox, Request::get(uri).body(Body::empty()).unwrap()).await
}

async fn post_json(inbox: &Inbox, uri: &str, body: &str) -> Answer {
    let request = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    send(inbox, request).await
}

fn time(v: &Value) -> SystemTime {
    let text = v.as_str().unwrap_or_else(|| panic!("a time, not {v}"));
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap()
        .into()
}

fn ids(page: &Value) -> Vec<String> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn counts_and_listings_show_each_state_with_its_last_error(inbox: Inbox) {
    seed(&inbox, 3).await;
    let counts = get(&inbox, "/counts").await;
    assert_eq!(counts.status, StatusCode::OK);
    assert_eq!(counts.json["queued"], 2, "{}", counts.json);
    assert_eq!(counts.json["processing"], 0);
    assert_eq!(counts.json["processed"], 1);
    assert_eq!(counts.json["dead"], 3);
    assert!(counts.json["oldest_due_ms"].is_u64(), "evt_queued is due");
    assert!(
        counts.json.get("processors").is_none(),
        "one processor: as before"
    );

    let dead = get(&inbox, "/events?state=dead").await;
    assert_eq!(dead.status, StatusCode::OK);
    let mut seen = ids(&dead.json);
    seen.sort();
    assert_eq!(seen, ["evt_dead_1", "evt_dead_2", "evt_dead_3"]);
    assert_eq!(dead.json["next"], Value::Null, "one page");
    for row in dead.json["events"].as_array().unwrap() {
        let id = row["id"].as_str().unwrap();
        assert_eq!(row["source"], "standard");
        assert_eq!(row["type"], "order.paid");
        assert_eq!(row["object_id"], format!("pi_{id}"));
        assert_eq!(row["state"], "dead");
        assert_eq!(row["attempts"], 2);
        assert_eq!(row["last_error"], DEAD_ERROR);
        assert_eq!(row["next_attempt_at"], Value::Null, "a dead row is not due");
        assert!(time(&row["dead_at"]) >= time(&row["received_at"]));
        assert!(row.get("body").is_none(), "a listing carries no bodies");
        assert!(row.get("processor").is_none(), "one processor: as before");
    }

    let failing = get(&inbox, "/events?state=failing").await;
    assert_eq!(failing.status, StatusCode::OK);
    assert_eq!(
        ids(&failing.json),
        ["evt_failing"],
        "not the never-tried queued row"
    );
    let row = &failing.json["events"][0];
    assert_eq!(row["state"], "queued");
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["last_error"], FAILING_ERROR);
    assert_eq!(row["dead_at"], Value::Null);
    let due_in = time(&row["next_attempt_at"])
        .duration_since(SystemTime::now())
        .expect("due later");
    assert!(due_in > Duration::from_secs(25 * 60), "{due_in:?}");
}

async fn listings_page_by_cursor_in_either_order(inbox: Inbox) {
    seed(&inbox, 5).await;
    // Newest first, two at a time: every dead row once, dead_at never increasing.
    let mut newest = Vec::new();
    let mut uri = "/events?state=dead&limit=2".to_owned();
    for page in 0.. {
        let answer = get(&inbox, &uri).await;
        assert_eq!(answer.status, StatusCode::OK);
        let rows = answer.json["events"].as_array().unwrap().clone();
        assert_eq!(rows.len(), if page < 2 { 2 } else { 1 }, "page {page}");
        newest.extend(rows);
        match answer.json["next"].as_str() {
            Some(next) => uri = format!("/events?state=dead&limit=2&after={next}"),
            None => break,
        }
    }
    let order: Vec<String> = newest
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(order.iter().collect::<HashSet<_>>().len(), 5, "{order:?}");
    for pair in newest.windows(2) {
        assert!(time(&pair[0]["dead_at"]) >= time(&pair[1]["dead_at"]));
    }
    // Oldest first, in one page of five: the same rows, the other way round.
    let oldest = get(&inbox, "/events?state=dead&order=oldest&limit=5").await;
    let mut reversed = ids(&oldest.json);
    reversed.reverse();
    assert_eq!(reversed, order);
    assert_eq!(oldest.json["next"], Value::Null);
    // A cursor of the newest-first listing continues it past rows requeued meanwhile.
    let first = get(&inbox, "/events?state=dead&limit=2").await;
    let next = first.json["next"].as_str().unwrap().to_owned();
    let requeued = post_json(
        &inbox,
        "/requeue",
        &json!({"source": "standard", "id": order[0]}).to_string(),
    )
    .await;
    assert_eq!(requeued.json["requeued"], 1);
    let rest = get(&inbox, &format!("/events?state=dead&limit=10&after={next}")).await;
    assert_eq!(ids(&rest.json), order[2..]);
}

async fn one_event_shows_its_body_as_text_or_base64(inbox: Inbox) {
    seed(&inbox, 1).await;
    let dead = get(&inbox, "/events/standard/evt_dead_1").await;
    assert_eq!(dead.status, StatusCode::OK);
    assert_eq!(dead.json["state"], "dead");
    assert_eq!(dead.json["livemode"], true);
    assert_eq!(dead.json["last_error"], DEAD_ERROR);
    assert_eq!(dead.json["processed_at"], Value::Null);
    assert_eq!(dead.json["body"], body("evt_dead_1"));
    assert_eq!(dead.json["body_encoding"], "utf-8");
    // Its request headers as stored, and its attempts beside their count.
    let headers = dead.json["headers"].as_array().unwrap();
    assert!(
        headers
            .iter()
            .any(|h| h[0] == "webhook-id" && h[1] == "evt_dead_1"),
        "{headers:?}"
    );
    assert_eq!(dead.json["attempts"], 2);
    let history = dead.json["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(
        dead.json.get("routes").is_none(),
        "one processor: as before"
    );
    for (record, (n, outcome)) in history.iter().zip([(1, "failed"), (2, "dead")]) {
        assert_eq!(record["attempt"], n);
        assert_eq!(record["outcome"], outcome);
        assert_eq!(record["error"], DEAD_ERROR);
        assert!(record.get("processor").is_none());
        assert!(record["duration_ms"].as_f64().unwrap() >= 0.0);
        assert!(time(&record["finished_at"]) >= time(&record["started_at"]));
    }

    // The rate: evt_done processed in the last minutes (this one, or the one before if it
    // just turned).
    let rate = get(&inbox, "/processed?minutes=3").await;
    assert_eq!(rate.status, StatusCode::OK);
    let minutes = rate.json["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 3, "{minutes:?}");
    let counted: u64 = minutes
        .iter()
        .map(|m| m["processed"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 1, "{minutes:?}");
    assert!(time(&minutes[2]["start"]) > time(&minutes[1]["start"]));
    let default = get(&inbox, "/processed").await;
    assert_eq!(default.json["minutes"].as_array().unwrap().len(), 15);

    let done = get(&inbox, "/events/standard/evt_done").await;
    assert_eq!(done.json["state"], "processed");
    assert_eq!(done.json["attempts"], 1);
    assert!(time(&done.json["processed_at"]) >= time(&done.json["received_at"]));
    assert_eq!(done.json["next_attempt_at"], Value::Null);

    let queued = get(&inbox, "/events/standard/evt_queued").await;
    assert_eq!(queued.json["state"], "queued");
    assert_eq!(queued.json["attempts"], 0);
    assert_eq!(queued.json["last_error"], Value::Null);

    // Not UTF-8, under a source and id that need percent-encoding.
    inbox
        .ingest(
            &common::seed::standard("tenant/a b"),
            Some("evt/x"),
            vec![0xff, 0x00, b'{'],
        )
        .await
        .unwrap();
    let binary = get(&inbox, "/events/tenant%2Fa%20b/evt%2Fx").await;
    assert_eq!(binary.status, StatusCode::OK);
    assert_eq!(binary.json["source"], "tenant/a b");
    assert_eq!(binary.json["id"], "evt/x");
    assert_eq!(binary.json["body"], "/wB7");
    assert_eq!(binary.json["body_encoding"], "base64");
    assert_eq!(binary.json["type"], Value::Null);
    assert_eq!(binary.json["headers"], json!([]), "ingested: no request");
    assert_eq!(binary.json["history"], json!([]));

    for unknown in [
        "/events/standard/evt_never",
        "/events/other/evt_dead_1",
        "/events/standard/evt%00nul",
    ] {
        let answer = get(&inbox, unknown).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{unknown}");
        assert_eq!(answer.json, json!({"error": "no such event"}));
        assert_eq!(answer.error.unwrap().kind(), AdminErrorKind::NotFound);
    }
}

async fn bad_input_is_a_400_with_a_fixed_json_error_and_changes_nothing(inbox: Inbox) {
    seed(&inbox, 2).await;
    let rows = async || {
        let c = inbox.counts().await.unwrap();
        (c.queued, c.processing, c.processed, c.dead)
    };
    let before = rows().await;
    for uri in [
        "/events",
        "/events?state=bogus",
        "/events?state=processed",
        "/events?state=dead&limit=0",
        "/events?state=dead&limit=1001",
        "/events?state=dead&limit=-1",
        "/events?state=dead&limit=99999999999999999999999",
        "/events?state=dead&order=sideways",
        "/events?state=dead&after=%3Cscript%3E",
        "/events?state=dead&after=WzEsInMiXQ",
        "/events?state=dead&limt=5",
        "/events?state=dead&state=failing",
        "/events/standard/%FF",
        "/processed?minutes=0",
        "/processed?minutes=1441",
        "/processed?minutes=many",
        "/processed?minutes=5&minutes=6",
        "/processed?limt=5",
    ] {
        let answer = get(&inbox, uri).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{uri}");
        let message = answer.json["error"].as_str().expect("a message");
        assert!(
            !message.contains("script") && !message.contains("limt"),
            "{message}"
        );
        assert_eq!(answer.json.as_object().unwrap().len(), 1, "{uri}");
        assert_eq!(answer.error.unwrap().kind(), AdminErrorKind::BadRequest);
    }
    for body in [
        "{}",
        r#"{"dead": false}"#,
        r#"{"id": "evt_dead_1"}"#,
        r#"{"source": "standard"}"#,
        r#"{"source": "standard", "id": "evt_dead_1", "dead": true}"#,
        r#"{"dead": true, "all": true}"#,
        r#"{"all": true, "type": "order.paid"}"#,
        r#"{"dead": true, "received_from": "yesterday"}"#,
        r#"{"dead": true, "received_from": "2026-01-02T00:00:00Z", "received_before": "2026-01-01T00:00:00Z"}"#,
        r#"{"daed": true}"#,
        r#"{"dead": "yes"}"#,
        r#"{"source": "standard", "id": "evt\u0000"}"#,
        r#"[true]"#,
        "not json",
        "",
    ] {
        let answer = post_json(&inbox, "/requeue", body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer.json["error"].is_string(), "{body}");
    }
    let no_type = Request::post("/requeue")
        .body(Body::from(r#"{"dead": true}"#))
        .unwrap();
    let answer = send(&inbox, no_type).await;
    assert_eq!(
        answer.status,
        StatusCode::BAD_REQUEST,
        "a form post is not JSON"
    );
    assert_eq!(
        answer.json["error"],
        "the body is JSON, sent as Content-Type: application/json"
    );
    assert_eq!(rows().await, before, "nothing requeued");
    let dead = get(&inbox, "/events?state=dead").await;
    assert_eq!(ids(&dead.json).len(), 2, "still dead");

    let wrong_method = get(&inbox, "/requeue").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong_method.json, json!({"error": "method not allowed"}));
    let nowhere = get(&inbox, "/nowhere").await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);
    assert_eq!(nowhere.json, json!({"error": "no such endpoint"}));
}

async fn requeued_dead_rows_are_queued_again_and_a_worker_processes_them(inbox: Inbox) {
    seed(&inbox, 3).await;
    let answer = post_json(&inbox, "/requeue", r#"{"dead": true}"#).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json, json!({"requeued": 3, "without_body": 0}));
    let row = get(&inbox, "/events/standard/evt_dead_2").await.json;
    assert_eq!(row["state"], "queued");
    assert_eq!(row["attempts"], 0);
    assert_eq!(row["last_error"], Value::Null);
    assert_eq!(row["dead_at"], Value::Null);
    assert!(row["next_attempt_at"].is_string());
    assert_eq!(
        ids(&get(&inbox, "/events?state=dead").await.json),
        Vec::<String>::new()
    );
    assert_eq!(get(&inbox, "/counts").await.json["dead"], 0);

    let worker = Worker::new(&inbox, |_: Event, _: Attempt| async { Ok::<_, String>(()) })
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn();
    // The three requeued and evt_queued; evt_failing is not due for half an hour.
    eventually("the requeued rows processed", async || {
        get(&inbox, "/counts").await.json["processed"] == 5
    })
    .await;
    worker.shutdown().await;
    let row = get(&inbox, "/events/standard/evt_dead_2").await.json;
    assert_eq!(row["state"], "processed");
    assert_eq!(row["attempts"], 1, "attempts started again");
    assert_eq!(
        ids(&get(&inbox, "/events?state=failing").await.json),
        ["evt_failing"]
    );
}

async fn requeue_by_id_type_and_receipt_window(inbox: Inbox) {
    seed(&inbox, 2).await;
    let requeue = async |body: Value| {
        let answer = post_json(&inbox, "/requeue", &body.to_string()).await;
        assert_eq!(answer.status, StatusCode::OK, "{body}");
        answer.json["requeued"].as_u64().unwrap()
    };
    // One processed event, by id: a replay.
    assert_eq!(
        requeue(json!({"source": "standard", "id": "evt_done"})).await,
        1
    );
    assert_eq!(
        get(&inbox, "/events/standard/evt_done").await.json["state"],
        "queued"
    );
    assert_eq!(
        requeue(json!({"source": "standard", "id": "evt_never"})).await,
        0
    );
    // The dead ones, narrowed by type and window.
    assert_eq!(
        requeue(json!({"dead": true, "type": "invoice.paid"})).await,
        0
    );
    assert_eq!(
        requeue(json!({"dead": true, "received_before": "2000-01-01T00:00:00Z"})).await,
        0
    );
    assert_eq!(
        requeue(json!({"dead": true, "type": "order.paid",
            "received_from": "2000-01-01T00:00:00Z", "received_before": "2100-01-01T00:00:00+02:00"}))
        .await,
        2
    );
    // A type alone: every row of it, whatever its state.
    assert_eq!(
        requeue(json!({"type": "order.paid", "received_from": "2100-01-01T00:00:00Z"})).await,
        0
    );
    assert_eq!(requeue(json!({"type": "order.paid"})).await, 5);
    let c = inbox.counts().await.unwrap();
    assert_eq!((c.queued, c.processed, c.dead), (5, 0, 0), "{c:?}");
}

/// With fan-out, the counts are the sum and each processor's, by name.
async fn counts_show_each_processor_with_fan_out(inbox: Inbox) {
    let inbox = inbox
        .with_processors([
            ProcessorSpec::new("ledger").unwrap(),
            ProcessorSpec::new("refunds")
                .unwrap()
                .with_types(["charge.refunded"])
                .unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(deliver(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    let counts = get(&inbox, "/counts").await;
    assert_eq!(counts.status, StatusCode::OK);
    assert_eq!(counts.json["queued"], 2, "{}", counts.json);
    let of = |name: &str| counts.json["processors"][name]["queued"].clone();
    assert_eq!((of("ledger"), of("refunds")), (json!(2), json!(0)));
    assert_eq!(counts.json["processors"]["ledger"]["processed"], 0);
}

/// `POST /backfill` makes a processor's routes of older events once; `GET /counts` counts
/// a processor no longer configured apart from the sum and names it under "orphaned",
/// until it is dropped.
async fn backfill_and_orphaned_processors(inbox: Inbox) {
    let old = inbox
        .clone()
        .with_processors([
            ProcessorSpec::new("ledger").unwrap(),
            ProcessorSpec::new("legacy").unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(deliver(&old, id).await, StatusCode::NO_CONTENT);
    }
    let audit = ProcessorSpec::new("audit").unwrap().with_types(["order.*"]);
    let new = inbox
        .with_processors([ProcessorSpec::new("ledger").unwrap(), audit.unwrap()])
        .unwrap();
    let counts = get(&new, "/counts").await;
    assert_eq!(counts.status, StatusCode::OK);
    assert_eq!(counts.json["queued"], 2, "ledger's: {}", counts.json);
    assert_eq!(counts.json["orphaned"], json!(["legacy"]));
    assert_eq!(counts.json["processors"]["legacy"]["queued"], 2);
    assert_eq!(counts.json["processors"]["audit"]["queued"], 0);

    let backfill = async |body: &str| {
        let answer = post_json(&new, "/backfill", body).await;
        (answer.status, answer.json)
    };
    let created = |n: u64| (StatusCode::OK, json!({ "created": n }));
    let later = r#"{"processor": "audit", "received_from": "2999-01-01T00:00:00Z"}"#;
    assert_eq!(backfill(later).await, created(0));
    assert_eq!(backfill(r#"{"processor": "audit"}"#).await, created(2));
    assert_eq!(backfill(r#"{"processor": "audit"}"#).await, created(0));
    let refused = |error: &str| (StatusCode::BAD_REQUEST, json!({ "error": error }));
    for unknown in [r#"{"processor": "legacy"}"#, r#"{"processor": "nope"}"#] {
        assert_eq!(backfill(unknown).await, refused("no such processor"));
    }
    let backwards = r#"{"processor": "audit", "received_from": "2026-12-02T00:00:00Z",
        "received_before": "2026-12-01T00:00:00Z"}"#;
    assert_eq!(
        backfill(backwards).await,
        refused("received_from must be before received_before")
    );
    let counts = get(&new, "/counts").await;
    assert_eq!(counts.json["processors"]["audit"]["queued"], 2);
    assert_eq!(counts.json["queued"], 4);

    assert_eq!(new.drop_processor("legacy").await.unwrap(), 2);
    let counts = get(&new, "/counts").await;
    assert_eq!(counts.json.get("orphaned"), None, "{}", counts.json);
    assert_eq!(counts.json["processors"].as_object().unwrap().len(), 2);
}

/// With fan-out, an event shows each processor's route and whose each attempt was; the
/// listings, requeues and pauses take a processor and touch only its routes; a
/// processor the inbox does not have is a 400.
async fn fan_out_routes_listings_requeues_and_pauses_per_processor(inbox: Inbox) {
    let inbox = inbox
        .with_processors([
            ProcessorSpec::new("steady").unwrap(),
            ProcessorSpec::new("flaky").unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(deliver(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    let worker = |name: &str, fails: bool| {
        Worker::processor(&inbox, name, move |_: Event, _: Attempt| async move {
            match fails {
                true => Err(DEAD_ERROR),
                false => Ok(()),
            }
        })
        .unwrap()
        .with_max_attempts(2)
        .unwrap()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn()
    };
    let steady = worker("steady", false);
    let flaky = worker("flaky", true);
    let of = async |name: &str, state: &str| {
        get(&inbox, "/counts").await.json["processors"][name][state].clone()
    };
    eventually("steady's processed, flaky's dead", async || {
        of("steady", "processed").await == 2 && of("flaky", "dead").await == 2
    })
    .await;
    flaky.shutdown().await;

    let event = get(&inbox, "/events/standard/evt_1").await;
    assert_eq!(event.status, StatusCode::OK);
    assert_eq!(event.json["state"], "dead", "the most urgent route");
    let route = |json: &Value, name: &str| {
        let routes = json["routes"].as_array().expect("routes with fan-out");
        assert_eq!(routes.len(), 2, "{routes:?}");
        routes
            .iter()
            .find(|r| r["processor"] == name)
            .unwrap_or_else(|| panic!("{name}'s route in {routes:?}"))
            .clone()
    };
    let dead = route(&event.json, "flaky");
    assert_eq!(dead["state"], "dead");
    assert_eq!(dead["attempts"], 2);
    assert_eq!(dead["last_error"], DEAD_ERROR);
    assert_eq!(dead["next_attempt_at"], Value::Null);
    assert_eq!(dead["processed_at"], Value::Null);
    let done = route(&event.json, "steady");
    assert_eq!(done["state"], "processed");
    assert_eq!(done["attempts"], 1);
    assert_eq!(done["last_error"], Value::Null);
    assert!(time(&done["processed_at"]) >= time(&event.json["received_at"]));
    let history = event.json["history"].as_array().unwrap();
    let whose = |name: &str| history.iter().filter(|h| h["processor"] == name).count();
    assert_eq!((whose("flaky"), whose("steady")), (2, 1), "{history:?}");

    let listed = get(&inbox, "/events?state=dead&processor=flaky").await;
    assert_eq!(listed.status, StatusCode::OK);
    let mut seen = ids(&listed.json);
    seen.sort();
    assert_eq!(seen, ["evt_1", "evt_2"]);
    for row in listed.json["events"].as_array().unwrap() {
        assert_eq!(row["processor"], "flaky");
    }
    let none = get(&inbox, "/events?state=dead&processor=steady").await;
    assert_eq!(ids(&none.json), Vec::<String>::new());

    // Unknown processors: a fixed 400 that changes nothing.
    let unknown = json!({"error": "no such processor"});
    let answer = get(&inbox, "/events?state=dead&processor=nobody").await;
    assert_eq!(
        (answer.status, &answer.json),
        (StatusCode::BAD_REQUEST, &unknown)
    );
    let answer = post_json(
        &inbox,
        "/requeue",
        r#"{"processor": "nobody", "dead": true}"#,
    )
    .await;
    assert_eq!(
        (answer.status, &answer.json),
        (StatusCode::BAD_REQUEST, &unknown)
    );
    for uri in [
        "/pause?processor=nobody",
        "/resume?processor=nobody&source=standard",
    ] {
        let answer = post_json(&inbox, uri, "").await;
        assert_eq!(
            (answer.status, &answer.json),
            (StatusCode::BAD_REQUEST, &unknown),
            "{uri}"
        );
    }
    assert_eq!(of("flaky", "dead").await, 2);

    // Flaky paused alone: its requeued routes wait, steady's new event runs.
    let paused = post_json(&inbox, "/pause?processor=flaky&source=standard", "").await;
    assert_eq!(paused.json, json!({"changed": true}));
    let pauses = get(&inbox, "/pauses").await.json;
    assert_eq!(pauses.as_array().unwrap().len(), 1, "{pauses}");
    assert_eq!(pauses[0]["processor"], "flaky");
    assert_eq!(pauses[0]["source"], "standard");
    assert_eq!(pauses[0]["type"], Value::Null);
    let requeued = post_json(
        &inbox,
        "/requeue",
        r#"{"processor": "flaky", "dead": true}"#,
    )
    .await;
    assert_eq!(requeued.json, json!({"requeued": 2, "without_body": 0}));
    let event = get(&inbox, "/events/standard/evt_1").await.json;
    assert_eq!(route(&event, "flaky")["state"], "queued");
    assert_eq!(route(&event, "flaky")["attempts"], 0);
    assert_eq!(
        route(&event, "steady")["state"],
        "processed",
        "not run again"
    );
    assert_eq!(route(&event, "steady")["attempts"], 1);

    let flaky = worker("flaky", false);
    assert_eq!(deliver(&inbox, "evt_3").await, StatusCode::NO_CONTENT);
    eventually("steady processes evt_3", async || {
        of("steady", "processed").await == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(of("flaky", "queued").await, 3, "flaky's paused");
    let resumed = post_json(&inbox, "/resume?processor=flaky&source=standard", "").await;
    assert_eq!(resumed.json, json!({"changed": true}));
    eventually("flaky processes its three once resumed", async || {
        of("flaky", "processed").await == 3
    })
    .await;
    assert_eq!(of("steady", "processed").await, 3);
    flaky.shutdown().await;
    steady.shutdown().await;
}

/// A fresh SQLite inbox of its own.
async fn sqlite() -> Inbox {
    let path = std::env::temp_dir().join(format!(
        "tower-webhook-admin-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    Inbox::sqlite(&SqliteStore::open(path).await.unwrap())
}

/// A fresh PostgreSQL inbox of its own.
async fn postgres() -> Inbox {
    Inbox::postgres(
        &PgStore::connect(&common::fresh_pg_url().await)
            .await
            .unwrap(),
    )
}

macro_rules! suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn counts_and_listings_show_each_state_with_its_last_error() {
                super::counts_and_listings_show_each_state_with_its_last_error($make).await;
            }

            #[tokio::test]
            async fn listings_page_by_cursor_in_either_order() {
                super::listings_page_by_cursor_in_either_order($make).await;
            }

            #[tokio::test]
            async fn one_event_shows_its_body_as_text_or_base64() {
                super::one_event_shows_its_body_as_text_or_base64($make).await;
            }

            #[tokio::test]
            async fn bad_input_is_a_400_with_a_fixed_json_error_and_changes_nothing() {
                super::bad_input_is_a_400_with_a_fixed_json_error_and_changes_nothing($make).await;
            }

            #[tokio::test]
            async fn requeued_dead_rows_are_queued_again_and_a_worker_processes_them() {
                super::requeued_dead_rows_are_queued_again_and_a_worker_processes_them($make).await;
            }

            #[tokio::test]
            async fn counts_show_each_processor_with_fan_out() {
                super::counts_show_each_processor_with_fan_out($make).await;
            }

            #[tokio::test]
            async fn fan_out_routes_listings_requeues_and_pauses_per_processor() {
                super::fan_out_routes_listings_requeues_and_pauses_per_processor($make).await;
            }

            #[tokio::test]
            async fn backfill_and_orphaned_processors() {
                super::backfill_and_orphaned_processors($make).await;
            }

            #[tokio::test]
            async fn requeue_by_id_type_and_receipt_window() {
                super::requeue_by_id_type_and_receipt_window($make).await;
            }
        }
    };
}

suite!(sqlite_inbox, sqlite().await);
suite!(postgres_inbox, postgres().await);

/// Every endpoint answers 503 with a fixed message when the database does not answer;
/// the store's error rides in the extensions, never in the body.
async fn a_database_that_does_not_answer_is_a_503_without_its_text(inbox: Inbox) {
    let requests = [
        Request::get("/counts").body(Body::empty()).unwrap(),
        Request::get("/events?state=dead")
            .body(Body::empty())
            .unwrap(),
        Request::get("/events?state=failing&order=oldest")
            .body(Body::empty())
            .unwrap(),
        Request::get("/events/standard/evt_1")
            .body(Body::empty())
            .unwrap(),
        Request::post("/requeue")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"dead": true}"#))
            .unwrap(),
    ];
    for request in requests {
        let uri = request.uri().clone();
        let answer = send(&inbox, request).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(
            answer.json,
            json!({"error": "the inbox's database is unavailable"}),
            "{uri}"
        );
        let error = answer.error.expect("the error in the extensions");
        assert_eq!(error.kind(), AdminErrorKind::Unavailable);
        assert!(
            std::error::Error::source(&error).is_some(),
            "the store's error kept"
        );
    }
}

#[tokio::test]
async fn sqlite_a_database_that_does_not_answer_is_a_503_without_its_text() {
    let path = std::env::temp_dir().join(format!(
        "tower-webhook-admin-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let store = SqliteStore::open(&path).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    deliver(&inbox, "evt_1").await;
    store.pool().close().await;
    a_database_that_does_not_answer_is_a_503_without_its_text(inbox).await;
}

#[tokio::test]
async fn postgres_a_database_that_does_not_answer_is_a_503_without_its_text() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/nowhere")
        .unwrap();
    let inbox = Inbox::postgres(&PgStore::from_migrated_pool(pool));
    a_database_that_does_not_answer_is_a_503_without_its_text(inbox).await;
}

// The operators' door (`OperatorDoor`): the token's rules, the bearer check, the throttle.

const TOKEN: &str = "operator-token-0123456789abcdef";

/// A request to the door from `peer` (as axum's `ConnectInfo` gives it), with
/// `authorization` when given.
fn from_peer(peer: &str, uri: &str, authorization: Option<&str>) -> Request<Body> {
    let mut request = Request::get(uri);
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let mut request = request.body(Body::empty()).unwrap();
    let peer: std::net::SocketAddr = peer.parse().unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    request
}

/// The door's answer: status, `Retry-After` and the JSON body.
async fn through(app: &axum::Router, request: Request<Body>) -> (StatusCode, Option<u64>, Value) {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry_after, json)
}

#[test]
fn an_operator_token_under_16_bytes_is_refused_at_construction() {
    for short in ["", " ", "fifteen-chars-x"] {
        let error = admin::OperatorToken::new(short).unwrap_err();
        assert_eq!(error.kind(), tower_webhook::ConfigErrorKind::InvalidSecret);
        let error = admin::OperatorDoor::new(short).unwrap_err();
        assert_eq!(error.kind(), tower_webhook::ConfigErrorKind::InvalidSecret);
        assert!(error.to_string().contains("16 bytes"), "{error}");
    }
    let door = admin::OperatorDoor::new("sixteen-chars-xx").unwrap();
    assert!(!format!("{door:?}").contains("sixteen"), "{door:?}");
}

/// Over the real router: without `Authorization`, with an empty or wrong bearer token or
/// another scheme, 401 (`WWW-Authenticate: Bearer`, a JSON error, no inbox call: an unknown
/// endpoint is 401 too, not 404); the token itself, 200.
#[tokio::test]
async fn the_api_refuses_a_missing_empty_or_wrong_bearer_token_with_401() {
    let inbox = sqlite().await;
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let app = axum::Router::new().nest("/admin", admin::router(inbox).layer(door.bearer()));
    let wrong_token = format!("Bearer {TOKEN}x");
    let short_token = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let basic = format!("Basic {TOKEN}");
    for authorization in [
        None,
        Some(""),
        Some("Bearer"),
        Some("Bearer "),
        Some("Bearer a-guess"),
        Some(wrong_token.as_str()),
        Some(short_token.as_str()),
        Some(basic.as_str()),
        Some(TOKEN),
    ] {
        for uri in ["/admin/counts", "/admin/no-such-endpoint"] {
            let mut request = Request::get(uri);
            if let Some(value) = authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            let response = app
                .clone()
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{authorization:?} {uri}"
            );
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
            let error = response.extensions().get::<AdminError>().unwrap();
            assert_eq!(error.kind(), AdminErrorKind::Unauthorized);
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let json: Value = serde_json::from_slice(&bytes).unwrap();
            assert!(json["error"].is_string(), "{json}");
            assert!(!String::from_utf8_lossy(&bytes).contains(TOKEN));
        }
    }
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let request = Request::get("/admin/counts")
            .header(header::AUTHORIZATION, format!("{scheme} {TOKEN}"))
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{scheme}");
    }
}

/// The defaults: 20 wrong tokens within a minute from one address, then 429 with
/// `Retry-After` (at most 60 s) — for the right token too — until the minute has passed;
/// other addresses are not held, and requests without credentials are not counted.
#[tokio::test(start_paused = true)]
async fn twenty_wrong_tokens_in_a_minute_from_one_address_get_429_until_it_passes() {
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let app = axum::Router::new()
        .route("/admin/counts", axum::routing::get(|| async { "{}" }))
        .layer(door.bearer());
    let right = format!("Bearer {TOKEN}");
    let guesser = "10.0.0.1:5000";
    for n in 0..20 {
        let (status, _, _) = through(
            &app,
            from_peer(guesser, "/admin/counts", Some("Bearer a-guess")),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {n}");
        tokio::time::advance(Duration::from_secs(2)).await; // 20 in 40 s
    }
    let (status, retry_after, json) = through(
        &app,
        from_peer("10.0.0.1:5001", "/admin/counts", Some(&right)),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the right token is held too"
    );
    let retry_after = retry_after.expect("Retry-After");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert!(
        json["error"].as_str().unwrap().contains("too many"),
        "{json}"
    );
    // Another address is not held; a client sending no credentials is not counted.
    for _ in 0..50 {
        let (status, _, _) = through(&app, from_peer("10.0.0.3:1", "/admin/counts", None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    for peer in ["10.0.0.2:1", "10.0.0.3:1"] {
        let (status, _, _) = through(&app, from_peer(peer, "/admin/counts", Some(&right))).await;
        assert_eq!(status, StatusCode::OK, "{peer}");
    }
    tokio::time::advance(Duration::from_secs(retry_after - 1)).await;
    let (status, _, _) = through(&app, from_peer(guesser, "/admin/counts", Some(&right))).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a second before it passes"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let (status, _, _) = through(&app, from_peer(guesser, "/admin/counts", Some(&right))).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the right token works again once it has passed"
    );
    // 19 wrong a minute, for three minutes, never holds anyone.
    for n in 0..57 {
        let (status, _, _) = through(
            &app,
            from_peer(guesser, "/admin/counts", Some("Bearer a-guess")),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {n}");
        tokio::time::advance(Duration::from_millis(3200)).await;
    }
}

/// The addresses tracked are capped: past the cap the oldest is forgotten (here its block
/// with it), so a spray of addresses costs bounded memory.
#[tokio::test(start_paused = true)]
async fn more_addresses_than_the_cap_evict_the_oldest() {
    let door = admin::OperatorDoor::new(TOKEN)
        .unwrap()
        .with_throttle(1, Duration::from_secs(60))
        .unwrap()
        .with_max_clients(2);
    let app = axum::Router::new()
        .route("/admin/counts", axum::routing::get(|| async { "{}" }))
        .layer(door.bearer());
    let right = format!("Bearer {TOKEN}");
    let ask = |peer: &'static str, authorization: &str| {
        through(&app, from_peer(peer, "/admin/counts", Some(authorization)))
    };
    assert_eq!(
        ask("10.0.0.1:1", "Bearer x").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        ask("10.0.0.1:1", &right).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        ask("10.0.0.2:1", "Bearer x").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        ask("10.0.0.1:1", &right).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "within the cap"
    );
    assert_eq!(
        ask("10.0.0.3:1", "Bearer x").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        ask("10.0.0.1:1", &right).await.0,
        StatusCode::OK,
        "the oldest was evicted"
    );
    assert_eq!(
        ask("10.0.0.3:1", &right).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    for bad in [(0, 60), (1, 0), (1, 61)] {
        let door = admin::OperatorDoor::new(TOKEN).unwrap();
        let window = Duration::from_secs(bad.1);
        assert!(door.with_throttle(bad.0, window).is_err(), "{bad:?}");
    }
}

// The receiver example's door (`WEBHOOK_ADMIN_TOKEN`).

/// Runs the receiver in inbox mode on a fresh SQLite file with `env`; returns the child and
/// its URL (`http://127.0.0.1:<port>`), or its exit status and stderr when it did not start.
async fn receiver(
    env: &[(&str, &str)],
) -> Result<(tokio::process::Child, String), (std::process::ExitStatus, String)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let db = common::stores::temp_sqlite_path();
    let mut child = tokio::process::Command::new(common::example_binary("receiver"))
        .env_remove("DATABASE_URL")
        .env("WEBHOOK_SQLITE", &db)
        .env("BIND", "127.0.0.1:0")
        .env("WEBHOOK_MODE", "inbox")
        .env("WEBHOOK_SCHEME", "stripe")
        .env("WEBHOOK_SECRETS", "whsec_receiver_door_0123456789")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(Duration::from_secs(30), stderr.read_line(&mut first))
        .await
        .expect("the receiver starts or exits within 30 s")
        .unwrap();
    match first.trim().strip_prefix("receiving ") {
        Some(line) => {
            let url = line
                .split_whitespace()
                .last()
                .unwrap()
                .replace("/webhooks", "");
            // Read on: a closed pipe would make its next `eprintln!` end it.
            tokio::spawn(async move {
                let mut lines = stderr.lines();
                while let Ok(Some(_)) = lines.next_line().await {}
            });
            Ok((child, url))
        }
        None => {
            let mut rest = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), stderr.read_to_string(&mut rest))
                .await;
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .expect("the receiver exits")
                .unwrap();
            Err((status, first + &rest))
        }
    }
}

/// `WEBHOOK_ADMIN_TOKEN=` (set, empty: what `${UNSET}` gives) or shorter than 16
/// characters: the receiver refuses to start, non-zero, naming the variable.
#[tokio::test]
async fn receiver_refuses_to_start_with_an_empty_or_short_admin_token() {
    for token in ["", "fifteen-chars-x"] {
        match receiver(&[("WEBHOOK_ADMIN_TOKEN", token)]).await {
            Ok((mut child, url)) => {
                child.kill().await.unwrap();
                panic!("the receiver started at {url} with WEBHOOK_ADMIN_TOKEN={token:?}");
            }
            Err((status, stderr)) => {
                assert!(!status.success(), "{token:?}: {status}");
                assert!(
                    stderr.contains("WEBHOOK_ADMIN_TOKEN"),
                    "{token:?}: {stderr}"
                );
                assert!(stderr.contains("16"), "says the rule: {stderr}");
            }
        }
    }
    let (mut child, _) = receiver(&[("WEBHOOK_ADMIN_TOKEN", "sixteen-chars-xx")])
        .await
        .expect("16 characters start");
    child.kill().await.unwrap();
}

/// GET `url` from the local address `from` with a bearer token: the status and
/// `Retry-After`.
async fn ask_from(from: &str, url: &str, token: &str) -> (StatusCode, Option<String>) {
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from.parse().unwrap()));
    let client = Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, http_body_util::Empty<bytes::Bytes>>(connector);
    let request = Request::get(url)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), retry_after)
}

/// The receiver serves with each connection's address: 20 wrong tokens from 127.0.0.2
/// hold that address (429), while the operator at 127.0.0.1 still gets in.
#[tokio::test]
async fn receiver_throttles_wrong_tokens_by_client_address() {
    let (mut child, url) = receiver(&[("WEBHOOK_ADMIN_TOKEN", TOKEN)])
        .await
        .expect("starts");
    let counts = format!("{url}/admin/counts");
    for n in 0..20 {
        let (status, _) = ask_from("127.0.0.2", &counts, "a-guess").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {n}");
    }
    let (status, retry_after) = ask_from("127.0.0.2", &counts, TOKEN).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let (status, _) = ask_from("127.0.0.1", &counts, TOKEN).await;
    assert_eq!(status, StatusCode::OK, "another address is not held");
    child.kill().await.unwrap();
}

/// `admin::jetstream_router` over a real NATS server: counts per processor, pauses of one
/// processor, and a processor's backfill.
#[cfg(feature = "nats")]
mod jetstream {
    use super::*;
    use tower_webhook::inbox::jetstream::JetStream;
    use tower_webhook::inbox::ProcessorSpec;
    use tower_webhook::Scheme;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn typed_event(id: &str, event_type: &str) -> Event {
        let body = format!(r#"{{"type":"{event_type}"}}"#);
        let headers = Scheme::standard()
            .sign([SECRET], id, common::at(common::NOW), body.as_bytes())
            .unwrap();
        common::verifier(Scheme::standard(), &[SECRET])
            .verify(&headers, body.into())
            .unwrap()
    }

    async fn jetstream(name: &str, processors: Option<Vec<ProcessorSpec>>) -> JetStream {
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let builder = JetStream::builder(client, name).with_memory_storage();
        let builder = match processors {
            Some(processors) => builder.with_processors(processors).unwrap(),
            None => builder,
        };
        builder.build().await.unwrap()
    }

    async fn send(jetstream: &JetStream, method: &str, uri: &str, body: &str) -> Answer {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let response = admin::jetstream_router(jetstream.clone())
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let error = response.extensions().get::<AdminError>().cloned();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            json: serde_json::from_slice(&bytes).expect("a JSON body"),
            error,
        }
    }

    #[tokio::test]
    async fn counts_show_processors_only_with_fan_out_and_pauses_take_a_processor() {
        let name = format!("tw_admin_{}", uuid::Uuid::new_v4().simple());
        let single = jetstream(&name, None).await;
        let counts = send(&single, "GET", "/counts", "").await;
        assert_eq!(counts.status, StatusCode::OK);
        assert_eq!(counts.json["queued"], 0);
        assert!(counts.json.get("processors").is_none(), "{}", counts.json);
        let billing = ProcessorSpec::new("billing")
            .unwrap()
            .with_types(["invoice.*"])
            .unwrap();
        let js = jetstream(
            &name,
            Some(vec![ProcessorSpec::default_processor(), billing]),
        )
        .await;
        js.accept(&typed_event("evt_1", "invoice.paid"))
            .await
            .unwrap();
        let counts = send(&js, "GET", "/counts", "").await;
        assert_eq!(counts.status, StatusCode::OK);
        let processors = counts.json["processors"].as_object().unwrap();
        let names: Vec<&String> = processors.keys().collect();
        assert_eq!(names, ["billing", "default"]);
        assert_eq!(counts.json["processors"]["billing"]["queued"], 1);
        assert_eq!(counts.json["processors"]["default"]["queued"], 1);
        assert_eq!(counts.json["queued"], 2, "the sum");
        assert_eq!(counts.json["processors"]["billing"]["dead"], 0);

        let paused = send(
            &js,
            "POST",
            "/pause?processor=billing&type=invoice.paid",
            "",
        )
        .await;
        assert_eq!(
            (paused.status, &paused.json),
            (StatusCode::OK, &json!({"changed": true}))
        );
        let pauses = send(&js, "GET", "/pauses", "").await;
        assert_eq!(pauses.json[0]["processor"], "billing");
        assert_eq!(pauses.json[0]["type"], "invoice.paid");
        let unknown = send(&js, "POST", "/pause?processor=nope", "").await;
        assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
        assert_eq!(unknown.error.unwrap().kind(), AdminErrorKind::BadRequest);
        let everyone = send(&js, "POST", "/resume?type=invoice.paid", "").await;
        assert_eq!(
            everyone.json,
            json!({"changed": false}),
            "billing's own pause stays"
        );
        let resumed = send(
            &js,
            "POST",
            "/resume?processor=billing&type=invoice.paid",
            "",
        )
        .await;
        assert_eq!(resumed.json, json!({"changed": true}));
        assert_eq!(send(&js, "GET", "/pauses", "").await.json, json!([]));
        js.delete().await.unwrap();
    }

    #[tokio::test]
    async fn backfill_copies_a_processors_window_once_and_refuses_an_unknown_processor() {
        let name = format!("tw_admin_{}", uuid::Uuid::new_v4().simple());
        let before_billing = jetstream(&name, Some(vec![ProcessorSpec::default_processor()])).await;
        for (id, ty) in [("evt_1", "invoice.paid"), ("evt_2", "customer.created")] {
            before_billing.accept(&typed_event(id, ty)).await.unwrap();
        }
        let billing = ProcessorSpec::new("billing")
            .unwrap()
            .with_types(["invoice.*"])
            .unwrap();
        let js = jetstream(
            &name,
            Some(vec![ProcessorSpec::default_processor(), billing]),
        )
        .await;
        let created = send(&js, "POST", "/backfill", r#"{"processor": "billing"}"#).await;
        assert_eq!(
            (created.status, &created.json),
            (StatusCode::OK, &json!({"created": 1}))
        );
        let counts = send(&js, "GET", "/counts", "").await;
        assert_eq!(
            counts.json["processors"]["billing"]["queued"], 1,
            "the copy"
        );
        let again = send(&js, "POST", "/backfill", r#"{"processor": "billing"}"#).await;
        assert_eq!(again.json, json!({"created": 0}));
        let window = r#"{"processor": "billing", "received_from": "2000-01-01T00:00:00Z",
            "received_before": "2000-01-02T00:00:00Z"}"#;
        assert_eq!(
            send(&js, "POST", "/backfill", window).await.json,
            json!({"created": 0})
        );
        for bad in [
            r#"{"processor": "nope"}"#,
            r#"{}"#,
            r#"{"processor": "billing", "received_from": "yesterday"}"#,
            r#"{"processor": "billing", "received_from": "2000-01-02T00:00:00Z",
                "received_before": "2000-01-01T00:00:00Z"}"#,
        ] {
            let refused = send(&js, "POST", "/backfill", bad).await;
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        let counts = send(&js, "GET", "/counts", "").await;
        assert_eq!(
            counts.json["processors"]["billing"]["queued"], 1,
            "nothing more"
        );
        js.delete().await.unwrap();
    }
}

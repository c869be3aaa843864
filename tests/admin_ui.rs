//! `admin::ui`, the operator's web page, over a real inbox on SQLite, mounted at
//! `/admin/ui`: every answer HTML with a strict Content-Security-Policy, a stored body with
//! markup printed as escaped text, cross-site POSTs refused without effect, lists filtered
//! and paged by the inbox's cursor, search by id alone, and the bulk actions counting
//! first and acting only once confirmed; an event's body state and key id beside its
//! body, one sealed under a key the inbox lacks shown as unreadable, never an error
//! page. (tests/browser.rs drives it in Chromium.)

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use common::seed::{seed, SECRET};
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::admin::{self, AdminError, AdminErrorKind};
use tower_webhook::inbox::Inbox;
use tower_webhook::{Scheme, VerifyWebhookLayer};

/// What the page answered.
struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    html: String,
    error: Option<AdminError>,
}

fn page(inbox: &Inbox) -> Router {
    Router::new().nest("/admin/ui", admin::ui(inbox.clone()))
}

async fn send(inbox: &Inbox, request: Request<Body>) -> Answer {
    let response = page(inbox).oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let error = response.extensions().get::<AdminError>().cloned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let html = String::from_utf8(bytes.to_vec()).unwrap();
    Answer {
        status,
        headers,
        html,
        error,
    }
}

async fn get(inbox: &Inbox, uri: &str) -> Answer {
    send(inbox, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// A form POST as a browser sends it from the page itself (`Sec-Fetch-Site: same-origin`),
/// with `extra` headers on top.
async fn post_form(inbox: &Inbox, uri: &str, form: &str, extra: &[(&str, &str)]) -> Answer {
    let mut request = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "ops.internal:8080");
    if !extra
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("sec-fetch-site"))
    {
        request = request.header("sec-fetch-site", "same-origin");
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    send(inbox, request.body(Body::from(form.to_owned())).unwrap()).await
}

async fn inbox() -> Inbox {
    Inbox::sqlite(&common::stores::sqlite().await)
}

/// Delivers `body` as event `id` (source `standard`) through verify + accept.
async fn deliver_body(inbox: &Inbox, id: &str, body: &str) {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(common::verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(inbox.accept_service());
    let headers = Scheme::standard()
        .sign([SECRET], id, common::at(common::NOW), body.as_bytes())
        .unwrap();
    let request: Request<Full<Bytes>> = common::request(headers, body.to_owned());
    let status = svc.oneshot(request).await.unwrap().status();
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn every_page_is_html_with_a_strict_content_security_policy() {
    let inbox = inbox().await;
    seed(&inbox, 2).await;
    for uri in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui/events?state=failing",
        "/admin/ui/event?source=standard&id=evt_dead_1",
        "/admin/ui/event?source=standard&id=evt_dead_1&view=base64",
        "/admin/ui/no-such-page",
    ] {
        let answer = get(&inbox, uri).await;
        let expected = match uri.ends_with("no-such-page") {
            true => StatusCode::NOT_FOUND,
            false => StatusCode::OK,
        };
        assert_eq!(answer.status, expected, "{uri}: {}", answer.html);
        assert_eq!(
            answer.headers[header::CONTENT_TYPE],
            "text/html; charset=utf-8",
            "{uri}"
        );
        let csp = answer.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.starts_with("default-src 'none';"), "{uri}: {csp}");
        assert!(
            csp.contains("script-src 'self';") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(answer.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
        assert!(answer.html.starts_with("<!DOCTYPE html>"), "{uri}");
        // Links start at the mount point, wherever that is.
        assert!(
            answer.html.contains(r#"href="/admin/ui/style.css""#),
            "{uri}"
        );
    }
    let overview = get(&inbox, "/admin/ui").await.html;
    for shown in [
        r#"<div class="dead"><dt>dead</dt><dd>2</dd></div>"#,
        r#"<div class="queued"><dt>queued</dt><dd>2</dd></div>"#,
        "<code>standard</code>",
    ] {
        assert!(overview.contains(shown), "{shown} in {overview}");
    }
    let dead = get(&inbox, "/admin/ui/events?state=dead").await.html;
    assert!(
        dead.contains("order not found") && dead.contains("evt_dead_2"),
        "{dead}"
    );
    let css = get(&inbox, "/admin/ui/style.css").await;
    assert_eq!(css.headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
}

#[tokio::test]
async fn a_stored_body_with_markup_is_shown_as_escaped_text() {
    let inbox = inbox().await;
    let body = r#"{"type":"<b>order.paid</b>","note":"</pre><script>alert(1)</script>"}"#;
    deliver_body(&inbox, "evt_<i>markup</i>", body).await;
    for view in ["pretty", "raw"] {
        let uri =
            format!("/admin/ui/event?source=standard&id=evt_%3Ci%3Emarkup%3C%2Fi%3E&view={view}");
        let answer = get(&inbox, &uri).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.html);
        let html = answer.html;
        assert!(
            html.contains("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{view}: {html}"
        );
        assert!(html.contains("&lt;b&gt;order.paid&lt;/b&gt;"), "{html}");
        assert!(html.contains("evt_&lt;i&gt;markup&lt;/i&gt;"), "{html}");
        assert!(!html.contains("<script>alert") && !html.contains("<b>") && !html.contains("<i>"));
        // The one script element is the page's own.
        assert_eq!(html.matches("<script").count(), 1, "{html}");
    }
}

#[tokio::test]
async fn a_cross_site_post_is_refused_and_changes_nothing() {
    let inbox = inbox().await;
    seed(&inbox, 1).await;
    for extra in [
        &[("sec-fetch-site", "cross-site")][..],
        &[("sec-fetch-site", "same-site")],
        &[
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://ops.internal:8080"),
        ],
        &[("sec-fetch-site", ""), ("origin", "https://evil.example")],
    ] {
        for (uri, form) in [
            ("/admin/ui/pause", "source=standard"),
            ("/admin/ui/requeue", "source=standard&id=evt_dead_1"),
            ("/admin/ui/requeue-matching", "dead=yes&confirm=yes"),
            ("/admin/ui/delete-dead", "hours=0&confirm=yes"),
        ] {
            let answer = post_form(&inbox, uri, form, extra).await;
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "{uri} {extra:?}");
            assert_eq!(answer.error.unwrap().kind(), AdminErrorKind::Forbidden);
            assert!(answer.html.contains("cross-site"), "{}", answer.html);
        }
    }
    assert!(inbox.pauses().await.unwrap().is_empty());
    assert_eq!(
        inbox.counts().await.unwrap().dead,
        1,
        "nothing requeued or deleted"
    );

    // Without Sec-Fetch-Site (an older browser), the Origin decides: another's is refused,
    // the page's own passes.
    let from = |origin: &str| {
        Request::post("/admin/ui/pause")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::HOST, "ops.internal:8080")
            .header(header::ORIGIN, origin)
            .body(Body::from("source=standard"))
            .unwrap()
    };
    let answer = send(&inbox, from("http://evil.example")).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(inbox.pauses().await.unwrap().is_empty());
    let answer = send(&inbox, from("http://ops.internal:8080")).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.headers[header::LOCATION], "/admin/ui?done=paused");
    assert_eq!(inbox.pauses().await.unwrap().len(), 1);
    let answer = post_form(&inbox, "/admin/ui/resume", "source=standard&type=", &[]).await;
    assert_eq!(answer.headers[header::LOCATION], "/admin/ui?done=resumed");
    assert!(inbox.pauses().await.unwrap().is_empty());
}

#[tokio::test]
async fn lists_are_filtered_and_paged_by_the_inbox_cursor() {
    let inbox = inbox().await;
    seed(&inbox, 55).await;
    let first = get(&inbox, "/admin/ui/events?state=dead&type=order.paid")
        .await
        .html;
    assert_eq!(
        first.matches("<tr>").count(),
        1 + 50,
        "a header row and 50: {first}"
    );
    let next = first
        .split("href=\"")
        .find(|s| s.contains("after="))
        .and_then(|s| s.split('"').next())
        .expect("a next page link")
        .replace("&amp;", "&");
    let second = get(&inbox, &next).await.html;
    assert_eq!(second.matches("<tr>").count(), 1 + 5, "{second}");
    assert!(!second.contains("after="), "the last page");
    let none = get(&inbox, "/admin/ui/events?state=dead&source=stripe")
        .await
        .html;
    assert!(none.contains("No dead event matches."), "{none}");
    let later = get(
        &inbox,
        "/admin/ui/events?state=failing&from=2999-01-01T00:00",
    )
    .await
    .html;
    assert!(later.contains("No failing event matches."), "{later}");
    let failing = get(
        &inbox,
        "/admin/ui/events?state=failing&before=2999-01-01T00:00",
    )
    .await;
    assert!(failing.html.contains("evt_failing"), "{}", failing.html);
    let bad = get(&inbox, "/admin/ui/events?state=dead&from=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_id_alone_is_found_in_the_sources_the_page_knows() {
    let inbox = inbox().await;
    seed(&inbox, 1).await;
    let found = get(&inbox, "/admin/ui/event?id=evt_done").await;
    assert_eq!(found.status, StatusCode::SEE_OTHER);
    assert_eq!(
        found.headers[header::LOCATION],
        "/admin/ui/event?source=standard&id=evt_done"
    );
    let missing = get(&inbox, "/admin/ui/event?id=evt_never").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.html.contains("Give its source too"),
        "{}",
        missing.html
    );
    let unknown = get(&inbox, "/admin/ui/event?source=standard&id=evt_never").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bulk_actions_count_first_and_act_only_once_confirmed() {
    let inbox = inbox().await;
    seed(&inbox, 3).await;
    let count = post_form(
        &inbox,
        "/admin/ui/requeue-matching",
        "type=order.paid&dead=yes",
        &[],
    )
    .await;
    assert_eq!(count.status, StatusCode::OK);
    assert!(
        count.html.contains("<strong>3</strong> dead events match"),
        "{}",
        count.html
    );
    assert!(count.html.contains(r#"name="confirm" value="yes""#));
    assert_eq!(
        inbox.counts().await.unwrap().dead,
        3,
        "nothing before the confirmation"
    );

    let nothing = post_form(
        &inbox,
        "/admin/ui/requeue-matching",
        "type=&from=&before=",
        &[],
    )
    .await;
    assert_eq!(
        nothing.status,
        StatusCode::BAD_REQUEST,
        "every event at once is refused"
    );

    let count = post_form(&inbox, "/admin/ui/delete-dead", "hours=0", &[]).await;
    assert!(
        count.html.contains("<strong>3</strong> dead events"),
        "{}",
        count.html
    );
    assert_eq!(inbox.counts().await.unwrap().dead, 3);
    let kept = post_form(&inbox, "/admin/ui/delete-dead", "hours=48&confirm=yes", &[]).await;
    assert!(
        kept.html.contains("Deleted 0 dead events."),
        "{}",
        kept.html
    );

    let one = post_form(
        &inbox,
        "/admin/ui/requeue",
        "source=standard&id=evt_dead_1",
        &[],
    )
    .await;
    assert_eq!(one.status, StatusCode::SEE_OTHER);
    assert_eq!(
        one.headers[header::LOCATION],
        "/admin/ui/event?source=standard&id=evt_dead_1&done=requeued"
    );
    let requeued = post_form(
        &inbox,
        "/admin/ui/requeue-matching",
        "type=order.paid&dead=yes&confirm=yes",
        &[],
    )
    .await;
    assert!(
        requeued.html.contains("Requeued 2 events."),
        "{}",
        requeued.html
    );
    let c = inbox.counts().await.unwrap();
    assert_eq!((c.dead, c.queued), (0, 5), "{c:?}");

    let other = self::inbox().await;
    seed(&other, 2).await;
    let deleted = post_form(&other, "/admin/ui/delete-dead", "hours=0&confirm=yes", &[]).await;
    assert!(
        deleted.html.contains("Deleted 2 dead events."),
        "{}",
        deleted.html
    );
    let c = other.counts().await.unwrap();
    assert_eq!(
        (c.dead, c.processed, c.queued),
        (0, 1, 2),
        "only the dead: {c:?}"
    );
}

/// An event's page shows every attempt (its outcome and error) and the headers it was
/// accepted with; the overview's chart counts the events processed in its minutes.
#[tokio::test]
async fn an_event_page_shows_its_attempts_and_headers_and_the_overview_its_rate() {
    let inbox = inbox().await;
    seed(&inbox, 1).await;
    let answer = get(&inbox, "/admin/ui/event?source=standard&id=evt_dead_1").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.html);
    let attempts = section(&answer.html, "attempts");
    assert_eq!(
        attempts.matches("class=\"outcome failed\"").count(),
        1,
        "{attempts}"
    );
    assert_eq!(
        attempts.matches("class=\"outcome dead\"").count(),
        1,
        "{attempts}"
    );
    assert_eq!(
        attempts.matches(common::seed::DEAD_ERROR).count(),
        2,
        "{attempts}"
    );
    let headers = section(&answer.html, "headers");
    assert!(headers.contains("<code>webhook-id</code>"), "{headers}");
    assert!(headers.contains("<code>evt_dead_1</code>"), "{headers}");
    let processed = get(&inbox, "/admin/ui/event?source=standard&id=evt_done").await;
    let attempts = section(&processed.html, "attempts");
    assert_eq!(
        attempts.matches("class=\"outcome processed\"").count(),
        1,
        "{attempts}"
    );

    let overview = get(&inbox, "/admin/ui").await;
    let rate = section(&overview.html, "rate");
    assert!(
        rate.contains("aria-label=\"1 events processed in the last 30 minutes\""),
        "{rate}"
    );
}

/// The body's state and key beside it: sealed under k1 and opened, "stored" and k1 with
/// the body; stored in clear, "stored" and no key; read by an inbox with k2 alone,
/// "unreadable" and k1, the page a 200 without a byte of the body or its headers.
#[cfg(feature = "seal")]
#[tokio::test]
async fn an_event_page_shows_the_bodys_state_and_key_and_an_unreadable_body_is_no_error() {
    use tower_webhook::seal::{Key, KeyRing};
    let ring = |id: &str, b: u8| KeyRing::new([Key::new(id, [b; 32]).unwrap()]).unwrap();
    let store = common::stores::sqlite().await;
    deliver_body(&Inbox::sqlite(&store), "evt_clear", r#"{"type":"a"}"#).await;
    let k1 = Inbox::sqlite(&store).with_keys(ring("k1", 1));
    let body = r#"{"type":"order.paid","email":"ada@example.com"}"#;
    deliver_body(&k1, "evt_sealed", body).await;
    let uri = "/admin/ui/event?source=standard&id=evt_sealed&view=raw";

    let opened = get(&k1, uri).await;
    assert_eq!(opened.status, StatusCode::OK, "{}", opened.html);
    let section_of = |html: &str| section(html, "body").to_owned();
    let shown = section_of(&opened.html);
    assert!(
        shown.contains("class=\"state body-stored\">stored<"),
        "{shown}"
    );
    assert!(shown.contains("<code>k1</code>"), "{shown}");
    assert!(shown.contains("ada@example.com"), "{shown}");

    let clear = get(&k1, "/admin/ui/event?source=standard&id=evt_clear").await;
    let shown = section_of(&clear.html);
    assert!(
        shown.contains("class=\"state body-stored\">stored<"),
        "{shown}"
    );
    assert!(shown.contains("none: stored in clear"), "{shown}");

    let k2 = Inbox::sqlite(&store).with_keys(ring("k2", 2));
    let unreadable = get(&k2, uri).await;
    assert_eq!(unreadable.status, StatusCode::OK, "{}", unreadable.html);
    assert!(unreadable.error.is_none());
    let shown = section_of(&unreadable.html);
    assert!(
        shown.contains("class=\"state body-unreadable\">unreadable<"),
        "{shown}"
    );
    assert!(shown.contains("<code>k1</code>"), "{shown}");
    assert!(
        shown.contains("Sealed under key &quot;k1&quot;, and no key of this inbox opens it"),
        "{shown}"
    );
    assert!(!shown.contains("<pre"), "no body shown: {shown}");
    assert!(!unreadable.html.contains("ada@example.com"));
    let headers = section(&unreadable.html, "headers");
    assert!(!headers.contains("<code>webhook-id</code>"), "{headers}");
}

/// The HTML of `<section … id="{id}">` up to its end.
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id}: {html}"));
    let end = html[start..]
        .find("</section>")
        .map_or(html.len(), |e| start + e);
    &html[start..end]
}

// The page behind the operators' door (`OperatorDoor::sign_in`): sign-in, the session
// cookie, sign-out, expiry, the throttle, the trailing slash.

const TOKEN: &str = "operator-ui-token-0123456789abcdef";

/// The page mounted as the docs say: `nest_service`, behind the door's sign-in.
fn behind(door: &admin::OperatorDoor, inbox: &Inbox) -> Router {
    Router::new().nest_service("/admin/ui", admin::ui(inbox.clone()).layer(door.sign_in()))
}

/// What the door answered: status, headers and the text.
async fn door_answer(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let error = response.extensions().get::<AdminError>().cloned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        html: String::from_utf8(bytes.to_vec()).unwrap(),
        error,
    }
}

fn get_with(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

/// Signs in with `?token=`; returns the `Set-Cookie` and its `name=value`.
async fn sign_in(app: &Router, headers: &[(&str, &str)]) -> (String, String) {
    let answer = door_answer(app, get_with(&format!("/admin/ui?token={TOKEN}"), headers)).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.html);
    assert_eq!(answer.headers[header::LOCATION], "/admin/ui");
    let set = answer.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned();
    let pair = set.split("; ").next().unwrap().to_owned();
    (set, pair)
}

#[tokio::test]
async fn signing_in_opens_a_session_whose_cookie_is_not_the_token() {
    use base64::Engine as _;
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let app = behind(&door, &inbox);
    for uri in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui?token=a-guess",
        "/admin/ui?token=",
    ] {
        let answer = door_answer(&app, get_with(uri, &[])).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(
            answer.html.contains("/admin/ui?token="),
            "says how: {}",
            answer.html
        );
        assert_eq!(answer.error.unwrap().kind(), AdminErrorKind::Unauthorized);
        assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
    }
    let (set, pair) = sign_in(&app, &[]).await;
    let attributes: Vec<&str> = set.split("; ").collect();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/admin/ui"] {
        assert!(attributes.contains(&attribute), "{attribute}: {set}");
    }
    let max_age: u64 = attributes
        .iter()
        .find_map(|a| a.strip_prefix("Max-Age="))
        .expect("Max-Age")
        .parse()
        .unwrap();
    assert!((1..=43_200).contains(&max_age), "{set}");
    assert!(
        !attributes.contains(&"Secure"),
        "served over plain HTTP: {set}"
    );
    let value = pair.strip_prefix("tower_webhook_admin=").expect(&set);
    let engines = [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    let mut encodings = vec![
        TOKEN.to_owned(),
        hex::encode(TOKEN),
        hex::encode_upper(TOKEN),
    ];
    encodings.extend(engines.iter().map(|e| e.encode(TOKEN)));
    for encoded in &encodings {
        let stem = &encoded[..16]; // any 12 bytes of it, at its start
        assert!(
            !value.contains(stem),
            "the cookie holds the token ({encoded}): {value}"
        );
    }
    for engine in engines {
        if let Ok(bytes) = engine.decode(value) {
            assert!(!bytes
                .windows(12)
                .any(|w| TOKEN.as_bytes().windows(12).any(|t| t == w)));
        }
    }
    // The cookie opens every page, each with the sign-out button.
    for uri in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui/events?state=failing",
    ] {
        let answer = door_answer(&app, get_with(uri, &[("cookie", &pair)])).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}: {}", answer.html);
        assert!(
            answer
                .html
                .contains(r#"<form class="logout" method="post" action="/admin/ui/logout">"#),
            "{uri}: {}",
            answer.html
        );
    }
    // The token to another URL signs in there, and keeps its other parameters.
    let answer = door_answer(
        &app,
        get_with(
            &format!("/admin/ui/events?state=dead&token={TOKEN}&after=x"),
            &[],
        ),
    )
    .await;
    assert_eq!(
        answer.headers[header::LOCATION],
        "/admin/ui/events?state=dead&after=x"
    );
    // A session of another token (another deployment) does not open this one; the same
    // token's door in another process (a replica) accepts it.
    let other = admin::OperatorDoor::new("another-token-0123456789abcdef").unwrap();
    let other_app = behind(&other, &inbox);
    let answer = door_answer(&other_app, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(
        answer.status,
        StatusCode::UNAUTHORIZED,
        "another token's door"
    );
    let replica = behind(&admin::OperatorDoor::new(TOKEN).unwrap(), &inbox);
    let answer = door_answer(&replica, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "a replica with the same token"
    );
    // The page alone (behind your own authorization) shows no sign-out button.
    assert!(!get(&inbox, "/admin/ui").await.html.contains("logout"));
}

#[tokio::test]
async fn the_session_cookie_is_secure_when_the_page_is_served_over_https() {
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let app = behind(&door, &inbox);
    for headers in [
        &[("x-forwarded-proto", "https")][..],
        &[("forwarded", "for=10.0.0.1;proto=https;host=ops.example")],
    ] {
        let (set, _) = sign_in(&app, headers).await;
        assert!(set.ends_with("; Secure"), "{headers:?}: {set}");
    }
    let request = Request::get(format!("https://ops.example/admin/ui?token={TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let answer = door_answer(&app, request).await;
    let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.ends_with("; Secure"), "an https URI: {set}");
    let always = behind(&door.clone().with_secure_cookies(true), &inbox);
    let (set, _) = sign_in(&always, &[]).await;
    assert!(
        set.ends_with("; Secure"),
        "with_secure_cookies(true): {set}"
    );
}

#[tokio::test]
async fn signing_out_clears_the_cookie_and_the_old_cookie_no_longer_opens_the_page() {
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let app = behind(&door, &inbox);
    let (_, pair) = sign_in(&app, &[]).await;
    let (_, kept) = sign_in(&app, &[]).await; // another browser's session
    let logout = |site: &'static str, cookie: String| {
        Request::post("/admin/ui/logout")
            .header("cookie", cookie)
            .header("sec-fetch-site", site)
            .header(header::HOST, "ops.internal:8080")
            .body(Body::empty())
            .unwrap()
    };
    // From another site: refused, and the session holds.
    let answer = door_answer(&app, logout("cross-site", pair.clone())).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!answer.headers.contains_key(header::SET_COOKIE));
    let answer = door_answer(&app, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(answer.status, StatusCode::OK);

    let answer = door_answer(&app, logout("same-origin", pair.clone())).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.html);
    assert!(answer.html.contains("signed out"), "{}", answer.html);
    let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        set.starts_with("tower_webhook_admin=; Path=/admin/ui; Max-Age=0;"),
        "{set}"
    );
    for uri in ["/admin/ui", "/admin/ui/events?state=dead"] {
        let answer = door_answer(&app, get_with(uri, &[("cookie", &pair)])).await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "the old cookie replayed: {uri}"
        );
    }
    let answer = door_answer(&app, get_with("/admin/ui", &[("cookie", &kept)])).await;
    assert_eq!(answer.status, StatusCode::OK, "another session stays open");
    // A clone of the door (the same process) knows the revocation.
    let clone = behind(&door.clone(), &inbox);
    let answer = door_answer(&clone, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_expired_session_no_longer_opens_the_page() {
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN)
        .unwrap()
        .with_session_max_age(Duration::from_secs(1))
        .unwrap();
    let app = behind(&door, &inbox);
    let (set, pair) = sign_in(&app, &[]).await;
    assert!(set.contains("; Max-Age=1;"), "{set}");
    let answer = door_answer(&app, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(answer.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let answer = door_answer(&app, get_with("/admin/ui", &[("cookie", &pair)])).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "expired");
    for bad in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(12 * 3600 + 1),
    ] {
        let door = admin::OperatorDoor::new(TOKEN).unwrap();
        assert!(door.with_session_max_age(bad).is_err(), "{bad:?}");
    }
}

/// Wrong tokens at the sign-in count as guesses, as the API's do: past the limit the
/// address gets 429 at both, its right token too, until the window has passed.
#[tokio::test]
async fn wrong_sign_ins_are_throttled_with_the_apis_guesses() {
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN)
        .unwrap()
        .with_throttle(3, Duration::from_secs(1))
        .unwrap();
    let app =
        behind(&door, &inbox).nest("/admin", admin::router(inbox.clone()).layer(door.bearer()));
    let peer = |mut request: Request<Body>| {
        let addr: std::net::SocketAddr = "10.0.0.1:4000".parse().unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        request
    };
    for guess in ["a", "b"] {
        let answer = door_answer(
            &app,
            peer(get_with(&format!("/admin/ui?token={guess}"), &[])),
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    }
    let bearer = peer(get_with("/admin/counts", &[("authorization", "Bearer c")]));
    assert_eq!(
        door_answer(&app, bearer).await.status,
        StatusCode::UNAUTHORIZED
    );
    let answer = door_answer(
        &app,
        peer(get_with(&format!("/admin/ui?token={TOKEN}"), &[])),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.html
    );
    assert_eq!(answer.headers[header::RETRY_AFTER], "1");
    assert!(!answer.headers.contains_key(header::SET_COOKIE));
    let right = format!("Bearer {TOKEN}");
    let bearer = peer(get_with("/admin/counts", &[("authorization", &right)]));
    assert_eq!(
        door_answer(&app, bearer).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let answer = door_answer(
        &app,
        peer(get_with(&format!("/admin/ui?token={TOKEN}"), &[])),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::SEE_OTHER,
        "once the window has passed"
    );
}

/// Mounted as the docs say, `/admin/ui/` answers: the door sends it to `/admin/ui`, and
/// the page alone serves its overview there.
#[tokio::test]
async fn the_page_answers_its_url_with_a_trailing_slash() {
    let inbox = inbox().await;
    let door = admin::OperatorDoor::new(TOKEN).unwrap();
    let answer = door_answer(&behind(&door, &inbox), get_with("/admin/ui/", &[])).await;
    assert_eq!(answer.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(answer.headers[header::LOCATION], "/admin/ui");
    let alone = Router::new().nest_service("/admin/ui", admin::ui(inbox.clone()));
    let answer = door_answer(&alone, get_with("/admin/ui/", &[])).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.html.contains("Webhook inbox"), "{}", answer.html);
}

// Fan-out (`Inbox::with_processors`): each route on the event page with a requeue button of
// its own, a processor filter on the lists, counts and pauses per processor.

/// An inbox of `steady` (succeeds) and `flaky` (fails every attempt, dead after 2) with
/// `evt_1` and `evt_2` delivered and drained: steady's routes processed, flaky's dead.
async fn fanned_out_and_drained() -> Inbox {
    use tower_webhook::inbox::{Attempt, ProcessorSpec, Worker};
    let inbox = inbox()
        .await
        .with_processors([
            ProcessorSpec::new("steady").unwrap(),
            ProcessorSpec::new("flaky").unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(
            common::seed::deliver(&inbox, id).await,
            StatusCode::NO_CONTENT
        );
    }
    let worker = |name: &str, fails: bool| {
        Worker::processor(
            &inbox,
            name,
            move |_: tower_webhook::Event, _: Attempt| async move {
                match fails {
                    true => Err(common::seed::DEAD_ERROR),
                    false => Ok(()),
                }
            },
        )
        .unwrap()
        .with_max_attempts(2)
        .unwrap()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(2))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn()
    };
    let (steady, flaky) = (worker("steady", false), worker("flaky", true));
    common::seed::eventually("steady's processed, flaky's dead", async || {
        let by = inbox.counts_by_processor().await.unwrap();
        by["steady"].processed == 2 && by["flaky"].dead == 2
    })
    .await;
    steady.shutdown().await;
    flaky.shutdown().await;
    inbox
}

/// The HTML of the `<tr data-processor="{name}"…>` row in `html`.
fn route_row<'a>(html: &'a str, name: &str) -> &'a str {
    let start = html
        .find(&format!("<tr data-processor=\"{name}\""))
        .unwrap_or_else(|| panic!("no row of {name}: {html}"));
    let end = html[start..]
        .find("</tr>")
        .map_or(html.len(), |e| start + e);
    &html[start..end]
}

/// The event page lists each processor's route (state, attempts, error) with a form that
/// requeues it alone, and whose each attempt was; that form requeues that route only,
/// through the same-origin check, and an unknown processor is a 400 that changes nothing.
#[tokio::test]
async fn with_fan_out_the_event_page_shows_each_route_and_requeues_one() {
    let inbox = fanned_out_and_drained().await;
    let uri = "/admin/ui/event?source=standard&id=evt_1";
    let answer = get(&inbox, uri).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.html);
    let routes = section(&answer.html, "routes");
    let flaky = route_row(routes, "flaky");
    assert!(
        flaky.contains(r#"<span class="state dead">dead</span>"#),
        "{flaky}"
    );
    assert!(flaky.contains(r#"<td class="num">2</td>"#), "{flaky}");
    assert!(flaky.contains(common::seed::DEAD_ERROR), "{flaky}");
    assert!(
        flaky.contains(r#"<input type="hidden" name="processor" value="flaky">"#),
        "a requeue form of its own: {flaky}"
    );
    let steady = route_row(routes, "steady");
    assert!(
        steady.contains(r#"<span class="state processed">processed</span>"#),
        "{steady}"
    );
    assert!(steady.contains(r#"<td class="num">1</td>"#), "{steady}");
    assert!(!routes.contains("orphaned"), "{routes}");
    let attempts = section(&answer.html, "attempts");
    assert_eq!(
        attempts.matches("<code>flaky</code>").count(),
        2,
        "{attempts}"
    );
    assert_eq!(
        attempts.matches("<code>steady</code>").count(),
        1,
        "{attempts}"
    );

    // A cross-site post of the route's form changes nothing.
    let form = "source=standard&id=evt_1&processor=flaky";
    let refused = post_form(
        &inbox,
        "/admin/ui/requeue",
        form,
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let unknown = post_form(
        &inbox,
        "/admin/ui/requeue",
        "source=standard&id=evt_1&processor=nobody",
        &[],
    )
    .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert!(
        unknown.html.contains("no such processor"),
        "{}",
        unknown.html
    );
    let by = inbox.counts_by_processor().await.unwrap();
    assert_eq!((by["flaky"].dead, by["steady"].processed), (2, 2));

    let requeued = post_form(&inbox, "/admin/ui/requeue", form, &[]).await;
    assert_eq!(requeued.status, StatusCode::SEE_OTHER, "{}", requeued.html);
    let to = requeued.headers[header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(to, format!("{uri}&done=requeued-route"));
    let event = inbox.event("standard", "evt_1").await.unwrap().unwrap();
    let state = |name: &str| {
        let route = event.routes.iter().find(|r| r.processor == name).unwrap();
        (route.state.as_str(), route.attempts)
    };
    assert_eq!(state("flaky"), ("queued", 0), "flaky's route requeued");
    assert_eq!(state("steady"), ("processed", 1), "steady's left as it was");
    let other = inbox.event("standard", "evt_2").await.unwrap().unwrap();
    assert!(other.routes.iter().any(|r| r.state.as_str() == "dead"));
    let after = get(&inbox, &to).await.html;
    assert!(after.contains("Requeued that processor's route"), "{after}");
    let flaky = route_row(section(&after, "routes"), "flaky");
    assert!(
        flaky.contains(r#"<span class="state queued">queued</span>"#),
        "{flaky}"
    );
}

/// The lists take a processor (a select of the configured ones) and list its routes
/// alone, each row saying whose; the overview counts each processor's routes, and
/// pauses and resumes one processor.
#[tokio::test]
async fn with_fan_out_lists_filter_by_processor_and_the_overview_counts_and_pauses_each() {
    let inbox = fanned_out_and_drained().await;
    let all = get(&inbox, "/admin/ui/events?state=dead").await.html;
    assert!(
        all.contains(r#"<select name="processor"><option value="" selected>any</option><option value="steady">steady</option><option value="flaky">flaky</option></select>"#),
        "{all}"
    );
    assert!(all.contains("<th>processor</th>"), "{all}");
    assert_eq!(
        all.matches(r#"<td class="processor"><code>flaky</code></td>"#)
            .count(),
        2,
        "{all}"
    );
    let flaky = get(&inbox, "/admin/ui/events?state=dead&processor=flaky")
        .await
        .html;
    assert_eq!(flaky.matches("<tr>").count(), 1 + 2, "{flaky}");
    assert!(
        flaky.contains(r#"<option value="flaky" selected>flaky</option>"#),
        "{flaky}"
    );
    let steady = get(&inbox, "/admin/ui/events?state=dead&processor=steady")
        .await
        .html;
    assert!(steady.contains("No dead event matches."), "{steady}");
    let unknown = get(&inbox, "/admin/ui/events?state=dead&processor=nobody").await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);

    let overview = get(&inbox, "/admin/ui").await.html;
    assert!(
        overview.contains(r#"<div class="dead"><dt>dead</dt><dd>2</dd></div>"#),
        "the sum: {overview}"
    );
    let processors = section(&overview, "processors");
    let flaky = route_row(processors, "flaky");
    assert!(
        flaky.contains(r#"<td class="num processed">0</td>"#),
        "{flaky}"
    );
    assert!(flaky.contains(">2</a></td>"), "dead, linked: {flaky}");
    assert!(
        flaky.contains("/admin/ui/events?state=dead&amp;processor=flaky"),
        "{flaky}"
    );
    let steady = route_row(processors, "steady");
    assert!(
        steady.contains(r#"<td class="num processed">2</td>"#),
        "{steady}"
    );

    let paused = post_form(
        &inbox,
        "/admin/ui/pause",
        "source=&type=&processor=flaky",
        &[],
    )
    .await;
    assert_eq!(paused.headers[header::LOCATION], "/admin/ui?done=paused");
    let pauses = inbox.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].processor.as_deref(), Some("flaky"));
    assert_eq!(pauses[0].source, None);
    let shown = section(&get(&inbox, "/admin/ui").await.html, "pauses").to_owned();
    assert!(shown.contains("<th>processor</th>"), "{shown}");
    assert!(shown.contains("<td><code>flaky</code></td>"), "{shown}");
    assert!(
        shown.contains(r#"<input type="hidden" name="processor" value="flaky">"#),
        "its resume names it: {shown}"
    );
    let refused = post_form(&inbox, "/admin/ui/pause", "processor=nobody", &[]).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let resumed = post_form(&inbox, "/admin/ui/resume", "processor=flaky", &[]).await;
    assert_eq!(resumed.headers[header::LOCATION], "/admin/ui?done=resumed");
    assert!(inbox.pauses().await.unwrap().is_empty());

    // Requeue matching, narrowed to a processor: counted and requeued for it alone.
    let count = post_form(
        &inbox,
        "/admin/ui/requeue-matching",
        "type=order.paid&dead=yes&processor=flaky",
        &[],
    )
    .await;
    assert!(
        count.html.contains("<strong>2</strong> dead events match"),
        "{}",
        count.html
    );
    assert!(
        count
            .html
            .contains(r#"<input type="hidden" name="processor" value="flaky">"#),
        "{}",
        count.html
    );
    let done = post_form(
        &inbox,
        "/admin/ui/requeue-matching",
        "type=order.paid&dead=yes&processor=flaky&confirm=yes",
        &[],
    )
    .await;
    assert!(done.html.contains("Requeued 2 events."), "{}", done.html);
    let by = inbox.counts_by_processor().await.unwrap();
    assert_eq!((by["flaky"].queued, by["steady"].processed), (2, 2));
}

/// With one processor (`default`), nothing of fan-out shows: no routes, no processor
/// column, select or counts.
#[tokio::test]
async fn with_one_processor_no_page_names_a_processor() {
    let inbox = inbox().await;
    seed(&inbox, 1).await;
    for uri in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui/event?source=standard&id=evt_dead_1",
    ] {
        let html = get(&inbox, uri).await.html;
        for absent in ["processor", "id=\"routes\"", "id=\"processors\""] {
            assert!(!html.contains(absent), "{absent} in {uri}: {html}");
        }
    }
}

/// A processor the inbox is no longer configured with: its routes are marked orphaned on
/// the event page (no requeue button: no worker of this inbox runs them) and its counts
/// on the overview, left out of the totals.
#[tokio::test]
async fn orphaned_routes_and_counts_are_marked() {
    use tower_webhook::inbox::ProcessorSpec;
    let store = common::stores::sqlite().await;
    let spec = |name: &str| ProcessorSpec::new(name).unwrap();
    let before = Inbox::sqlite(&store)
        .with_processors([spec("steady"), spec("gone")])
        .unwrap();
    assert_eq!(
        common::seed::deliver(&before, "evt_1").await,
        StatusCode::NO_CONTENT
    );
    let inbox = Inbox::sqlite(&store)
        .with_processors([spec("steady"), spec("new")])
        .unwrap();
    let html = get(&inbox, "/admin/ui/event?source=standard&id=evt_1")
        .await
        .html;
    let gone = route_row(section(&html, "routes"), "gone");
    assert!(gone.contains(">orphaned</span>"), "{gone}");
    assert!(!gone.contains("<form"), "{gone}");
    let steady = route_row(section(&html, "routes"), "steady");
    assert!(
        !steady.contains("orphaned") && steady.contains("<form"),
        "{steady}"
    );

    let overview = get(&inbox, "/admin/ui").await.html;
    let gone = route_row(section(&overview, "processors"), "gone");
    assert!(gone.contains(">orphaned</span>"), "{gone}");
    assert!(gone.contains(r#"<td class="num queued">1</td>"#), "{gone}");
    assert!(
        overview.contains(r#"<div class="queued"><dt>queued</dt><dd>1</dd></div>"#),
        "steady's alone in the total: {overview}"
    );
}

/// "Erase body" on an event's page asks to confirm first (nothing erased), then erases:
/// the page shows the body erased and the route dead with the reason, and offers the
/// form no more; a cross-site post is refused, an unknown event is 404.
#[tokio::test]
async fn erase_body_confirms_first_then_erases() {
    let inbox = inbox().await;
    deliver_body(
        &inbox,
        "evt_erase",
        r#"{"type":"order.paid","secret":"s3cr3t-body"}"#,
    )
    .await;
    let uri = "/admin/ui/event?source=standard&id=evt_erase";
    let shown = get(&inbox, uri).await;
    assert!(
        shown.html.contains(r#"action="/admin/ui/erase-body""#),
        "{}",
        shown.html
    );
    assert!(shown.html.contains("s3cr3t-body"));

    let cross = post_form(
        &inbox,
        "/admin/ui/erase-body",
        "source=standard&id=evt_erase&confirm=yes",
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    let ask = post_form(
        &inbox,
        "/admin/ui/erase-body",
        "source=standard&id=evt_erase",
        &[],
    )
    .await;
    assert_eq!(ask.status, StatusCode::OK);
    assert!(ask.html.contains("cannot be undone"), "{}", ask.html);
    assert!(ask.html.contains(r#"name="confirm" value="yes""#));
    let stored = inbox.event("standard", "evt_erase").await.unwrap().unwrap();
    assert_eq!(
        stored.body_state.as_str(),
        "stored",
        "nothing before the confirmation"
    );

    let done = post_form(
        &inbox,
        "/admin/ui/erase-body",
        "source=standard&id=evt_erase&confirm=yes",
        &[],
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    let to = done.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(to.ends_with("&done=erased"), "{to}");
    let shown = get(&inbox, &to).await;
    assert!(shown.html.contains("Erased: its body"), "{}", shown.html);
    assert!(shown.html.contains("body-erased"), "{}", shown.html);
    assert!(
        shown
            .html
            .contains("the body was erased before the event was processed"),
        "{}",
        shown.html
    );
    assert!(!shown.html.contains("s3cr3t-body"));
    assert!(!shown.html.contains(r#"action="/admin/ui/erase-body""#));

    let unknown = post_form(
        &inbox,
        "/admin/ui/erase-body",
        "source=standard&id=evt_never&confirm=yes",
        &[],
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

/// Invalid events (issue 36): the overview counts them, `/invalid` lists them with their
/// errors, and the event's page shows them beside the body, as escaped text.
#[tokio::test]
async fn invalid_events_are_counted_listed_and_their_errors_shown_beside_the_body() {
    let id_is_a_number = serde_json::json!({"properties": {"data": {"properties": {
        "object": {"properties": {"id": {"type": "integer"}}}
    }}}});
    let schemas = tower_webhook::schemas::Schemas::new()
        .with_schema("order.paid", &id_is_a_number)
        .unwrap();
    let inbox = inbox().await.with_schemas(schemas);
    let body = r#"{"type":"order.paid","data":{"object":{"id":"pi_<b>1</b>"}}}"#;
    deliver_body(&inbox, "evt_invalid", body).await;

    let overview = get(&inbox, "/admin/ui").await;
    assert_eq!(overview.status, StatusCode::OK);
    let counts = section(&overview.html, "counts");
    assert!(counts.contains("<dt>invalid</dt><dd>1</dd>"), "{counts}");

    let listed = get(&inbox, "/admin/ui/invalid").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert!(listed.html.contains("evt_invalid"), "{}", listed.html);
    assert!(
        listed.html.contains("<code>/data/object/id</code>"),
        "{}",
        listed.html
    );

    let page = get(&inbox, "/admin/ui/event?source=standard&id=evt_invalid").await;
    assert_eq!(page.status, StatusCode::OK);
    let errors = section(&page.html, "validation");
    assert!(errors.contains("<code>/data/object/id</code>"), "{errors}");
    assert!(
        !errors.contains("pi_"),
        "no payload value in the errors: {errors}"
    );
    assert!(page.html.contains("invalid"), "its state");
    assert!(!page.html.contains("<b>1</b>"), "the body escaped");
}

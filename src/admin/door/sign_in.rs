//! [`SignInLayer`]: the operator page's door — `?token=` once, then a session cookie;
//! `POST <page>/logout` signs out.

use std::borrow::Cow;
use std::task::{Context, Poll};

use axum::extract::{NestedPath, OriginalUri};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use tokio::task::futures::TaskLocalFuture;
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::session::{self, Session, COOKIE};
use super::throttle::client;
use super::{retry_after, OperatorDoor};
use crate::admin::AdminError;

tokio::task_local! {
    /// Set while a signed-in request runs through the page, whose layout then shows the
    /// sign-out button (a task-local, so no page function needs a new argument).
    static SIGNED_IN: ();
}

/// Whether the page is being rendered for a session the door let in.
pub(in crate::admin) fn signed_in() -> bool {
    SIGNED_IN.try_with(|()| ()).is_ok()
}

/// Lets a browser into the operator's page with a session: [`OperatorDoor::sign_in`].
#[derive(Clone, Debug)]
#[must_use]
pub struct SignInLayer {
    door: OperatorDoor,
}

impl SignInLayer {
    pub(super) fn new(door: OperatorDoor) -> Self {
        Self { door }
    }
}

impl<S> Layer<S> for SignInLayer {
    type Service = SignIn<S>;

    fn layer(&self, inner: S) -> SignIn<S> {
        SignIn {
            inner,
            door: self.door.clone(),
        }
    }
}

/// The service of [`SignInLayer`].
#[derive(Clone, Debug)]
#[must_use]
pub struct SignIn<S> {
    inner: S,
    door: OperatorDoor,
}

crate::admin::door::inner_access!(SignIn);

impl<S, B> Service<Request<B>> for SignIn<S>
where
    S: Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<TaskLocalFuture<(), S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.door.answer(&request) {
            None => ResponseFuture::inner(SIGNED_IN.scope((), self.inner.call(request))),
            Some(answer) => ResponseFuture::own(answer),
        }
    }
}

/// Where the page is mounted (`/admin/ui`, no trailing slash; `""` at the root).
fn base<B>(request: &Request<B>) -> &str {
    request
        .extensions()
        .get::<NestedPath>()
        .map_or("", |path| path.as_str().trim_end_matches('/'))
}

/// The mount point's own URL (`/admin/ui`, or `/`).
fn home(base: &str) -> &str {
    if base.is_empty() {
        "/"
    } else {
        base
    }
}

/// Whether the browser reached the page over HTTPS: the request's URI says so (HTTP/2),
/// or a proxy's `X-Forwarded-Proto` / `Forwarded` does. Trusting the header is safe here:
/// it can only add `Secure`, which makes the cookie stricter.
fn over_https<B>(request: &Request<B>) -> bool {
    let says_https = |name: &str| {
        request.headers().get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|v| {
                v.split([',', ';']).any(|part| {
                    let part = part.trim();
                    part.eq_ignore_ascii_case("https") || part.eq_ignore_ascii_case("proto=https")
                })
            })
        })
    };
    request.uri().scheme() == Some(&http::uri::Scheme::HTTPS)
        || says_https("x-forwarded-proto")
        || says_https("forwarded")
}

/// The values of the session cookie the request carries (a browser may send several).
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// The headers every answer of the door carries: nothing cached, nothing sniffed,
/// nothing loaded, no referrer (a sign-in URL holds the token).
fn guarded(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; frame-ancestors 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A short page of text with `status`, an [`AdminError`] in its extensions.
fn text(status: StatusCode, body: String, error: Option<AdminError>) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response();
    if let Some(error) = error {
        response.extensions_mut().insert(error);
    }
    guarded(response)
}

fn sign_in_hint(base: &str) -> String {
    format!("sign in: open {}?token=<operator token> once\n", home(base))
}

impl OperatorDoor {
    /// The door's own answer to `request` — 429 while its client is throttled, a
    /// sign-in, a sign-out, the trailing slash, or 401 — or `None`: a live session, let in.
    fn answer<B>(&self, request: &Request<B>) -> Option<Response> {
        let client = client(request.extensions());
        if let Err(wait) = self.throttle.check(client) {
            let error = AdminError::too_many_requests();
            let mut response = text(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{error}\n"),
                Some(error),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after(wait));
            return Some(response);
        }
        let base = base(request);
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or_default();
        let token = form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == "token");
        if let (true, Some((_, token))) = (
            matches!(*request.method(), Method::GET | Method::HEAD),
            token,
        ) {
            if !self.token.matches(token.as_bytes()) {
                self.throttle.fail(client);
                return Some(self.unauthorized(base));
            }
            return Some(self.signed_in(request, base, path, query));
        }
        let slash = request
            .extensions()
            .get::<OriginalUri>()
            .is_some_and(|uri| uri.path().ends_with('/'));
        if !base.is_empty() && path == "/" && slash {
            // `/admin/ui/`: the page's own URL is without the slash (its links start from it).
            let to = match request.uri().query() {
                Some(query) => format!("{base}?{query}"),
                None => base.to_owned(),
            };
            return Some(guarded(
                axum::response::Redirect::permanent(&to).into_response(),
            ));
        }
        let session = cookies(request.headers())
            .filter_map(|value| session::read(&self.token, value))
            .find(|session| !self.revoked.contains(*session));
        if path == "/logout" && request.method() == Method::POST {
            return Some(self.signed_out(request, base, session));
        }
        match session {
            Some(_) => None,
            None => Some(self.unauthorized(base)),
        }
    }

    fn unauthorized(&self, base: &str) -> Response {
        let error = AdminError::unauthorized("sign in with the operator token");
        text(StatusCode::UNAUTHORIZED, sign_in_hint(base), Some(error))
    }

    /// `Set-Cookie` for `value` with `max_age` seconds, on the page's path.
    fn cookie<B>(
        &self,
        request: &Request<B>,
        base: &str,
        value: &str,
        max_age: u64,
    ) -> HeaderValue {
        let secure = if self.secure_cookies || over_https(request) {
            "; Secure"
        } else {
            ""
        };
        let cookie = format!(
            "{COOKIE}={value}; Path={}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            home(base)
        );
        HeaderValue::try_from(cookie).expect("a mount path and base64 are header-safe")
    }

    /// The token was right: a new session, and back to the same URL without the token
    /// (it leaves the address bar and the history).
    fn signed_in<B>(&self, request: &Request<B>, base: &str, path: &str, query: &str) -> Response {
        let value = session::open(&self.token, self.session_max_age);
        let max_age = self.session_max_age.as_secs_f64().ceil() as u64;
        let rest: Vec<(Cow<'_, str>, Cow<'_, str>)> = form_urlencoded::parse(query.as_bytes())
            .filter(|(name, _)| name != "token")
            .collect();
        let path = if path == "/" && !base.is_empty() {
            ""
        } else {
            path
        };
        // The path as asked, never `//host`: a redirect stays on this site.
        let mut to = format!("/{}", format!("{base}{path}").trim_start_matches('/'));
        if !rest.is_empty() {
            to.push('?');
            to.push_str(
                &form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(rest)
                    .finish(),
            );
        }
        let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
        response.headers_mut().insert(
            header::SET_COOKIE,
            self.cookie(request, base, &value, max_age),
        );
        guarded(response)
    }

    /// `POST /logout`: the session revoked (in this process) and its cookie cleared.
    fn signed_out<B>(
        &self,
        request: &Request<B>,
        base: &str,
        session: Option<Session>,
    ) -> Response {
        if !crate::admin::ui::same_origin(request.headers(), request.uri()) {
            let error = AdminError::forbidden(
                "refused: this page's forms post only from this page (a cross-site request)",
            );
            return text(StatusCode::FORBIDDEN, format!("{error}\n"), Some(error));
        }
        if let Some(session) = session {
            self.revoked.revoke(session);
        }
        let mut response = text(
            StatusCode::OK,
            format!(
                "signed out. To sign in again, open {}?token=<operator token>\n",
                home(base)
            ),
            None,
        );
        response
            .headers_mut()
            .insert(header::SET_COOKIE, self.cookie(request, base, "", 0));
        response
    }
}

//! What keeps the page safe in a browser: POSTs only from the page itself, and headers
//! that forbid everything the page does not do.
//!
//! Cross-site requests are refused by the headers the *browser* sets, which a page on
//! another site cannot forge: `Sec-Fetch-Site` (every current browser sends it) must be
//! `same-origin` (or `none`: typed by the user), and where it is missing, an `Origin`
//! must name the host the request was sent to. A request with neither comes from no
//! browser (curl, a script), which cross-site request forgery needs. No token to keep,
//! so any authorization in front works, cookies included.

use axum::extract::{FromRequestParts, NestedPath};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Response, Uri};

use super::routes::UiError;
use crate::admin::AdminError;

/// Allows nothing from elsewhere: the page's own stylesheet and script, its own forms, no
/// inline script or style, no framing, no plugins. A body with markup shown on the page
/// is text anyway; this is the second wall.
pub(super) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
    script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// An extractor that refuses a cross-site request (403): every POST handler takes one.
pub(super) struct SameOrigin;

impl<S: Send + Sync> FromRequestParts<S> for SameOrigin {
    type Rejection = UiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, UiError> {
        if same_origin(&parts.headers, &parts.uri) {
            return Ok(SameOrigin);
        }
        let Ok(Base(base)) = Base::from_request_parts(parts, state).await;
        let why = "refused: this page's forms post only from this page (a cross-site request)";
        Err(UiError::at(base, AdminError::forbidden(why)))
    }
}

/// Whether the request came from a page of its own origin, or from no browser at all
/// (the page's forms, and the door's sign-out).
pub(in crate::admin) fn same_origin(headers: &HeaderMap, uri: &Uri) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true; // a browser sends Origin with every cross-origin POST
    };
    let host = headers
        .get(header::HOST)
        .map(HeaderValue::as_bytes)
        .or_else(|| uri.authority().map(|a| a.as_str().as_bytes()));
    let Some(host) = host else { return false };
    let origin = origin.as_bytes();
    [&b"http://"[..], b"https://"]
        .iter()
        .any(|scheme| origin.strip_prefix(*scheme) == Some(host))
}

/// Where the router is mounted (`/admin/ui`), without a trailing slash: the start of
/// every link the pages print (`""` when it is not nested).
pub(super) struct Base(pub(super) String);

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let base = match NestedPath::from_request_parts(parts, state).await {
            Ok(path) => path.as_str().trim_end_matches('/').to_owned(),
            Err(_) => String::new(),
        };
        Ok(Base(base))
    }
}

/// Sets the headers every response of the page carries (its errors and redirects too).
/// Not a hot path: one `map_response` layer over the operator's requests.
pub(super) async fn secure_headers<B>(mut response: Response<B>) -> Response<B> {
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Event ids are in the page's URLs: no other site learns them from a link.
        (header::REFERRER_POLICY, "no-referrer"),
        // Payloads are customer data: no shared or disk cache keeps them.
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::post("/requeue");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_post_from_the_page_itself_or_no_browser_passes() {
        for headers in [
            &[("sec-fetch-site", "same-origin"), ("host", "ops:8080")][..],
            &[("sec-fetch-site", "none")],
            &[("origin", "http://ops:8080"), ("host", "ops:8080")],
            &[("origin", "https://ops.example"), ("host", "ops.example")],
            &[("host", "ops:8080")],
            &[],
        ] {
            let parts = parts(headers);
            assert!(same_origin(&parts.headers, &parts.uri), "{headers:?}");
        }
    }

    #[test]
    fn a_cross_site_post_is_refused() {
        for headers in [
            &[("sec-fetch-site", "cross-site"), ("host", "ops:8080")][..],
            &[
                ("sec-fetch-site", "same-site"),
                ("origin", "http://ops:8080"),
            ],
            // Sec-Fetch-Site decides where a browser sends it, whatever Origin says.
            &[
                ("sec-fetch-site", "cross-site"),
                ("origin", "http://ops:8080"),
                ("host", "ops:8080"),
            ],
            &[("origin", "http://evil.example"), ("host", "ops:8080")],
            &[
                ("origin", "http://ops:8080.evil.example"),
                ("host", "ops:8080"),
            ],
            &[("origin", "null"), ("host", "ops:8080")],
            &[("origin", "http://ops:8080")],
        ] {
            let parts = parts(headers);
            assert!(!same_origin(&parts.headers, &parts.uri), "{headers:?}");
        }
    }
}

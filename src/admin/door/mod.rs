//! The operators' door: [`OperatorDoor`] (its docs say how it works) and its parts, one
//! file each.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::error::ConfigError;

mod bearer; // the JSON API's check
mod future;
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
mod session; // the page's cookie: open, read, revoke
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
mod sign_in; // the page's check, sign-in and sign-out
mod throttle; // failed tries per client address
mod token; // the token, compared by digest

pub use self::bearer::{Bearer, BearerLayer};
pub use self::future::ResponseFuture;
#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
pub use self::sign_in::{SignIn, SignInLayer};
pub use self::token::{OperatorToken, MIN_TOKEN_BYTES};

#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
pub(in crate::admin) use self::sign_in::signed_in;

/// Failed tries from one address before it is answered 429, by default.
const MAX_FAILURES: u32 = 20;

/// The window they are counted in, and how long an address is then refused.
const WINDOW: Duration = Duration::from_secs(60);

/// Client addresses tracked at most, by default (about 64 bytes each).
const MAX_CLIENTS: usize = 10_000;

/// The longest session: a working day and some.
const MAX_SESSION: Duration = Duration::from_secs(12 * 3600);

/// The operators' door: who may use [`router`][super::router] and [`ui`][super::ui].
///
/// An [`OperatorDoor`] is built from the operators' token ([`OperatorToken`]: at least 16
/// bytes, compared in constant time) and hands out two layers that share its state:
///
/// - [`bearer`](OperatorDoor::bearer), for the JSON API: `Authorization: Bearer <token>`,
///   else 401 (`{"error": …}`, `WWW-Authenticate: Bearer`);
/// - [`sign_in`][OperatorDoor::sign_in] (feature `admin-ui`), for the page: a browser
///   opens `<page>?token=<token>` once and is redirected (303) to the same URL without
///   the token, holding a session cookie; `POST <page>/logout` (the page's "Sign out"
///   button) ends the session. Without a live session, 401 with how to sign in.
///
/// **Throttle.** Wrong tokens are counted per client address: after 20 in a minute (by
/// default; [`with_throttle`](OperatorDoor::with_throttle)), that address is answered
/// 429 with `Retry-After` (at most the window, 60 s) — its right token too — until the
/// window has passed; then the right token works again. A request with no credentials at
/// all (a probe, a browser before sign-in) is refused without being counted. The address
/// is the connection's peer, from axum's `ConnectInfo<SocketAddr>`: serve with
/// `app.into_make_service_with_connect_info::<SocketAddr>()`.
/// **Without `ConnectInfo`, every client shares one count**: a guesser then locks the
/// operators out too (the door fails closed). Forwarded headers (`X-Forwarded-For`) are
/// not trusted, since any client can write them; behind a proxy you trust, insert the
/// `ConnectInfo` yourself (a layer before the door) from the address it reports. An IPv6
/// client counts as its /64. At most 10 000 addresses are tracked
/// ([`with_max_clients`](OperatorDoor::with_max_clients)), the oldest evicted first:
/// memory stays bounded under a spray of addresses, at the price that a spray of more
/// than that many addresses within the window frees a blocked one early.
///
/// **Sessions.** The cookie (`tower_webhook_admin`) holds a random session id and its
/// expiry, signed with HMAC-SHA256 under a key derived from the token: it is not the
/// token in any encoding, and every replica built from the same token accepts it.
/// `Max-Age` is 12 h by default (at most;
/// [`with_session_max_age`][OperatorDoor::with_session_max_age]), the cookie is
/// `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page sends it),
/// on the page's path, and `Secure` when the page was reached over HTTPS (the request's
/// URI says so, or `X-Forwarded-Proto: https` / `Forwarded: proto=https`; always with
/// [`with_secure_cookies(true)`][OperatorDoor::with_secure_cookies]). Signing out revokes
/// the session **in this process** (kept until it would have expired, at most 10 000):
/// another replica still accepts a copy of the cookie until it expires. Changing the
/// token ends every session at once.
///
/// ```
/// use axum::body::Body;
/// use axum::http::{self, header, StatusCode};
/// use axum::Router;
/// use tower::ServiceExt as _;
/// use tower_webhook::admin::{self, OperatorDoor};
/// use tower_webhook::inbox::Inbox;
/// use tower_webhook::store::SqliteStore;
///
/// # fn token_from_your_secret_store() -> String { "kX9f2c7b1e0a4d6f8e3b5a7c9d1f3e5a".into() }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("tower-webhook-door-doc-{}.db", std::process::id()));
/// let inbox = Inbox::sqlite(&SqliteStore::open(&path).await?);
/// let token = token_from_your_secret_store();
/// // A token under 16 bytes (an unset variable's "") is a ConfigError here.
/// let door = OperatorDoor::new(&token)?;
/// let app: Router = Router::new()
///     // .route("/webhooks", …): the rest of your application
///     .nest_service("/admin/ui", admin::ui(inbox.clone()).layer(door.sign_in()))
///     .nest("/admin", admin::router(inbox).layer(door.bearer()));
/// // Serve it with the client's address, for the throttle:
/// // axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
///
/// let ask = |token: &str| {
///     http::Request::get("/admin/counts")
///         .header(header::AUTHORIZATION, format!("Bearer {token}"))
///         .body(Body::empty())
/// };
/// assert_eq!(app.clone().oneshot(ask("a guess")?).await?.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(app.clone().oneshot(ask("")?).await?.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(app.clone().oneshot(ask(&token)?).await?.status(), StatusCode::OK);
/// let sign_in = http::Request::get(format!("/admin/ui?token={token}")).body(Body::empty())?;
/// let answer = app.oneshot(sign_in).await?;
/// assert_eq!(answer.status(), StatusCode::SEE_OTHER);
/// assert_eq!(answer.headers()[header::LOCATION], "/admin/ui");
/// # let _ = std::fs::remove_file(&path);
/// # Ok(())
/// # }
/// ```
///
/// Mount the page with `nest_service`, which also answers `/admin/ui/` (redirected to
/// `/admin/ui`); `nest` leaves that URL to your router's 404.
///
/// Cloning shares the throttle and the revoked sessions: build one door and take both
/// layers from it, so a guess at either counts for both.
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "[super::router]: super::router"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[super::router]: crate#features"
)]
#[cfg_attr(
    all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")),
    doc = "[super::ui]: super::ui"
)]
#[cfg_attr(
    not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
    doc = "[super::ui]: crate#features"
)]
#[cfg_attr(
    all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")),
    doc = "[OperatorDoor::sign_in]: OperatorDoor::sign_in"
)]
#[cfg_attr(
    not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
    doc = "[OperatorDoor::sign_in]: crate#features"
)]
#[cfg_attr(
    all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")),
    doc = "[OperatorDoor::with_session_max_age]: OperatorDoor::with_session_max_age"
)]
#[cfg_attr(
    not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
    doc = "[OperatorDoor::with_session_max_age]: crate#features"
)]
#[cfg_attr(
    all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")),
    doc = "[OperatorDoor::with_secure_cookies]: OperatorDoor::with_secure_cookies"
)]
#[cfg_attr(
    not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
    doc = "[OperatorDoor::with_secure_cookies]: crate#features"
)]
#[derive(Clone)]
#[must_use]
pub struct OperatorDoor {
    token: Arc<OperatorToken>,
    throttle: Arc<throttle::Throttle>,
    #[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
    revoked: Arc<session::Revoked>,
    #[cfg_attr(
        not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
        allow(dead_code)
    )]
    session_max_age: Duration,
    #[cfg_attr(
        not(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres"))),
        allow(dead_code)
    )]
    secure_cookies: bool,
}

impl OperatorDoor {
    /// A door for `token`, with the defaults: 20 failures a minute per address, 10 000
    /// addresses tracked, sessions of 12 h.
    ///
    /// # Errors
    ///
    /// A token under [`MIN_TOKEN_BYTES`] bytes (see [`OperatorToken::new`]).
    pub fn new(token: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        Ok(Self::from_token(OperatorToken::new(token)?))
    }

    /// A door for a token checked already.
    pub fn from_token(token: OperatorToken) -> Self {
        Self {
            token: Arc::new(token),
            throttle: Arc::new(throttle::Throttle::new(MAX_FAILURES, WINDOW, MAX_CLIENTS)),
            #[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
            revoked: Arc::default(),
            session_max_age: MAX_SESSION,
            secure_cookies: false,
        }
    }

    /// After `max_failures` wrong tokens from one address within `window`, that address
    /// is answered 429 for `window` (its `Retry-After`). Replaces the throttle (and what
    /// it counted).
    ///
    /// # Errors
    ///
    /// `max_failures` of 0, or a `window` of 0 or over 60 s.
    pub fn with_throttle(
        mut self,
        max_failures: u32,
        window: Duration,
    ) -> Result<Self, ConfigError> {
        if max_failures == 0 {
            return Err(ConfigError::new(
                crate::ConfigErrorKind::InvalidValue,
                "the throttle's failures must be at least 1",
            ));
        }
        if window.is_zero() || window > WINDOW {
            return Err(ConfigError::duration(
                "the throttle's window",
                window,
                "above 0 and at most 60 s",
            ));
        }
        let cap = self.throttle.cap();
        self.throttle = Arc::new(throttle::Throttle::new(max_failures, window, cap));
        Ok(self)
    }

    /// Tracks at most `max_clients` addresses (at least 1), the oldest evicted first.
    /// Replaces the throttle (and what it counted).
    pub fn with_max_clients(mut self, max_clients: usize) -> Self {
        let (failures, window) = (self.throttle.max_failures(), self.throttle.window());
        self.throttle = Arc::new(throttle::Throttle::new(failures, window, max_clients));
        self
    }

    /// The API's layer: `Authorization: Bearer <token>`, else 401; 429 while the client
    /// is throttled. For [`router`][super::router] and
    /// [`jetstream_router`][super::jetstream_router]:
    /// `admin::router(inbox).layer(door.bearer())`.
    ///
    #[cfg_attr(
        feature = "nats",
        doc = "[super::jetstream_router]: super::jetstream_router"
    )]
    #[cfg_attr(
        not(feature = "nats"),
        doc = "[super::jetstream_router]: crate#features"
    )]
    #[cfg_attr(
        any(feature = "sqlite", feature = "postgres"),
        doc = "[super::router]: super::router"
    )]
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        doc = "[super::router]: crate#features"
    )]
    pub fn bearer(&self) -> BearerLayer {
        BearerLayer::new(self.clone())
    }
}

#[cfg(all(feature = "admin-ui", any(feature = "sqlite", feature = "postgres")))]
impl OperatorDoor {
    /// How long a session lasts (its cookie's `Max-Age`): from 1 s to 12 h, 12 h by
    /// default.
    ///
    /// # Errors
    ///
    /// A duration under 1 s or over 12 h.
    pub fn with_session_max_age(mut self, max_age: Duration) -> Result<Self, ConfigError> {
        if max_age < Duration::from_secs(1) || max_age > MAX_SESSION {
            return Err(ConfigError::duration(
                "a session's max age",
                max_age,
                "from 1 s to 12 h",
            ));
        }
        self.session_max_age = max_age;
        Ok(self)
    }

    /// `true`: every session cookie is `Secure`, whatever the request says (set it when
    /// the page is only ever served over HTTPS). `false`, the default: `Secure` when the
    /// request says HTTPS (see [`OperatorDoor`]).
    pub fn with_secure_cookies(mut self, always: bool) -> Self {
        self.secure_cookies = always;
        self
    }

    /// The page's layer: a session, else 401 with how to sign in; `?token=` signs in,
    /// `POST /logout` signs out; 429 while the client is throttled. For
    /// [`ui`][super::ui]: `admin::ui(inbox).layer(door.sign_in())`, mounted with
    /// `nest_service`.
    pub fn sign_in(&self) -> SignInLayer {
        SignInLayer::new(self.clone())
    }
}

impl fmt::Debug for OperatorDoor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorDoor")
            .field("token", &self.token)
            .field("max_failures", &self.throttle.max_failures())
            .field("window", &self.throttle.window())
            .field("max_clients", &self.throttle.cap())
            .field("session_max_age", &self.session_max_age)
            .field("secure_cookies", &self.secure_cookies)
            .finish()
    }
}

/// `Retry-After` for `wait`: whole seconds, rounded up (at least 1).
fn retry_after(wait: Duration) -> HeaderValue {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

/// `get_ref`, `get_mut` and `into_inner` for a door's service.
macro_rules! inner_access {
    ($service:ident) => {
        impl<S> $service<S> {
            /// The inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// The inner service, unwrapped.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }
    };
}
pub(crate) use inner_access;

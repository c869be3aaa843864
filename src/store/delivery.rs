//! What a claim is about: a delivery's key (source and id), its kind, and the audit
//! columns of its event.

use super::{StoreError, StoreErrorKind};
use crate::Event;

/// What a claim is about: the key, and the verified event when there is one (SQL stores
/// keep its type, object id and livemode beside the key; the inbox keeps its body too, a
/// dedupe claim never does).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub(super) source: String,
    pub(super) id: String,
    event: Option<Event>,
    once: bool,
    /// An event key kept until pruned by name: its scheme signs no time.
    kept: bool,
    /// The request headers the SQL inbox stores with the row (credentials left out).
    headers: Option<String>,
    /// The processors the SQL inbox makes a route for (none: stored unrouted).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    routes: Vec<std::sync::Arc<str>>,
    /// The body and headers the SQL inbox stores, sealed (an inbox with keys): what
    /// [`audit`](Self::audit) answers instead of the plaintext (P1).
    sealed: Option<Box<SealedBody>>,
    /// The accept's span context the SQL inbox stores with the event (feature `otel`;
    /// a zero-sized nothing without it).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    trace: crate::span::TraceContext,
}

/// A delivery's body and headers sealed under one key, as the SQL inbox stores them.
#[derive(Clone)]
#[allow(dead_code)] // made only with the feature `seal`
pub(crate) struct SealedBody {
    pub(crate) key_id: String,
    pub(crate) body: Vec<u8>,
    pub(crate) body_nonce: Vec<u8>,
    /// The headers' ciphertext and nonce, when headers are stored.
    pub(crate) headers: Option<(Vec<u8>, Vec<u8>)>,
    /// The application's subject ([`Inbox::with_subject`](crate::inbox::Inbox)): its
    /// ciphertext, nonce and keyed digest under the same key.
    pub(crate) subject: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for SealedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedBody")
            .field("key_id", &self.key_id)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// A delivery keyed by `(source, id)`, without an event.
    #[must_use]
    pub fn new(source: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            id: id.into(),
            event: None,
            once: false,
            kept: false,
            headers: None,
            routes: Vec::new(),
            sealed: None,
            trace: crate::span::TraceContext::default(),
        }
    }

    /// A [`Once`](crate::once::Once) business key: `id` within the namespace `source`.
    pub(crate) fn once_key(source: &str, id: &str) -> Self {
        Self {
            once: true,
            ..Self::new(source, id)
        }
    }

    /// The delivery of a verified event, keyed on its
    /// [`dedupe_id`](Event::dedupe_id): the id when the signature covers it, else a digest
    /// of the body. An event of a scheme that signs no time gives a [kept](Self::is_kept)
    /// key.
    #[must_use]
    pub fn from_event(event: &Event) -> Self {
        Self {
            source: event.source().to_owned(),
            id: event.dedupe_id().to_owned(),
            event: Some(event.clone()),
            once: false,
            // No signed time: a replay passes every check but the key, however late.
            kept: event.keeps_key(),
            headers: None,
            routes: Vec::new(),
            sealed: None,
            trace: crate::span::TraceContext::default(),
        }
    }

    /// Which endpoint or provider.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The provider's event id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The verified event, when the delivery came through `VerifyWebhookLayer`.
    #[must_use]
    pub fn event(&self) -> Option<&Event> {
        self.event.as_ref()
    }

    /// Whether this is a [`Once`](crate::once::Once) business key rather than an event
    /// key. A store keeps done business keys until
    /// [`DedupeStore::prune_once`](super::DedupeStore::prune_once) names their namespace:
    /// they must outlive every event that could trigger the action again.
    #[must_use]
    pub fn is_once_key(&self) -> bool {
        self.once
    }

    /// Whether this is the key of an event whose scheme signs no time (GitHub, Shopify,
    /// Twilio, Meta, Intercom, Microsoft Graph, …): only the key stops a replay of it, at
    /// any age. A store keeps such a key, once done, until
    /// [`DedupeStore::prune_once`](super::DedupeStore::prune_once) names its source — never
    /// by the retention.
    #[must_use]
    pub fn is_kept(&self) -> bool {
        self.kept
    }

    /// Whether a done key outlives the retention: a business key or a kept event key.
    pub(crate) fn kept_until_pruned(&self) -> bool {
        self.once || self.kept
    }

    /// The `kind` column of the key's row in SQL stores.
    #[allow(dead_code)]
    pub(crate) fn kind(&self) -> &'static str {
        if self.once {
            "once"
        } else if self.kept {
            "kept"
        } else {
            "event"
        }
    }

    /// The delivery with the request headers the SQL inbox stores beside it.
    #[allow(dead_code)]
    pub(crate) fn with_headers(mut self, headers: Option<String>) -> Self {
        self.headers = headers;
        self
    }

    /// The processors the SQL inbox makes a route for, in the accept's transaction.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn with_routes(mut self, routes: Vec<std::sync::Arc<str>>) -> Self {
        self.routes = routes;
        self
    }

    /// The accept's span context, stored with the event.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn with_trace(mut self, trace: crate::span::TraceContext) -> Self {
        self.trace = trace;
        self
    }

    /// The accept's span context (empty without the feature `otel`).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn trace(&self) -> &crate::span::TraceContext {
        &self.trace
    }

    /// The processors the SQL inbox makes a route for (none: stored unrouted).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn routes(&self) -> &[std::sync::Arc<str>] {
        &self.routes
    }

    /// The delivery with its body and headers sealed: every statement that binds the
    /// audit's body then stores the ciphertext, and its headers are stored sealed only.
    #[allow(dead_code)] // made only with the feature `seal`
    pub(crate) fn with_sealed(mut self, sealed: SealedBody) -> Self {
        self.sealed = Some(Box::new(sealed));
        self
    }

    /// The body and headers sealed, when they are.
    #[allow(dead_code)]
    pub(crate) fn sealed(&self) -> Option<&SealedBody> {
        self.sealed.as_deref()
    }

    /// What SQL stores record beside the key: sealed, the ciphertext as the body and no
    /// headers in clear.
    #[allow(dead_code)]
    pub(crate) fn audit(&self) -> Audit<'_> {
        match &self.event {
            Some(e) => Audit {
                event_type: e.event_type(),
                object_id: e.object_id(),
                livemode: e.livemode(),
                body: Some(match &self.sealed {
                    Some(sealed) => &sealed.body,
                    None => e.body(),
                }),
                headers: match &self.sealed {
                    Some(_) => None,
                    None => self.headers.as_deref(),
                },
            },
            None => Audit::default(),
        }
    }

    /// What it adds to a batch of writes: its body and its headers.
    #[allow(dead_code)]
    pub(crate) fn size(&self) -> usize {
        let audit = self.audit();
        let sealed_headers = self.sealed().and_then(|s| s.headers.as_ref());
        audit.body.map_or(0, <[u8]>::len)
            + audit.headers.map_or(0, str::len)
            + sealed_headers.map_or(0, |(h, _)| h.len())
    }
}

/// The longest source, and the longest id, the built-in stores keep (bytes): together they
/// fit PostgreSQL's index (at most 2 704 bytes a row), and every store refuses alike.
pub(crate) const MAX_KEY_PART: usize = 1024;

/// Refuses, as [`StoreErrorKind::InvalidInput`], a key the built-in stores cannot keep
/// alike: a source or id over [`MAX_KEY_PART`] bytes, or holding a NUL (PostgreSQL's text
/// cannot). Checked before a claim or an accept reaches a store, so such a key is a 500 on
/// every store — not a 503 the provider retries for days, nor one store keeping what
/// another refuses.
pub(crate) fn check_key(source: &str, id: &str) -> Result<(), StoreError> {
    let fits = |part: &str| part.len() <= MAX_KEY_PART && !part.contains('\0');
    if fits(source) && fits(id) {
        return Ok(());
    }
    Err(
        StoreError::message("a source and an id are at most 1 KiB each, without NUL")
            .with_kind(StoreErrorKind::InvalidInput),
    )
}

/// What SQL stores keep beside a key: type, object id and livemode on every row; the raw
/// body and the request headers for the inbox's accept only (a claim row keeps no body).
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Audit<'a> {
    pub(crate) event_type: Option<&'a str>,
    pub(crate) object_id: Option<&'a str>,
    pub(crate) livemode: Option<bool>,
    pub(crate) body: Option<&'a [u8]>,
    /// The request headers the inbox's accept keeps (one `name: value` a line).
    pub(crate) headers: Option<&'a str>,
}

//! Rekey's rows and the Rust between its read and its write (issue 34 step 3,
//! `docs/design/payload-protection.md` §9), shared by both dialects: a body row opened
//! under the key that sealed it (or read in clear) and sealed again under the ring's
//! current key, and an error text likewise. What does not open is left as it is and
//! counted; the crate's own texts in clear (a crash, a shutdown, why a body was refused)
//! stay in clear, so an operator can read why a route died even without its key. And
//! what both dialects run the same way over their own statements: the walks
//! ([`rekey_walks!`]) and a batch's writes ([`rewrite`]).

use sqlx::{Database, Encode, Executor, IntoArguments, Type};

use super::shared::{changed, Changed};
use super::store_error;
use crate::seal::{Aad, Column, KeyRing, SealError};
use crate::store::StoreError;

/// A body row's key, as rekey's walk of `webhook_bodies_key` finds it: its key id (`None`:
/// in clear), source and event id.
pub(crate) type BodyKey = (Option<String>, String, String);

/// A route's key: source, event id, processor.
pub(crate) type RouteKey = (String, String, String);

/// A body row as rekey reads it: every part sealed under the row's one key id.
#[derive(sqlx::FromRow)]
pub(crate) struct BodyRow {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) key_id: Option<String>,
    pub(crate) body_nonce: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) headers: Option<String>,
    pub(crate) sealed_headers: Option<Vec<u8>>,
    pub(crate) headers_nonce: Option<Vec<u8>>,
    pub(crate) sealed_subject: Option<Vec<u8>>,
    pub(crate) subject_nonce: Option<Vec<u8>>,
}

/// A body row sealed again: written only where its key id and nonce are still
/// `old_key_id` and `old_nonce` (compare-and-set: an erase, an expiry, a re-accept or
/// another replica's rekey in between wins).
pub(crate) struct BodyRewrite {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) old_key_id: Option<String>,
    pub(crate) old_nonce: Option<Vec<u8>>,
    pub(crate) key_id: String,
    pub(crate) body_nonce: Vec<u8>,
    pub(crate) body: Vec<u8>,
    /// The headers' ciphertext and nonce (the clear `headers` column is set NULL).
    pub(crate) headers: Option<(Vec<u8>, Vec<u8>)>,
    /// The subject's ciphertext, nonce and keyed digest under the new key.
    pub(crate) subject: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

impl BodyRewrite {
    /// Its bytes, for the writer's batch cap.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // SQLite's writer's
    pub(crate) fn size(&self) -> usize {
        self.body.len() + self.headers.as_ref().map_or(0, |(h, _)| h.len())
    }
}

/// One error text of a route (its `processing_error`, or one of its attempts' `error`) to
/// seal again.
pub(crate) struct ErrorRow {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) processor: String,
    pub(crate) text: String,
}

/// An error text sealed again: every column of the route (its own and its attempts') that
/// still holds `old` gets `new` (compare-and-set on the text: a worker's newer outcome
/// wins). One text can be in several: a route's error is its last attempt's.
pub(crate) struct ErrorRewrite {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) processor: String,
    pub(crate) old: String,
    pub(crate) new: String,
}

/// A batch of rekey's writes: one transaction (on SQLite, one operation of the writer).
pub(crate) enum Rewrites {
    Bodies(Vec<BodyRewrite>),
    Errors(Vec<ErrorRewrite>),
}

impl Rewrites {
    /// Its bytes, for the writer's batch cap.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // SQLite's writer's
    pub(crate) fn size(&self) -> usize {
        match self {
            Rewrites::Bodies(rows) => rows.iter().map(BodyRewrite::size).sum(),
            Rewrites::Errors(rows) => rows.iter().map(|r| r.new.len()).sum(),
        }
    }
}

/// A row of the dialect's `ERROR_TEXTS`: a route's key and one of its error texts.
pub(crate) type TextRow = (String, String, String, String);

impl From<TextRow> for ErrorRow {
    fn from((source, event_id, processor, text): TextRow) -> Self {
        ErrorRow {
            source,
            event_id,
            processor,
            text,
        }
    }
}

/// A walk's limit as the statements bind it.
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Rekey's walks, the same on both dialects, inside the dialect's `impl Rekeying` (with
/// its `self.pool`): `CLEAR_BODIES`, `STALE_BODIES`, `STALE_ROUTES` and `ERROR_TEXTS`
/// are the dialect's statements, in scope where it expands; `$bind_routes` binds a list
/// of routes' keys as `ERROR_TEXTS` takes them first (PostgreSQL: three arrays; SQLite:
/// a JSON array), the current key's sealed prefix bound after them.
macro_rules! rekey_walks {
    ($bind_routes:path) => {
        fn clear_bodies(
            &self,
            after: (String, String),
            n: usize,
        ) -> $crate::store::StoreFuture<Vec<$crate::sql::rekey::BodyKey>> {
            let pool = self.pool.clone();
            Box::pin(async move {
                sqlx::query_as(CLEAR_BODIES)
                    .bind(after.0)
                    .bind(after.1)
                    .bind($crate::sql::rekey::limit(n))
                    .fetch_all(&pool)
                    .await
                    .map_err(|e| $crate::sql::store_error("inbox rekey", e))
            })
        }

        fn stale_bodies(
            &self,
            current: String,
            after: (String, String, String),
            n: usize,
        ) -> $crate::store::StoreFuture<Vec<$crate::sql::rekey::BodyKey>> {
            let pool = self.pool.clone();
            Box::pin(async move {
                sqlx::query_as(STALE_BODIES)
                    .bind(current)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(after.2)
                    .bind($crate::sql::rekey::limit(n))
                    .fetch_all(&pool)
                    .await
                    .map_err(|e| $crate::sql::store_error("inbox rekey", e))
            })
        }

        fn stale_errors(
            &self,
            prefix: String,
            after: $crate::sql::rekey::RouteKey,
            n: usize,
        ) -> $crate::store::StoreFuture<(
            Vec<$crate::sql::rekey::RouteKey>,
            Vec<$crate::sql::rekey::ErrorRow>,
        )> {
            let pool = self.pool.clone();
            Box::pin(async move {
                let err = |e| $crate::sql::store_error("inbox rekey", e);
                let routes: Vec<$crate::sql::rekey::RouteKey> = sqlx::query_as(STALE_ROUTES)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(after.2)
                    .bind(&prefix)
                    .bind($crate::sql::rekey::limit(n))
                    .fetch_all(&pool)
                    .await
                    .map_err(err)?;
                if routes.is_empty() {
                    return Ok((routes, Vec::new()));
                }
                let texts: Vec<$crate::sql::rekey::TextRow> =
                    $bind_routes(sqlx::query_as(ERROR_TEXTS), &routes)
                        .bind(&prefix)
                        .fetch_all(&pool)
                        .await
                        .map_err(err)?;
                Ok((routes, texts.into_iter().map(Into::into).collect()))
            })
        }
    };
}
pub(crate) use rekey_walks;

/// A batch of rekey's writes on `conn`, in the dialect's transaction, each
/// compare-and-set: a body row with `body_sql` (its key, then its key id, nonce, body,
/// headers' ciphertext and nonce, subject's ciphertext, nonce and digest, then the key id
/// and nonce it must still have), an error text with each of `error_sql` (the route's
/// key, the text it must still be, the new one); how many values changed.
pub(crate) async fn rewrite<'q, DB>(
    conn: &mut DB::Connection,
    rewrites: &'q Rewrites,
    body_sql: &'static str,
    error_sql: [&'static str; 2],
) -> Result<u64, StoreError>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: Changed,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
{
    let err = |e| store_error("inbox rekey", e);
    let mut n = 0;
    match rewrites {
        Rewrites::Bodies(rows) => {
            for r in rows {
                let headers = r.headers.as_ref();
                let (sealed_headers, headers_nonce) =
                    headers.map(|(h, nonce)| (&h[..], &nonce[..])).unzip();
                let subject = r.subject.as_ref();
                let (subject, subject_nonce, digest) = match subject {
                    Some((s, nonce, digest)) => (Some(&s[..]), Some(&nonce[..]), Some(&digest[..])),
                    None => (None, None, None),
                };
                let query = sqlx::query::<DB>(body_sql)
                    .bind(r.source.as_str())
                    .bind(r.event_id.as_str())
                    .bind(r.key_id.as_str())
                    .bind(&r.body_nonce[..])
                    .bind(&r.body[..])
                    .bind(sealed_headers)
                    .bind(headers_nonce)
                    .bind(subject)
                    .bind(subject_nonce)
                    .bind(digest)
                    .bind(r.old_key_id.as_deref())
                    .bind(r.old_nonce.as_deref());
                n += changed(query, &mut *conn).await.map_err(err)?;
            }
        }
        Rewrites::Errors(rows) => {
            for r in rows {
                for sql in error_sql {
                    let query = sqlx::query::<DB>(sql)
                        .bind(r.source.as_str())
                        .bind(r.event_id.as_str())
                        .bind(r.processor.as_str())
                        .bind(r.old.as_str())
                        .bind(r.new.as_str());
                    n += changed(query, &mut *conn).await.map_err(err)?;
                }
            }
        }
    }
    Ok(n)
}

/// What resealing one stored value gave.
pub(crate) enum Resealed<T> {
    /// Sealed under the current key: write it.
    Rewrite(T),
    /// No configured key opens it (or it is not a ciphertext): left as it is, counted.
    Unreadable,
    /// Nothing to do: already under the current key, or the crate's own text in clear.
    Kept,
}

/// `row` opened (or read in clear) and sealed under `ring`'s current key: body, headers
/// and subject together (one key id a row), each with a fresh nonce.
///
/// # Errors
///
/// The system's random source failed: nothing is sealed.
pub(crate) fn reseal_body(
    ring: &KeyRing,
    row: BodyRow,
) -> Result<Resealed<BodyRewrite>, SealError> {
    let (source, id) = (row.source.as_str(), row.event_id.as_str());
    let aad = |column| Aad::new(source, id, column);
    let (body, headers, subject) = match row.key_id.as_deref() {
        Some(key_id) if !ring.needs_rekey(key_id) => return Ok(Resealed::Kept),
        Some(key_id) => {
            let open = |column, nonce: &Option<Vec<u8>>, sealed: &Option<Vec<u8>>| {
                let (nonce, sealed) = (nonce.as_deref(), sealed.as_deref());
                ring.open_parts(
                    &aad(column),
                    key_id,
                    nonce.unwrap_or_default(),
                    sealed.unwrap_or_default(),
                )
                .ok()
            };
            let Some(body) = open(Column::Body, &row.body_nonce, &row.body) else {
                return Ok(Resealed::Unreadable);
            };
            let mut parts = [None, None];
            let sealed = [
                (Column::Headers, &row.headers_nonce, &row.sealed_headers),
                (Column::Subject, &row.subject_nonce, &row.sealed_subject),
            ];
            for (part, (column, nonce, value)) in parts.iter_mut().zip(sealed) {
                if value.is_some() {
                    let Some(opened) = open(column, nonce, value) else {
                        return Ok(Resealed::Unreadable);
                    };
                    *part = Some(opened);
                }
            }
            let [headers, subject] = parts;
            (body, headers, subject)
        }
        // A row stored in clear without a body has nothing to seal.
        None => match row.body {
            Some(body) => (body, row.headers.map(String::into_bytes), None),
            None => return Ok(Resealed::Kept),
        },
    };
    let body = ring.seal(&aad(Column::Body), &body)?;
    let headers = headers
        .map(|h| ring.seal(&aad(Column::Headers), &h))
        .transpose()?
        .map(|h| (h.nonce().to_vec(), h.into_ciphertext()))
        .map(|(nonce, ciphertext)| (ciphertext, nonce));
    let subject = match subject {
        Some(plain) => {
            let Ok(text) = std::str::from_utf8(&plain) else {
                return Ok(Resealed::Unreadable);
            };
            let digest = ring.subject_digests(text)[0].1.to_vec();
            let sealed = ring.seal(&aad(Column::Subject), &plain)?;
            Some((
                sealed.ciphertext().to_vec(),
                sealed.nonce().to_vec(),
                digest,
            ))
        }
        None => None,
    };
    Ok(Resealed::Rewrite(BodyRewrite {
        old_key_id: row.key_id,
        old_nonce: row.body_nonce,
        key_id: body.key_id().to_owned(),
        body_nonce: body.nonce().to_vec(),
        body: body.into_ciphertext(),
        headers,
        subject,
        source: row.source,
        event_id: row.event_id,
    }))
}

/// `row`'s text opened (or read in clear) and sealed under `ring`'s current key, what
/// SQL appended after a sealed token (`; then …`, the crate's text) kept in clear.
///
/// # Errors
///
/// The system's random source failed: nothing is sealed.
pub(crate) fn reseal_error(
    ring: &KeyRing,
    row: ErrorRow,
) -> Result<Resealed<ErrorRewrite>, SealError> {
    let (source, id, processor) = (&row.source, &row.event_id, &row.processor);
    let (plain, rest) = match super::sealed::parse_error(&row.text) {
        Some((key_id, _, _)) if !ring.needs_rekey(key_id) => return Ok(Resealed::Kept),
        Some((key_id, b64, rest)) => {
            match super::sealed::open_sealed_error(ring, source, id, processor, key_id, b64) {
                Ok(plain) => (plain, rest),
                Err(_) => return Ok(Resealed::Unreadable),
            }
        }
        None => {
            // In clear: the processor's error from before keys, sealed now — but the
            // crate's own texts stay readable without any key.
            let (lead, rest) = split_crashed(&row.text);
            if super::sealed::crate_text(lead) {
                return Ok(Resealed::Kept);
            }
            (lead.to_owned(), rest)
        }
    };
    let sealed = super::sealed::try_seal_error(ring, source, id, processor, &plain)?;
    let new = format!("{sealed}{rest}");
    Ok(Resealed::Rewrite(ErrorRewrite {
        new,
        source: row.source,
        event_id: row.event_id,
        processor: row.processor,
        old: row.text,
    }))
}

/// A clear text split before the `; then <crashed>` a claim appends in SQL (P3).
fn split_crashed(text: &str) -> (&str, &str) {
    let suffix_len = "; then ".len() + super::CRASHED.len();
    match text.len().checked_sub(suffix_len) {
        Some(at)
            if text.is_char_boundary(at) && text[at..] == format!("; then {}", super::CRASHED) =>
        {
            text.split_at(at)
        }
        _ => (text, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Key;

    fn ring(keys: &[(&str, u8)]) -> KeyRing {
        KeyRing::new(keys.iter().map(|(id, b)| Key::new(*id, [*b; 32]).unwrap())).unwrap()
    }

    fn error(text: &str) -> ErrorRow {
        ErrorRow {
            source: "s".into(),
            event_id: "e".into(),
            processor: "p".into(),
            text: text.into(),
        }
    }

    fn rewritten(r: Resealed<ErrorRewrite>) -> String {
        match r {
            Resealed::Rewrite(r) => r.new,
            Resealed::Unreadable => "unreadable".into(),
            Resealed::Kept => "kept".into(),
        }
    }

    #[test]
    fn an_error_is_sealed_again_under_the_current_key_and_the_crates_texts_stay_clear() {
        let (k1, k21) = (ring(&[("k1", 1)]), ring(&[("k2", 2), ("k1", 1)]));
        let old = super::super::sealed::seal_error(&k1, "s", "e", "p", "HTTP 502 for ada@");
        let crashed = format!("{old}; then {}", super::super::CRASHED);
        let new = rewritten(reseal_error(&k21, error(&crashed)).unwrap());
        assert!(
            new.starts_with("sealed:v1:k2:") && new.ends_with(super::super::CRASHED),
            "{new}"
        );
        let opened =
            super::super::sealed::open_error(&Some(k21.clone()), "s", "e", "p", new.clone());
        assert_eq!(
            opened,
            format!("HTTP 502 for ada@; then {}", super::super::CRASHED)
        );
        // Already current: kept. Under a key the ring lacks: unreadable.
        assert_eq!(rewritten(reseal_error(&k21, error(&new)).unwrap()), "kept");
        let k3 = ring(&[("k3", 3)]);
        assert_eq!(
            rewritten(reseal_error(&k3, error(&old)).unwrap()),
            "unreadable"
        );
        // In clear: sealed, the crash's suffix kept clear; the crate's own texts kept.
        let clear = format!("HTTP 502; then {}", super::super::CRASHED);
        let sealed = rewritten(reseal_error(&k21, error(&clear)).unwrap());
        assert!(
            sealed.starts_with("sealed:v1:k2:") && !sealed.contains("HTTP 502"),
            "{sealed}"
        );
        for own in [
            super::super::CRASHED.to_owned(),
            super::super::ABANDONED.to_owned(),
            format!(
                "{}; then {}",
                super::super::ABANDONED,
                super::super::CRASHED
            ),
            "the body is missing".to_owned(),
            crate::inbox::PANICKED.to_owned(),
            "the body cannot be opened: sealed under key \"k0\", which no configured key has"
                .to_owned(),
        ] {
            assert_eq!(
                rewritten(reseal_error(&k21, error(&own)).unwrap()),
                "kept",
                "{own}"
            );
        }
    }
}

//! What [`PgStore`](super::PgStore) and [`SqliteStore`](super::SqliteStore) share: a
//! dedupe store over a dialect's table, whose operations take the same arguments in both.

/// `impl DedupeStore for $store`, each operation handed to its table, `self.sql`; the
/// items in braces after it are added to the impl.
macro_rules! sql_dedupe_store {
    ($store:ty $(, { $($extra:tt)* })?) => {
        impl $crate::store::DedupeStore for $store {
            fn claim(
                &self,
                d: $crate::store::Delivery,
                token: $crate::store::Token,
                lease: ::std::time::Duration,
            ) -> $crate::store::StoreFuture<$crate::store::Claim> {
                let sql = self.sql.clone();
                Box::pin(async move {
                    $crate::store::check_key(d.source(), d.id())?;
                    sql.claim(d, token, lease).await
                })
            }

            fn renew(
                &self,
                d: $crate::store::Delivery,
                token: $crate::store::Token,
                lease: ::std::time::Duration,
            ) -> $crate::store::StoreFuture<$crate::store::Renewed> {
                let sql = self.sql.clone();
                Box::pin(async move {
                    let held = sql.renew(d.source(), d.id(), token, lease).await?;
                    Ok(if held {
                        $crate::store::Renewed::Held
                    } else {
                        $crate::store::Renewed::Fenced
                    })
                })
            }

            fn complete(
                &self,
                d: $crate::store::Delivery,
                token: $crate::store::Token,
            ) -> $crate::store::StoreFuture<$crate::store::Completed> {
                let sql = self.sql.clone();
                Box::pin(async move {
                    let done = sql
                        .complete(d.source().into(), d.id().into(), token)
                        .await?;
                    Ok(if done {
                        $crate::store::Completed::Done
                    } else {
                        $crate::store::Completed::Fenced
                    })
                })
            }

            fn release(
                &self,
                d: $crate::store::Delivery,
                token: $crate::store::Token,
            ) -> $crate::store::StoreFuture<()> {
                let sql = self.sql.clone();
                Box::pin(async move { sql.release(d.source(), d.id(), token).await })
            }

            fn prune(
                &self,
                older_than: $crate::store::Retention,
            ) -> $crate::store::StoreFuture<u64> {
                let sql = self.sql.clone();
                Box::pin(async move { sql.prune(older_than.get()).await })
            }

            fn prune_once(
                &self,
                namespace: &str,
                older_than: ::std::time::Duration,
            ) -> $crate::store::StoreFuture<u64> {
                let (sql, namespace) = (self.sql.clone(), namespace.to_owned());
                Box::pin(async move { sql.prune_once(&namespace, older_than).await })
            }

            $($($extra)*)?
        }
    };
}

pub(super) use sql_dedupe_store;

//! What [`PgStore`](super::PgStore) and [`SqliteStore`](super::SqliteStore) share: a
//! dedupe store over a dialect's table, whose operations take the same arguments in both.

/// `impl DedupeStore for $store`, each operation handed to its table, `self.sql`, as a
/// [`KeyOp`](crate::sql::KeyOp); the items in braces after it are added to the impl.
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
                    Ok(sql.key($crate::sql::KeyOp::Claim(d, token, lease)).await?.claim())
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
                    let held = sql.key($crate::sql::KeyOp::Renew(d, token, lease)).await?;
                    Ok(if held.held() {
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
                    let done = sql.key($crate::sql::KeyOp::Complete(d, token)).await?;
                    Ok(if done.held() {
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
                let release = $crate::sql::KeyOp::Release(d, token);
                Box::pin(async move { sql.key(release).await.map(|_| ()) })
            }

            fn prune(
                &self,
                older_than: $crate::store::Retention,
            ) -> $crate::store::StoreFuture<u64> {
                let sql = self.sql.clone();
                let prune = $crate::sql::KeyOp::Prune(older_than.get());
                Box::pin(async move { Ok(sql.key(prune).await?.count()) })
            }

            fn prune_once(
                &self,
                namespace: &str,
                older_than: ::std::time::Duration,
            ) -> $crate::store::StoreFuture<u64> {
                let sql = self.sql.clone();
                let prune = $crate::sql::KeyOp::PruneOnce(namespace.to_owned(), older_than);
                Box::pin(async move { Ok(sql.key(prune).await?.count()) })
            }

            $($($extra)*)?
        }
    };
}

pub(super) use sql_dedupe_store;

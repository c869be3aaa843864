//! What runs a claimed event: the processor alone, or (PostgreSQL) the processor and the
//! row's `processed_at` in one transaction.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::super::process::Failure;
use super::super::{Attempt, Processor};
use crate::store::Token;
use crate::Event;

/// How a worker runs a claimed event.
#[derive(Clone)]
pub(crate) enum Runner {
    /// The processor; the worker records the outcome after it.
    Plain(Arc<dyn Processor>),
    /// The processor and the row's `processed_at` in one PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    InTransaction(Arc<dyn super::super::TxProcessor>, sqlx::PgPool, Arc<str>),
}

/// How a run ended well.
pub(super) enum Done {
    /// The processor succeeded; the worker records it.
    Succeeded,
    /// Already recorded in the processor's transaction (`false`: fenced out, rolled back).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Recorded(bool),
}

impl Runner {
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))] // the token fences commits
    pub(super) fn run(
        &self,
        event: Event,
        attempt: Attempt,
        token: Token,
    ) -> Pin<Box<dyn Future<Output = Result<Done, Failure>> + Send>> {
        match self {
            Runner::Plain(p) => {
                let future = p.process(event, attempt);
                Box::pin(async move {
                    match future.await {
                        Ok(()) => Ok(Done::Succeeded),
                        Err(e) => Err(Failure::of(&*e)),
                    }
                })
            }
            #[cfg(feature = "postgres")]
            Runner::InTransaction(p, pool, route) => {
                let future = super::super::transactional::run(
                    p.clone(),
                    (pool.clone(), route.clone()),
                    event,
                    attempt,
                    token,
                );
                Box::pin(async move { future.await.map(Done::Recorded) })
            }
        }
    }
}

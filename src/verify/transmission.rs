//! PayPal's transmissions, remembered in a shared store: one body per transmission id
//! across every replica and restart ([`VerifyWebhookLayer::with_transmission_store`]).
//!
//! A transmission is recorded as a claim keyed by its id whose fencing token is derived
//! from the body's SHA-256: the first body to claim it completes it, and the store's own
//! rule that only the completing token completes it again answers whether a later body
//! is the same one. No store needs anything beyond [`DedupeStore`]'s contract.
//!
//! [`VerifyWebhookLayer::with_transmission_store`]: super::VerifyWebhookLayer::with_transmission_store

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sha2::Digest as _;

use crate::error::{VerifyError, VerifyErrorKind};
use crate::store::{Completed, DedupeStore, Delivery, Token};

/// The outcome of recording one transmission.
pub(super) type AdmitFuture = Pin<Box<dyn Future<Output = Result<(), VerifyError>> + Send>>;

/// The most a claim is leased: the layers' own ceiling.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// Records transmission `id` of `source` with `body` in `store`, for `keep` (the claim's
/// lease: a process that dies between its claim and its completion still holds the id
/// with its body's token for as long as the headers can pass the time check). Refuses a
/// body other than the first recorded under the id.
pub(super) fn admit(
    store: Arc<dyn DedupeStore>,
    source: &str,
    id: &str,
    body: &[u8],
    keep: Duration,
) -> AdmitFuture {
    let delivery = Delivery::new(format!("{source}/transmission"), id);
    let digest = sha2::Sha256::digest(body);
    let mut token = [0; 16];
    token.copy_from_slice(&digest[..16]);
    // Every replica derives the same token from the same body, and another from another.
    let token = Token::from_uuid(uuid::Uuid::from_bytes(token));
    let lease = keep.clamp(store.min_lease(), MAX_LEASE);
    Box::pin(async move {
        // Its outcome does not matter: `complete` alone says whose body holds the id.
        // New (first seen), Done (recorded) or InFlight (another attempt between its
        // claim and its completion) all leave the id held by exactly one token.
        store
            .claim(delivery.clone(), token, lease)
            .await
            .map_err(unavailable)?;
        match store.complete(delivery, token).await.map_err(unavailable)? {
            Completed::Done => Ok(()),
            _ => Err(VerifyError::new(
                VerifyErrorKind::InvalidSignature,
                "this transmission was already delivered with another body",
            )),
        }
    })
}

fn unavailable(_: crate::store::StoreError) -> VerifyError {
    VerifyError::new(
        VerifyErrorKind::StoreUnavailable,
        "the transmission store could not be reached",
    )
}

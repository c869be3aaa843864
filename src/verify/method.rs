//! The methods a webhook endpoint takes: POST, and GET where the provider sends GET too.
//! Anything else (a load balancer's GET health check on a POST-only endpoint, a browser,
//! a stray PUT) is answered 405 with `Allow` before a header is checked or a byte of the
//! body read, and never reaches the handler.

use http::Method;

use crate::error::VerifyError;
use crate::scheme::Scheme;

/// The 405 for `method`, if `scheme`'s provider never sends it.
pub(super) fn refuse(scheme: &Scheme, method: &Method) -> Option<VerifyError> {
    let takes_get = scheme.takes_get();
    let taken = *method == Method::POST || (takes_get && *method == Method::GET);
    (!taken).then(|| VerifyError::method_not_allowed(takes_get))
}

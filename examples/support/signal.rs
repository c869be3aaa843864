//! The signal a shutdown starts on, for every example that serves: SIGTERM (what systemd,
//! Kubernetes and a deploy send) or Ctrl-C. One that waited for Ctrl-C only would be
//! killed by a deploy's SIGTERM mid-event, and the event would run again after its lease.

use std::future::Future;

/// Completes at the first SIGTERM or Ctrl-C (SIGINT). The handlers are installed by this
/// call, not at the first poll: a SIGTERM that comes before the server polls is not missed
/// (nor does it kill the process).
#[cfg(unix)]
pub fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Fails only outside a Tokio runtime with signals enabled: a bug here, not an input.
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("a Ctrl-C handler");
    async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}

/// Completes at the first Ctrl-C (there is no SIGTERM here).
#[cfg(not(unix))]
pub fn shutdown_signal() -> impl Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

//! Why a run failed: the action's error, the store's, or the drain's stop.

use std::fmt;

use crate::store::StoreError;

/// Why [`Once::run`](super::Once::run) failed: the action's own error, or the store's;
/// [`kind`](Self::kind) says which.
///
/// ```
/// use tower_webhook::once::{OnceError, OnceErrorKind};
///
/// fn report(e: OnceError<std::io::Error>) {
///     match e.kind() {
///         // Released: a later attempt runs the action again.
///         OnceErrorKind::Action => eprintln!("the action failed: {:?}", e.action()),
///         // Whether the store may come back: `StoreError::kind`.
///         OnceErrorKind::Store => eprintln!("not run: {:?}", e.store_error()),
///         _ => eprintln!("{e}"),
///     }
/// }
/// ```
pub struct OnceError<E> {
    repr: Repr<E>,
}

#[derive(Debug)]
enum Repr<E> {
    Action(E),
    Store(StoreError),
    Stopped,
}

/// The kinds of [`OnceError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnceErrorKind {
    /// The action failed; its claim was released, so a later attempt runs it. The error
    /// is [`OnceError::action`].
    Action,
    /// The store could not claim the key (the action did not run), or, in
    /// `Once::run_in` (feature `postgres`), a statement of the transaction failed. The error is
    /// [`OnceError::store_error`].
    Store,
    /// Stopped by [`Drain::wait`](crate::Drain::wait) at shutdown: the action ran past the drain's bound and was
    /// stopped midway (its key released, so a later attempt runs it again), or it came
    /// after the drain and never started.
    Stopped,
}

impl<E> OnceError<E> {
    pub(super) fn of_action(e: E) -> Self {
        Self {
            repr: Repr::Action(e),
        }
    }

    pub(super) fn of_store(e: StoreError) -> Self {
        Self {
            repr: Repr::Store(e),
        }
    }

    pub(super) fn stopped() -> Self {
        Self {
            repr: Repr::Stopped,
        }
    }

    /// Whose failure this is.
    #[must_use]
    pub fn kind(&self) -> OnceErrorKind {
        match self.repr {
            Repr::Action(_) => OnceErrorKind::Action,
            Repr::Store(_) => OnceErrorKind::Store,
            Repr::Stopped => OnceErrorKind::Stopped,
        }
    }

    /// The action's error, when the action failed.
    #[must_use]
    pub fn action(&self) -> Option<&E> {
        match &self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(_) | Repr::Stopped => None,
        }
    }

    /// The action's error, when the action failed, by value.
    #[must_use]
    pub fn into_action(self) -> Option<E> {
        match self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(_) | Repr::Stopped => None,
        }
    }

    /// The store's error, when the store failed.
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.repr {
            Repr::Store(e) => Some(e),
            Repr::Action(_) | Repr::Stopped => None,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Action(e) => f.debug_tuple("OnceError::Action").field(e).finish(),
            Repr::Store(e) => f.debug_tuple("OnceError::Store").field(e).finish(),
            Repr::Stopped => f.write_str("OnceError::Stopped"),
        }
    }
}

impl<E: fmt::Display> fmt::Display for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Action(e) => write!(f, "action failed: {e}"),
            Repr::Store(e) => write!(f, "once store failed: {e}"),
            Repr::Stopped => f.write_str("action stopped by the drain at shutdown"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OnceError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::Action(e) => Some(e),
            Repr::Store(e) => Some(e),
            Repr::Stopped => None,
        }
    }
}

//! Processors: the named consumers of an inbox's events (fan-out). Each accepted event gets
//! one route per processor whose filter takes it, created with the event; each route has
//! its own attempts, state and replay, so one processor's failures or slowness never
//! hold another's.

use std::fmt;
use std::sync::Arc;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::Event;

/// The processor an inbox has when none is configured, and the one [`Worker::new`] runs:
/// every event of every type. Rows stored before fan-out are its routes.
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "[`Worker::new`]: crate::inbox::Worker::new"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`Worker::new`]: crate#features"
)]
pub const DEFAULT_PROCESSOR: &str = "default";

type Predicate = Arc<dyn Fn(&Event) -> bool + Send + Sync>;

/// One processor of an inbox: a name, and which events it takes — event type globs, and
/// optionally a predicate over the [`Event`]. Without either it takes every event.
///
/// ```
/// use tower_webhook::inbox::ProcessorSpec;
///
/// # fn main() -> Result<(), tower_webhook::ConfigError> {
/// let billing = ProcessorSpec::new("billing")?.with_types(["invoice.*", "charge.refunded"])?;
/// let audit = ProcessorSpec::new("audit")?.with_predicate(|e| e.livemode() == Some(true));
/// assert!(billing.matches_type(Some("invoice.paid")));
/// assert!(!billing.matches_type(Some("customer.created")));
/// # let _ = audit;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ProcessorSpec {
    name: Arc<str>,
    /// Its workers' and counts' metrics, labelled with its name.
    metrics: crate::metrics::Processor,
    types: Vec<Box<str>>,
    predicate: Option<Predicate>,
}

impl ProcessorSpec {
    /// A processor named `name` that takes every event. A name is 1 to 64 ASCII letters,
    /// digits, `_` or `-`: it names a JetStream consumer and a CLI argument as it is.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`] for a name outside that alphabet or length.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidProcessor,
                format!(
                    "a processor name is 1 to 64 ASCII letters, digits, '_' or '-', not {name:?}"
                ),
            ));
        }
        Ok(Self {
            metrics: crate::metrics::Processor::new(&name),
            name: name.into(),
            types: Vec::new(),
            predicate: None,
        })
    }

    /// The processor `default`: every event ([`DEFAULT_PROCESSOR`]).
    #[must_use]
    pub fn default_processor() -> Self {
        Self {
            metrics: crate::metrics::Processor::new(DEFAULT_PROCESSOR),
            name: DEFAULT_PROCESSOR.into(),
            types: Vec::new(),
            predicate: None,
        }
    }

    /// Takes only events whose type matches one of `globs`: `*` matches any run of
    /// characters, dots included, and a glob matches the whole type (`invoice.*` takes
    /// `invoice.paid`, not `pre.invoice.paid`). An event without a type is then not taken.
    /// Replaces the globs set before.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`] when `globs` is empty or one is empty.
    pub fn with_types<I>(mut self, globs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let globs: Vec<Box<str>> = globs.into_iter().map(|g| g.into().into()).collect();
        if globs.is_empty() || globs.iter().any(|g| g.is_empty()) {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidProcessor,
                format!(
                    "processor {:?}: a type filter needs at least one glob, none empty",
                    &*self.name
                ),
            ));
        }
        self.types = globs;
        Ok(self)
    }

    /// Takes only events for which `predicate` answers `true` (and that its type globs
    /// take, if any). It runs in the accept, before the event is stored: keep it cheap,
    /// and pure — it is evaluated again by a backfill.
    #[must_use]
    pub fn with_predicate<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&Event) -> bool + Send + Sync + 'static,
    {
        self.predicate = Some(Arc::new(predicate));
        self
    }

    /// The processor's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its type globs; empty when it takes every type.
    #[must_use]
    pub fn types(&self) -> &[Box<str>] {
        &self.types
    }

    /// Whether it has a predicate (which a command-line backfill cannot evaluate).
    #[must_use]
    pub fn has_predicate(&self) -> bool {
        self.predicate.is_some()
    }

    /// Whether its type globs take an event of type `event_type` (the predicate aside).
    #[must_use]
    pub fn matches_type(&self, event_type: Option<&str>) -> bool {
        if self.types.is_empty() {
            return true;
        }
        event_type.is_some_and(|t| self.types.iter().any(|g| glob_matches(g, t)))
    }

    /// Whether it takes `event`: its type globs and its predicate both do.
    #[must_use]
    pub fn matches(&self, event: &Event) -> bool {
        self.matches_type(event.event_type()) && self.predicate.as_ref().is_none_or(|p| p(event))
    }
}

impl ProcessorSpec {
    /// Its metrics' keys (`processor` label).
    pub(crate) fn metrics(&self) -> &crate::metrics::Processor {
        &self.metrics
    }
}

impl fmt::Debug for ProcessorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessorSpec")
            .field("name", &&*self.name)
            .field("types", &self.types)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

/// An inbox's processors: at least one, names unique, in the order configured.
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // the SQL inbox's in step 2
#[derive(Clone, Debug)]
pub(crate) struct Processors {
    specs: Arc<[ProcessorSpec]>,
}

#[cfg_attr(not(feature = "nats"), allow(dead_code))] // the SQL inbox's in step 2
impl Processors {
    /// Checks a configured set.
    pub(crate) fn new(specs: impl IntoIterator<Item = ProcessorSpec>) -> Result<Self, ConfigError> {
        let specs: Vec<ProcessorSpec> = specs.into_iter().collect();
        if specs.is_empty() {
            // An inbox that routes nothing is a queue nobody drains.
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidProcessor,
                "an inbox needs at least one processor",
            ));
        }
        for (i, s) in specs.iter().enumerate() {
            if specs[..i].iter().any(|t| t.name == s.name) {
                return Err(ConfigError::new(
                    ConfigErrorKind::InvalidProcessor,
                    format!("processor {:?} is configured twice", &*s.name),
                ));
            }
        }
        Ok(Self {
            specs: specs.into(),
        })
    }

    /// The set `{default}`: today's single processor.
    #[must_use]
    pub(crate) fn single() -> Self {
        Self {
            specs: Arc::from([ProcessorSpec::default_processor()]),
        }
    }

    /// The processors that take `event`, in configured order: its routes.
    #[allow(dead_code)] // until the SQL inbox routes its accepts (issue 33, step 2)
    pub(crate) fn routes(&self, event: &Event) -> Vec<Arc<str>> {
        self.specs
            .iter()
            .filter(|s| s.matches(event))
            .map(|s| s.name.clone())
            .collect()
    }

    /// The processor named `name`.
    #[allow(dead_code)] // until the SQL inbox routes its accepts (issue 33, step 2)
    pub(crate) fn get(&self, name: &str) -> Option<&ProcessorSpec> {
        self.specs.iter().find(|s| &*s.name == name)
    }

    /// The configured processors, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ProcessorSpec> {
        self.specs.iter()
    }

    /// A processor this set lacks, as the error the workers' constructors answer.
    pub(crate) fn unknown(&self, name: &str) -> ConfigError {
        let known: Vec<&str> = self.specs.iter().map(|s| s.name()).collect();
        ConfigError::new(
            ConfigErrorKind::InvalidProcessor,
            format!("no processor {name:?} is configured (the inbox has {known:?})"),
        )
    }
}

/// Whether `glob` (where `*` matches any run of characters) matches the whole of `text`.
fn glob_matches(glob: &str, text: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: an exact match
    };
    for part in middle {
        // Leftmost match of each middle part leaves the most room for the rest.
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_the_whole_type_with_star_as_any_run() {
        let cases = [
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoice.", true),
            ("invoice.*", "pre.invoice.paid", false),
            ("invoice.*", "invoice", false),
            ("*", "", true),
            ("*", "anything.at.all", true),
            ("*.paid", "invoice.paid", true),
            ("*.paid", "invoice.paid.late", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXcYb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("charge.refunded", "charge.refunded", true),
            ("charge.refunded", "charge.refunded.x", false),
            ("**", "x", true),
        ];
        for (glob, text, want) in cases {
            assert_eq!(glob_matches(glob, text), want, "{glob:?} ~ {text:?}");
        }
    }

    #[test]
    fn names_are_checked_and_a_set_needs_unique_names_and_at_least_one() {
        for bad in ["", "a b", "billing.x", "é", &"x".repeat(65)] {
            let e = ProcessorSpec::new(bad).unwrap_err();
            assert_eq!(e.kind(), ConfigErrorKind::InvalidProcessor, "{bad:?}");
        }
        ProcessorSpec::new("x".repeat(64)).unwrap();
        ProcessorSpec::new("billing_v2-eu").unwrap();
        let twice = Processors::new([
            ProcessorSpec::new("a").unwrap(),
            ProcessorSpec::new("a").unwrap(),
        ])
        .unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        let none = Processors::new([]).unwrap_err();
        assert_eq!(none.kind(), ConfigErrorKind::InvalidProcessor);
        let e = ProcessorSpec::new("a")
            .unwrap()
            .with_types(Vec::<String>::new())
            .unwrap_err();
        assert_eq!(e.kind(), ConfigErrorKind::InvalidProcessor);
        assert!(ProcessorSpec::new("a").unwrap().with_types([""]).is_err());
    }

    #[test]
    fn an_event_is_routed_to_the_processors_whose_globs_and_predicate_take_it() {
        let set = Processors::new([
            ProcessorSpec::new("billing")
                .unwrap()
                .with_types(["invoice.*"])
                .unwrap(),
            ProcessorSpec::new("email").unwrap(),
            ProcessorSpec::new("live")
                .unwrap()
                .with_predicate(|e| e.livemode() == Some(true)),
        ])
        .unwrap();
        let names = |event_type: Option<&str>, livemode: Option<bool>| -> Vec<String> {
            let event = Event::stored(crate::event::Stored {
                source: "test".into(),
                id: "evt_1".into(),
                event_type: event_type.map(str::to_owned),
                object_id: None,
                livemode,
                timestamp: None,
                body: bytes::Bytes::new(),
            });
            set.routes(&event).iter().map(|n| n.to_string()).collect()
        };
        assert_eq!(
            names(Some("invoice.paid"), Some(true)),
            ["billing", "email", "live"]
        );
        assert_eq!(names(Some("customer.created"), None), ["email"]);
        // No type: only processors without globs take it.
        assert_eq!(names(None, Some(true)), ["email", "live"]);
        assert!(set.get("email").is_some() && set.get("nope").is_none());
        let unknown = set.unknown("nope").to_string();
        assert!(
            unknown.contains("nope") && unknown.contains("billing"),
            "{unknown}"
        );
        let debug = format!("{:?}", set.get("live").unwrap());
        assert!(debug.contains("predicate: true"), "{debug}");
    }
}

//! The receiver's processors (fan-out) and its workers' handler: `WEBHOOK_PROCESSORS`,
//! `WEBHOOK_FAIL_PROCESSORS` and `WEBHOOK_PROCESSOR_DELAY_MS`, beside the settings every
//! processor shares (`WEBHOOK_FAIL_TYPES`, `WEBHOOK_HANDLER_DELAY_MS`).

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tower_webhook::inbox::{Attempt, ProcessorSpec, DEFAULT_PROCESSOR};
use tower_webhook::store::{Claim, DedupeStore, Delivery, Renewed, Retention, StoreFuture, Token};
use tower_webhook::Event;

/// What the environment configures: the processors, and which fail or are slowed.
#[derive(Debug)]
pub struct Plan {
    /// The configured processors; `None` when `WEBHOOK_PROCESSORS` is unset (one
    /// processor, `default`, printing as before fan-out).
    pub specs: Option<Vec<ProcessorSpec>>,
    /// Processors whose every attempt fails.
    pub fail: BTreeSet<String>,
    /// Extra time a processor's run takes, on top of `WEBHOOK_HANDLER_DELAY_MS`.
    pub delay: BTreeMap<String, Duration>,
}

impl Plan {
    /// Reads the three variables; a name in the fail or delay list that is not a
    /// processor refuses to start (a typo would otherwise test nothing).
    pub fn from_env() -> Result<Self, String> {
        let read = |name: &str, value: Result<String, std::env::VarError>| match value {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: not UTF-8")),
        };
        // Each name spelled out in its `env::var`: the test that checks `--help` and the
        // README's table finds the variables read that way.
        let processors = read("WEBHOOK_PROCESSORS", std::env::var("WEBHOOK_PROCESSORS"))?;
        let fail = read(
            "WEBHOOK_FAIL_PROCESSORS",
            std::env::var("WEBHOOK_FAIL_PROCESSORS"),
        )?;
        let delay = read(
            "WEBHOOK_PROCESSOR_DELAY_MS",
            std::env::var("WEBHOOK_PROCESSOR_DELAY_MS"),
        )?;
        Self::parse(processors.as_deref(), fail.as_deref(), delay.as_deref())
    }

    fn parse(
        processors: Option<&str>,
        fail: Option<&str>,
        delay: Option<&str>,
    ) -> Result<Self, String> {
        let specs = processors.map(parse_processors).transpose()?;
        let mut plan = Self {
            specs,
            fail: BTreeSet::new(),
            delay: BTreeMap::new(),
        };
        let names = plan.names();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(format!("WEBHOOK_PROCESSORS: '{name}' is named twice"));
            }
        }
        let known = |var: &str, name: &str| {
            if names.iter().any(|n| n == name) {
                Ok(())
            } else {
                Err(format!(
                    "{var}: '{name}' is not a processor (WEBHOOK_PROCESSORS names {})",
                    names.join(", ")
                ))
            }
        };
        for name in list(fail) {
            known("WEBHOOK_FAIL_PROCESSORS", name)?;
            plan.fail.insert(name.to_owned());
        }
        for entry in list(delay) {
            let (name, ms) = entry
                .split_once(':')
                .ok_or_else(|| format!("WEBHOOK_PROCESSOR_DELAY_MS: name:ms, not {entry:?}"))?;
            let name = name.trim();
            known("WEBHOOK_PROCESSOR_DELAY_MS", name)?;
            let ms: u64 = ms.trim().parse().map_err(|_| {
                format!("WEBHOOK_PROCESSOR_DELAY_MS: {ms:?} is not a whole number of milliseconds")
            })?;
            plan.delay
                .insert(name.to_owned(), Duration::from_millis(ms));
        }
        Ok(plan)
    }

    /// The names of the processors run: the configured ones, or `default`.
    pub fn names(&self) -> Vec<String> {
        match &self.specs {
            Some(specs) => specs.iter().map(|s| s.name().to_owned()).collect(),
            None => vec![DEFAULT_PROCESSOR.to_owned()],
        }
    }

    /// The handler of processor `name`: `shared`'s, failing every attempt when `name` is
    /// in `WEBHOOK_FAIL_PROCESSORS`, slowed by its `WEBHOOK_PROCESSOR_DELAY_MS`, and
    /// naming the processor in its lines when processors are configured.
    pub fn handler(&self, name: &str, shared: &Shared) -> Handler {
        Handler {
            processor: self.specs.is_some().then(|| Arc::from(name)),
            fails: self.fail.contains(name),
            fail_types: shared.fail_types.clone(),
            delay: shared.delay + self.delay.get(name).copied().unwrap_or_default(),
        }
    }
}

/// `,`-separated non-empty entries, trimmed.
fn list(value: Option<&str>) -> impl Iterator<Item = &str> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
}

/// `name` or `name=glob|glob`, comma-separated.
fn parse_processors(value: &str) -> Result<Vec<ProcessorSpec>, String> {
    let specs = list(Some(value))
        .map(|entry| {
            let (name, globs) = match entry.split_once('=') {
                Some((name, globs)) => (name.trim(), Some(globs)),
                None => (entry, None),
            };
            let spec = ProcessorSpec::new(name).map_err(|e| format!("WEBHOOK_PROCESSORS: {e}"))?;
            match globs {
                Some(globs) => spec
                    .with_types(globs.split('|').map(str::trim))
                    .map_err(|e| format!("WEBHOOK_PROCESSORS: {e}")),
                None => Ok(spec),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    if specs.is_empty() {
        return Err("WEBHOOK_PROCESSORS: no processor named".into());
    }
    Ok(specs)
}

/// What every processor's handler shares: `WEBHOOK_FAIL_TYPES` and
/// `WEBHOOK_HANDLER_DELAY_MS`.
pub struct Shared {
    /// Event types whose every attempt fails.
    pub fail_types: Arc<Vec<String>>,
    /// How long a run waits after its effect.
    pub delay: Duration,
}

/// One processor's handler: prints `handled <id>` (then `finished <id>`, or `failed <id>`),
/// with ` <processor>` after the id when processors are configured.
pub struct Handler {
    processor: Option<Arc<str>>,
    fails: bool,
    fail_types: Arc<Vec<String>>,
    delay: Duration,
}

impl tower_webhook::inbox::Processor for Handler {
    fn process(
        &self,
        event: Event,
        _: Attempt,
    ) -> Pin<Box<dyn Future<Output = Result<(), Box<dyn Error + Send + Sync>>> + Send>> {
        let processor = self.processor.clone();
        let failure = if self.fails {
            let name = processor.as_deref().unwrap_or(DEFAULT_PROCESSOR);
            Some(format!(
                "processor {name} fails every attempt (WEBHOOK_FAIL_PROCESSORS)"
            ))
        } else {
            event
                .event_type()
                .filter(|t| self.fail_types.iter().any(|f| f == t))
                .map(|t| format!("type {t} fails every attempt (WEBHOOK_FAIL_TYPES)"))
        };
        let delay = self.delay;
        Box::pin(async move {
            let id = event.id().unwrap_or(event.dedupe_id());
            let line = |what: &str| match &processor {
                Some(name) => print_line(what, &format!("{id} {name}")),
                None => print_line(what, id),
            };
            if let Some(failure) = failure {
                line("failed");
                return Err(failure.into());
            }
            line("handled");
            tokio::time::sleep(delay).await;
            line("finished");
            Ok(())
        })
    }
}

/// `<what> <event id>` on stdout.
pub fn print_line(what: &str, id: &str) {
    let mut out = std::io::stdout().lock();
    // Flushed per line: a supervisor or test reading the pipe sees each one at once.
    let _ = writeln!(out, "{what} {id}");
    let _ = out.flush();
}

/// A store shared behind an `Arc` as a store of its own, for
/// `JetStreamWorker::processor`, which takes one by value.
pub struct SharedStore(pub Arc<dyn DedupeStore>);

impl DedupeStore for SharedStore {
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        self.0.claim(delivery, token, lease)
    }

    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        self.0.renew(delivery, token, lease)
    }

    fn complete(
        &self,
        delivery: Delivery,
        token: Token,
    ) -> StoreFuture<tower_webhook::store::Completed> {
        self.0.complete(delivery, token)
    }

    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()> {
        self.0.release(delivery, token)
    }

    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        self.0.prune(older_than)
    }

    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        self.0.prune_once(namespace, older_than)
    }

    fn min_lease(&self) -> Duration {
        self.0.min_lease()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_globs_failures_and_delays() {
        let plan = Plan::parse(
            Some("billing=invoice.*|charge.refunded, email,flaky"),
            Some("flaky"),
            Some("email:250"),
        )
        .unwrap();
        assert_eq!(plan.names(), ["billing", "email", "flaky"]);
        let billing = &plan.specs.as_ref().unwrap()[0];
        assert!(billing.matches_type(Some("charge.refunded")));
        assert!(!billing.matches_type(Some("charge.succeeded")));
        assert!(plan.fail.contains("flaky"));
        assert_eq!(plan.delay["email"], Duration::from_millis(250));
    }

    #[test]
    fn refuses_a_name_that_is_not_a_processor() {
        let err = Plan::parse(Some("a,b"), Some("c"), None).unwrap_err();
        assert!(
            err.contains("WEBHOOK_FAIL_PROCESSORS") && err.contains("'c'"),
            "{err}"
        );
        let err = Plan::parse(None, None, Some("a:5")).unwrap_err();
        assert!(err.contains("WEBHOOK_PROCESSOR_DELAY_MS"), "{err}");
        assert!(Plan::parse(None, Some("default"), None).is_ok());
        assert!(Plan::parse(Some("a,a"), None, None).is_err());
        assert!(Plan::parse(Some("a=,b"), None, None).is_err());
    }
}

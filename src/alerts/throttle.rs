//! The bookkeeping behind [`Alerts`](super::Alerts): which alert goes out now and which is
//! held back and counted, each source's failing streak, each source's rejection window.
//! Every map holds at most [`MAX_SOURCES`] sources, so sources sprayed by an attacker
//! cannot grow memory without bound.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::alert::{clean, AlertKind, KINDS, MAX_NAME};

/// How many sources each map tracks at most. Past it, the sources not yet tracked share
/// one slot (throttle, rejections) or are not tracked (streaks).
pub(crate) const MAX_SOURCES: usize = 1024;

/// When one kind was last sent for one source, and how many were held back since.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    last: Option<Instant>,
    held: u64,
}

impl Slot {
    /// Whether it says nothing the next alert needs: its interval is over, nothing held.
    fn idle(&self, now: Instant, interval: Duration) -> bool {
        self.held == 0 && self.last.is_none_or(|last| now - last >= interval)
    }
}

/// At most one alert per interval per kind and source.
#[derive(Debug)]
pub(crate) struct Throttle {
    interval: Duration,
    sources: HashMap<String, [Slot; KINDS]>,
    /// The alerts without a source, and the sources past the cap.
    shared: [Slot; KINDS],
}

impl Throttle {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            sources: HashMap::new(),
            shared: [Slot::default(); KINDS],
        }
    }

    /// Whether an alert of `kind` about `source` goes out now: `Some(held)` with how many
    /// were held back since the last one sent; `None` when it is held back (and counted).
    pub(crate) fn admit(
        &mut self,
        kind: AlertKind,
        source: Option<&str>,
        now: Instant,
    ) -> Option<u64> {
        let interval = self.interval;
        let slot = &mut self.slots(source, now)[kind.index()];
        if slot.last.is_some_and(|last| now - last < interval) {
            slot.held += 1;
            return None;
        }
        slot.last = Some(now);
        Some(std::mem::take(&mut slot.held))
    }

    fn slots(&mut self, source: Option<&str>, now: Instant) -> &mut [Slot; KINDS] {
        let Some(source) = source else {
            return &mut self.shared;
        };
        if !self.sources.contains_key(source) {
            if self.sources.len() >= MAX_SOURCES {
                let interval = self.interval;
                self.sources
                    .retain(|_, slots| !slots.iter().all(|slot| slot.idle(now, interval)));
            }
            if self.sources.len() >= MAX_SOURCES {
                return &mut self.shared;
            }
            self.sources
                .insert(source.to_owned(), [Slot::default(); KINDS]);
        }
        self.sources.get_mut(source).expect("inserted above")
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.sources.len()
    }
}

/// The sources whose processor is failing now, with how many attempts failed since the
/// streak began. A source not in it is not failing: a success costs one lookup.
#[derive(Debug, Default)]
pub(crate) struct Streaks {
    failing: HashMap<String, u64>,
}

impl Streaks {
    /// Counts a failed attempt of `source`; whether it begins a streak. A streak that
    /// begins while [`MAX_SOURCES`] are failing is not tracked (no recovery follows it).
    pub(crate) fn fail(&mut self, source: &str) -> bool {
        if let Some(failures) = self.failing.get_mut(source) {
            *failures += 1;
            return false;
        }
        if self.failing.len() < MAX_SOURCES {
            self.failing.insert(source.to_owned(), 1);
        }
        true
    }

    /// Counts a success of `source`; when it ends a streak, how many attempts failed in it.
    pub(crate) fn succeed(&mut self, source: &str) -> Option<u64> {
        if self.failing.is_empty() {
            return None;
        }
        self.failing.remove(source)
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.failing.len()
    }
}

/// Rejections of one source in one window, by kind.
#[derive(Debug)]
struct Window {
    start: Instant,
    count: u64,
    /// The first few kinds seen, with their counts (the rest only in `count`).
    kinds: Vec<(String, u64)>,
}

/// The kinds of rejection a window names, at most (there are a dozen).
const MAX_KINDS: usize = 16;

impl Window {
    fn new(now: Instant) -> Self {
        Self {
            start: now,
            count: 0,
            kinds: Vec::new(),
        }
    }
}

/// Rejected deliveries per source in fixed windows: a window begins with the first
/// rejection after the last window ended, and reaching `threshold` in it raises an alert.
#[derive(Debug)]
pub(crate) struct Rejections {
    threshold: u64,
    window: Duration,
    sources: HashMap<String, Window>,
    /// The sources past the cap.
    shared: Window,
}

impl Rejections {
    pub(crate) fn new(threshold: u32, window: Duration, now: Instant) -> Self {
        Self {
            threshold: u64::from(threshold),
            window,
            sources: HashMap::new(),
            shared: Window::new(now),
        }
    }

    /// Counts a rejection of `source` for `kind`; when it brings the window to the
    /// threshold, the count and the kinds seen (`InvalidSignature: 18, BodyTooLarge: 2`).
    pub(crate) fn reject(
        &mut self,
        source: &str,
        kind: &str,
        now: Instant,
    ) -> Option<(u64, String)> {
        let (threshold, length) = (self.threshold, self.window);
        let window = self.window_of(source, now);
        if now - window.start >= length {
            *window = Window::new(now);
        }
        window.count += 1;
        match window.kinds.iter().position(|(k, _)| k == kind) {
            Some(i) => window.kinds[i].1 += 1,
            None if window.kinds.len() < MAX_KINDS => window.kinds.push((clean(kind, MAX_NAME), 1)),
            None => {}
        }
        (window.count == threshold).then(|| {
            let kinds: Vec<String> = window
                .kinds
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            (window.count, kinds.join(", "))
        })
    }

    fn window_of(&mut self, source: &str, now: Instant) -> &mut Window {
        if !self.sources.contains_key(source) {
            if self.sources.len() >= MAX_SOURCES {
                let length = self.window;
                self.sources.retain(|_, window| now - window.start < length);
            }
            if self.sources.len() >= MAX_SOURCES {
                return &mut self.shared;
            }
            self.sources.insert(source.to_owned(), Window::new(now));
        }
        self.sources.get_mut(source).expect("inserted above")
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn one_alert_per_interval_per_kind_and_source_and_the_next_one_counts_the_rest() {
        let mut throttle = Throttle::new(MINUTE);
        let t0 = Instant::now();
        assert_eq!(throttle.admit(AlertKind::Dead, Some("stripe"), t0), Some(0));
        for _ in 0..3 {
            assert_eq!(throttle.admit(AlertKind::Dead, Some("stripe"), t0), None);
        }
        // Another source, another kind: slots of their own.
        assert_eq!(throttle.admit(AlertKind::Dead, Some("github"), t0), Some(0));
        assert_eq!(
            throttle.admit(AlertKind::Failing, Some("stripe"), t0),
            Some(0)
        );
        let almost = t0 + MINUTE - Duration::from_millis(1);
        assert_eq!(
            throttle.admit(AlertKind::Dead, Some("stripe"), almost),
            None
        );
        assert_eq!(
            throttle.admit(AlertKind::Dead, Some("stripe"), t0 + MINUTE),
            Some(4)
        );
        assert_eq!(
            throttle.admit(AlertKind::Dead, Some("stripe"), t0 + 2 * MINUTE),
            Some(0),
            "the count starts again"
        );
        assert_eq!(throttle.admit(AlertKind::Lagging, None, t0), Some(0));
        assert_eq!(throttle.admit(AlertKind::Lagging, None, t0), None);
    }

    #[test]
    fn a_spray_of_sources_is_capped_and_the_rest_share_one_slot() {
        let mut throttle = Throttle::new(MINUTE);
        let t0 = Instant::now();
        for i in 0..MAX_SOURCES {
            assert_eq!(
                throttle.admit(AlertKind::Dead, Some(&format!("s{i}")), t0),
                Some(0)
            );
        }
        assert_eq!(throttle.tracked(), MAX_SOURCES);
        // Past the cap, within the interval: one alert for all the new ones.
        assert_eq!(throttle.admit(AlertKind::Dead, Some("new-1"), t0), Some(0));
        assert_eq!(throttle.admit(AlertKind::Dead, Some("new-2"), t0), None);
        assert_eq!(throttle.tracked(), MAX_SOURCES);
        // Once their interval is over, idle sources make room again.
        let later = t0 + MINUTE;
        assert_eq!(
            throttle.admit(AlertKind::Dead, Some("new-3"), later),
            Some(0)
        );
        assert_eq!(throttle.tracked(), 1);
    }

    #[test]
    fn a_streak_begins_once_and_its_end_says_how_many_failed() {
        let mut streaks = Streaks::default();
        assert_eq!(streaks.succeed("stripe"), None, "not failing");
        assert!(streaks.fail("stripe"));
        assert!(!streaks.fail("stripe"));
        assert!(!streaks.fail("stripe"));
        assert!(streaks.fail("github"));
        assert_eq!(streaks.succeed("stripe"), Some(3));
        assert_eq!(streaks.succeed("stripe"), None, "already recovered");
        assert!(streaks.fail("stripe"), "a new streak");
        // Capped: past it, a streak still begins but is not kept.
        for i in 0..2 * MAX_SOURCES {
            streaks.fail(&format!("s{i}"));
        }
        assert_eq!(streaks.tracked(), MAX_SOURCES);
        assert!(streaks.fail("one-more"));
        assert_eq!(streaks.succeed("one-more"), None);
    }

    #[test]
    fn the_threshold_within_a_window_raises_once_and_a_new_window_starts_over() {
        let t0 = Instant::now();
        let mut rejections = Rejections::new(3, MINUTE, t0);
        assert_eq!(rejections.reject("stripe", "InvalidSignature", t0), None);
        assert_eq!(rejections.reject("stripe", "TimestampTooOld", t0), None);
        assert_eq!(
            rejections.reject("stripe", "InvalidSignature", t0),
            Some((3, "InvalidSignature: 2, TimestampTooOld: 1".to_owned()))
        );
        assert_eq!(
            rejections.reject("stripe", "InvalidSignature", t0),
            None,
            "once"
        );
        // The window ended: two more are below the threshold again.
        let later = t0 + MINUTE;
        assert_eq!(rejections.reject("stripe", "InvalidSignature", later), None);
        assert_eq!(rejections.reject("stripe", "InvalidSignature", later), None);
        assert_eq!(rejections.reject("github", "InvalidSignature", later), None);
        // Capped like the throttle.
        for i in 0..2 * MAX_SOURCES {
            rejections.reject(&format!("s{i}"), "MissingHeader", later);
        }
        assert_eq!(rejections.tracked(), MAX_SOURCES);
    }
}

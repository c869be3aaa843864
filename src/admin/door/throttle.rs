//! The door's throttle: failed tries counted per client address in a window; past the
//! limit, the address is answered 429 (its right token too) until the window has passed.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::ConnectInfo;
use http::Extensions;
use tokio::time::Instant;

/// Who tried: an IPv4 address, an IPv6 /64 (one host holds a whole /64, so counting its
/// addresses apart would multiply its tries by 2^64), or `None` where the server gave no
/// address (no `ConnectInfo`): then every request shares one count.
pub(super) type Client = Option<IpAddr>;

/// The client of a request: the peer address axum's `ConnectInfo<SocketAddr>` holds. No
/// forwarded header is trusted: any client could write one.
pub(super) fn client(extensions: &Extensions) -> Client {
    let ConnectInfo(peer) = extensions.get::<ConnectInfo<SocketAddr>>()?;
    Some(match peer.ip().to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    })
}

/// Failed tries of one client in its current window.
#[derive(Debug)]
struct Tries {
    since: Instant,
    failures: u32,
    blocked_until: Option<Instant>,
}

/// The clients tracked, at most `cap`, the oldest tracked evicted first.
#[derive(Debug, Default)]
struct Clients {
    tries: HashMap<Client, Tries>,
    // Insertion order: a key is pushed once, when it enters `tries`, and leaves both together.
    order: VecDeque<Client>,
}

#[derive(Debug)]
pub(super) struct Throttle {
    max_failures: u32,
    window: Duration,
    cap: usize,
    clients: Mutex<Clients>,
}

impl Throttle {
    pub(super) fn new(max_failures: u32, window: Duration, cap: usize) -> Self {
        Self {
            max_failures,
            window,
            cap: cap.max(1),
            clients: Mutex::new(Clients::default()),
        }
    }

    pub(super) fn window(&self) -> Duration {
        self.window
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    pub(super) fn max_failures(&self) -> u32 {
        self.max_failures
    }

    /// `Err(wait)` while `client` is blocked: how long until it may try again.
    pub(super) fn check(&self, client: Client) -> Result<(), Duration> {
        let now = Instant::now();
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        match clients.tries.get(&client).and_then(|t| t.blocked_until) {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// Counts a failed try of `client`; the one that reaches the limit blocks it for a
    /// window.
    pub(super) fn fail(&self, client: Client) {
        let now = Instant::now();
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let Clients { tries, order } = &mut *clients;
        let entry = match tries.get_mut(&client) {
            Some(entry) => entry,
            None => {
                while tries.len() >= self.cap {
                    let Some(oldest) = order.pop_front() else {
                        break;
                    };
                    tries.remove(&oldest);
                }
                order.push_back(client);
                tries.entry(client).or_insert(Tries {
                    since: now,
                    failures: 0,
                    blocked_until: None,
                })
            }
        };
        if now.duration_since(entry.since) >= self.window {
            // A new window: what was counted (and any block, which ends with its window) is over.
            *entry = Tries {
                since: now,
                failures: 0,
                blocked_until: None,
            };
        }
        entry.failures += 1;
        if entry.failures >= self.max_failures && entry.blocked_until.is_none() {
            entry.since = now;
            entry.blocked_until = Some(now + self.window);
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        let clients = self.clients.lock().unwrap();
        assert_eq!(clients.tries.len(), clients.order.len());
        clients.tries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> Client {
        Some(IpAddr::V4(n.into()))
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_blocks_for_a_window_then_tries_count_again() {
        let throttle = Throttle::new(3, Duration::from_secs(60), 10);
        for _ in 0..2 {
            throttle.fail(ip(1));
            assert_eq!(throttle.check(ip(1)), Ok(()));
        }
        throttle.fail(ip(1));
        assert_eq!(throttle.check(ip(1)), Err(Duration::from_secs(60)));
        assert_eq!(
            throttle.check(ip(2)),
            Ok(()),
            "another address is not blocked"
        );
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(throttle.check(ip(1)), Err(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(throttle.check(ip(1)), Ok(()));
        throttle.fail(ip(1));
        assert_eq!(throttle.check(ip(1)), Ok(()), "a new window counts from 0");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_wider_than_the_window_never_block() {
        let throttle = Throttle::new(3, Duration::from_secs(60), 10);
        for _ in 0..10 {
            throttle.fail(ip(1));
            throttle.fail(ip(1));
            tokio::time::advance(Duration::from_secs(61)).await;
            assert_eq!(throttle.check(ip(1)), Ok(()));
        }
    }

    #[test]
    fn more_addresses_than_the_cap_keep_the_map_at_the_cap_evicting_the_oldest() {
        let throttle = Throttle::new(1, Duration::from_secs(60), 100);
        for n in 0..10_000 {
            throttle.fail(ip(n));
            assert!(throttle.tracked() <= 100);
        }
        assert_eq!(throttle.tracked(), 100);
        assert!(throttle.check(ip(9_999)).is_err(), "the newest is held");
        assert_eq!(throttle.check(ip(0)), Ok(()), "the oldest was evicted");
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64_and_no_address_as_one_shared_client() {
        let peer = |addr: &str| {
            let mut extensions = Extensions::new();
            extensions.insert(ConnectInfo(addr.parse::<SocketAddr>().unwrap()));
            client(&extensions)
        };
        assert_eq!(
            peer("[2001:db8:1:2::1]:443"),
            peer("[2001:db8:1:2:ffff::9]:80")
        );
        assert_ne!(peer("[2001:db8:1:2::1]:443"), peer("[2001:db8:1:3::1]:443"));
        assert_eq!(peer("[::ffff:10.0.0.1]:1"), peer("10.0.0.1:2"));
        assert_eq!(client(&Extensions::new()), None);
    }
}

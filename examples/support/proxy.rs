//! A TCP proxy on 127.0.0.1 in front of a store, to cut the store off and restore it: a
//! store outage (a network partition, a database failover) on demand, for the demo and
//! the chaos tests.
//!
//! [`Proxy::cut`] resets every live connection (RST, as a failed network path or a
//! firewall would) and, until [`Proxy::restore`], resets every new one as soon as it is
//! accepted: a client sees a connection that dies during its handshake at once — not a
//! refused one (which sqlx's pool retries quietly for up to its acquire timeout) and not
//! a silent one (which only a timeout ends). [`Proxy::swallow`] makes the path fail one
//! way first: what the store sends is read and dropped until the cut, so whatever it
//! delivers meanwhile is lost in transit.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    /// Set while cut: new connections are reset at once.
    cut: AtomicBool,
    /// Set from `swallow` until the next cut: what upstream sends is dropped.
    swallowing: AtomicBool,
    /// Bumped by each cut: every connection older than the bump resets itself.
    epoch: watch::Sender<u64>,
    /// Connections being forwarded now.
    live: AtomicUsize,
    /// Connections reset by a cut, or refused while cut.
    dropped: AtomicUsize,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards each connection to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cut: AtomicBool::new(false),
            swallowing: AtomicBool::new(false),
            epoch: watch::channel(0).0,
            live: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if s.cut.load(Ordering::SeqCst) {
                    reset(inbound);
                    s.dropped.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                tokio::spawn(forward(inbound, upstream.clone(), s.clone()));
            }
        });
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port` to give clients instead of the store's.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// Drops what upstream sends on every connection from now until the next
    /// [`cut`](Self::cut), while what clients send still goes through: replies and
    /// deliveries sent meanwhile are lost in transit.
    pub fn swallow(&self) {
        self.shared.swallowing.store(true, Ordering::SeqCst);
    }

    /// Resets every live connection and every new one until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.swallowing.store(false, Ordering::SeqCst);
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Connections being forwarded now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// Connections reset by a cut or refused while cut, so far.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut(); // and every forwarding task with it
    }
}

/// Closes `stream` with a reset rather than an orderly shutdown.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Decrements the live count however the forwarding ends.
struct Live(Arc<Shared>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn forward(inbound: TcpStream, upstream: String, shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    epoch.mark_unchanged();
    shared.live.fetch_add(1, Ordering::SeqCst);
    let _live = Live(shared.clone());
    let outbound = tokio::select! {
        connected = TcpStream::connect(&upstream) => match connected {
            Ok(stream) => stream,
            Err(_) => return reset(inbound),
        },
        _ = epoch.changed() => {
            shared.dropped.fetch_add(1, Ordering::SeqCst);
            return reset(inbound);
        }
    };
    // A cut between the accept and here: this connection is older than it.
    if shared.cut.load(Ordering::SeqCst) {
        shared.dropped.fetch_add(1, Ordering::SeqCst);
        reset(outbound);
        return reset(inbound);
    }
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_upstream, mut to_upstream) = outbound.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut from_client, &mut to_upstream).await;
        let _ = to_upstream.shutdown().await;
    };
    // As `copy`, but what comes while swallowing is read and dropped.
    let down = async {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from_upstream.read(&mut buf).await {
            let swallowed = shared.swallowing.load(Ordering::SeqCst);
            if !swallowed && to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_client.shutdown().await;
    };
    let cut = tokio::select! {
        _ = async { tokio::join!(up, down) } => false,
        _ = epoch.changed() => true,
    };
    if cut {
        shared.dropped.fetch_add(1, Ordering::SeqCst);
        if let (Ok(inbound), Ok(outbound)) = (
            from_client.reunite(to_client),
            from_upstream.reunite(to_upstream),
        ) {
            reset(outbound);
            reset(inbound);
        }
    }
}

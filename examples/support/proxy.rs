//! A TCP proxy on 127.0.0.1 that can cut its traffic off and restore it: a store outage
//! (a network partition, a database failover) on demand, for the demo and the tests.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections to a target until [`cut`](Self::cut): then every open connection
/// is dropped and new ones are closed at once, until [`restore`](Self::restore).
#[derive(Clone)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let accepting = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if *accepting.borrow() {
                    continue; // cut off: closed at once
                }
                let mut cut = accepting.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.wait_for(|cut| *cut) => {} // dropped: both sides reset
                    }
                });
            }
        });
        Ok(Self { addr, cut })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

//! `rttscope serve`: the responder for TCP and UDP request/response probes.
//!
//! Limits (each refusal has a counter in [`ServeStats`]; see docs/security.md):
//!
//! - sizes: a request or response larger than `max_size` is refused;
//! - TCP: at most `max_conns` concurrent connections and `max_conns_per_peer`
//!   from one source address (a connection over either is accepted and closed
//!   at once); a hello must arrive within `idle_timeout` of the accept, a
//!   request within `idle_timeout` of its first byte, a response must be read
//!   within `idle_timeout` of its first byte, and a connection idle between
//!   transactions for `idle_timeout` is closed;
//! - UDP: no reply is larger than its request unless the request carries a
//!   valid cookie (the peer proved it receives at its address: see
//!   `framing.rs`), and replies to each source address are rate-limited (a
//!   token bucket per address in a bounded table).
//!
//! Each TCP connection has a thread of its own doing blocking recv() and
//! send(), as a bare server does (at most `max_conns` threads); one watchdog
//! task enforces the deadlines by shutting a late connection's socket down.
//! Accept and UDP run on the async runtime.
//!
//! A client that breaks the framing is disconnected with a log line; everyone
//! else keeps being served. Per-connection and per-datagram log lines are
//! rate-limited: the first ten of each kind, then every thousandth.
mod config;
mod limits;
mod stats;
mod tcp;
#[cfg(test)]
mod tests;
mod udp;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::info;

use crate::active::cancel::Cancel;
pub use config::{
    default_listen, ServeConfig, DEFAULT_MAX_CONNS_PER_PEER, DEFAULT_PORT, DEFAULT_UDP_BURST,
    DEFAULT_UDP_RATE,
};
use limits::{Cookies, PeerConns, RateLimiter};
pub use stats::ServeStats;
use tcp::{accept_loop, tcp_watchdog, ConnTable, TcpShared};
use udp::{udp_loop, UdpShared};

/// A socket on `addr`; an IPv6 one is IPv6-only, so that `[::]` and
/// `0.0.0.0` can both be bound on one port.
fn socket_on(addr: &SocketAddr, ty: socket2::Type) -> std::io::Result<socket2::Socket> {
    let s = socket2::Socket::new(socket2::Domain::for_address(*addr), ty, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    if ty == socket2::Type::STREAM {
        s.set_reuse_address(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&(*addr).into())?;
    Ok(s)
}

fn tcp_listener(addr: &SocketAddr) -> std::io::Result<TcpListener> {
    let s = socket_on(addr, socket2::Type::STREAM)?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}

fn udp_socket(addr: &SocketAddr) -> std::io::Result<UdpSocket> {
    UdpSocket::from_std(socket_on(addr, socket2::Type::DGRAM)?.into())
}

/// A bound server: sockets are open, nothing is served until [`Server::run`].
pub struct Server {
    cfg: ServeConfig,
    tcp: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
    pub stats: Arc<ServeStats>,
}

/// Bind every listen address (TCP and UDP). A port of 0 picks one; the UDP
/// socket then takes the same port as the TCP listener.
pub async fn bind(cfg: ServeConfig) -> Result<Server> {
    if cfg.listen.is_empty() {
        anyhow::bail!("no listen address given");
    }
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    let defaults = cfg.listen == default_listen();
    for addr in &cfg.listen {
        let l = match tcp_listener(addr) {
            Ok(l) => l,
            // The default [::] on a host without IPv6: IPv4 alone, said once.
            Err(e) if defaults && addr.is_ipv6() => {
                info!("not listening on {addr} (no IPv6 here: {e}); IPv4 only");
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("listening on TCP {addr}")),
        };
        let bound = l.local_addr()?;
        let u = udp_socket(&bound).with_context(|| format!("listening on UDP {bound}"))?;
        info!("serving TCP and UDP request/response on {bound}");
        tcp.push(l);
        udp.push(u);
    }
    Ok(Server {
        cfg,
        tcp,
        udp,
        stats: Arc::new(ServeStats::default()),
    })
}

impl Server {
    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serve until `cancel` fires. Then every TCP connection is shut down and
    /// its thread waited for (at most 2 s), so the counters are final.
    pub async fn run(self, mut cancel: Cancel) -> Result<()> {
        let mut set = JoinSet::new();
        let sem = Arc::new(Semaphore::new(self.cfg.max_conns));
        let udp = Arc::new(UdpShared {
            cookies: Cookies::new(self.cfg.cookie_window),
            limiter: RateLimiter::new(
                self.cfg.udp_rate,
                self.cfg.udp_burst,
                self.cfg.udp_rate_sources,
            )
            .map(Mutex::new),
        });
        let cfg = Arc::new(self.cfg);
        let tcp = TcpShared {
            cfg: cfg.clone(),
            sem: sem.clone(),
            peers: Arc::new(PeerConns::default()),
            table: Arc::new(ConnTable::default()),
            stats: self.stats.clone(),
        };
        for l in self.tcp {
            set.spawn(accept_loop(l, tcp.clone()));
        }
        set.spawn(tcp_watchdog(
            tcp.table.clone(),
            cfg.idle_timeout,
            self.stats.clone(),
        ));
        for u in self.udp {
            set.spawn(udp_loop(u, cfg.clone(), udp.clone(), self.stats.clone()));
        }
        let r = tokio::select! {
            _ = super::cancel::cancelled(&mut cancel) => Ok(()),
            Some(r) = set.join_next() => match r {
                Ok(Err(e)) => Err(e),
                _ => Ok(()),
            },
        };
        set.shutdown().await;
        tcp.table.cut_all();
        // Each connection thread holds a permit until its socket is closed.
        let all = cfg.max_conns.min(u32::MAX as usize) as u32;
        let _ = tokio::time::timeout(Duration::from_secs(2), sem.acquire_many(all)).await;
        r
    }
}

/// Bind and serve until cancelled.
pub async fn serve(cfg: ServeConfig, cancel: Cancel) -> Result<()> {
    let s = bind(cfg).await?;
    let stats = s.stats.clone();
    let r = s.run(cancel).await;
    info!(
        "serve stopping: {}",
        serde_json::to_string(&*stats).unwrap_or_default()
    );
    r
}

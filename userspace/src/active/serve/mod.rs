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
mod limits;
mod tcp;
#[cfg(test)]
mod tests;
mod udp;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use md5::Md5;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::active::cancel::Cancel;
use crate::active::framing::{
    carried_cookie, encode_cookie, is_cookie_request, write_cookie, FrameError, Hello, UdpHeader,
    HELLO_ACK, HELLO_LEN, UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN,
};
use limits::{Cookies, PeerConns, PeerSlot, RateLimiter};
use tcp::{accept_loop, tcp_watchdog, ConnTable, TcpShared};
use udp::udp_loop;

/// The responder's default port (TCP and UDP).
pub const DEFAULT_PORT: u16 = 7878;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Addresses to listen on (TCP and UDP on each).
    pub listen: Vec<SocketAddr>,
    /// Largest request or response size in bytes.
    pub max_size: u32,
    /// Largest number of concurrent TCP connections.
    pub max_conns: usize,
    /// Largest number of concurrent TCP connections from one source address (0: no limit).
    pub max_conns_per_peer: usize,
    /// Close a connection idle (nothing received, or a response not read) this
    /// long; also the time a hello, a whole request and a whole response each
    /// have, from their first byte.
    pub idle_timeout: Duration,
    /// UDP replies per second to one source address (0: no limit).
    pub udp_rate: u32,
    /// Replies a source may get back to back above its rate (the bucket's depth).
    pub udp_burst: u32,
    /// Source addresses the UDP rate limiter remembers at most; beyond, the
    /// stalest are forgotten (counted in `udp_rate_evictions`).
    pub udp_rate_sources: usize,
    /// A UDP cookie is valid in the window it was made in and the next one.
    pub cookie_window: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: default_listen(),
            max_size: 1 << 20,
            max_conns: 256,
            max_conns_per_peer: DEFAULT_MAX_CONNS_PER_PEER,
            idle_timeout: Duration::from_secs(30),
            udp_rate: DEFAULT_UDP_RATE,
            udp_burst: DEFAULT_UDP_BURST,
            udp_rate_sources: 4096,
            cookie_window: Duration::from_secs(3600),
        }
    }
}

/// Default per-source TCP connection limit.
pub const DEFAULT_MAX_CONNS_PER_PEER: usize = 32;
/// Default UDP replies per second per source: above a back-to-back UDP_RR on
/// loopback (~20-50k transactions/s), so one probe is never throttled.
pub const DEFAULT_UDP_RATE: u32 = 100_000;
/// Default bucket depth: 10 ms at the default rate.
pub const DEFAULT_UDP_BURST: u32 = 1000;

/// 0.0.0.0:7878 and [::]:7878: every address, as netserver and `irtt server`
/// listen (the replies are bounded: cookies, rates, deadlines above).
pub fn default_listen() -> Vec<SocketAddr> {
    vec![
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)),
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, DEFAULT_PORT)),
    ]
}

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

/// What the server did; every refusal has a counter.
#[derive(Debug, Default, Serialize)]
pub struct ServeStats {
    pub connections: AtomicU64,
    /// TCP connections closed at once: `max_conns` reached.
    pub over_conn_limit: AtomicU64,
    /// TCP connections closed at once: `max_conns_per_peer` reached for their source address.
    pub over_peer_limit: AtomicU64,
    pub bad_hello: AtomicU64,
    /// No hello within the idle timeout, or idle between transactions.
    pub idle_closed: AtomicU64,
    /// A request not complete within the idle timeout of its first byte (slowloris).
    pub slow_requests: AtomicU64,
    /// A response not read within the idle timeout of its first byte.
    pub slow_readers: AtomicU64,
    pub mid_request_disconnects: AtomicU64,
    pub tcp_transactions: AtomicU64,
    pub udp_requests: AtomicU64,
    pub udp_bad: AtomicU64,
    /// Cookie requests answered with a cookie.
    pub udp_cookie_requests: AtomicU64,
    /// Requests for a response larger than themselves without a valid cookie:
    /// answered with a (smaller) cookie datagram instead.
    pub udp_cookie_required: AtomicU64,
    /// Datagrams not answered: their source was over its rate.
    pub udp_rate_limited: AtomicU64,
    /// Sources the full rate table forgot while they still had a partly spent bucket.
    pub udp_rate_evictions: AtomicU64,
    pub udp_send_errors: AtomicU64,
    /// TCP connections closed at once: no thread could be started for them.
    pub thread_spawn_errors: AtomicU64,
}

fn inc(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
}

/// Log the first ten of a kind, then every thousandth, so a flood cannot flood the log.
fn log_nth(count: u64) -> bool {
    count <= 10 || count.is_multiple_of(1000)
}

/// IPv4-mapped IPv6 addresses count as the IPv4 address they carry.
fn source(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
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

/// What the UDP sockets share: cookies and the per-source rate table.
struct UdpShared {
    cookies: Cookies,
    limiter: Option<Mutex<RateLimiter>>,
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

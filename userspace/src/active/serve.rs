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

use super::cancel::Cancel;
use super::framing::{
    carried_cookie, encode_cookie, is_cookie_request, write_cookie, FrameError, Hello, UdpHeader,
    HELLO_ACK, HELLO_LEN, UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN,
};

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

type HmacMd5 = Hmac<Md5>;

/// Stateless UDP cookies: HMAC-MD5, keyed with 32 random bytes made at server
/// start, of (time window, peer address, peer port), truncated to 64 bits. A
/// cookie is accepted in its window and the next one, so it lives between one
/// and two windows. Nothing is stored per peer.
struct Cookies {
    mac: HmacMd5,
    start: Instant,
    window: Duration,
}

impl Cookies {
    fn new(window: Duration) -> Self {
        let key: [u8; 32] = rand::random();
        Cookies {
            mac: <HmacMd5 as Mac>::new_from_slice(&key).expect("HMAC takes any key length"),
            start: Instant::now(),
            window: window.max(Duration::from_millis(1)),
        }
    }

    fn window_at(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_nanos() / self.window.as_nanos()) as u64
    }

    fn make(&self, peer: SocketAddr, window: u64) -> u64 {
        let mut m = self.mac.clone();
        m.update(&window.to_be_bytes());
        match source(peer.ip()) {
            IpAddr::V4(a) => {
                m.update(&[4]);
                m.update(&a.octets());
            }
            IpAddr::V6(a) => {
                m.update(&[6]);
                m.update(&a.octets());
            }
        }
        m.update(&peer.port().to_be_bytes());
        let tag = m.finalize().into_bytes();
        u64::from_be_bytes(tag[..8].try_into().unwrap())
    }

    fn current(&self, peer: SocketAddr, now: Instant) -> u64 {
        self.make(peer, self.window_at(now))
    }

    fn valid(&self, cookie: u64, peer: SocketAddr, now: Instant) -> bool {
        let w = self.window_at(now);
        cookie == self.make(peer, w) || (w > 0 && cookie == self.make(peer, w - 1))
    }
}

/// Per-source token buckets in a bounded table.
struct RateLimiter {
    /// Tokens per nanosecond.
    per_ns: f64,
    burst: f64,
    cap: usize,
    table: HashMap<IpAddr, Bucket>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// None when `rate` is 0 (no limit).
    fn new(rate: u32, burst: u32, cap: usize) -> Option<Self> {
        (rate > 0).then(|| RateLimiter {
            per_ns: rate as f64 / 1e9,
            burst: burst.max(1) as f64,
            cap: cap.max(1),
            table: HashMap::new(),
        })
    }

    /// Take a token for `ip` at `now`: true when a reply may be sent. `evicted`
    /// counts sources forgotten with a partly spent bucket to make room.
    fn allow(&mut self, ip: IpAddr, now: Instant, evicted: &mut u64) -> bool {
        if !self.table.contains_key(&ip) && self.table.len() >= self.cap {
            *evicted += self.make_room(now);
        }
        let (per_ns, burst) = (self.per_ns, self.burst);
        let b = self.table.entry(ip).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let dt = now.saturating_duration_since(b.last).as_nanos() as f64;
        b.tokens = (b.tokens + dt * per_ns).min(burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The table is full: forget every source whose bucket has refilled (it
    /// holds nothing a new entry would not), then, if that freed less than a
    /// quarter, the stalest sources down to three quarters of the cap.
    /// Returns how many of the latter (state lost) there were. A source being
    /// flooded is the freshest in the table, so it is never the one forgotten.
    fn make_room(&mut self, now: Instant) -> u64 {
        let (per_ns, burst) = (self.per_ns, self.burst);
        self.table.retain(|_, b| {
            let dt = now.saturating_duration_since(b.last).as_nanos() as f64;
            b.tokens + dt * per_ns < burst
        });
        let keep = (self.cap - self.cap / 4).min(self.cap - 1);
        if self.table.len() <= keep {
            return 0;
        }
        let mut ages: Vec<Instant> = self.table.values().map(|b| b.last).collect();
        let drop = self.table.len() - keep;
        let (_, cutoff, _) = ages.select_nth_unstable(drop - 1);
        let cutoff = *cutoff;
        let before = self.table.len();
        self.table.retain(|_, b| b.last > cutoff);
        (before - self.table.len()) as u64
    }
}

/// Live TCP connections per source address (entries only while a connection lives).
#[derive(Default)]
struct PeerConns(Mutex<HashMap<IpAddr, usize>>);

/// One live connection's share of its source's count; released on drop.
struct PeerSlot {
    conns: Arc<PeerConns>,
    ip: IpAddr,
}

impl PeerConns {
    fn try_take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if limit > 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            conns: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.conns.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
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

/// What the accept loops share: the limits, the live connections, the counters.
#[derive(Clone)]
struct TcpShared {
    cfg: Arc<ServeConfig>,
    sem: Arc<Semaphore>,
    peers: Arc<PeerConns>,
    table: Arc<ConnTable>,
    stats: Arc<ServeStats>,
}

async fn accept_loop(l: TcpListener, t: TcpShared) -> Result<()> {
    let (cfg, stats) = (&t.cfg, &t.stats);
    let mut accept_errors = 0u64;
    loop {
        let (s, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                accept_errors += 1;
                if log_nth(accept_errors) {
                    warn!("accept failed: {e} (accept errors so far: {accept_errors})");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        inc(&stats.connections);
        let Some(slot) = t.peers.try_take(source(peer.ip()), cfg.max_conns_per_peer) else {
            let n = inc(&stats.over_peer_limit);
            if log_nth(n) {
                warn!("{peer}: per-source connection limit {} reached; disconnected (refused so far: {n})", cfg.max_conns_per_peer);
            }
            continue;
        };
        let Ok(permit) = t.sem.clone().try_acquire_owned() else {
            let n = inc(&stats.over_conn_limit);
            if log_nth(n) {
                warn!(
                    "{peer}: connection limit {} reached; disconnected (refused so far: {n})",
                    cfg.max_conns
                );
            }
            continue;
        };
        start_conn(s, peer, (permit, slot), &t);
    }
}

/// A buffer of response bytes written repeatedly for large responses.
const CHUNK: usize = 64 * 1024;

/// The stack of a connection thread (address space; only the pages it
/// touches take memory, a few KiB).
const CONN_STACK: usize = 256 * 1024;

/// What a TCP connection waits for. The watchdog closes a connection whose
/// phase has not changed for `idle_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The hello, from the accept.
    Hello = 0,
    /// The first byte of the next request.
    Idle = 1,
    /// The rest of a request whose first bytes came.
    Request = 2,
    /// The client to read the response.
    Response = 3,
}

impl Phase {
    fn of(word: u64) -> Phase {
        match word & 3 {
            0 => Phase::Hello,
            1 => Phase::Idle,
            2 => Phase::Request,
            _ => Phase::Response,
        }
    }
}

/// One live TCP connection, shared by its thread and the watchdog.
struct Conn {
    sock: std::net::TcpStream,
    peer: SocketAddr,
    /// `(changes << 2) | phase`: one relaxed store per phase change is all
    /// the hot path does for the deadlines.
    phase: AtomicU64,
    /// Shut down by the watchdog, which counted and logged why.
    cut: AtomicBool,
}

impl Conn {
    fn enter(&self, changes: &mut u64, p: Phase) {
        *changes += 1;
        self.phase
            .store((*changes << 2) | p as u64, Ordering::Relaxed);
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }
}

/// The live connections, for the watchdog and for stopping.
#[derive(Default)]
struct ConnTable {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl ConnTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cut_all(&self) {
        for c in self.lock().values() {
            c.cut();
        }
    }
}

/// A connection's entry in the table and its places in the limits; released
/// (socket closed first) when its thread ends.
struct ConnGuard {
    table: Arc<ConnTable>,
    id: u64,
    _limits: (OwnedSemaphorePermit, PeerSlot),
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        // The table holds the last reference: this closes the socket.
        let c = self.table.lock().remove(&self.id);
        drop(c);
    }
}

/// Hand an accepted connection to a thread of its own: blocking recv() and
/// send(), the two system calls per transaction a bare server makes (through
/// the reactor each turnaround also cost an EAGAIN recv, an epoll_wait and a
/// timer: ~0.8 us of CPU, 15% of a loopback transaction; docs/perf-active.md).
fn start_conn(
    s: TcpStream,
    peer: SocketAddr,
    limits: (OwnedSemaphorePermit, PeerSlot),
    t: &TcpShared,
) {
    let sock = match s
        .into_std()
        .and_then(|s| s.set_nonblocking(false).map(|_| s))
    {
        Ok(s) => s,
        Err(e) => {
            debug!("{peer}: {e}");
            return;
        }
    };
    let conn = Arc::new(Conn {
        sock,
        peer,
        phase: AtomicU64::new(Phase::Hello as u64),
        cut: AtomicBool::new(false),
    });
    let id = t.table.next.fetch_add(1, Ordering::Relaxed);
    t.table.lock().insert(id, conn.clone());
    let guard = ConnGuard {
        table: t.table.clone(),
        id,
        _limits: limits,
    };
    let (cfg, stats) = (t.cfg.clone(), t.stats.clone());
    let spawned = std::thread::Builder::new()
        .name("rttscope-conn".into())
        .stack_size(CONN_STACK)
        .spawn(move || {
            conn_thread(&conn, &cfg, &stats);
            drop(conn);
            drop(guard);
        });
    if let Err(e) = spawned {
        // The closure (and with it the guard) is dropped: connection closed.
        let n = inc(&t.stats.thread_spawn_errors);
        if log_nth(n) {
            warn!("{peer}: no thread for the connection ({e}); disconnected (so far: {n})");
        }
    }
}

/// Every `idle_timeout / 10` (1-100 ms): a connection whose phase has not
/// changed for `idle_timeout` is counted, logged and shut down. The deadline
/// runs from when the watchdog first saw the phase: `idle` to `idle + period`
/// after the phase began.
async fn tcp_watchdog(table: Arc<ConnTable>, idle: Duration, stats: Arc<ServeStats>) -> Result<()> {
    let period = (idle / 10).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: HashMap<u64, (u64, Instant)> = HashMap::new();
    loop {
        tick.tick().await;
        let now = Instant::now();
        let live = table.lock();
        seen.retain(|id, _| live.contains_key(id));
        for (id, c) in live.iter() {
            let word = c.phase.load(Ordering::Relaxed);
            let e = seen.entry(*id).or_insert((word, now));
            if e.0 != word {
                *e = (word, now);
            } else if now.duration_since(e.1) >= idle && !c.was_cut() {
                report_cut(c.peer, Phase::of(word), idle, &stats);
                c.cut();
            }
        }
    }
}

/// Count and log a connection the watchdog closes.
fn report_cut(peer: SocketAddr, phase: Phase, idle: Duration, stats: &ServeStats) {
    let (counter, what, kind) = match phase {
        Phase::Hello => (&stats.idle_closed, "sent no hello within", "idle"),
        Phase::Idle => (&stats.idle_closed, "idle for", "idle"),
        Phase::Request => (
            &stats.slow_requests,
            "request not complete within its first byte +",
            "slow requests",
        ),
        Phase::Response => (
            &stats.slow_readers,
            "did not read its response within",
            "slow readers",
        ),
    };
    let n = inc(counter);
    if log_nth(n) {
        warn!("{peer}: {what} {idle:?}; disconnected ({kind} so far: {n})");
    }
}

/// A connection's thread: the hello, then transactions until the client
/// leaves, breaks the framing or the watchdog shuts the socket down.
fn conn_thread(c: &Conn, cfg: &ServeConfig, stats: &ServeStats) {
    let Some(h) = read_hello(c, cfg, stats) else {
        return;
    };
    if h.flags & super::framing::FLAG_NODELAY != 0 {
        let _ = c.sock.set_nodelay(true);
    }
    if (&c.sock).write_all(&HELLO_ACK).is_err() {
        return;
    }
    debug!(
        "{}: request {} bytes, response {} bytes",
        c.peer, h.req, h.resp
    );
    let end = serve_requests(c, &h, stats);
    if c.was_cut() {
        return; // counted by the watchdog
    }
    match end {
        ConnEnd::Closed => {}
        ConnEnd::MidRequest => {
            inc(&stats.mid_request_disconnects);
            debug!("{}: disconnected in the middle of a request", c.peer);
        }
        ConnEnd::Error(e) => debug!("{}: {e}", c.peer),
    }
}

/// The hello, decoded; None when the connection is to end (counted).
fn read_hello(c: &Conn, cfg: &ServeConfig, stats: &ServeStats) -> Option<Hello> {
    let peer = c.peer;
    let mut hello = [0u8; HELLO_LEN];
    if let Err(e) = (&c.sock).read_exact(&mut hello) {
        if !c.was_cut() {
            let n = inc(&stats.bad_hello);
            if log_nth(n) {
                warn!("{peer}: connection ended before a complete hello ({e}); disconnected (bad hellos so far: {n})");
            }
        }
        return None;
    }
    match Hello::decode(&hello, cfg.max_size) {
        Ok(h) => Some(h),
        Err(e) => {
            let n = inc(&stats.bad_hello);
            if log_nth(n) {
                warn!("{peer}: framing violation: {e}; disconnected (bad hellos so far: {n})");
            }
            None
        }
    }
}

/// How a connection's transactions ended.
enum ConnEnd {
    /// The client closed between transactions.
    Closed,
    /// The client closed in the middle of a request.
    MidRequest,
    Error(std::io::Error),
}

/// Transactions: read exactly one request, write one response, again. The
/// phase tells the watchdog which deadline runs (see [`Phase`]).
fn serve_requests(c: &Conn, h: &Hello, stats: &ServeStats) -> ConnEnd {
    let mut s = &c.sock;
    let mut inbuf = vec![0u8; (h.req as usize).min(CHUNK)];
    let out = vec![b'r'; (h.resp as usize).min(CHUNK)];
    let mut changes = 0u64;
    loop {
        c.enter(&mut changes, Phase::Idle);
        let mut left = h.req as usize;
        while left > 0 {
            let want = left.min(inbuf.len());
            match s.read(&mut inbuf[..want]) {
                Ok(0) if left == h.req as usize => return ConnEnd::Closed,
                Ok(0) => return ConnEnd::MidRequest,
                Ok(n) => {
                    if left == h.req as usize && n < left {
                        c.enter(&mut changes, Phase::Request);
                    }
                    left -= n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return ConnEnd::Error(e),
            }
        }
        c.enter(&mut changes, Phase::Response);
        let mut left = h.resp as usize;
        while left > 0 {
            let n = left.min(out.len());
            if let Err(e) = s.write_all(&out[..n]) {
                return ConnEnd::Error(e);
            }
            left -= n;
        }
        inc(&stats.tcp_transactions);
    }
}

/// What a UDP datagram gets back.
enum UdpAnswer {
    /// The response: `resp` bytes starting with the request's header; bytes
    /// 16..24 carry this cookie when one was verified.
    Response { resp: usize, cookie: Option<u64> },
    /// A 16-byte cookie datagram.
    Cookie(u64),
}

/// Decide the answer to one datagram (None: dropped, counted and logged).
fn udp_answer(
    d: &[u8],
    peer: SocketAddr,
    now: Instant,
    cfg: &ServeConfig,
    cookies: &Cookies,
    stats: &ServeStats,
) -> Option<UdpAnswer> {
    match is_cookie_request(d) {
        Some(true) => {
            inc(&stats.udp_cookie_requests);
            return Some(UdpAnswer::Cookie(cookies.current(peer, now)));
        }
        Some(false) => {
            let c = inc(&stats.udp_bad);
            log_udp_bad(peer, &FrameError::Short(d.len()), c);
            return None;
        }
        None => {}
    }
    let h = match UdpHeader::decode_request(d, cfg.max_size) {
        Ok(h) => h,
        Err(e) => {
            let c = inc(&stats.udp_bad);
            log_udp_bad(peer, &e, c);
            return None;
        }
    };
    inc(&stats.udp_requests);
    let resp = h.resp as usize;
    if resp <= d.len() {
        // Never larger than the request: no proof needed.
        return Some(UdpAnswer::Response { resp, cookie: None });
    }
    match carried_cookie(d) {
        Some(c) if cookies.valid(c, peer, now) => Some(UdpAnswer::Response {
            resp,
            cookie: Some(cookies.current(peer, now)),
        }),
        _ => {
            // Maybe a spoofed source: answer with no more than was received.
            let c = inc(&stats.udp_cookie_required);
            if log_nth(c) {
                warn!(
                    "{peer}: UDP request of {} bytes asks for {resp} without a valid cookie; answered with a cookie (so far: {c})",
                    d.len()
                );
            }
            Some(UdpAnswer::Cookie(cookies.current(peer, now)))
        }
    }
}

async fn udp_loop(
    u: UdpSocket,
    cfg: Arc<ServeConfig>,
    shared: Arc<UdpShared>,
    stats: Arc<ServeStats>,
) -> Result<()> {
    let mut buf = vec![0u8; 65536];
    let mut out = vec![b'r'; 65536];
    loop {
        let (n, peer) = match u.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                // ICMP errors from earlier sends surface here; they are not ours to act on.
                debug!("udp recv: {e}");
                continue;
            }
        };
        let now = Instant::now();
        let Some(answer) = udp_answer(&buf[..n], peer, now, &cfg, &shared.cookies, &stats) else {
            continue;
        };
        if let Some(limiter) = &shared.limiter {
            let mut evicted = 0;
            let ok = limiter.lock().unwrap_or_else(|e| e.into_inner()).allow(
                source(peer.ip()),
                now,
                &mut evicted,
            );
            if evicted > 0 {
                let before = stats
                    .udp_rate_evictions
                    .fetch_add(evicted, Ordering::Relaxed);
                if before == 0 || (before / 1000) != ((before + evicted) / 1000) {
                    warn!(
                        "UDP rate table full ({} sources): forgot {evicted} of the stalest (so far: {})",
                        cfg.udp_rate_sources,
                        before + evicted
                    );
                }
            }
            if !ok {
                let c = inc(&stats.udp_rate_limited);
                if log_nth(c) {
                    warn!(
                        "{peer}: over the UDP rate of {}/s (burst {}); dropped (so far: {c})",
                        cfg.udp_rate, cfg.udp_burst
                    );
                }
                continue;
            }
        }
        let sent = match answer {
            UdpAnswer::Cookie(c) => u.send_to(&encode_cookie(c), peer).await,
            UdpAnswer::Response { resp, cookie } => {
                out[..UDP_HEADER_LEN].copy_from_slice(&buf[..UDP_HEADER_LEN]);
                // Bytes 16..24: this peer's fresh cookie, or plain filler (never
                // another peer's cookie left over in the buffer).
                match cookie {
                    Some(c) if resp >= UDP_COOKIE_REQ_MIN => write_cookie(&mut out, c),
                    _ => out[UDP_HEADER_LEN..UDP_COOKIE_REQ_MIN].fill(b'r'),
                }
                u.send_to(&out[..resp], peer).await
            }
        };
        if let Err(e) = sent {
            let c = inc(&stats.udp_send_errors);
            if c <= 10 {
                debug!("udp send to {peer}: {e}");
            }
        }
    }
}

/// Bad datagrams are logged for the first ten and then every thousandth, so a flood cannot flood the log.
fn log_udp_bad(peer: SocketAddr, e: &FrameError, count: u64) {
    if log_nth(count) {
        warn!("{peer}: bad UDP request ({e}); dropped (bad datagrams so far: {count})");
    }
}

#[cfg(test)]
mod tests {
    //! Real sockets on loopback (127.0.0.1, 127.0.0.2, ::1) only, no privileges.
    use super::*;
    use crate::active::cancel::cancel_pair;
    use crate::active::framing::{cookie_request, decode_cookie, UDP_COOKIE_LEN, UDP_MAX};
    use crate::active::rr;
    use std::io::{Read, Write};

    /// The default listens on every address, IPv4 and IPv6 on one port (the
    /// IPv6 socket is IPv6-only, or the two would collide).
    #[tokio::test]
    async fn listens_on_every_address_v4_and_v6_on_one_port() {
        assert_eq!(
            default_listen()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>(),
            ["0.0.0.0:7878", "[::]:7878"]
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = ServeConfig {
            listen: vec![
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
            ],
            ..ServeConfig::default()
        };
        match bind(cfg).await {
            Ok(s) => assert_eq!(s.local_addrs().len(), 2),
            // A host without IPv6 cannot bind [::] at all; the v4 part is
            // what the default keeps there.
            Err(e) => assert!(
                format!("{e:#}").contains("[::]"),
                "binding 0.0.0.0 and [::] on one port: {e:#}"
            ),
        }
    }

    /// A refused connect says what it means, not only "refused".
    #[tokio::test]
    async fn refused_connect_says_nothing_listens() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(); // closed again: nothing listens there
        let mut c = rr::ProbeConfig::new(rr::Kind::TcpRr, "127.0.0.1");
        c.port = port;
        c.stop = rr::Stop::Count(1);
        let (_tx, rx) = cancel_pair();
        let e = rr::run_probe(&c, rx).await.unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("refused (nothing listens on port") && e.contains("rttscope serve"),
            "{e}"
        );
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Start a server on `listen` (port 0); its addresses, stats and stop handle.
    async fn start(
        cfg: ServeConfig,
    ) -> (
        Vec<SocketAddr>,
        Arc<ServeStats>,
        tokio::sync::watch::Sender<bool>,
    ) {
        let server = bind(cfg).await.unwrap();
        let addrs = server.local_addrs();
        let stats = server.stats.clone();
        let (tx, cancel) = cancel_pair();
        tokio::spawn(server.run(cancel));
        (addrs, stats, tx)
    }

    fn v4_cfg() -> ServeConfig {
        ServeConfig {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            ..Default::default()
        }
    }

    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn request(resp: u32, seq: u64, len: usize, cookie: Option<u64>) -> Vec<u8> {
        let mut b = vec![b'q'; len];
        UdpHeader { resp, seq }.write(&mut b);
        if let Some(c) = cookie {
            write_cookie(&mut b, c);
        }
        b
    }

    /// One reply (or None within `wait`).
    async fn reply(u: &UdpSocket, wait: Duration) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 65536];
        let n = tokio::time::timeout(wait, u.recv(&mut buf))
            .await
            .ok()?
            .unwrap();
        buf.truncate(n);
        Some(buf)
    }

    async fn client(server: SocketAddr) -> UdpSocket {
        let u = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        u.connect(server).await.unwrap();
        u
    }

    async fn get_cookie(u: &UdpSocket) -> u64 {
        u.send(&cookie_request()).await.unwrap();
        let r = reply(u, Duration::from_secs(2))
            .await
            .expect("cookie reply");
        assert_eq!(r.len(), UDP_COOKIE_LEN, "{r:02x?}");
        decode_cookie(&r).expect("a cookie datagram")
    }

    /// Issue 18 item 2: `"RTU1" + pack("!IQ", 65507, 1)` (16 bytes) used to
    /// get a 65,507-byte reply, from any (spoofable) source.
    #[test]
    fn udp_amplification_request_gets_no_larger_reply() {
        rt().block_on(async {
            let (addrs, stats, _stop) = start(v4_cfg()).await;
            let u = client(addrs[0]).await;
            for len in [16usize, 24, 100, 1000] {
                let req = request(UDP_MAX, 1, len, None);
                u.send(&req).await.unwrap();
                let r = reply(&u, Duration::from_secs(2))
                    .await
                    .expect("an answer (a cookie)");
                assert!(
                    r.len() <= req.len(),
                    "a {}-byte request asking for {UDP_MAX} got a {}-byte reply (first bytes {:02x?})",
                    req.len(),
                    r.len(),
                    &r[..r.len().min(24)]
                );
                assert!(decode_cookie(&r).is_some(), "not a cookie datagram: {r:02x?}");
            }
            assert_eq!(get(&stats.udp_cookie_required), 4);
            // A response no larger than the request needs no cookie, as before.
            for (resp, len) in [(16u32, 16usize), (100, 100), (50, 200)] {
                u.send(&request(resp, 7, len, None)).await.unwrap();
                let r = reply(&u, Duration::from_secs(2)).await.expect("a response");
                assert_eq!(r.len(), resp as usize);
                assert_eq!(UdpHeader::decode(&r).unwrap(), UdpHeader { resp, seq: 7 });
            }
            assert_eq!(get(&stats.udp_cookie_required), 4);
        });
    }

    #[test]
    fn udp_cookie_handshake_gets_the_full_response() {
        rt().block_on(async {
            let (addrs, stats, _stop) = start(v4_cfg()).await;
            let u = client(addrs[0]).await;
            let c = get_cookie(&u).await;
            let req = request(UDP_MAX, 5, UDP_COOKIE_REQ_MIN, Some(c));
            u.send(&req).await.unwrap();
            let r = reply(&u, Duration::from_secs(2)).await.expect("a response");
            assert_eq!(
                r.len(),
                UDP_MAX as usize,
                "first bytes {:02x?}",
                &r[..24.min(r.len())]
            );
            assert_eq!(
                UdpHeader::decode(&r).unwrap(),
                UdpHeader {
                    resp: UDP_MAX,
                    seq: 5
                }
            );
            // The response carries the current cookie (here the same window's).
            assert_eq!(carried_cookie(&r), Some(c));
            assert!(r[UDP_COOKIE_REQ_MIN..].iter().all(|&b| b == b'r'));
            // The cookie is bound to the port: another socket of the same host
            // cannot use it.
            let other = client(addrs[0]).await;
            other.send(&req).await.unwrap();
            let r = reply(&other, Duration::from_secs(2))
                .await
                .expect("a cookie");
            assert!(r.len() <= req.len(), "{} bytes for another port", r.len());
            // A response without a cookie never carries another peer's cookie.
            other.send(&request(100, 1, 100, None)).await.unwrap();
            let r = reply(&other, Duration::from_secs(2)).await.unwrap();
            assert_eq!(r.len(), 100);
            assert!(r[UDP_HEADER_LEN..].iter().all(|&b| b == b'r'), "{r:02x?}");
            assert_eq!(get(&stats.udp_cookie_requests), 1);
            assert_eq!(get(&stats.udp_cookie_required), 1);

            // The probe does the handshake itself: requests raised to 24 bytes.
            let mut c = rr::ProbeConfig::new(rr::Kind::UdpRr, "127.0.0.1");
            c.port = addrs[0].port();
            c.stop = rr::Stop::Count(100);
            c.req_size = 1;
            c.resp_size = 60000;
            let (_keep, cancel) = cancel_pair();
            let r = rr::run_probe(&c, cancel).await.unwrap();
            assert_eq!(r.counts.received, 100, "{:?}", r.counts);
            assert_eq!((r.settings.req_size, r.settings.resp_size), (24, 60000));
            assert_eq!(r.counts.cookie_refreshes, 0, "{:?}", r.counts);
            assert_eq!(
                get(&stats.udp_cookie_required),
                1,
                "the probe was never refused"
            );
        });
    }

    #[test]
    fn udp_forged_and_stale_cookies_get_no_large_reply() {
        rt().block_on(async {
            let (addrs, stats, _stop) = start(ServeConfig {
                cookie_window: Duration::from_millis(200),
                ..v4_cfg()
            })
            .await;
            let u = client(addrs[0]).await;
            // Forged.
            for forged in [0u64, u64::MAX, rand::random()] {
                let req = request(UDP_MAX, 1, 64, Some(forged));
                u.send(&req).await.unwrap();
                let r = reply(&u, Duration::from_secs(2)).await.expect("a cookie");
                assert!(
                    r.len() <= req.len(),
                    "forged cookie {forged:#x}: {} bytes",
                    r.len()
                );
            }
            // Stale: made in window w, valid through w+1, refused from w+2 on.
            let c = get_cookie(&u).await;
            tokio::time::sleep(Duration::from_millis(450)).await;
            let req = request(UDP_MAX, 2, 64, Some(c));
            u.send(&req).await.unwrap();
            let r = reply(&u, Duration::from_secs(2)).await.expect("a cookie");
            assert!(r.len() <= req.len(), "stale cookie: {} bytes", r.len());
            // The reply is a fresh cookie, which works.
            let fresh = decode_cookie(&r).expect("a cookie datagram");
            assert_ne!(fresh, c);
            u.send(&request(UDP_MAX, 3, 64, Some(fresh))).await.unwrap();
            let r = reply(&u, Duration::from_secs(2)).await.expect("a response");
            assert_eq!(r.len(), UDP_MAX as usize);
            assert_eq!(get(&stats.udp_cookie_required), 4);
        });
    }

    #[test]
    fn cookies_live_one_to_two_windows_and_bind_the_address() {
        let c = Cookies::new(Duration::from_secs(10));
        let at = |s: u64| c.start + Duration::from_secs(s);
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let k = c.current(a, at(15)); // window 1
        assert!(c.valid(k, a, at(10)) && c.valid(k, a, at(19)));
        assert!(c.valid(k, a, at(29)), "the next window accepts it");
        assert!(!c.valid(k, a, at(30)), "two windows later it is stale");
        assert!(!c.valid(k, a, at(5)), "not before its window");
        assert!(!c.valid(k, "127.0.0.1:4001".parse().unwrap(), at(15)));
        assert!(!c.valid(k, "127.0.0.2:4000".parse().unwrap(), at(15)));
        // An IPv4-mapped IPv6 source is the same peer.
        assert!(c.valid(k, "[::ffff:127.0.0.1]:4000".parse().unwrap(), at(15)));
        // Another server (another key) does not accept it.
        let d = Cookies::new(Duration::from_secs(10));
        assert_ne!(d.make(a, 1), k);
    }

    #[test]
    fn udp_rate_limit_engages_and_is_counted() {
        rt().block_on(async {
            let (addrs, stats, _stop) = start(ServeConfig {
                udp_rate: 100,
                udp_burst: 10,
                ..v4_cfg()
            })
            .await;
            let u = client(addrs[0]).await;
            let t = Instant::now();
            for seq in 0..300u64 {
                u.send(&request(16, seq, 16, None)).await.unwrap();
                if seq % 20 == 19 {
                    // Not faster than the server reads (its socket buffer would drop them).
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            let mut got = 0u64;
            while reply(&u, Duration::from_millis(200)).await.is_some() {
                got += 1;
            }
            let secs = t.elapsed().as_secs_f64();
            let limited = get(&stats.udp_rate_limited);
            assert!(
                got >= 10 && (got as f64) <= 10.0 + 100.0 * secs + 2.0,
                "{got} replies to 300 requests in {secs:.3} s at 100/s, burst 10; {limited} limited"
            );
            assert!(limited > 0);
            assert_eq!(
                got + limited,
                get(&stats.udp_requests),
                "every refusal counted"
            );
            assert!(get(&stats.udp_requests) > 250, "{:?}", stats);
            // Another source has its own bucket.
            let other = UdpSocket::bind("127.0.0.2:0").await.unwrap();
            other.connect(addrs[0]).await.unwrap();
            other.send(&request(16, 1, 16, None)).await.unwrap();
            assert!(reply(&other, Duration::from_secs(2)).await.is_some());
            // And the limited source gets replies again after a pause.
            tokio::time::sleep(Duration::from_millis(100)).await;
            u.send(&request(16, 1000, 16, None)).await.unwrap();
            assert!(reply(&u, Duration::from_secs(2)).await.is_some());
        });
    }

    #[test]
    fn default_rate_does_not_throttle_a_back_to_back_probe() {
        rt().block_on(async {
            let (addrs, stats, _stop) = start(v4_cfg()).await;
            let mut c = rr::ProbeConfig::new(rr::Kind::UdpRr, "127.0.0.1");
            c.port = addrs[0].port();
            c.stop = rr::Stop::Count(20_000);
            let (_keep, cancel) = cancel_pair();
            let r = rr::run_probe(&c, cancel).await.unwrap();
            assert_eq!(r.counts.received, 20_000, "{:?}", r.counts);
            assert_eq!(get(&stats.udp_rate_limited), 0);
        });
    }

    #[test]
    fn rate_table_is_bounded_and_keeps_the_busy_source() {
        let mut l = RateLimiter::new(1, 2, 8).unwrap();
        let t0 = Instant::now();
        let ip = |i: u8| IpAddr::from([10, 0, 0, i]);
        let mut evicted = 0;
        // A flooded source, then seven others one tick apart, each spending a token.
        for k in 0..3 {
            l.allow(ip(200), t0 + Duration::from_millis(k), &mut evicted);
        }
        assert!(!l.allow(ip(200), t0 + Duration::from_millis(3), &mut evicted));
        for i in 1..8u8 {
            l.allow(
                ip(i),
                t0 + Duration::from_millis(10 + i as u64),
                &mut evicted,
            );
            l.allow(
                ip(200),
                t0 + Duration::from_millis(10 + i as u64),
                &mut evicted,
            );
        }
        assert_eq!(l.table.len(), 8);
        // A new source: the stalest go, the flooded one (freshest) stays limited.
        let now = t0 + Duration::from_millis(100);
        assert!(l.allow(ip(100), now, &mut evicted));
        assert!(evicted >= 1, "evictions counted");
        assert!(l.table.len() <= 8);
        assert!(
            !l.allow(ip(200), now, &mut evicted),
            "the flooded source kept its state"
        );
        // Sources whose bucket refilled are dropped without counting.
        let later = now + Duration::from_secs(10);
        let before = evicted;
        for i in 0..8u8 {
            l.allow(ip(50 + i), later, &mut evicted);
        }
        assert_eq!(evicted, before, "refilled buckets are no loss");
        assert!(l.table.len() <= 8);
        assert!(RateLimiter::new(0, 10, 10).is_none(), "0 = no limit");
        let mut one = RateLimiter::new(1, 1, 1).unwrap();
        let mut ev = 0;
        assert!(one.allow(ip(1), t0, &mut ev));
        assert!(one.allow(ip(2), t0, &mut ev));
        assert_eq!((one.table.len(), ev), (1, 1));
    }

    fn hello(req: u32, resp: u32) -> [u8; HELLO_LEN] {
        Hello {
            req,
            resp,
            flags: 0,
        }
        .encode()
    }

    /// Connect, send a hello, read the ack (blocking sockets, from a plain thread).
    fn connected(addr: SocketAddr, req: u32, resp: u32) -> std::net::TcpStream {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.write_all(&hello(req, resp)).unwrap();
        let mut ack = [0u8; 4];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.read_exact(&mut ack).unwrap();
        assert_eq!(ack, HELLO_ACK);
        s
    }

    /// Closed by the server within `within`?
    fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 64];
        loop {
            match s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Issue 18 item 5: the idle timeout used to be per read, so one byte
    /// every 300 ms held a 1 MiB request's slot forever.
    #[test]
    fn tcp_slowloris_request_is_cut_at_its_deadline() {
        let rt = rt();
        let (addrs, stats, _stop) = rt.block_on(start(ServeConfig {
            idle_timeout: Duration::from_secs(1),
            ..v4_cfg()
        }));
        let addr = addrs[0];
        let r = std::thread::spawn(move || {
            let mut s = connected(addr, 1 << 20, 1);
            let t = Instant::now();
            let mut sent = 0;
            loop {
                if s.write_all(b"x").is_err() {
                    break;
                }
                sent += 1;
                // Closed? (a read that returns 0 within 300 ms)
                if closed_within(&mut s, Duration::from_millis(300)) {
                    break;
                }
                if t.elapsed() > Duration::from_secs(10) {
                    break;
                }
            }
            (t.elapsed(), sent)
        })
        .join()
        .unwrap();
        let (took, sent) = r;
        assert!(
            took < Duration::from_secs(2),
            "a trickled request held its connection {took:?} ({sent} bytes) with a 1 s deadline"
        );
        assert!(took >= Duration::from_millis(900), "closed after {took:?}");
        assert_eq!(get(&stats.slow_requests), 1);
        // A request that comes in pieces within the deadline is fine.
        let t = std::thread::spawn(move || {
            let mut s = connected(addr, 3, 2);
            for _ in 0..3 {
                s.write_all(b"x").unwrap();
                std::thread::sleep(Duration::from_millis(200));
            }
            let mut resp = [0u8; 2];
            s.read_exact(&mut resp).is_ok()
        })
        .join()
        .unwrap();
        assert!(t, "a 600 ms request within a 1 s deadline was served");
    }

    #[test]
    fn tcp_per_peer_connection_limit() {
        let rt = rt();
        let v6 = std::net::TcpListener::bind("[::1]:0").is_ok();
        let mut listen = vec!["127.0.0.1:0".parse().unwrap()];
        if v6 {
            listen.push("[::1]:0".parse().unwrap());
        }
        let (addrs, stats, _stop) = rt.block_on(start(ServeConfig {
            listen,
            max_conns_per_peer: 4,
            ..Default::default()
        }));
        let a4 = addrs[0];
        let held: Vec<_> = (0..4).map(|_| connected(a4, 1, 1)).collect();
        let mut fifth = std::net::TcpStream::connect_timeout(&a4, Duration::from_secs(2)).unwrap();
        let _ = fifth.write_all(&hello(1, 1));
        assert!(
            closed_within(&mut fifth, Duration::from_secs(1)),
            "the 5th connection from 127.0.0.1 was not refused"
        );
        assert_eq!(get(&stats.over_peer_limit), 1);
        let probe = |host: &str, port: u16| {
            let mut c = rr::ProbeConfig::new(rr::Kind::TcpRr, host);
            c.port = port;
            c.stop = rr::Stop::Count(50);
            let (_keep, cancel) = cancel_pair();
            rt.block_on(rr::run_probe(&c, cancel))
        };
        // Another source is served meanwhile.
        if v6 {
            let r = probe("::1", addrs[1].port()).unwrap();
            assert_eq!(r.counts.received, 50);
        }
        // From the same source: refused while the four are held...
        assert!(probe("127.0.0.1", a4.port()).is_err());
        assert_eq!(get(&stats.over_peer_limit), 2);
        // ...and served once they are gone.
        drop(held);
        let t = Instant::now();
        let r = loop {
            match probe("127.0.0.1", a4.port()) {
                Ok(r) => break r,
                Err(e) if t.elapsed() < Duration::from_secs(2) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("no slot after the held connections closed: {e:#}"),
            }
        };
        assert_eq!(r.counts.received, 50);
        assert_eq!(get(&stats.over_conn_limit), 0);
    }

    /// Wait until `c` reads `want`; how long that took (None: not within `within`).
    fn until_count(c: &AtomicU64, want: u64, within: Duration) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < within {
            if get(c) >= want {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// The watchdog's three other deadlines, with a 1 s idle timeout: no
    /// hello, idle between transactions, a response not read. Each is cut
    /// between 0.9 and 2.5 s (the watchdog looks every 100 ms) and counted.
    #[test]
    fn tcp_idle_hello_and_slow_reader_are_cut_at_their_deadlines() {
        let rt = rt();
        let (addrs, stats, _stop) = rt.block_on(start(ServeConfig {
            idle_timeout: Duration::from_secs(1),
            max_size: 64 << 20,
            ..v4_cfg()
        }));
        let addr = addrs[0];
        let in_time = |d: Option<Duration>, what: &str| {
            let d = d.unwrap_or_else(|| panic!("{what}: not cut within 2.5 s"));
            assert!(d >= Duration::from_millis(900), "{what}: cut after {d:?}");
        };
        // No hello.
        let mut silent = std::net::TcpStream::connect(addr).unwrap();
        in_time(
            until_count(&stats.idle_closed, 1, Duration::from_millis(2500)),
            "no hello",
        );
        assert!(closed_within(&mut silent, Duration::from_secs(1)));
        // One transaction, then silence.
        let mut idle = connected(addr, 1, 1);
        idle.write_all(b"q").unwrap();
        let mut b = [0u8; 1];
        idle.read_exact(&mut b).unwrap();
        in_time(
            until_count(&stats.idle_closed, 2, Duration::from_millis(2500)),
            "idle",
        );
        assert!(closed_within(&mut idle, Duration::from_secs(1)));
        // A 32 MiB response nobody reads: more than the server's send buffer
        // (at most tcp_wmem's 4 MiB) and the client's small receive buffer
        // hold, so the server's send blocks.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&addr.into()).unwrap();
        let mut slow: std::net::TcpStream = sock.into();
        slow.write_all(&hello(1, 32 << 20)).unwrap();
        slow.read_exact(&mut [0u8; 4]).unwrap();
        slow.write_all(b"q").unwrap();
        in_time(
            until_count(&stats.slow_readers, 1, Duration::from_millis(2500)),
            "slow reader",
        );
        assert!(closed_within(&mut slow, Duration::from_secs(2)));
        assert_eq!(get(&stats.tcp_transactions), 1, "{stats:?}");
        assert_eq!(get(&stats.slow_requests), 0, "{stats:?}");
    }

    /// At most `max_conns` connection threads: the one over is refused and
    /// counted. Stopping the server shuts every live connection down and
    /// waits for its thread: `run` returns promptly and the counters are final.
    #[test]
    fn tcp_connections_are_bounded_and_end_with_the_server() {
        let rt = rt();
        let server = rt
            .block_on(bind(ServeConfig {
                max_conns: 3,
                ..v4_cfg()
            }))
            .unwrap();
        let addr = server.local_addrs()[0];
        let stats = server.stats.clone();
        let (stop, cancel) = cancel_pair();
        let run = rt.spawn(server.run(cancel));
        let mut held: Vec<_> = (0..3).map(|_| connected(addr, 1, 1)).collect();
        for s in &mut held {
            s.write_all(b"q").unwrap();
            s.read_exact(&mut [0u8; 1]).unwrap();
        }
        let mut over = std::net::TcpStream::connect(addr).unwrap();
        let _ = over.write_all(&hello(1, 1));
        assert!(closed_within(&mut over, Duration::from_secs(1)));
        assert_eq!(get(&stats.over_conn_limit), 1);
        let t = Instant::now();
        stop.send(true).unwrap();
        rt.block_on(run).unwrap().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "stopping took {:?}",
            t.elapsed()
        );
        for s in &mut held {
            assert!(closed_within(s, Duration::from_millis(200)));
        }
        assert_eq!(get(&stats.tcp_transactions), 3);
        assert_eq!(
            get(&stats.idle_closed),
            0,
            "a stop is not a timeout: {stats:?}"
        );
    }
}

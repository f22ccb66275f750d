//! TCP: the accept loop, a thread per connection doing blocking recv() and
//! send(), and the watchdog that enforces the deadlines.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use super::config::ServeConfig;
use super::limits::{source, PeerConns, PeerSlot};
use super::stats::{inc, log_nth, ServeStats};
use crate::active::framing::{Hello, HELLO_ACK, HELLO_LEN};

/// What the accept loops share: the limits, the live connections, the counters.
#[derive(Clone)]
pub(super) struct TcpShared {
    pub(super) cfg: Arc<ServeConfig>,
    pub(super) sem: Arc<Semaphore>,
    pub(super) peers: Arc<PeerConns>,
    pub(super) table: Arc<ConnTable>,
    pub(super) stats: Arc<ServeStats>,
}

pub(super) async fn accept_loop(l: TcpListener, t: TcpShared) -> Result<()> {
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
pub(super) const CHUNK: usize = 64 * 1024;

/// The stack of a connection thread (address space; only the pages it
/// touches take memory, a few KiB).
pub(super) const CONN_STACK: usize = 256 * 1024;

/// What a TCP connection waits for. The watchdog closes a connection whose
/// phase has not changed for `idle_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
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
    pub(super) fn of(word: u64) -> Phase {
        match word & 3 {
            0 => Phase::Hello,
            1 => Phase::Idle,
            2 => Phase::Request,
            _ => Phase::Response,
        }
    }
}

/// One live TCP connection, shared by its thread and the watchdog.
pub(super) struct Conn {
    pub(super) sock: std::net::TcpStream,
    pub(super) peer: SocketAddr,
    /// `(changes << 2) | phase`: one relaxed store per phase change is all
    /// the hot path does for the deadlines.
    pub(super) phase: AtomicU64,
    /// Shut down by the watchdog, which counted and logged why.
    pub(super) cut: AtomicBool,
}

impl Conn {
    pub(super) fn enter(&self, changes: &mut u64, p: Phase) {
        *changes += 1;
        self.phase
            .store((*changes << 2) | p as u64, Ordering::Relaxed);
    }

    pub(super) fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    pub(super) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }
}

/// The live connections, for the watchdog and for stopping.
#[derive(Default)]
pub(super) struct ConnTable {
    pub(super) next: AtomicU64,
    pub(super) live: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl ConnTable {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn cut_all(&self) {
        for c in self.lock().values() {
            c.cut();
        }
    }
}

/// A connection's entry in the table and its places in the limits; released
/// (socket closed first) when its thread ends.
pub(super) struct ConnGuard {
    pub(super) table: Arc<ConnTable>,
    pub(super) id: u64,
    pub(super) _limits: (OwnedSemaphorePermit, PeerSlot),
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
pub(super) fn start_conn(
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
pub(super) async fn tcp_watchdog(
    table: Arc<ConnTable>,
    idle: Duration,
    stats: Arc<ServeStats>,
) -> Result<()> {
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
pub(super) fn report_cut(peer: SocketAddr, phase: Phase, idle: Duration, stats: &ServeStats) {
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
pub(super) fn conn_thread(c: &Conn, cfg: &ServeConfig, stats: &ServeStats) {
    let Some(h) = read_hello(c, cfg, stats) else {
        return;
    };
    if h.flags & crate::active::framing::FLAG_NODELAY != 0 {
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
pub(super) fn read_hello(c: &Conn, cfg: &ServeConfig, stats: &ServeStats) -> Option<Hello> {
    let peer = c.peer;
    let mut hello = [0u8; HELLO_LEN];
    // closed before a byte: a handshake probe (`probe tcp-connect`, tcping), counted apart
    let first = loop {
        match (&c.sock).read(&mut hello[..1]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    if matches!(first, Ok(0)) {
        if !c.was_cut() {
            inc(&stats.handshake_only);
            debug!("{peer}: closed before its hello (a handshake probe)");
        }
        return None;
    }
    if let Err(e) = first.and_then(|_| (&c.sock).read_exact(&mut hello[1..])) {
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
pub(super) enum ConnEnd {
    /// The client closed between transactions.
    Closed,
    /// The client closed in the middle of a request.
    MidRequest,
    Error(std::io::Error),
}

/// Transactions: read exactly one request, write one response, again. The
/// phase tells the watchdog which deadline runs (see [`Phase`]).
pub(super) fn serve_requests(c: &Conn, h: &Hello, stats: &ServeStats) -> ConnEnd {
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

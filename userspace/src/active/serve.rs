//! `rttscope serve`: the responder for TCP and UDP request/response probes.
//!
//! Limits: request and response sizes (`max_size`), concurrent TCP
//! connections (`max_conns`: a connection over the limit is accepted and closed
//! at once), and an idle timeout (a connection that sends nothing, or does not
//! read its responses, for that long is closed). A client that breaks the
//! framing is disconnected with a log line; everyone else keeps being served.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::framing::{FrameError, Hello, UdpHeader, HELLO_ACK, HELLO_LEN, UDP_HEADER_LEN};
use super::Cancel;

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
    /// Close a connection idle (nothing received, or a response not read) this long.
    pub idle_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: default_listen(),
            max_size: 1 << 20,
            max_conns: 256,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// 127.0.0.1:7878 and [::1]:7878.
pub fn default_listen() -> Vec<SocketAddr> {
    vec![
        SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, DEFAULT_PORT)),
    ]
}

/// What the server did; every refusal has a counter.
#[derive(Debug, Default, Serialize)]
pub struct ServeStats {
    pub connections: AtomicU64,
    pub over_conn_limit: AtomicU64,
    pub bad_hello: AtomicU64,
    pub idle_closed: AtomicU64,
    pub mid_request_disconnects: AtomicU64,
    pub tcp_transactions: AtomicU64,
    pub udp_requests: AtomicU64,
    pub udp_bad: AtomicU64,
    pub udp_send_errors: AtomicU64,
}

fn inc(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
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
    for addr in &cfg.listen {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on TCP {addr}"))?;
        let bound = l.local_addr()?;
        let u = UdpSocket::bind(bound)
            .await
            .with_context(|| format!("listening on UDP {bound}"))?;
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

    /// Serve until `cancel` fires; every connection task is aborted then.
    pub async fn run(self, mut cancel: Cancel) -> Result<()> {
        let mut set = JoinSet::new();
        let sem = Arc::new(Semaphore::new(self.cfg.max_conns));
        let cfg = Arc::new(self.cfg);
        for l in self.tcp {
            set.spawn(accept_loop(l, cfg.clone(), sem.clone(), self.stats.clone()));
        }
        for u in self.udp {
            set.spawn(udp_loop(u, cfg.clone(), self.stats.clone()));
        }
        tokio::select! {
            _ = super::cancelled(&mut cancel) => {}
            Some(r) = set.join_next() => {
                if let Ok(Err(e)) = r {
                    return Err(e);
                }
            }
        }
        set.shutdown().await;
        Ok(())
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

async fn accept_loop(
    l: TcpListener,
    cfg: Arc<ServeConfig>,
    sem: Arc<Semaphore>,
    stats: Arc<ServeStats>,
) -> Result<()> {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = l.accept() => {
                let (s, peer) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                inc(&stats.connections);
                let Ok(permit) = sem.clone().try_acquire_owned() else {
                    let n = inc(&stats.over_conn_limit);
                    warn!("{peer}: connection limit {} reached; disconnected (refused so far: {n})", cfg.max_conns);
                    drop(s);
                    continue;
                };
                let (cfg, stats) = (cfg.clone(), stats.clone());
                conns.spawn(async move {
                    handle_tcp(s, peer, &cfg, &stats).await;
                    drop(permit);
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A buffer of response bytes written repeatedly for large responses.
const CHUNK: usize = 64 * 1024;

async fn handle_tcp(mut s: TcpStream, peer: SocketAddr, cfg: &ServeConfig, stats: &ServeStats) {
    let idle = cfg.idle_timeout;
    let mut hello = [0u8; HELLO_LEN];
    match tokio::time::timeout(idle, s.read_exact(&mut hello)).await {
        Err(_) => {
            inc(&stats.idle_closed);
            warn!("{peer}: sent no hello within {idle:?}; disconnected");
            return;
        }
        Ok(Err(e)) => {
            inc(&stats.bad_hello);
            warn!("{peer}: connection ended before a complete hello ({e}); disconnected");
            return;
        }
        Ok(Ok(_)) => {}
    }
    let h = match Hello::decode(&hello, cfg.max_size) {
        Ok(h) => h,
        Err(e) => {
            inc(&stats.bad_hello);
            warn!("{peer}: framing violation: {e}; disconnected");
            return;
        }
    };
    if h.flags & super::framing::FLAG_NODELAY != 0 {
        let _ = s.set_nodelay(true);
    }
    if s.write_all(&HELLO_ACK).await.is_err() {
        return;
    }
    debug!("{peer}: request {} bytes, response {} bytes", h.req, h.resp);
    let mut inbuf = vec![0u8; (h.req as usize).min(CHUNK)];
    let out = vec![b'r'; (h.resp as usize).min(CHUNK)];
    loop {
        // Read exactly one request.
        let mut left = h.req as usize;
        while left > 0 {
            let want = left.min(inbuf.len());
            match tokio::time::timeout(idle, s.read(&mut inbuf[..want])).await {
                Err(_) => {
                    inc(&stats.idle_closed);
                    warn!("{peer}: idle for {idle:?}; disconnected");
                    return;
                }
                Ok(Ok(0)) => {
                    if left != h.req as usize {
                        inc(&stats.mid_request_disconnects);
                        debug!("{peer}: disconnected in the middle of a request");
                    }
                    return;
                }
                Ok(Ok(n)) => left -= n,
                Ok(Err(e)) => {
                    debug!("{peer}: read error {e}");
                    return;
                }
            }
        }
        // Write one response.
        let mut left = h.resp as usize;
        while left > 0 {
            let n = left.min(out.len());
            match tokio::time::timeout(idle, s.write_all(&out[..n])).await {
                Err(_) => {
                    inc(&stats.idle_closed);
                    warn!("{peer}: did not read its response for {idle:?}; disconnected");
                    return;
                }
                Ok(Err(e)) => {
                    debug!("{peer}: write error {e}");
                    return;
                }
                Ok(Ok(())) => left -= n,
            }
        }
        inc(&stats.tcp_transactions);
    }
}

async fn udp_loop(u: UdpSocket, cfg: Arc<ServeConfig>, stats: Arc<ServeStats>) -> Result<()> {
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
        let h = match UdpHeader::decode_request(&buf[..n], cfg.max_size) {
            Ok(h) => h,
            Err(e) => {
                let c = inc(&stats.udp_bad);
                log_udp_bad(peer, &e, c);
                continue;
            }
        };
        inc(&stats.udp_requests);
        let len = h.resp as usize;
        out[..UDP_HEADER_LEN].copy_from_slice(&buf[..UDP_HEADER_LEN]);
        if let Err(e) = u.send_to(&out[..len], peer).await {
            let c = inc(&stats.udp_send_errors);
            if c <= 10 {
                debug!("udp send to {peer}: {e}");
            }
        }
    }
}

/// Bad datagrams are logged for the first ten and then every thousandth, so a flood cannot flood the log.
fn log_udp_bad(peer: SocketAddr, e: &FrameError, count: u64) {
    if count <= 10 || count.is_multiple_of(1000) {
        warn!("{peer}: bad UDP request ({e}); dropped (bad datagrams so far: {count})");
    }
}

//! Shared harness for the privileged end-to-end tests.
//!
//! Every test builds its own network namespaces with unique names; the
//! guards delete them on drop (also when a test panics). Traffic is real
//! TCP/UDP/ICMP between those namespaces, created from threads that
//! `setns()` into them. Nothing here touches the host's own namespace
//! beyond creating and deleting the test's own namespaces.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub mod busy;
pub mod fixtures;
pub mod frames;
pub mod lab;
pub mod observer;
pub mod prometheus;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short name: `<prefix><pid%10000>x<n>` (interface names are limited to 15 bytes).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    format!("{prefix}{}x{n}", std::process::id() % 10000)
}

/// Run a command, fail with its output if it fails.
pub fn sh(args: &[&str]) -> Result<Output> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Skip (by returning true) when not root: privileged tests need CAP_BPF/CAP_NET_ADMIN.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("RTTSCOPE_REQUIRE_PRIVILEGED").is_some() {
        panic!("privileged tests must run as root (RTTSCOPE_REQUIRE_PRIVILEGED is set)");
    }
    eprintln!("skipping: needs root");
    false
}

/// A named network namespace, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new(prefix: &str) -> Result<Self> {
        let name = unique(prefix);
        sh(&["ip", "netns", "add", &name])?;
        let ns = NetNs { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Run a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// A `Command` that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Run `f` on a thread that has entered this namespace; sockets it
    /// creates belong to the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let path = PathBuf::from("/var/run/netns").join(&self.name);
        std::thread::spawn(move || {
            rttscope::sys::netns::enter_path(&path, &path.to_string_lossy()).expect("setns");
            f()
        })
    }

    /// Run `f` inside the namespace and wait for it.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).join().expect("thread in netns panicked")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two namespaces joined by a veth pair: `a` has 10.77.0.1/24 and fd77::1/64
/// on `a_if`, `b` has 10.77.0.2/24 and fd77::2/64 on `b_if`.
pub struct Pair {
    pub a: NetNs,
    pub b: NetNs,
    pub a_if: String,
    pub b_if: String,
}

pub const A_ADDR: &str = "10.77.0.1";
pub const B_ADDR: &str = "10.77.0.2";
pub const A_ADDR6: &str = "fd77::1";
pub const B_ADDR6: &str = "fd77::2";

impl Pair {
    pub fn new() -> Result<Self> {
        let a = NetNs::new("rtsa")?;
        let b = NetNs::new("rtsb")?;
        let a_if = unique("va");
        let b_if = unique("vb");
        sh(&[
            "ip", "link", "add", &a_if, "netns", &a.name, "type", "veth", "peer", "name", &b_if,
            "netns", &b.name,
        ])?;
        a.exec(&["ip", "addr", "add", &format!("{A_ADDR}/24"), "dev", &a_if])?;
        b.exec(&["ip", "addr", "add", &format!("{B_ADDR}/24"), "dev", &b_if])?;
        a.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{A_ADDR6}/64"),
            "dev",
            &a_if,
            "nodad",
        ])?;
        b.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{B_ADDR6}/64"),
            "dev",
            &b_if,
            "nodad",
        ])?;
        a.exec(&["ip", "link", "set", &a_if, "up"])?;
        b.exec(&["ip", "link", "set", &b_if, "up"])?;
        Ok(Pair { a, b, a_if, b_if })
    }
}

/// The rttscope binary under test: `RTTSCOPE_BIN`, else next to the test executable.
pub fn rttscope_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RTTSCOPE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("rttscope");
    assert!(
        bin.exists(),
        "{} not built: run `cargo build` first or set RTTSCOPE_BIN",
        bin.display()
    );
    bin
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning child")?;
        Ok(ChildGuard(Some(child)))
    }
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }
    /// Wait for the process to exit by itself (up to `timeout`), return its
    /// output. The pipes are drained while waiting, so a child writing more
    /// than a pipe's worth of output does not block.
    pub fn wait_output(mut self, timeout: Duration) -> Result<Output> {
        let mut child = self.0.take().unwrap();
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out_t = drain(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err_t = drain(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let (o, e) = (
                    out_t.join().unwrap_or_default(),
                    err_t.join().unwrap_or_default(),
                );
                bail!(
                    "process did not exit within {timeout:?}; stdout: {} stderr: {}",
                    String::from_utf8_lossy(&o),
                    String::from_utf8_lossy(&e)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Output {
            status,
            stdout: out_t.join().unwrap_or_default(),
            stderr: err_t.join().unwrap_or_default(),
        })
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP request/response server (1-byte request, `resp` bytes response) on
/// `addr`, running inside a namespace until the returned flag is set.
pub struct RrServer {
    pub stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl RrServer {
    pub fn start(ns: &NetNs, addr: SocketAddr, resp: usize) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let stop2 = stop.clone();
        let handle = ns.spawn(move || {
            let l = match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            l.set_nonblocking(true).unwrap();
            let _ = tx.send(Ok(()));
            let mut workers = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let stop3 = stop2.clone();
                        workers.push(std::thread::spawn(move || {
                            s.set_nonblocking(false).unwrap();
                            s.set_nodelay(true).unwrap();
                            s.set_read_timeout(Some(Duration::from_millis(200)))
                                .unwrap();
                            let mut buf = [0u8; 1];
                            let out = vec![b'r'; resp];
                            while !stop3.load(Ordering::Relaxed) {
                                match s.read(&mut buf) {
                                    Ok(0) => break,
                                    Ok(_) => {
                                        if s.write_all(&out).is_err() {
                                            break;
                                        }
                                    }
                                    Err(e)
                                        if matches!(
                                            e.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => break,
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for w in workers {
                let _ = w.join();
            }
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(RrServer {
                stop,
                handle: Some(handle),
            }),
            Ok(Err(e)) => bail!("RR server bind {addr}: {e}"),
            Err(_) => bail!("RR server did not start"),
        }
    }
}

impl Drop for RrServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A TCP RR client connection inside a namespace: it sends one byte, reads
/// `resp` bytes, sleeps `think`, repeats until dropped. It can be paused
/// (the connection stays open, idle) and resumed.
pub struct RrClient {
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
    pub local: SocketAddr,
    pub transactions: Arc<AtomicU32>,
    /// The longest transaction (write to the end of the read) the client itself timed, ns; a test
    /// may reset it (store 0) to see one stretch of time.
    pub max_rtt_ns: Arc<std::sync::atomic::AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl RrClient {
    pub fn start(ns: &NetNs, server: SocketAddr, resp: usize, think: Duration) -> Result<Self> {
        Self::start_paused(ns, server, resp, think, false)
    }

    /// With `paused`, the connection is opened but no request is sent until `resume()`.
    pub fn start_paused(
        ns: &NetNs,
        server: SocketAddr,
        resp: usize,
        think: Duration,
        paused: bool,
    ) -> Result<Self> {
        Self::start_with(ns, None, server, resp, think, paused)
    }

    /// A client whose socket is bound to `local` before it connects (a
    /// chosen source port).
    pub fn start_bound(
        ns: &NetNs,
        local: SocketAddr,
        server: SocketAddr,
        resp: usize,
        think: Duration,
    ) -> Result<Self> {
        Self::start_with(ns, Some(local), server, resp, think, false)
    }

    fn start_with(
        ns: &NetNs,
        bind: Option<SocketAddr>,
        server: SocketAddr,
        resp: usize,
        think: Duration,
        paused: bool,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let pause = Arc::new(AtomicBool::new(paused));
        let transactions = Arc::new(AtomicU32::new(0));
        let max_rtt_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop2, pause2, tr2) = (stop.clone(), pause.clone(), transactions.clone());
        let max2 = max_rtt_ns.clone();
        let handle = ns.spawn(move || {
            let connect = || -> std::io::Result<TcpStream> {
                let Some(local) = bind else {
                    return TcpStream::connect_timeout(&server, Duration::from_secs(3));
                };
                let sock = socket2::Socket::new(
                    socket2::Domain::for_address(server),
                    socket2::Type::STREAM,
                    None,
                )?;
                sock.set_reuse_address(true)?;
                sock.bind(&local.into())?;
                sock.connect_timeout(&server.into(), Duration::from_secs(3))?;
                Ok(sock.into())
            };
            let mut s = match connect() {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = tx.send(Ok(s.local_addr().unwrap()));
            let mut buf = vec![0u8; resp];
            while !stop2.load(Ordering::Relaxed) {
                if pause2.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let t0 = Instant::now();
                if s.write_all(b"q").is_err() || s.read_exact(&mut buf).is_err() {
                    break;
                }
                max2.fetch_max(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                tr2.fetch_add(1, Ordering::Relaxed);
                if !think.is_zero() {
                    std::thread::sleep(think);
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(local)) => Ok(RrClient {
                stop,
                pause,
                local,
                transactions,
                max_rtt_ns,
                handle: Some(handle),
            }),
            Ok(Err(e)) => bail!("RR client connect {server}: {e}"),
            Err(_) => bail!("RR client did not connect"),
        }
    }

    /// Start (again) sending requests.
    pub fn resume(&self) {
        self.pause.store(false, Ordering::Relaxed);
    }

    /// Stop sending requests; the connection stays open.
    pub fn pause(&self) {
        self.pause.store(true, Ordering::Relaxed);
    }
}

impl Drop for RrClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// `ss -tin` inside a namespace: the smoothed RTT (ms) of the connection
/// whose local address ends with `:lport`.
pub fn ss_rtt_ms(ns: &NetNs, lport: u16) -> Result<Option<f64>> {
    let out = ns.exec(&["ss", "-tin", "state", "established"])?;
    Ok(parse_ss_rtt(&String::from_utf8_lossy(&out.stdout), lport))
}

/// Parse `ss -ti` output: the `rtt:<srtt>/<rttvar>` of the socket with local port `lport`.
pub fn parse_ss_rtt(text: &str, lport: u16) -> Option<f64> {
    parse_ss_field(text, lport, "rtt")
}

/// `ss -tin` inside a namespace: TCP's minimum RTT (ms, `minrtt:`) of the
/// connection whose local address ends with `:lport`.
pub fn ss_minrtt_ms(ns: &NetNs, lport: u16) -> Result<Option<f64>> {
    let out = ns.exec(&["ss", "-tin", "state", "established"])?;
    Ok(parse_ss_field(
        &String::from_utf8_lossy(&out.stdout),
        lport,
        "minrtt",
    ))
}

/// A numeric `name:value[/...]` field of `ss -tin` for the socket on `lport`.
pub fn parse_ss_field(text: &str, lport: u16, name: &str) -> Option<f64> {
    let prefix = format!("{name}:");
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_sock = fields.iter().any(|f| {
            f.ends_with(&format!(":{lport}"))
                && fields.iter().position(|x| x == f) == Some(fields.len().saturating_sub(2))
        });
        if !is_sock {
            continue;
        }
        if let Some(info) = lines.peek() {
            for tok in info.split_whitespace() {
                if let Some(v) = tok.strip_prefix(&prefix) {
                    return v.split('/').next().and_then(|x| x.parse().ok());
                }
            }
        }
    }
    None
}

/// Names of tc filters, bpf links and programs of ours that remain anywhere.
pub fn leftover_bpf() -> Result<Vec<String>> {
    let mut left = Vec::new();
    let progs = sh(&["bpftool", "-j", "prog", "show"])?;
    let v: serde_json::Value = serde_json::from_slice(&progs.stdout)?;
    for p in v.as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("");
        if name.starts_with("rtt_tcp_") || name.starts_with("rtt_sampler_") {
            left.push(format!("prog {} id {}", name, p["id"]));
        }
    }
    Ok(left)
}

/// Run `rttscope observe --format json` with `args` to completion and return
/// its JSON lines (start, intervals, end).
pub fn observe_json(args: &[&str], timeout: Duration) -> Result<Vec<serde_json::Value>> {
    let mut cmd = Command::new(rttscope_bin());
    cmd.arg("observe").arg("--format").arg("json").args(args);
    let out = ChildGuard::spawn(&mut cmd)?.wait_output(timeout)?;
    if !out.status.success() {
        bail!(
            "rttscope observe {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_lines(&out.stdout)
}

/// [`observe_json`] in a thread, returned once the observer has attached: its first line, the
/// start record, is written after the programs are attached. No fixed wait for start-up, which
/// takes seconds on a loaded machine (a connection closed before the attach is never seen). An
/// observer that exits without a start record gives its error through the handle.
pub fn observe_json_attached(
    args: Vec<String>,
    timeout: Duration,
) -> std::thread::JoinHandle<Result<Vec<serde_json::Value>>> {
    let mut cmd = Command::new(rttscope_bin());
    cmd.arg("observe").arg("--format").arg("json").args(&args);
    observe_json_attached_cmd(cmd, args, timeout)
}

/// [`observe_json_attached`] for a command made by the caller (an observer in a chroot, say):
/// `cmd` runs `rttscope observe --format json`; `args` name it in errors.
pub fn observe_json_attached_cmd(
    mut cmd: Command,
    args: Vec<String>,
    timeout: Duration,
) -> std::thread::JoinHandle<Result<Vec<serde_json::Value>>> {
    use std::io::BufRead;
    let mut child = match ChildGuard::spawn(&mut cmd) {
        Ok(c) => c,
        Err(e) => return std::thread::spawn(move || Err(e)),
    };
    let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut r = std::io::BufReader::new(stdout);
    let mut first = String::new();
    let _ = r.read_line(&mut first);
    std::thread::spawn(move || {
        let rest = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            b
        });
        let out = child.wait_output(timeout)?;
        if !out.status.success() {
            bail!(
                "rttscope observe {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut all = first.into_bytes();
        all.extend(rest.join().unwrap_or_default());
        parse_lines(&all)
    })
}

pub fn parse_lines(stdout: &[u8]) -> Result<Vec<serde_json::Value>> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad JSON line: {l}")))
        .collect()
}

/// The counters of `view` in the observer's last interval line.
pub fn last_interval_counters<'a>(
    lines: &'a [serde_json::Value],
    view: &str,
) -> &'a serde_json::Value {
    let last = lines
        .iter()
        .rev()
        .find(|l| l["type"] == "interval")
        .unwrap_or_else(|| panic!("no interval line: {lines:#?}"));
    &last["counters"][view]
}

/// The `end` line's flow entry for (netns name, local address).
pub fn end_flow<'a>(
    lines: &'a [serde_json::Value],
    netns: &str,
    local: &str,
) -> Option<&'a serde_json::Value> {
    let end = lines.iter().find(|l| l["type"] == "end")?;
    end["flows"]
        .as_array()?
        .iter()
        .find(|f| f["netns_name"] == netns && f["local"] == local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ss() {
        let text = "State Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n\
ESTAB 0 0 10.77.0.1:45678 10.77.0.2:5001\n\
\t cubic wscale:7,7 rto:204 rtt:0.071/0.035 ato:40 mss:1448\n\
ESTAB 0 0 10.77.0.1:45680 10.77.0.2:5001\n\
\t cubic wscale:7,7 rto:220 rtt:20.5/3 ato:40 mss:1448\n";
        assert_eq!(parse_ss_rtt(text, 45678), Some(0.071));
        assert_eq!(parse_ss_rtt(text, 45680), Some(20.5));
        assert_eq!(parse_ss_rtt(text, 5001), None);
    }
}

/// What a scrape storm saw: answers, failures and latencies.
#[derive(Debug, Default)]
pub struct Storm {
    pub ok: u64,
    pub failed: u64,
    pub slowest: Duration,
    /// Latencies of every answered scrape, sorted.
    pub latencies: Vec<Duration>,
}

impl Storm {
    pub fn pct(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[i - 1]
    }
}

/// `scrapers` threads each scraping http://127.0.0.1:port/metrics in a loop
/// (one request per connection, as Prometheus does) for `dur`; bounded in
/// count and time, loopback only.
pub fn scrape_storm(port: u16, scrapers: usize, dur: Duration) -> Storm {
    scrape_storm_paced(port, scrapers, dur, None)
}

/// [`scrape_storm`] with each scraper paced: with `Some(every)` a scraper
/// starts a scrape every `every` (its first at a phase spread over the
/// interval, as many Prometheus servers with the same scrape interval
/// would), or at once when the last one took longer; with `None` back to
/// back (a closed loop: the latency is then mostly the queue the scrapers
/// themselves make, scrapers / throughput).
pub fn scrape_storm_paced(
    port: u16,
    scrapers: usize,
    dur: Duration,
    every: Option<Duration>,
) -> Storm {
    let start = Instant::now();
    let end = start + dur;
    let handles: Vec<_> = (0..scrapers)
        .map(|i| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut lat = Vec::new();
                    let mut failed = 0u64;
                    let mut next = match every {
                        Some(e) => start + e.mul_f64(i as f64 / scrapers.max(1) as f64),
                        None => start,
                    };
                    while Instant::now() < end {
                        if let Some(e) = every {
                            std::thread::sleep(next.saturating_duration_since(Instant::now()));
                            next += e;
                            if Instant::now() >= end {
                                break;
                            }
                        }
                        let t0 = Instant::now();
                        match scrape_once(port) {
                            Ok(true) => lat.push(t0.elapsed()),
                            _ => failed += 1,
                        }
                    }
                    (lat, failed)
                })
                .expect("scraper thread")
        })
        .collect();
    let mut s = Storm::default();
    for h in handles {
        let (lat, failed) = h.join().unwrap_or_default();
        s.ok += lat.len() as u64;
        s.failed += failed;
        s.latencies.extend(lat);
    }
    s.latencies.sort();
    s.slowest = s.latencies.last().copied().unwrap_or_default();
    s
}

/// One scrape: Ok(true) when answered 200 with a whole body.
fn scrape_once(port: u16) -> std::io::Result<bool> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n")?;
    let mut out = Vec::with_capacity(64 * 1024);
    s.read_to_end(&mut out)?;
    Ok(out.starts_with(b"HTTP/1.1 200 ") && out.ends_with(b"# EOF\n"))
}

/// VmHWM and VmRSS of a process (kB).
pub fn rss_kb(pid: u32) -> (u64, u64) {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        st.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("VmRSS:"))
}

/// A network namespace held open by a test that checks for leftovers: an open namespace file
/// keeps the namespace, and so its nsfs (device, inode), alive; a namespace that anything else on
/// the host creates meanwhile cannot be given the same identity and be taken for a leftover (the
/// kernel recycles the inode numbers of namespaces that are gone). Drop it before checking that
/// what lived in the namespace (interfaces, their filters) is gone.
pub struct HeldNs {
    _file: std::fs::File,
    /// (st_dev, st_ino) of the namespace.
    pub id: (u64, u64),
}

impl HeldNs {
    /// Hold the namespace at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<HeldNs> {
        use std::os::unix::fs::MetadataExt;
        let path = path.as_ref();
        let file = std::fs::File::open(path).with_context(|| format!("opening {path:?}"))?;
        let m = file.metadata()?;
        Ok(HeldNs {
            id: (m.dev(), m.ino()),
            _file: file,
        })
    }
}

/// Threads anywhere on the host whose network namespace is one of `held`.
pub fn threads_in(held: &[HeldNs]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let ids: Vec<(u64, u64)> = held.iter().map(|h| h.id).collect();
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(m) = std::fs::metadata(t.path().join("ns/net")) {
                if ids.contains(&(m.dev(), m.ino())) {
                    found.push(format!(
                        "pid {pid} task {}",
                        t.file_name().to_string_lossy()
                    ));
                }
            }
        }
    }
    found
}

/// Make `cmd` run under a seccomp filter that refuses bpf(2) with EPERM, as a container
/// runtime's default profile does to a container: the child sets no_new_privs and installs the
/// filter (SECCOMP_SET_MODE_FILTER) just before it executes the program. Every other system
/// call passes; the capabilities are untouched.
pub fn refuse_bpf_by_seccomp(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; it allocates nothing and makes
    // two prctl(2) calls, both async-signal-safe.
    unsafe { cmd.pre_exec(install_bpf_refusal) }
}

/// The classic-BPF seccomp program: on x86_64, bpf(2) returns EPERM, all else is allowed.
fn install_bpf_refusal() -> std::io::Result<()> {
    // linux/filter.h, linux/seccomp.h, linux/audit.h
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let filter = [
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, RET_ALLOW),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        op(JEQ_K, 0, 1, libc::SYS_bpf as u32),
        op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with the documented arguments; `prog` and `filter` outlive the calls.
    let r = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            -1
        } else {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

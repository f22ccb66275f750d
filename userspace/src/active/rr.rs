//! The request/response probes: TCP_RR, UDP_RR and ICMP echo transactions,
//! paced, timed with CLOCK_MONOTONIC right around the send and receive system
//! calls (TCP, UDP), or from the kernel's receive timestamp as ping does (ICMP,
//! see `icmp.rs`). This file holds [`run_probe`]: it checks the config
//! (`config.rs`), picks the transport (`transport/`), runs the loop (`engine/`)
//! and builds the result (`result.rs`).
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::cancel::Cancel;
use super::engine::{self, Pacer, Plan, Recorder, Signal};
use super::framing::{UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN, UDP_MAX};
use super::icmp::{IcmpSocket, MIN_PAYLOAD};
use super::transport::connect::Connect;
use super::transport::dgram::{Dgram, Icmp, UdpPeer};
use super::transport::tcp::TcpConn;
use super::transport::{tcp, tcp_blocking};
use crate::analysis::stats::{NetperfPercentiles, Summary};
// The config and result types lived here before; their paths under `active::rr` stay.
pub use super::config::{IoMode, Kind, LineHook, ProbeConfig, ProbeLine, ReplyHook, Stop};
pub use super::result::{Counts, ProbeIdent, ProbeResult, Settings};

async fn resolve(cfg: &ProbeConfig) -> Result<SocketAddr> {
    if let Ok(ip) = cfg.target.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, cfg.port));
    }
    let host = cfg.target.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, cfg.port));
    }
    tokio::net::lookup_host((host, cfg.port))
        .await
        .with_context(|| format!("resolving {}", cfg.target))?
        .next()
        .with_context(|| format!("{} has no address", cfg.target))
}

/// What throughput divides by: the run length `-l` when the run reached it
/// (netperf: transactions / test length, so a 10 ms-paced `-l 4` reads
/// 100.00/s, not 400 / 3.99 s), otherwise the time from the first send to the
/// end of the last transaction (`-n`, a count reached before `-w`, a cancel).
fn run_length(stop: Stop, sent: u64, cancelled: bool, elapsed_s: f64) -> f64 {
    match stop {
        Stop::Duration(d) if !cancelled => d.as_secs_f64(),
        Stop::CountOrDuration(n, d) if !cancelled && sent < n => d.as_secs_f64(),
        _ => elapsed_s,
    }
}

fn validate(cfg: &ProbeConfig) -> Result<()> {
    if cfg.burst == 0 {
        bail!("burst must be at least 1");
    }
    if cfg.kind != Kind::TcpConnect && (cfg.req_size == 0 || cfg.resp_size == 0) {
        bail!("request and response sizes must be at least 1 byte");
    }
    if cfg.kind == Kind::UdpRr && (cfg.req_size > UDP_MAX || cfg.resp_size > UDP_MAX) {
        bail!("UDP request and response sizes are limited to {UDP_MAX} bytes");
    }
    if cfg.kind == Kind::Icmp && cfg.req_size > 65000 {
        bail!("ICMP payload is limited to 65000 bytes");
    }
    if cfg.timeout.is_zero() {
        bail!("the reply timeout must be above zero");
    }
    Ok(())
}

/// Bytes actually sent per request / expected per response.
fn wire_sizes(cfg: &ProbeConfig) -> (u32, u32) {
    match cfg.kind {
        Kind::TcpRr => (cfg.req_size, cfg.resp_size),
        Kind::UdpRr => {
            let req = cfg.req_size.max(UDP_HEADER_LEN as u32);
            let resp = cfg.resp_size.max(UDP_HEADER_LEN as u32);
            // A response larger than its request needs a cookie, carried in
            // bytes 16..24 of every request (see framing.rs).
            if resp > req {
                (req.max(UDP_COOKIE_REQ_MIN as u32), resp)
            } else {
                (req, resp)
            }
        }
        Kind::Icmp => {
            let p = cfg.req_size.max(MIN_PAYLOAD as u32);
            (p, p)
        }
        // A handshake carries no data.
        Kind::TcpConnect => (0, 0),
    }
}

fn settings(cfg: &ProbeConfig, addr: SocketAddr, (req_size, resp_size): (u32, u32)) -> Settings {
    let blocking = cfg.kind == Kind::TcpRr && cfg.io == IoMode::BlockingThread;
    Settings {
        kind: cfg.kind,
        target: cfg.target.clone(),
        address: addr.ip(),
        port: if cfg.kind == Kind::Icmp { 0 } else { cfg.port },
        interval_ns: cfg.interval.as_nanos() as u64,
        burst: cfg.burst,
        req_size,
        resp_size,
        duration_s: match cfg.stop {
            Stop::Duration(d) | Stop::CountOrDuration(_, d) => Some(d.as_secs_f64()),
            Stop::Count(_) => None,
        },
        count: match cfg.stop {
            Stop::Count(n) | Stop::CountOrDuration(n, _) => Some(n),
            Stop::Duration(_) => None,
        },
        spin: cfg.spin,
        busy_poll: cfg.busy_poll,
        nodelay: cfg.nodelay,
        timeout_ns: cfg.timeout.as_nanos() as u64,
        pacing: match (cfg.interval.is_zero(), cfg.spin, blocking) {
            (true, _, _) => "none (back to back)",
            (false, true, _) => "spin",
            (false, false, true) => "sleep (clock_nanosleep)",
            (false, false, false) => "sleep (timerfd)",
        }
        .into(),
        clock: if cfg.kind == Kind::TcpConnect {
            super::transport::connect::CLOCK
        } else {
            "CLOCK_MONOTONIC"
        }
        .into(),
        icmp_socket: None,
        io: if cfg.kind == Kind::TcpRr {
            cfg.io
        } else {
            IoMode::TokioReactor
        },
        ttl: cfg.ttl,
    }
}

/// Run one probe to completion (or until `cancel`), in-process.
pub async fn run_probe(cfg: &ProbeConfig, mut cancel: Cancel) -> Result<ProbeResult> {
    validate(cfg)?;
    // Precise wake-ups from the timerfd: 1 ns timer slack for this thread.
    // SAFETY: prctl on the calling thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let addr = resolve(cfg).await?;
    let sizes = wire_sizes(cfg);
    let mut settings = settings(cfg, addr, sizes);
    let mut rec = Recorder::new(cfg.max_samples, cfg.on_reply.clone());
    rec.on_line = cfg.on_line.clone();
    let start_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut ident = ProbeIdent::default();
    let (rec, end_ns) = match cfg.kind {
        Kind::TcpRr => run_tcp(cfg, addr, sizes, rec, &mut ident, &mut cancel).await?,
        Kind::TcpConnect => run_connect(cfg, addr, rec, &mut cancel).await?,
        Kind::UdpRr | Kind::Icmp => {
            run_dgram(
                cfg,
                addr,
                sizes,
                rec,
                &mut ident,
                &mut settings,
                &mut cancel,
            )
            .await?
        }
    };
    ident.start_mono_ns = rec.start;
    ident.end_mono_ns = end_ns;
    let cancelled = *cancel.borrow();
    Ok(result(
        cfg,
        settings,
        start_unix_s,
        rec,
        end_ns,
        cancelled,
        ident,
    ))
}

/// The pacer of a run in the reactor: `cfg`'s interval and burst, stopped by `cancel`.
fn pacer(cfg: &ProbeConfig, cancel: &Cancel) -> Result<Pacer> {
    Pacer::new(
        cfg.interval,
        cfg.burst,
        cfg.spin,
        Signal::Cancel(cancel.clone()),
    )
}

/// How a run proceeds.
fn plan(cfg: &ProbeConfig) -> Plan {
    Plan {
        stop: cfg.stop,
        yield_often: cfg.spin || cfg.busy_poll,
        grace: Duration::from_millis(10).min(cfg.timeout),
    }
}

async fn run_tcp(
    cfg: &ProbeConfig,
    addr: SocketAddr,
    (req, resp): (u32, u32),
    mut rec: Recorder,
    ident: &mut ProbeIdent,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    let mut conn = TcpConn::connect(addr, req, resp, cfg.nodelay, cfg.timeout).await?;
    ident.local = conn.s.local_addr().ok();
    if cfg.io == IoMode::BlockingThread {
        return tcp_blocking::run(conn, addr, cfg, plan(cfg), rec, cancel).await;
    }
    let mut pacer = pacer(cfg, cancel)?;
    let end = tcp::run(
        &mut conn,
        addr,
        cfg,
        &plan(cfg),
        &mut pacer,
        &mut rec,
        cancel,
    )
    .await?;
    Ok((rec, end))
}

/// TCP handshakes one after the other, each closed at once (`probe tcp-connect`); a refused or
/// timed-out handshake is lost and the run goes on, as tcping's.
async fn run_connect(
    cfg: &ProbeConfig,
    addr: SocketAddr,
    mut rec: Recorder,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    let mut pacer = pacer(cfg, cancel)?;
    let mut t = Connect::new(addr, cfg.timeout, cancel.clone());
    let end = engine::run(&mut t, &mut pacer, &mut rec, &plan(cfg)).await?;
    t.close();
    rec.counts.refused = t.refused;
    rec.counts.syn_retransmits = t.syn_retransmits;
    rec.counts.rx_timestamp_fallbacks = t.timed_in_userspace;
    Ok((rec, end))
}

/// UDP and ICMP: transactions one after the other; each waits for its reply
/// up to the timeout. Replies to older requests that arrive meanwhile are
/// counted as late (or duplicate) and reordered.
async fn run_dgram(
    cfg: &ProbeConfig,
    addr: SocketAddr,
    (req, resp): (u32, u32),
    mut rec: Recorder,
    ident: &mut ProbeIdent,
    settings: &mut Settings,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    let mut pacer = pacer(cfg, cancel)?;
    let (busy, to) = (cfg.busy_poll, cfg.timeout);
    if cfg.kind == Kind::UdpRr {
        let peer = UdpPeer::connect(addr, req, resp, cfg.timeout, cancel).await?;
        ident.local = peer.local_addr();
        let mut t = Dgram::new(peer, req, to, busy, cancel.clone());
        let end = engine::run(&mut t, &mut pacer, &mut rec, &plan(cfg)).await?;
        return Ok((rec, end));
    }
    let s = IcmpSocket::open(addr.ip(), cfg.ttl).context("opening an ICMP socket")?;
    settings.icmp_socket = Some(s.kind.name().to_string());
    let mut t = Dgram::new(Icmp::new(s), req, to, busy, cancel.clone());
    let end = engine::run(&mut t, &mut pacer, &mut rec, &plan(cfg)).await?;
    let s = &t.sock.sock;
    // After the first send: a datagram socket is bound to its identifier then.
    ident.icmp_id = s.identifier();
    let stamped = rec.counts.received - rec.counts.rx_timestamp_fallbacks;
    settings.clock = if s.rx_timestamps && stamped > 0 {
        super::icmp::CLOCK_KERNEL_RX
    } else {
        super::icmp::CLOCK_USERSPACE
    }
    .into();
    Ok((rec, end))
}

fn result(
    cfg: &ProbeConfig,
    settings: Settings,
    start_unix_s: f64,
    rec: Recorder,
    end_ns: u64,
    cancelled: bool,
    ident: ProbeIdent,
) -> ProbeResult {
    let elapsed_s = end_ns.saturating_sub(rec.start) as f64 / 1e9;
    let run_s = run_length(cfg.stop, rec.counts.sent, cancelled, elapsed_s);
    let (summary, source) = if rec.counts.samples_dropped == 0 {
        let ns: Vec<u64> = rec.samples.iter().map(|s| s.1).collect();
        (Summary::from_ns(&ns), "exact")
    } else {
        (rec.hdr.summary(), "hdr")
    };
    ProbeResult {
        settings,
        start_unix_s,
        elapsed_s,
        run_s,
        summary,
        summary_source: source.into(),
        netperf: NetperfPercentiles::of(&rec.np),
        throughput: if run_s > 0.0 {
            rec.counts.received as f64 / run_s
        } else {
            0.0
        },
        throughput_units: "Trans/s".into(),
        counts: rec.counts,
        samples: rec.samples,
        last_error: rec.last_error,
        ident,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::active::cancel::cancel_pair;
    use crate::active::framing::UdpHeader;
    use crate::active::serve;
    use crate::active::transport::tcp::{in_flight_verdict, InFlight};
    use crate::sys::clock::mono_ns;
    use tokio::net::UdpSocket;

    /// In-process, no privileges: serve on 127.0.0.1 (port 0) and probe it.
    #[test]
    fn in_process_probe_against_in_process_serve() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cfg = serve::ServeConfig {
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                ..Default::default()
            };
            let server = serve::bind(cfg).await.unwrap();
            let port = server.local_addrs()[0].port();
            let (stop_srv, srv_cancel) = cancel_pair();
            let srv = tokio::spawn(server.run(srv_cancel));
            for (kind, io) in [
                (Kind::TcpRr, IoMode::BlockingThread),
                (Kind::TcpRr, IoMode::TokioReactor),
                (Kind::UdpRr, IoMode::TokioReactor),
            ] {
                let mut c = ProbeConfig::new(kind, "127.0.0.1");
                c.port = port;
                c.io = io;
                c.stop = Stop::Count(200);
                c.req_size = 10;
                c.resp_size = 300;
                let (_keep, cancel) = cancel_pair();
                let r = run_probe(&c, cancel).await.unwrap();
                assert_eq!(r.counts.received, 200, "{kind:?} {io:?}: {:?}", r.counts);
                assert_eq!(r.samples.len(), 200);
                let s = r.summary;
                assert!(s.min <= s.p50 && s.p50 <= s.p99 && s.p99 <= s.max, "{s:?}");
                assert_eq!(r.settings.count, Some(200));
                assert_eq!(r.settings.resp_size, 300);
                // Samples are in send order, offsets increasing.
                assert!(r.samples.windows(2).all(|w| w[0].0 < w[1].0));
            }
            // Cancelling a long run returns promptly with what was measured.
            for io in [IoMode::BlockingThread, IoMode::TokioReactor] {
                let mut c = ProbeConfig::new(Kind::TcpRr, "127.0.0.1");
                c.port = port;
                c.io = io;
                c.stop = Stop::Duration(Duration::from_secs(60));
                c.interval = Duration::from_millis(5);
                let (tx, cancel) = cancel_pair();
                let t = std::time::Instant::now();
                let h = tokio::spawn(async move { run_probe(&c, cancel).await });
                tokio::time::sleep(Duration::from_millis(300)).await;
                tx.send(true).unwrap();
                let r = h.await.unwrap().unwrap();
                assert!(
                    t.elapsed() < Duration::from_secs(3),
                    "{io:?}: cancel took {:?}",
                    t.elapsed()
                );
                assert!(r.counts.received > 10, "{io:?}: {:?}", r.counts);
                assert_eq!(r.counts.sent, r.counts.received);
            }
            stop_srv.send(true).unwrap();
            srv.await.unwrap().unwrap();
        });
    }

    /// UDP accounting against a misbehaving responder whose behaviour per
    /// sequence number the test decides: every 5th request answered twice,
    /// every 7th answered 100 ms late (after the 30 ms timeout), every 11th
    /// not at all; the counts must come out exactly.
    #[test]
    fn udp_counts_late_duplicate_lost_exactly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let srv = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let port = srv.local_addr().unwrap().port();
            let srv = std::sync::Arc::new(srv);
            let s2 = srv.clone();
            let responder = tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let (n, peer) = s2.recv_from(&mut buf).await.unwrap();
                    let h = UdpHeader::decode(&buf[..n]).unwrap();
                    let reply = buf[..h.resp as usize].to_vec();
                    let seq = h.seq;
                    if seq.is_multiple_of(11) {
                        continue;
                    }
                    if seq.is_multiple_of(7) {
                        let s3 = s2.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let _ = s3.send_to(&reply, peer).await;
                        });
                        continue;
                    }
                    s2.send_to(&reply, peer).await.unwrap();
                    if seq.is_multiple_of(5) {
                        s2.send_to(&reply, peer).await.unwrap();
                    }
                }
            });
            let mut c = ProbeConfig::new(Kind::UdpRr, "127.0.0.1");
            c.port = port;
            c.stop = Stop::Count(40);
            c.timeout = Duration::from_millis(30);
            c.interval = Duration::from_millis(40);
            let (_keep, cancel) = cancel_pair();
            let r = run_probe(&c, cancel).await.unwrap();
            responder.abort();
            let seqs = 1..=40u64;
            let dropped = seqs.clone().filter(|s| s % 11 == 0).count() as u64;
            let delayed = seqs.clone().filter(|s| s % 7 == 0 && s % 11 != 0).count() as u64;
            let dups = seqs
                .clone()
                .filter(|s| s % 5 == 0 && s % 7 != 0 && s % 11 != 0)
                .count() as u64;
            let k = &r.counts;
            assert_eq!(k.sent, 40, "{k:?}");
            assert_eq!(k.lost, dropped + delayed, "{k:?}");
            assert_eq!(k.received, 40 - dropped - delayed, "{k:?}");
            // A late reply (100 ms) arrives two or three transactions later
            // (40 ms interval): late, and older than the newest reply. The
            // last delayed one (seq 35) arrives while seq 37 or 38 waits.
            assert_eq!(k.late, delayed, "{k:?}");
            assert_eq!(k.reordered, delayed, "{k:?}");
            assert_eq!(k.duplicates, dups, "{k:?}");
            assert_eq!(r.samples.len() as u64, k.received);
        });
    }

    /// `tcp-connect` over loopback, no privileges: handshakes to a listener complete; to a
    /// closed port each is refused; to a listener whose accept queue is full (backlog 0, one
    /// connection queued and never accepted) the kernel drops the SYN, sends it again after its
    /// 1 s timer, and the handshake times out with its retransmission counted.
    #[test]
    fn tcp_connect_completes_is_refused_and_times_out() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let connect = |port: u16, n: u64, timeout_ms: u64| {
            let mut c = ProbeConfig::new(Kind::TcpConnect, "127.0.0.1");
            c.port = port;
            c.stop = Stop::Count(n);
            c.interval = Duration::from_millis(10);
            c.timeout = Duration::from_millis(timeout_ms);
            let (_keep, cancel) = cancel_pair();
            rt.block_on(run_probe(&c, cancel)).unwrap()
        };
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let r = connect(open.local_addr().unwrap().port(), 5, 1000);
        assert_eq!((r.counts.sent, r.counts.received), (5, 5), "{:?}", r.counts);
        assert_eq!((r.settings.req_size, r.settings.resp_size), (0, 0));
        assert!(
            r.summary.max < 100_000.0,
            "loopback handshake {:?}",
            r.summary
        );
        // A port nothing listens on: a port just freed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let r = connect(port, 3, 1000);
        let k = &r.counts;
        assert_eq!((k.sent, k.received, k.refused), (3, 0, 3), "{k:?}");
        assert_eq!((k.lost, k.errors), (3, 3), "{k:?}");
        let full =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        full.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        full.listen(0).unwrap();
        let port = full.local_addr().unwrap().as_socket().unwrap().port();
        // The first handshake fills the queue (backlog 0 holds one); the second waits 1.6 s.
        let r = connect(port, 2, 1600);
        let k = &r.counts;
        assert_eq!(
            (k.sent, k.received, k.lost, k.errors),
            (2, 1, 1, 0),
            "{k:?}"
        );
        assert!(k.syn_retransmits >= 1, "{k:?}");
    }

    /// Transactions/s divide by `-l` (netperf), not by first send -> last reply.
    #[test]
    fn in_flight_at_the_end_of_the_run_ends_with_it() {
        let now = mono_ns();
        let hour = 3_600_000_000_000u64;
        assert_eq!(in_flight_verdict(0, now - 1, 1), InFlight::Waiting);
        // -l over, a transaction in flight: it ends with the run, even before its -W.
        assert_eq!(in_flight_verdict(now, now - 1, hour), InFlight::Ended);
        // Within -l: -W decides.
        assert_eq!(
            in_flight_verdict(now - 2_000, now + hour, 1_000),
            InFlight::TimedOut
        );
        assert_eq!(in_flight_verdict(now, now + hour, hour), InFlight::Waiting);
    }

    #[test]
    fn throughput_divides_by_the_run_length() {
        let l = Duration::from_secs(2);
        // A run that reached its end: -l, whatever the span of its transactions.
        assert_eq!(run_length(Stop::Duration(l), 200, false, 1.9901), 2.0);
        // Cancelled: only as long as it ran.
        assert_eq!(run_length(Stop::Duration(l), 50, true, 0.5), 0.5);
        // A count: the time it took.
        assert_eq!(run_length(Stop::Count(300), 300, false, 0.02), 0.02);
        // ping -c with -w: the deadline if it came first, else the time taken.
        assert_eq!(run_length(Stop::CountOrDuration(5, l), 3, false, 1.99), 2.0);
        assert_eq!(
            run_length(Stop::CountOrDuration(5, l), 5, false, 0.04),
            0.04
        );
    }
}

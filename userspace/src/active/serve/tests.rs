//! Real sockets on loopback (127.0.0.1, 127.0.0.2, ::1) only, no privileges.
use super::*;
use crate::active;
use crate::active::cancel::cancel_pair;
use crate::active::framing::{
    carried_cookie, cookie_request, decode_cookie, write_cookie, Hello, UdpHeader, HELLO_ACK,
    HELLO_LEN, UDP_COOKIE_LEN, UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN, UDP_MAX,
};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
    let mut c = active::ProbeConfig::new(active::Kind::TcpRr, "127.0.0.1");
    c.port = port;
    c.stop = active::Stop::Count(1);
    let (_tx, rx) = cancel_pair();
    let e = active::run_probe(&c, rx).await.unwrap_err();
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
            assert!(
                decode_cookie(&r).is_some(),
                "not a cookie datagram: {r:02x?}"
            );
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
        let mut c = active::ProbeConfig::new(active::Kind::UdpRr, "127.0.0.1");
        c.port = addrs[0].port();
        c.stop = active::Stop::Count(100);
        c.req_size = 1;
        c.resp_size = 60000;
        let (_keep, cancel) = cancel_pair();
        let r = active::run_probe(&c, cancel).await.unwrap();
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
        let mut c = active::ProbeConfig::new(active::Kind::UdpRr, "127.0.0.1");
        c.port = addrs[0].port();
        c.stop = active::Stop::Count(20_000);
        let (_keep, cancel) = cancel_pair();
        let r = active::run_probe(&c, cancel).await.unwrap();
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
        let mut c = active::ProbeConfig::new(active::Kind::TcpRr, host);
        c.port = port;
        c.stop = active::Stop::Count(50);
        let (_keep, cancel) = cancel_pair();
        rt.block_on(active::run_probe(&c, cancel))
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
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
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

/// A connection closed before a byte is a handshake probe (`probe tcp-connect`, tcping): counted
/// as `handshake_only`, not a bad hello; a hello cut short still is one; a whole one is served.
#[test]
fn a_handshake_probe_is_not_a_bad_hello() {
    rt().block_on(async {
        let (addrs, stats, _stop) = start(v4_cfg()).await;
        let addr = addrs[0];
        tokio::task::spawn_blocking(move || {
            drop(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap());
            let mut cut =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
            cut.write_all(&hello(1, 1)[..5]).unwrap();
            drop(cut);
            drop(connected(addr, 1, 1));
        })
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while (get(&stats.handshake_only), get(&stats.bad_hello)) != (1, 1)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            (
                get(&stats.handshake_only),
                get(&stats.bad_hello),
                get(&stats.connections)
            ),
            (1, 1, 3)
        );
    });
}

//! Load for the benchmarks: TCP request/response over one address.
//!
//!   rr_load server ADDR
//!   rr_load client ADDR SECONDS [CONNS [HOLD_SECONDS]]
//!
//! The client opens CONNS connections (default 1). Each does one 1-byte
//! request / 1-byte response exchange; then connection 0 runs back-to-back
//! transactions for SECONDS while the others stay open and idle (so an
//! observer has CONNS flows to track). Prints one JSON line with the
//! transactions per second of connection 0, then keeps every connection
//! open for HOLD_SECONDS (default 0).
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn serve(addr: &str) {
    let l = TcpListener::bind(addr).expect("bind");
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            s.set_nodelay(true).ok();
            let mut b = [0u8; 1];
            while let Ok(1) = s.read(&mut b) {
                if s.write_all(&b).is_err() {
                    break;
                }
            }
        });
    }
}

fn client(addr: &str, secs: f64, conns: usize, hold: f64) {
    let mut all = Vec::with_capacity(conns);
    for _ in 0..conns.max(1) {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).ok();
        let mut b = [1u8; 1];
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
        all.push(s);
    }
    let s = &mut all[0];
    let mut b = [1u8; 1];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
        n += 1;
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{{\"transactions\":{n},\"seconds\":{el:.3},\"tps\":{:.1},\"connections\":{}}}",
        n as f64 / el,
        all.len()
    );
    std::thread::sleep(Duration::from_secs_f64(hold));
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("server") => serve(&a[2]),
        Some("client") => client(
            &a[2],
            a[3].parse().unwrap(),
            a.get(4).map(|c| c.parse().unwrap()).unwrap_or(1),
            a.get(5).map(|c| c.parse().unwrap()).unwrap_or(0.0),
        ),
        _ => eprintln!("usage: rr_load server ADDR | rr_load client ADDR SECONDS [CONNS]"),
    }
}

//! The floor for the active-view benchmark: a bare, blocking send()/recv()
//! request/response loop with no runtime, no pacing and no bookkeeping beyond
//! one timestamp pair per transaction.
//!
//! `bare_rr client ADDR SECONDS [REQ RESP]`: speaks rttscope's hello (so it
//! can run against `rttscope serve`), then sends REQ bytes and reads RESP
//! bytes back to back for SECONDS; prints one JSON line with transactions,
//! transactions/s and the P50 (nearest rank) in microseconds.
//!
//! `bare_rr server ADDR`: a blocking thread-per-connection responder speaking
//! the same protocol, to compare servers as well.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rttscope::active::framing::{Hello, HELLO_ACK, HELLO_LEN};

fn client(addr: &str, secs: f64, req: u32, resp: u32) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.write_all(
        &Hello {
            req,
            resp,
            flags: 1,
        }
        .encode(),
    )?;
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack)?;
    assert_eq!(ack, HELLO_ACK, "not an rttscope responder");
    let q = vec![b'q'; req as usize];
    let mut r = vec![0u8; resp as usize];
    let mut rtts: Vec<u64> = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        s.write_all(&q)?;
        s.read_exact(&mut r)?;
        rtts.push(t0.elapsed().as_nanos() as u64);
    }
    let elapsed = start.elapsed().as_secs_f64();
    rtts.sort_unstable();
    let p50 = rtts[rtts.len().div_ceil(2) - 1] as f64 / 1e3;
    let mean = rtts.iter().sum::<u64>() as f64 / rtts.len() as f64 / 1e3;
    let over_100us = rtts.iter().filter(|&&x| x > 100_000).count();
    println!(
        "{{\"transactions\":{},\"elapsed_s\":{:.6},\"tps\":{:.2},\"p50_us\":{:.3},\"mean_us\":{:.3},\"over_100us\":{}}}",
        rtts.len(),
        elapsed,
        rtts.len() as f64 / elapsed,
        p50,
        mean,
        over_100us
    );
    Ok(())
}

fn serve_conn(mut s: TcpStream) -> std::io::Result<()> {
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h)?;
    let hello = Hello::decode(&h, 1 << 20)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    s.set_nodelay(true)?;
    s.write_all(&HELLO_ACK)?;
    let mut q = vec![0u8; hello.req as usize];
    let r = vec![b'r'; hello.resp as usize];
    loop {
        s.read_exact(&mut q)?;
        s.write_all(&r)?;
    }
}

fn server(addr: &str) -> std::io::Result<()> {
    let l = TcpListener::bind(addr)?;
    eprintln!("bare_rr server on {}", l.local_addr()?);
    for s in l.incoming() {
        let s = s?;
        std::thread::spawn(move || {
            let _ = serve_conn(s);
        });
    }
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: bare_rr client ADDR SECONDS [REQ RESP] | bare_rr server ADDR";
    let r = match a.get(1).map(|s| s.as_str()) {
        Some("client") if a.len() >= 4 => {
            let secs: f64 = a[3].parse().expect(usage);
            let req = a.get(4).map(|x| x.parse().expect(usage)).unwrap_or(1);
            let resp = a.get(5).map(|x| x.parse().expect(usage)).unwrap_or(1);
            client(&a[2], secs, req, resp)
        }
        Some("server") if a.len() >= 3 => server(&a[2]),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("bare_rr: {e}");
        std::process::exit(1);
    }
}

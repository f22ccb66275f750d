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
//!
//! `bare_rr interleave SECONDS BLOCK ADDR...`: the same loop against several
//! servers at once, one connection each, BLOCK transactions to one, then to
//! the next (A B B A A B ..., or A B C C B A ... for three), for SECONDS in
//! all; one JSON line per server with its transactions, the time spent on
//! its blocks, transactions/s over that time and P50. Every server sees the
//! same machine load: on a shared machine, transactions/s of two separate
//! 1 s runs differ by up to 50x, within one interleaved run by a few percent.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rttscope::active::framing::{Hello, HELLO_ACK, HELLO_LEN};

/// A connected, greeted client socket.
fn connect(addr: &str, req: u32, resp: u32) -> std::io::Result<TcpStream> {
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
    Ok(s)
}

fn client(addr: &str, secs: f64, req: u32, resp: u32) -> std::io::Result<()> {
    let mut s = connect(addr, req, resp)?;
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

/// P50 (nearest rank) in microseconds of RTTs in nanoseconds (sorts them).
fn p50_us(rtts: &mut [u64]) -> f64 {
    rtts.sort_unstable();
    rtts.get(rtts.len().div_ceil(2).max(1) - 1)
        .copied()
        .unwrap_or(0) as f64
        / 1e3
}

fn interleave(secs: f64, block: usize, addrs: &[String]) -> std::io::Result<()> {
    let (q, mut r) = ([b'q'; 1], [0u8; 1]);
    let mut conns = addrs
        .iter()
        .map(|a| connect(a, 1, 1))
        .collect::<std::io::Result<Vec<_>>>()?;
    let n = conns.len();
    let mut rtts: Vec<Vec<u64>> = vec![Vec::with_capacity(1 << 20); n];
    let mut spent = vec![Duration::ZERO; n];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut cycle = 0usize;
    while Instant::now() < end {
        // Forward, then backward: each server goes first as often as last.
        for k in 0..n {
            let i = if cycle.is_multiple_of(2) {
                k
            } else {
                n - 1 - k
            };
            let b0 = Instant::now();
            for _ in 0..block {
                let t0 = Instant::now();
                conns[i].write_all(&q)?;
                conns[i].read_exact(&mut r)?;
                rtts[i].push(t0.elapsed().as_nanos() as u64);
            }
            spent[i] += b0.elapsed();
        }
        cycle += 1;
    }
    for (i, a) in addrs.iter().enumerate() {
        let t = spent[i].as_secs_f64();
        let count = rtts[i].len();
        let p50 = p50_us(&mut rtts[i]);
        // 1 / mean of the fastest 99%: without the transactions during which
        // another process held a CPU (0.1-1% here, each up to several ms, and
        // together most of the time), which land on either server by chance.
        let fast = &rtts[i][..(count * 99).div_ceil(100)];
        let trim = fast.len() as f64 * 1e9 / fast.iter().sum::<u64>().max(1) as f64;
        println!(
            "{{\"server\":\"{a}\",\"transactions\":{count},\"time_s\":{t:.6},\"tps\":{:.2},\"tps_fastest99\":{trim:.2},\"p50_us\":{p50:.3}}}",
            count as f64 / t,
        );
    }
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
    let usage = "usage: bare_rr client ADDR SECONDS [REQ RESP] | bare_rr server ADDR | bare_rr interleave SECONDS BLOCK ADDR...";
    let r = match a.get(1).map(|s| s.as_str()) {
        Some("client") if a.len() >= 4 => {
            let secs: f64 = a[3].parse().expect(usage);
            let req = a.get(4).map(|x| x.parse().expect(usage)).unwrap_or(1);
            let resp = a.get(5).map(|x| x.parse().expect(usage)).unwrap_or(1);
            client(&a[2], secs, req, resp)
        }
        Some("server") if a.len() >= 3 => server(&a[2]),
        Some("interleave") if a.len() >= 5 => {
            let secs: f64 = a[2].parse().expect(usage);
            let block: usize = a[3].parse().expect(usage);
            interleave(secs, block.max(1), &a[4..])
        }
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

//! Load for the benchmarks (scripts/bench-tcp.sh, scripts/bench-metrics.sh).
//!
//!   load_gen server ADDR
//!   load_gen rr ADDR SECONDS CONNS RATE     # RATE transactions/s in total (0: as fast as possible)
//!   load_gen churn ADDR SECONDS THREADS     # short connections: connect, 1-byte RR, close
//!   load_gen hold ADDR CONNS SECONDS        # CONNS connections, one 1-byte RR each, then idle
//!
//! `rr` runs CONNS connections in parallel, each paced to RATE/CONNS
//! transactions per second (1-byte request, 1-byte response: two packets per
//! transaction). Prints one JSON line: {"tps":..,"transactions":..}.
//! `churn` prints {"conns_per_s":..,"conns":..,"failed":..}.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn serve(addr: &str) {
    let l = TcpListener::bind(addr).expect("bind");
    let mut accept_errors = 0u64;
    for s in l.incoming() {
        let mut s = match s {
            Ok(s) => s,
            Err(e) => {
                // EMFILE/ENFILE: said (the first and every 10,000th), and a pause instead of a spin
                if accept_errors.is_multiple_of(10_000) {
                    eprintln!(
                        "load_gen server: accept failed ({} so far): {e}",
                        accept_errors + 1
                    );
                }
                accept_errors += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        };
        // small stacks: `hold` keeps tens of thousands of connections, a thread each
        let spawned = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                s.set_nodelay(true).ok();
                let mut b = [0u8; 1];
                while let Ok(1) = s.read(&mut b) {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("load_gen server: no thread for a connection: {e}");
        }
    }
}

fn rr(addr: &str, secs: f64, conns: usize, rate: f64) {
    let total = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let per = rate / conns as f64;
    let handles: Vec<_> = (0..conns)
        .map(|_| {
            let addr = addr.to_string();
            let total = total.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).expect("connect");
                s.set_nodelay(true).ok();
                let mut b = [1u8; 1];
                let t0 = Instant::now();
                let mut n = 0u64;
                while Instant::now() < end {
                    if per > 0.0 {
                        // Pace: transaction n is due at t0 + n/per.
                        let due = t0 + Duration::from_secs_f64(n as f64 / per);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                    }
                    if s.write_all(&b).is_err() || s.read_exact(&mut b).is_err() {
                        break;
                    }
                    n += 1;
                }
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let n = total.load(Ordering::Relaxed);
    let el = start.elapsed().as_secs_f64();
    println!(
        "{{\"tps\":{:.1},\"transactions\":{n},\"conns\":{conns},\"rate\":{rate}}}",
        n as f64 / el
    );
}

fn churn(addr: &str, secs: f64, threads: usize) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let addr = addr.to_string();
            let (ok, failed) = (ok.clone(), failed.clone());
            std::thread::spawn(move || {
                while Instant::now() < end {
                    let r = (|| -> std::io::Result<()> {
                        let mut s = TcpStream::connect(&addr)?;
                        s.set_nodelay(true)?;
                        let mut b = [1u8; 1];
                        s.write_all(&b)?;
                        s.read_exact(&mut b)?;
                        Ok(())
                    })();
                    match r {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let n = ok.load(Ordering::Relaxed);
    println!(
        "{{\"conns_per_s\":{:.1},\"conns\":{n},\"failed\":{}}}",
        n as f64 / start.elapsed().as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
}

/// Open `conns` connections, one exchange each (so an observer has that many
/// flows with samples), keep them open and idle for `secs`.
fn hold(addr: &str, conns: usize, secs: f64) {
    let mut all = Vec::with_capacity(conns);
    for _ in 0..conns {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).ok();
        let mut b = [1u8; 1];
        s.write_all(&b).expect("write");
        s.read_exact(&mut b).expect("read");
        all.push(s);
    }
    println!("{{\"connections\":{}}}", all.len());
    std::thread::sleep(Duration::from_secs_f64(secs));
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize| -> f64 { a.get(i).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
    match a.get(1).map(String::as_str) {
        Some("server") if a.len() > 2 => serve(&a[2]),
        Some("rr") if a.len() > 5 => rr(&a[2], num(3), (num(4) as usize).max(1), num(5)),
        Some("churn") if a.len() > 4 => churn(&a[2], num(3), (num(4) as usize).max(1)),
        Some("hold") if a.len() > 4 => hold(&a[2], (num(3) as usize).max(1), num(4)),
        _ => {
            eprintln!("usage: load_gen server ADDR | rr ADDR SECONDS CONNS RATE | churn ADDR SECONDS THREADS | hold ADDR CONNS SECONDS");
            std::process::exit(2);
        }
    }
}

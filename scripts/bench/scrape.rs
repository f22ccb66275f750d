//! A scrape storm against a running observer (scripts/bench-scrape.sh):
//!
//!   bench_scrape PORT SCRAPERS SECONDS PID [EVERY_MS]
//!
//! SCRAPERS threads scrape http://127.0.0.1:PORT/metrics in a loop (one
//! request per connection) for SECONDS, back to back, or each every EVERY_MS
//! (phases spread over the interval); prints one JSON line with the
//! scrapes answered and failed, latency p50/p99/max, and the observer's
//! (PID) VmHWM/VmRSS before and after. Loopback only, bounded in time.
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 && a.len() != 6 {
        eprintln!("usage: bench_scrape PORT SCRAPERS SECONDS PID [EVERY_MS]");
        std::process::exit(2);
    }
    let port: u16 = a[1].parse().expect("PORT");
    let n: usize = a[2].parse().expect("SCRAPERS");
    let secs: u64 = a[3].parse().expect("SECONDS");
    let pid: u32 = a[4].parse().expect("PID");
    let every: Option<u64> = a.get(5).map(|v| v.parse().expect("EVERY_MS"));
    let before = rttscope_e2e::rss_kb(pid);
    let s = rttscope_e2e::scrape_storm_paced(
        port,
        n,
        Duration::from_secs(secs),
        every.map(Duration::from_millis),
    );
    let after = rttscope_e2e::rss_kb(pid);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{}",
        serde_json::json!({
            "scrapers": n, "seconds": secs, "every_ms": every, "answered": s.ok, "failed": s.failed,
            "p50_ms": ms(s.pct(0.5)), "p99_ms": ms(s.pct(0.99)), "max_ms": ms(s.slowest),
            "vm_hwm_kb_before": before.0, "vm_hwm_kb_after": after.0,
            "vm_rss_kb_before": before.1, "vm_rss_kb_after": after.1,
        })
    );
}

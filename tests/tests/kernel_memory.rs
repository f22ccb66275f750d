//! Kernel memory of one default `observe --view tcp,sampler` (issue 28): every
//! map the observer holds, as the kernel accounts it (`memlock` in the map's
//! /proc/PID/fdinfo entry, the number `bpftool map show` prints as
//! bytes_memlock), summed over the maps of this process only.
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rttscope_e2e::*;

/// Every BPF map the process `pid` holds a file descriptor of: id -> (name-less
/// description, memlock bytes).
fn maps_of(pid: u32) -> BTreeMap<u64, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        let desc = format!(
            "type {} value {} B x {}",
            field("map_type:").unwrap_or_default(),
            field("value_size:").unwrap_or_default(),
            field("max_entries:").unwrap_or_default()
        );
        if let (Ok(id), Ok(m)) = (id.parse(), memlock.parse()) {
            out.insert(id, (desc, m));
        }
    }
    out
}

/// At the default --max-flows, both views together hold at most 32 MiB of
/// kernel memory (it was 168 MiB with a 5 KiB histogram per flow and view),
/// and no flow entry is above 1 KiB.
#[test]
fn default_observe_maps_stay_under_32_mib() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--format", "json", "--view", "tcp,sampler"])
        .args(["--netns", &p.a.name, "--iface", &ia])
        .args(["--interval", "1s", "--duration", "4s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let obs = ChildGuard::spawn(&mut cmd).unwrap();
    // both objects loaded: the maps of the two views are there
    let t0 = Instant::now();
    let maps = loop {
        let m = maps_of(obs.pid());
        let tables = m.values().filter(|(d, _)| d.ends_with("x 16384")).count();
        // tcp_flows, tcp_free_slots, sampler_table
        if tables >= 3 || t0.elapsed() > Duration::from_secs(20) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = obs.wait_output(Duration::from_secs(30)).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total: u64 = maps.values().map(|m| m.1).sum();
    let listing: Vec<String> = maps
        .iter()
        .map(|(id, (d, m))| format!("map {id}: {d}: {m} B"))
        .collect();
    assert!(
        maps.len() >= 10,
        "expected both views' maps, found: {listing:#?}"
    );
    assert!(
        total <= 32 << 20,
        "kernel memory {total} B ({:.1} MiB) above 32 MiB: {listing:#?}",
        total as f64 / (1u64 << 20) as f64
    );
    // the per-flow tables: 16,384 entries of at most 1 KiB each
    let flow_tables: Vec<&String> = listing.iter().filter(|l| l.contains("x 16384:")).collect();
    assert!(
        flow_tables.len() >= 3,
        "no per-flow table of 16384 entries: {listing:#?}"
    );
    for (d, _) in maps.values().filter(|(d, _)| d.ends_with("x 16384")) {
        let v: u64 = d
            .split("value ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(v <= 1024, "per-flow entry of {v} B: {d}");
    }
}

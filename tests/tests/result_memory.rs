//! The result loader's memory (issue 26 item 11): `rttscope bucket` over a result document of
//! 1,000,000 samples peaks at most 64 bytes per sample above the same command over a 2-sample
//! document (the program's own baseline). Peak RSS is the child's `ru_maxrss` from wait4(2).
//! Before the fix the loader spent ~330 bytes per sample here (debug build; ~770 in the issue's
//! release measurement). No privileges needed.
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rttscope_e2e::{rttscope_bin, unique};

/// Most bytes per sample above the baseline (the issue's "Done when": 10 M samples in 640 MB).
const MAX_BYTES_PER_SAMPLE: u64 = 64;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A result document written on one line, as `serde_json::to_string` would: two views, `n`
/// samples in all.
fn write_result(path: &Path, n: usize) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = std::io::BufWriter::new(f);
    write!(
        w,
        r#"{{"format":"rttscope-result","version":2,"tool":{{"name":"rttscope","version":"0.1.0"}},"created":"2026-11-21T06:00:00Z","host":{{}},"command":"observe","views":["#
    )
    .unwrap();
    for (v, side) in ["client", "server"].iter().enumerate() {
        if v > 0 {
            write!(w, ",").unwrap();
        }
        write!(w, r#"{{"name":"tcp {side}","kind":"tcp","samples":["#).unwrap();
        for i in 0..n / 2 {
            let sep = if i > 0 { "," } else { "" };
            let t = i as f64 * 97.3;
            let rtt = 40 + (i * 7919) % 2000;
            write!(w, r#"{sep}{{"t_us":{t:.3},"rtt_us":{rtt}.0}}"#).unwrap();
        }
        write!(w, "]}}").unwrap();
    }
    writeln!(w, "]}}").unwrap();
    w.flush().unwrap();
}

/// Run `rttscope bucket FILE`; its peak RSS in bytes and its first stdout line.
#[allow(clippy::zombie_processes)] // reaped by wait4(2) below, which also gives its rusage
fn bucket_peak_rss(file: &Path) -> (u64, String) {
    let child = Command::new(rttscope_bin())
        .arg("bucket")
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut stderr = child.stderr.unwrap();
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, not yet reaped; status and ru are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let st = std::process::ExitStatus::from_raw(status);
    let err = err_t.join().unwrap();
    assert!(st.success(), "bucket {}: {st}: {err}", file.display());
    let first = out.lines().next().unwrap_or("").to_string();
    (ru.ru_maxrss as u64 * 1024, first)
}

#[test]
fn bucket_loads_a_million_samples_in_64_bytes_each() {
    let dir = Dir(std::env::temp_dir().join(unique("rtsmem")));
    std::fs::create_dir_all(&dir.0).unwrap();
    let n = 1_000_000;
    let (small, big) = (dir.0.join("small.json"), dir.0.join("big.json"));
    write_result(&small, 2);
    write_result(&big, n);
    let size = std::fs::metadata(&big).unwrap().len();
    let (base, _) = bucket_peak_rss(&small);
    let (peak, first) = bucket_peak_rss(&big);
    assert_eq!(
        first,
        format!(
            "tcp client: {} samples, min 0.040 ms, mean 1.040 ms, max 2.039 ms",
            n / 2
        ),
        "the whole document was read"
    );
    let per_sample = peak.saturating_sub(base) as f64 / n as f64;
    eprintln!(
        "bucket over {n} samples ({:.1} MB file): peak RSS {:.1} MB, baseline {:.1} MB, {per_sample:.1} bytes per sample (bound {MAX_BYTES_PER_SAMPLE})",
        size as f64 / 1e6,
        peak as f64 / 1e6,
        base as f64 / 1e6
    );
    assert!(
        peak <= base + MAX_BYTES_PER_SAMPLE * n as u64,
        "peak RSS {peak} B for {n} samples is {per_sample:.1} B per sample above the baseline {base} B (bound {MAX_BYTES_PER_SAMPLE})"
    );
}

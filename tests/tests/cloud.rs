//! Issue 16 end to end: local views written as Cloud Monitoring time series, and read back as if
//! the cloud had sent them. Real kernel programs, real TCP between two namespaces.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rttscope_e2e::*;
use serde_json::Value;

/// The vm_flow preset's finite bounds in microseconds (0-1 ms, then doubling, 16 finite buckets).
fn vm_flow_bounds_us() -> Vec<f64> {
    (0..16).map(|k| 1000.0 * 2f64.powi(k)).collect()
}

/// Bucket index of `us` in the vm_flow layout (0: underflow, below 0; 1: [0, 1 ms); ...).
fn vm_flow_index(us: f64) -> usize {
    1 + vm_flow_bounds_us().iter().filter(|&&b| us >= b).count()
}

/// Whether a sample lies in a kernel histogram bucket that straddles a vm_flow bound (the only
/// samples the export may place on the other side of a bound): kernel buckets are at most 1/64 of
/// a power of two wide, so one straddling bound B spans at most B/64 on each side.
fn near_a_bound(us: f64) -> bool {
    vm_flow_bounds_us()
        .iter()
        .any(|&b| (us - b).abs() <= b / 64.0)
}

fn netns_inode(name: &str) -> u64 {
    std::fs::metadata(Path::new("/run/netns").join(name))
        .unwrap()
        .ino()
}

/// An observer writing into files (so the test can see it has attached while it runs), stopped
/// by SIGTERM like a service.
struct Observer {
    child: ChildGuard,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Observer {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Observer {
        let (out, err) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.err")),
        );
        let mut cmd = Command::new(rttscope_bin());
        cmd.arg("observe")
            .args(args)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        Observer {
            child: ChildGuard(Some(cmd.spawn().unwrap())),
            out,
            err,
        }
    }

    fn read(&self) -> (String, String) {
        let r = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        (r(&self.out), r(&self.err))
    }

    /// Wait until `marker` shows in its output (it prints its start once attached).
    fn wait_attached(&self, marker: &str) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            let (o, e) = self.read();
            if o.contains(marker) || e.contains(marker) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("observer not attached after 30 s: {:?}", self.read());
    }

    /// SIGTERM, wait for the exit (it reports its last interval first), return stdout, stderr.
    fn stop(mut self) -> (String, String) {
        let mut c = self.child.0.take().unwrap();
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = c.kill();
                panic!("observer did not stop on SIGTERM: {:?}", self.read());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let (o, e) = self.read();
        assert!(status.success(), "observer failed ({status}): {e}");
        (o, e)
    }
}

/// `observe --format cloud-monitoring` counts every sample the kernel took, in the right cloud
/// buckets: a second observer with `--format json --raw` watches the same flow at the same time,
/// and its raw samples are the truth (both observers are attached before the first transaction
/// and stop after the last).
#[test]
fn observe_cloud_monitoring_holds_every_sample() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5011").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    // 1.5 ms of think time: the server side's TCP RTT (delayed ACK) lands in vm_flow's 1-2 ms
    // bucket, the client's in 0-1 ms.
    let cli = RrClient::start_paused(&p.a, server, 2, Duration::from_micros(1500), true).unwrap();
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let ib = format!("{}:{}", p.b.name, p.b_if);
    let common = [
        "--netns",
        &p.a.name,
        "--netns",
        &p.b.name,
        "--view",
        "tcp,sampler",
        "--iface",
        &ia,
        "--iface",
        &ib,
        "--interval",
        "500ms",
    ];
    let dir = std::env::temp_dir().join(unique("rtscm"));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = Observer::start(
        &dir,
        "raw",
        &[&common[..], &["--format", "json", "--raw"]].concat(),
    );
    let cloud = Observer::start(
        &dir,
        "cloud",
        &[&common[..], &["--format", "cloud-monitoring"]].concat(),
    );
    raw.wait_attached("\"type\":\"start\"");
    cloud.wait_attached("rttscope observe: one projects.timeSeries.create");
    cli.resume();
    std::thread::sleep(Duration::from_secs(2));
    cli.pause();
    std::thread::sleep(Duration::from_millis(300));
    let (raw_stdout, _) = raw.stop();
    let (cloud_stdout, cloud_err) = cloud.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let transactions = cli.transactions.load(std::sync::atomic::Ordering::Relaxed);
    assert!(transactions > 300, "only {transactions} transactions");

    let (truth, end) = raw_samples(&raw_stdout);
    let req = last_create_request(&cloud_stdout, &cloud_err);
    let mut exported: BTreeMap<&str, u64> = BTreeMap::new();
    let mut checked = 0;
    for (ns_name, side) in [(&p.a.name, "client"), (&p.b.name, "server")] {
        let ino = netns_inode(ns_name);
        for view in ["tcp", "sampler"] {
            let series = req["timeSeries"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| {
                    s["metric"]["labels"]["view"] == view
                        && s["metric"]["labels"]["netns"] == ns_name.as_str()
                })
                .unwrap_or_else(|| panic!("no {view} series for {ns_name}: {req}"));
            let samples = truth
                .get(&(view.to_string(), ino))
                .unwrap_or_else(|| panic!("no raw {view} samples in {ns_name}"));
            assert_eq!(series["metric"]["labels"]["side"], side, "{series}");
            assert_eq!(series["metricKind"], "CUMULATIVE");
            let why = format!("{transactions} transactions; raw observer's counters: {}\ncloud observer: {cloud_err}", end["counters"]);
            *exported.entry(view).or_insert(0) +=
                series_holds_the_samples(series, samples, view, side, &why);
            checked += 1;
        }
    }
    assert_eq!(checked, 4);
    // Every sample the cloud observer's kernel programs took is in its export: its closing line
    // (standard error, not among the requests) gives each view's sample counter.
    for view in ["tcp", "sampler"] {
        let taken: u64 = cloud_err
            .split(&format!("{view}: "))
            .nth(1)
            .and_then(|t| t.split(" samples").next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {view} sample count in the closing line: {cloud_err}"));
        assert_eq!(
            exported[view], taken,
            "{view}: exported vs the observer's own sample counter: {cloud_err}"
        );
    }
}

/// The truth: the raw samples of the raw observer, per (view, netns inode); and its end record.
fn raw_samples(raw_stdout: &str) -> (BTreeMap<(String, u64), Vec<f64>>, Value) {
    let lines = parse_lines(raw_stdout.as_bytes()).unwrap();
    let end = lines
        .iter()
        .find(|l| l["type"] == "end")
        .expect("end record");
    assert_eq!(end["counters"]["tcp"]["raw_events_dropped"], 0, "{end}");
    let mut truth: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for l in lines.iter().filter(|l| l["type"] == "sample") {
        truth
            .entry((
                l["view"].as_str().unwrap().to_string(),
                l["netns"].as_u64().unwrap(),
            ))
            .or_default()
            .push(l["rtt_us"].as_f64().unwrap());
    }

    (truth, end.clone())
}

/// The export: stdout holds only create requests; the last one (the whole run) returned.
fn last_create_request(text: &str, cloud_err: &str) -> Value {
    let last = text
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no create request on stdout; stderr: {cloud_err}"));
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["timeSeries"].is_array(), "not a create request: {l}");
    }
    serde_json::from_str(last).unwrap()
}

/// One exported distribution against the raw samples of its view and namespace: its count
/// (returned) and each bucket.
fn series_holds_the_samples(
    series: &Value,
    samples: &[f64],
    view: &str,
    side: &str,
    why: &str,
) -> u64 {
    let d = &series["points"][0]["value"]["distributionValue"];
    let count: u64 = d["count"].as_str().unwrap().parse().unwrap();
    // TCP's samples are one per ACK that TCP times: both observers see the same ones.
    // Two sampler instances pair segments and ACKs independently and may lose a few
    // pairings to races between CPUs (their `race`/`ack_no_match` counters): the raw
    // observer's sampler is then a truth within a few percent, and the exact check is
    // the cloud observer's own sample counter below.
    let diff = count.abs_diff(samples.len() as u64);
    let allowed = if view == "tcp" {
        0
    } else {
        samples.len() as u64 / 20
    };
    assert!(
        diff <= allowed,
        "{view} {side}: exported {count} vs {} raw samples (allowed {allowed}): {series}\n{why}",
        samples.len(),
    );
    // Bucket by bucket: equal, but for samples in a kernel bucket across a bound.
    let got: Vec<u64> = d["bucketCounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().parse().unwrap())
        .collect();
    let mut want = vec![0u64; 18];
    for &us in samples {
        want[vm_flow_index(us)] += 1;
    }
    let slack = samples.iter().filter(|&&us| near_a_bound(us)).count() as u64 + diff;
    for (i, &w) in want.iter().enumerate() {
        let g = got.get(i).copied().unwrap_or(0);
        assert!(
            g.abs_diff(w) <= slack,
            "{view} {side} bucket {i}: exported {g}, raw samples {w} (slack {slack}); exported {got:?}, raw {want:?}"
        );
    }
    count
}

fn run_ok(cmd: &mut Command) -> String {
    let out = ChildGuard::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(60))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The numbers of a table row of `compare` (N, then the columns up to MAX), by its view name.
fn row(table: &str, view: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with(view) && l[view.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no row {view}: {table}"));
    line[view.len()..]
        .split_whitespace()
        .take(7)
        .map(str::to_string)
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn trimmed(v: &Value) -> Vec<u64> {
    let mut c: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    while c.last() == Some(&0) {
        c.pop();
    }
    c
}

/// A namespace flow measured by `compare`, written as Cloud Monitoring time series by `bucket
/// --format cloud-monitoring`, read back by `bucket` and `compare --cloud` as if the cloud had
/// sent it: the same distribution and the same percentiles both ways.
#[test]
fn a_measured_flow_exported_reads_back_the_same() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let bin = rttscope_bin();
    let mut serve = p.b.command(bin.to_str().unwrap());
    serve.args(["serve", "--listen", &format!("{B_ADDR}:7879")]);
    let _srv = ChildGuard::spawn(&mut serve).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dir = std::env::temp_dir().join(unique("rtscloud"));
    std::fs::create_dir_all(&dir).unwrap();
    let result = dir.join("result.json");
    let compare = |extra: &[&str]| {
        let mut c = p.a.command(bin.to_str().unwrap());
        c.args([
            "compare", B_ADDR, "-p", "7879", "-w", "2ms", "--iface", &p.a_if,
        ])
        .args(extra);
        run_ok(&mut c)
    };
    let bucket = |args: &[&std::ffi::OsStr]| run_ok(Command::new(&bin).arg("bucket").args(args));
    let first = compare(&["-l", "3s", "--json", result.to_str().unwrap()]);
    let local: Vec<Value> = serde_json::from_str(&bucket(&[
        result.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]))
    .unwrap();

    // Out and back in: every view's series.
    let ts = bucket(&[
        result.as_os_str(),
        "--format".as_ref(),
        "cloud-monitoring".as_ref(),
    ]);
    let ts_file = dir.join("ts.jsonl");
    std::fs::write(&ts_file, &ts).unwrap();
    let back: Vec<Value> = serde_json::from_str(&bucket(&[
        ts_file.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "--local".as_ref(),
        result.as_os_str(),
    ]))
    .unwrap();
    assert_eq!(back.len(), local.len(), "one series per view: {ts}");
    for s in &back {
        series_reads_back_the_same(s, &local);
    }

    // compare --cloud with the sampler's series only (what vm_flow/rtt would hold): its row has
    // the numbers of the first run's "sampler cloud" row.
    let sampler_ts = bucket(&[
        result.as_os_str(),
        "--view".as_ref(),
        "sampler client".as_ref(),
        "--format".as_ref(),
        "cloud-monitoring".as_ref(),
    ]);
    let sampler_file = dir.join("sampler.jsonl");
    std::fs::write(&sampler_file, &sampler_ts).unwrap();
    let second = compare(&["-l", "1s", "--cloud", sampler_file.to_str().unwrap()]);
    let (want, got) = (row(&first, "sampler cloud"), row(&second, "cloud"));
    assert_eq!(
        got, want,
        "cloud row (N MIN MEAN P50 P90 P99 MAX) vs the first run's sampler cloud row:\n{first}\n{second}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One series read back from the cloud export against the local result it was made of: count,
/// buckets, the cloud lens, and the local samples beside the point.
fn series_reads_back_the_same(s: &Value, local: &[Value]) {
    let metric = s["metric"].as_str().unwrap();
    let view = metric.split("view=").nth(1).unwrap().trim_end_matches('}');
    let l = local
        .iter()
        .find(|l| l["name"] == view)
        .unwrap_or_else(|| panic!("no local view {view}"));
    let (d, ld) = (&s["distribution"], &l["distribution"]);
    assert_eq!(d["count"], ld["count"], "{view}: count");
    assert_eq!(
        trimmed(&d["bucket_counts"]),
        trimmed(&ld["bucket_counts"]),
        "{view}: buckets"
    );
    let lens = |name: &str| {
        floats(
            &l["lenses"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["lens"] == name)
                .unwrap()["values_us"],
        )
    };
    let cloud = floats(&s["cloud_us"]);
    assert!(
        cloud.iter().zip(lens("cloud")).all(|(a, b)| close(*a, b)),
        "{view}: percentiles read back {cloud:?} vs written {:?}",
        lens("cloud")
    );
    // The local samples beside the cloud point: exact as before, and re-bucketed with the
    // file's own layout they give the cloud's numbers.
    let beside = s["local"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == view)
        .unwrap_or_else(|| panic!("{view}: no local samples beside the point: {s}"));
    assert_eq!(
        beside["count"], ld["count"],
        "{view}: local samples beside the point: {beside}"
    );
    assert_eq!(floats(&beside["exact_us"]), lens("exact"), "{view}: exact");
    let re = floats(&beside["rebucketed_us"]);
    assert!(
        re.iter().zip(&cloud).all(|(a, b)| close(*a, *b)),
        "{view}: re-bucketed {re:?} vs cloud {cloud:?}"
    );
}

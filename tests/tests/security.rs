//! Files written as root into a directory other users can write to (docs/security.md, "Files").
//!
//! The attack of issue 26: a local user plants symbolic links at the names rttscope would
//! write (its old temporary `out.tmp<PID>`, its old temporary directories, the destination
//! itself) in a world-writable sticky directory, then root runs the command. Every writer must
//! leave the link's target untouched and either write its output correctly (temporaries are
//! created exclusively, at random names) or refuse a destination that is another user's link in
//! one sentence.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rttscope::analysis::results::{RunResult, Sample, ViewKind, ViewSeries};
use rttscope_e2e::*;

const VICTIM_TEXT: &str = "precious: root's file, not to be overwritten\n";

/// A world-writable sticky directory (as /tmp), with a root-owned victim file beside it.
struct Shared {
    dir: PathBuf,
    victim: PathBuf,
}

impl Shared {
    fn new() -> Shared {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(unique("rtssec"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let vdir = dir.join("root-only");
        std::fs::create_dir(&vdir).unwrap();
        std::fs::set_permissions(&vdir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let victim = vdir.join("victim");
        std::fs::write(&victim, VICTIM_TEXT).unwrap();
        Shared { dir, victim }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Run `args` (inside `ns`) from a shell that first plants, as uid/gid 65534, a symbolic
    /// link to the victim at each of `names` (`$$` in a name is the PID the command will have:
    /// the shell execs `ip netns exec`, which execs rttscope in the same process).
    fn plant_and_run(&self, ns: &NetNs, names: &[&str], args: &[&str]) -> Output {
        let mut script = String::new();
        for n in names {
            script += &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups ln -s '{}' \"{}/{n}\" || exit 99\n",
                self.victim.display(),
                self.dir.display()
            );
        }
        script += "exec ip netns exec \"$0\" \"$@\"\n";
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(script)
            .arg(&ns.name)
            .arg(rttscope_bin())
            .args(args)
            .env("TMPDIR", &self.dir);
        let out = ChildGuard::spawn(&mut c)
            .unwrap()
            .wait_output(Duration::from_secs(60))
            .unwrap();
        assert_ne!(
            out.status.code(),
            Some(99),
            "planting failed: {}",
            text(&out)
        );
        out
    }

    /// The victim is as it was, and every planted link still points at it (nothing was
    /// written through a link, nor a link replaced by a file of root's made through it).
    fn assert_victim_untouched(&self, what: &str) {
        let now = std::fs::read_to_string(&self.victim).unwrap();
        assert_eq!(now, VICTIM_TEXT, "{what}: the victim file was overwritten");
    }

    /// Every link in the directory is owned by 65534 and points at the victim (none was
    /// followed and replaced by a file under the link's own name in the victim's place).
    fn links(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().unwrap().is_symlink())
            .map(|e| e.path())
            .collect()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A refusal: non-zero exit, one sentence naming the link and its owner, nothing written.
fn assert_refused(out: &Output, path: &Path, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{what}: wrote through a planted link: {}",
        text(out)
    );
    let want = format!(
        "{}: it is a symbolic link owned by uid 65534",
        path.display()
    );
    assert!(
        err.contains(&want),
        "{what}: no clear refusal ({want}): {}",
        text(out)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: one sentence: {err}"
    );
}

/// Wait until `irtt server` listens on UDP `port` in `ns`.
fn wait_udp(ns: &NetNs, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&ns.exec(&["ss", "-ulnH"]).unwrap().stdout)
        .contains(&format!(":{port} "))
    {
        assert!(Instant::now() < deadline, "irtt server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn planted_links_never_redirect_what_root_writes() {
    if !require_root() {
        return;
    }
    let sh = Shared::new();
    let ns = NetNs::new("rtssec").unwrap();
    // The old predictable names: the result's temporary `<name>.tmp<PID>`, the private cgroup2
    // mount point and the chart test's directory in $TMPDIR.
    let temps = ["out.tmp$$", "rttscope-cgroup2-$$", "rttscope-chart-$$"];

    let out_json = sh.path("out.json");
    a_result_document_is_written_beside_planted_links(&sh, &ns, &temps, &out_json);
    a_planted_destination_is_refused(&sh, &ns);
    charts_are_written_and_planted_destinations_refused(&sh, &ns, &out_json);
    irtt_output_is_written_and_planted_destinations_refused(&sh, &ns);
    // Nothing but the outputs and the planted links is left (no stray temporaries).
    let mut left: Vec<String> = std::fs::read_dir(&sh.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    left.sort();
    assert!(left.is_empty(), "temporaries left behind: {left:?}");
}

/// Every reader of files ends in one sentence, within 2 s, on endless or huge input
/// (`/dev/zero`, a 2 GB sparse file, a 900 MB one), under a 2 GB address-space cap (issue 26.2:
/// `bucket /dev/zero` grew to 24.2 GB before).
#[test]
fn readers_refuse_endless_input_in_one_sentence() {
    let dir = std::env::temp_dir().join(unique("rtsread"));
    std::fs::create_dir(&dir).unwrap();
    let _rm = scopeguard_dir(&dir);
    let sparse = dir.join("sparse-2g");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(2_000_000_000)
        .unwrap();
    let sparse900 = dir.join("sparse-900m");
    std::fs::File::create(&sparse900)
        .unwrap()
        .set_len(900_000_000)
        .unwrap();
    let png = dir.join("c.png");
    let (png, s2, s9) = (
        png.to_str().unwrap(),
        sparse.to_str().unwrap(),
        sparse900.to_str().unwrap(),
    );
    let ok_result = dir.join("ok.json");
    let mut r = RunResult::new("probe icmp", serde_json::json!({}));
    let mut v = ViewSeries::new("ICMP", ViewKind::Probe);
    v.samples = vec![Sample::at_s(0.0, 100.0), Sample::at_s(1.0, 200.0)];
    r.views.push(v);
    r.save(&ok_result).unwrap();
    let ok = ok_result.to_str().unwrap();
    for input in ["/dev/zero", s2, s9] {
        let cases: Vec<Vec<&str>> = vec![
            vec!["bucket", input],
            vec!["chart", input, "-o", png],
            vec!["chart", ok, "--cloud", input, "-o", png],
            vec!["bucket", ok, "--layout-from", input],
            vec!["bucket", input, "--local", ok],
            vec!["observe", "--config", input, "--check-config"],
        ];
        for args in cases {
            let t0 = Instant::now();
            let out = Command::new("prlimit")
                .arg("--as=2147483648")
                .arg(rttscope_bin())
                .args(&args)
                .output()
                .unwrap();
            let took = t0.elapsed();
            let err = String::from_utf8_lossy(&out.stderr);
            let what = format!("rttscope {args:?}");
            assert!(!out.status.success(), "{what}: succeeded: {}", text(&out));
            assert!(took < Duration::from_secs(2), "{what}: took {took:?}");
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            let sentence = lines
                .iter()
                .find(|l| l.contains(input))
                .unwrap_or_else(|| panic!("{what}: no sentence naming {input}: {err}"));
            assert!(
                sentence.contains("not text")
                    || sentence.contains("larger than 1 GiB")
                    || sentence.contains("larger than 256 MiB")
                    || sentence.contains("not an rttscope result"),
                "{what}: {sentence}"
            );
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
    }
}

/// Removes `dir` when dropped.
fn scopeguard_dir(dir: &Path) -> impl Drop {
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    Rm(dir.to_path_buf())
}

/// 1. A result document (probe icmp --json): written correctly beside the planted links.
fn a_result_document_is_written_beside_planted_links(
    sh: &Shared,
    ns: &NetNs,
    temps: &[&str],
    out_json: &Path,
) {
    let o = sh.plant_and_run(
        ns,
        temps,
        &[
            "probe",
            "icmp",
            "127.0.0.1",
            "-c",
            "1",
            "--json",
            out_json.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "probe: {}", text(&o));
    sh.assert_victim_untouched("probe --json");
    let meta = std::fs::symlink_metadata(out_json).unwrap();
    assert!(meta.file_type().is_file(), "out.json is not a regular file");
    let r = RunResult::load(out_json).unwrap_or_else(|e| panic!("out.json: {e}"));
    let n: usize = r.views.iter().map(|v| v.samples.len()).sum();
    assert_eq!(n, 1, "one ping, one sample: {:?}", r.views);
    assert_eq!(sh.links().len(), 3, "the planted links are still there");
}

/// 2. The destination itself a link planted by another user: refused, victim untouched.
fn a_planted_destination_is_refused(sh: &Shared, ns: &NetNs) {
    let planted = sh.path("final.json");
    let o = sh.plant_and_run(
        ns,
        &["final.json"],
        &[
            "probe",
            "icmp",
            "127.0.0.1",
            "-c",
            "1",
            "--json",
            planted.to_str().unwrap(),
        ],
    );
    assert_refused(&o, &planted, "probe --json onto a planted link");
    sh.assert_victim_untouched("probe --json onto a planted link");
}

/// 3. Charts (PNG and SVG): written correctly; a planted destination refused.
fn charts_are_written_and_planted_destinations_refused(sh: &Shared, ns: &NetNs, out_json: &Path) {
    for ext in ["png", "svg"] {
        let name = format!("chart.{ext}");
        let c = sh.path(&name);
        let tmp = format!("chart.tmp$$-{ext}");
        let o = sh.plant_and_run(
            ns,
            &[&tmp, "rttscope-chart-$$"],
            &[
                "chart",
                out_json.to_str().unwrap(),
                "-o",
                c.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "chart {ext}: {}", text(&o));
        let bytes = std::fs::read(&c).unwrap();
        let ok = match ext {
            "png" => bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            _ => String::from_utf8_lossy(&bytes)
                .trim_end()
                .ends_with("</svg>"),
        };
        assert!(
            ok,
            "chart.{ext} is not a whole {ext} ({} bytes)",
            bytes.len()
        );
        sh.assert_victim_untouched("chart");
        let planted = sh.path(&format!("planted.{ext}"));
        let o = sh.plant_and_run(
            ns,
            &[&format!("planted.{ext}")],
            &[
                "chart",
                out_json.to_str().unwrap(),
                "-o",
                planted.to_str().unwrap(),
            ],
        );
        assert_refused(&o, &planted, "chart onto a planted link");
        sh.assert_victim_untouched("chart onto a planted link");
    }
}

/// 4. irtt's -o JSON (against a real irtt server on the namespace's loopback).
fn irtt_output_is_written_and_planted_destinations_refused(sh: &Shared, ns: &NetNs) {
    let mut srv = ns.command("irtt");
    srv.args(["server", "-b", "127.0.0.1:2112", "-i", "0"]);
    let _srv = ChildGuard::spawn(&mut srv).expect("irtt server (Debian package irtt)");
    wait_udp(ns, 2112);
    let irtt_out = sh.path("irtt.json");
    let probe = |o: &Path| {
        vec![
            "probe".to_string(),
            "irtt".into(),
            "127.0.0.1".into(),
            "-i".into(),
            "10ms".into(),
            "-d".into(),
            "50ms".into(),
            "-o".into(),
            o.display().to_string(),
        ]
    };
    let a = probe(&irtt_out);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = sh.plant_and_run(ns, &["irtt.tmp$$", "irtt.json.tmp$$"], &a);
    assert!(o.status.success(), "probe irtt -o: {}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&irtt_out).unwrap()).expect("irtt -o is JSON");
    assert!(v.pointer("/stats").is_some(), "irtt -o has its stats: {v}");
    sh.assert_victim_untouched("probe irtt -o");
    let planted = sh.path("irtt-planted.json");
    let a = probe(&planted);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = sh.plant_and_run(ns, &["irtt-planted.json"], &a);
    assert_refused(&o, &planted, "probe irtt -o onto a planted link");
    sh.assert_victim_untouched("probe irtt -o onto a planted link");
}

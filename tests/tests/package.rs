//! The release artifacts where they will run (issue 43): the static binary
//! (no program interpreter, no shared library) installed from the tarball as
//! README's Install section says, run in a Debian 11 root filesystem (glibc
//! 2.31) on this kernel: `features`, and `observe` of a real flow between two
//! namespaces, its sample count against the transactions the client made; the
//! `.deb` installed into a fresh Debian 12 root filesystem as README says,
//! its unit verified by `systemd-analyze verify`, then purged without a file
//! left behind; the `.rpm`'s file list.
//!
//! The root filesystems are made by `scripts/rootfs.sh` (mmdebstrap from this
//! machine's apt archive, cached under /var/cache/rttscope: minutes the first
//! time, scripts/setup.sh makes them), the artifacts by `scripts/package.sh`
//! (a release build the first time; then seconds). The chroots run in a mount
//! namespace of their own (`unshare -m`): /proc, /sys, /dev and /run/netns
//! mounted there vanish with it.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rttscope_e2e::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn version() -> String {
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap()
        .to_string()
}

/// A script of ours; its stdout's last line (a path), or a panic with its stderr.
fn script(args: &[&str]) -> PathBuf {
    let t0 = Instant::now();
    let out = Command::new(repo().join(args[0]))
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed:\n{err}");
    eprintln!("{args:?}: {:.1} s", t0.elapsed().as_secs_f64());
    let path = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(path.lines().last().unwrap_or_default().trim())
}

/// The artifacts (scripts/package.sh, once per test binary).
fn dist() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| script(&["scripts/package.sh"]))
}

/// README's Install commands that contain `needle` (lines of its code block, or `code` in its
/// prose), `sudo ` taken out (the chroot runs as root).
fn readme_lines(needle: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let install = readme
        .split("\n## Install\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has an Install section");
    let mut in_block = false;
    let mut commands = Vec::new();
    for l in install.lines() {
        if l.starts_with("```") {
            in_block = !in_block;
        } else if in_block {
            if !l.trim_start().starts_with('#') {
                commands.push(l.to_string());
            }
        } else {
            commands.extend(l.split('`').skip(1).step_by(2).map(str::to_string));
        }
    }
    let lines: Vec<String> = commands
        .into_iter()
        .filter(|c| c.contains(needle))
        .map(|c| c.replace("sudo ", "").trim().to_string())
        .collect();
    assert!(
        !lines.is_empty(),
        "no Install command with {needle}:\n{install}"
    );
    lines
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A root filesystem extracted into a directory of its own; removed on drop.
struct Root {
    dir: PathBuf,
}

/// Mounts for a chroot that loads kernel programs and enters the test's
/// namespaces, made in the unshared mount namespace, then `chroot`.
const ENTER: &str = r#"set -e; r="$0"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
if [ -d /run/netns ]; then mkdir -p "$r/run/netns"; mount --rbind /run/netns "$r/run/netns"; fi
exec chroot "$r" "$@""#;

impl Root {
    /// `scripts/rootfs.sh suite pkgs...`, extracted.
    fn new(suite_and_pkgs: &[&str]) -> Root {
        let mut args = vec!["scripts/rootfs.sh"];
        args.extend(suite_and_pkgs);
        let tar = script(&args);
        let dir = std::env::temp_dir().join(unique("rtsroot"));
        std::fs::create_dir(&dir).unwrap();
        let root = Root { dir };
        sh(&["tar", "-xf", tar.to_str().unwrap(), "-C", root.path()]).unwrap();
        root
    }

    fn path(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// `args` run inside the root (as root), in a mount namespace of their own.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            ENTER,
        ])
        .arg(self.path())
        .args(args)
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        c
    }

    /// A shell line inside the root; its output, or a panic naming it.
    fn sh(&self, line: &str) -> Output {
        let out = self.command(&["sh", "-c", line]).output().unwrap();
        assert!(
            out.status.success(),
            "in {}: `{line}` failed:\n{}",
            self.path(),
            text(&out)
        );
        out
    }

    /// Copy a file into the root's /tmp.
    fn put(&self, file: &Path) {
        std::fs::copy(file, self.dir.join("tmp").join(file.file_name().unwrap())).unwrap();
    }

    /// Every path in the root (but /proc, /sys, /dev, /tmp), sorted.
    fn files(&self) -> Vec<String> {
        let out = self.sh("find / -xdev -path /proc -prune -o -path /sys -prune -o -path /dev -prune -o -path /tmp -prune -o -print | LC_ALL=C sort");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // The mounts live in the chroots' own mount namespaces; never delete through one.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts.contains(self.path()) {
            eprintln!("{}: still mounted here, left in place", self.path());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// (i) The binary in the tarball: checksums hold, no PT_INTERP, no DT_NEEDED, and ldd agrees.
#[test]
fn static_binary_has_no_dynamic_dependencies() {
    if !require_root() {
        return;
    }
    let dist = dist();
    let sums = sh(&[
        "sh",
        "-c",
        &format!("cd {} && sha256sum -c SHA256SUMS", dist.display()),
    ]);
    eprintln!("{}", String::from_utf8_lossy(&sums.unwrap().stdout));
    let tmp = std::env::temp_dir().join(unique("rtstar"));
    std::fs::create_dir(&tmp).unwrap();
    let name = format!("rttscope-{}-x86_64-linux", version());
    let tarball = dist.join(format!("{name}.tar.gz"));
    sh(&[
        "tar",
        "-xzf",
        tarball.to_str().unwrap(),
        "-C",
        tmp.to_str().unwrap(),
    ])
    .unwrap();
    let top = tmp.join(&name);
    let inner = sh(&[
        "sh",
        "-c",
        &format!(
            "cd {} && sha256sum -c share/doc/rttscope/SHA256SUMS",
            top.display()
        ),
    ]);
    let bin = top.join("bin/rttscope");
    let bin = bin.to_str().unwrap();
    let headers = text(&sh(&["readelf", "-lW", bin]).unwrap());
    let dynamic = text(&sh(&["readelf", "-dW", bin]).unwrap());
    let ldd = Command::new("ldd").arg(bin).output().unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    inner.expect("the tarball's SHA256SUMS holds");
    assert!(
        !headers.contains("INTERP"),
        "a program interpreter:\n{headers}"
    );
    assert!(
        !dynamic.contains("(NEEDED)"),
        "shared libraries needed:\n{dynamic}"
    );
    let ldd = text(&ldd);
    assert!(
        ldd.contains("not a dynamic executable") || ldd.contains("statically linked"),
        "ldd: {ldd}"
    );
}

/// (ii) In Debian 11 (glibc 2.31): the tarball installed by README's line,
/// `features`, and `observe` of a request/response flow between two
/// namespaces. Truth: the client's own count of transactions while the observer
/// watched; one RTT sample each on the client's side (its request acked by the
/// response), within 10% + 3.
#[test]
fn static_binary_observes_a_flow_in_bullseye() {
    if !require_root() {
        return;
    }
    let dist = dist();
    let root = Root::new(&["bullseye"]);
    let libc = root.sh("ldd --version | head -1");
    assert!(
        text(&libc).contains("2.31"),
        "not glibc 2.31: {}",
        text(&libc)
    );
    root.put(&dist.join(format!("rttscope-{}-x86_64-linux.tar.gz", version())));
    for line in readme_lines(".tar.gz") {
        root.sh(&format!("cd /tmp && {line}"));
    }
    assert!(root.dir.join("etc/rttscope/rttscope.toml").exists());
    root.sh("cd /usr/local && sha256sum --quiet -c share/doc/rttscope/SHA256SUMS");
    let features = root.command(&["rttscope", "features"]).output().unwrap();
    assert!(
        features.status.success(),
        "features in bullseye:\n{}",
        text(&features)
    );
    eprintln!("{}", text(&features));

    let p = Pair::new().unwrap();
    let server: std::net::SocketAddr = format!("{B_ADDR}:5001").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let args = [
        "--netns",
        &p.a.name,
        "--netns",
        &p.b.name,
        "--interval",
        "500ms",
        "--duration",
        "3s",
    ];
    let mut cmd = root.command(&["rttscope", "observe", "--format", "json"]);
    cmd.args(args);
    let obs = observe_json_attached_cmd(
        cmd,
        args.map(String::from).to_vec(),
        Duration::from_secs(30),
    );
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    cli.pause();
    std::thread::sleep(Duration::from_millis(200));
    let made = cli.transactions.load(std::sync::atomic::Ordering::Relaxed) as u64;
    let lines = obs.join().unwrap().unwrap();
    let flow = end_flow(&lines, &p.a.name, &cli.local.to_string())
        .unwrap_or_else(|| panic!("no client flow in the observer's end line: {lines:#?}"));
    let n = flow["tcp"]["summary"]["n"].as_u64().unwrap_or(0);
    let tol = made / 10 + 3;
    assert!(
        made > 50 && n.abs_diff(made) <= tol,
        "client flow: {n} samples for {made} transactions (tolerance {tol}): {flow}"
    );
}

/// Paths dpkg and apt change by installing and removing any package (their
/// database, logs and caches), and /run (a tmpfs on a booted host; `systemd-analyze
/// verify` writes /run/systemd/systemd-units-load): not files of the package.
fn bookkeeping(path: &str) -> bool {
    [
        "/var/lib/dpkg/",
        "/var/log/",
        "/var/cache/apt/",
        "/var/lib/apt/",
        "/var/cache/debconf/",
        "/run/",
    ]
    .iter()
    .any(|p| path.starts_with(p))
}

/// (iii) In a fresh Debian 12: the .deb installed by README's line, its files
/// where Debian keeps them, the config a conffile, the unit verified and
/// enabled by README's line; `dpkg --purge` then leaves no file behind (the
/// root's file list before and after, less dpkg's and apt's bookkeeping).
#[test]
fn deb_installs_verifies_and_purges_in_bookworm() {
    if !require_root() {
        return;
    }
    let dist = dist();
    // usr-is-merged first: apt would otherwise satisfy init-system-helpers' "usrmerge |
    // usr-is-merged" with usrmerge, and with it perl (46 MB installed, and its conversion script
    // run): a Debian 12 installation has usr-is-merged.
    let root = Root::new(&["bookworm", "usr-is-merged", "systemd"]);
    let before = root.files();
    root.put(&dist.join(format!("rttscope_{}-1_amd64.deb", version())));
    for line in readme_lines(".deb") {
        root.sh(&format!("cd /tmp && {line}"));
    }
    let listed = text(&root.sh("dpkg -L rttscope"));
    for f in [
        "/usr/bin/rttscope",
        "/lib/systemd/system/rttscope.service",
        "/etc/rttscope/rttscope.toml",
        "/usr/share/man/man1/rttscope-observe.1.gz",
        "/usr/share/bash-completion/completions/rttscope",
        "/usr/share/doc/rttscope/copyright",
    ] {
        assert!(
            listed.lines().any(|l| l == f),
            "the .deb lacks {f}:\n{listed}"
        );
    }
    let conf = text(&root.sh("dpkg-query -W -f='${Conffiles}' rttscope"));
    assert!(
        conf.contains("/etc/rttscope/rttscope.toml"),
        "conffiles: {conf}"
    );
    let v = text(&root.sh("rttscope --version"));
    assert!(v.contains(&version()), "{v}");
    let verify = root.sh("systemd-analyze verify /lib/systemd/system/rttscope.service 2>&1");
    assert!(
        text(&verify).trim().is_empty(),
        "systemd-analyze verify:\n{}",
        text(&verify)
    );
    // No systemd runs in the chroot: enabled, not started (`--now` would fail there).
    for line in readme_lines("systemctl enable") {
        root.sh(&line.replace(" --now", ""));
    }
    let wants = root
        .dir
        .join("etc/systemd/system/multi-user.target.wants/rttscope.service");
    assert!(
        wants.symlink_metadata().is_ok(),
        "not enabled: no {}",
        wants.display()
    );
    root.sh("dpkg --purge rttscope");
    let after = root.files();
    let added: Vec<&String> = after
        .iter()
        .filter(|f| !before.contains(f) && !bookkeeping(f))
        .collect();
    let removed: Vec<&String> = before
        .iter()
        .filter(|f| !after.contains(f) && !bookkeeping(f))
        .collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "dpkg --purge left {added:?} behind and took {removed:?} away"
    );
}

/// (iv) The .rpm (when rpmbuild made one): its files, its config file, and
/// no shared-library requirement.
#[test]
fn rpm_lists_what_it_installs() {
    if !require_root() {
        return;
    }
    let rpm = dist().join(format!("rttscope-{}-1.x86_64.rpm", version()));
    if !rpm.exists() {
        assert!(
            Command::new("rpmbuild").arg("--version").output().is_err(),
            "rpmbuild is installed but scripts/package.sh made no {}",
            rpm.display()
        );
        eprintln!("no rpmbuild here (Debian's rpm package): no .rpm to list");
        return;
    }
    let rpm = rpm.to_str().unwrap();
    let files = text(&sh(&["rpm", "-qpl", rpm]).unwrap());
    for f in [
        "/usr/bin/rttscope",
        "/usr/lib/systemd/system/rttscope.service",
        "/etc/rttscope/rttscope.toml",
        "/usr/share/man/man1/rttscope.1.gz",
    ] {
        assert!(
            files.lines().any(|l| l == f),
            "the .rpm lacks {f}:\n{files}"
        );
    }
    let config = text(&sh(&["rpm", "-qpc", rpm]).unwrap());
    assert_eq!(config.trim(), "/etc/rttscope/rttscope.toml");
    let requires = text(&sh(&["rpm", "-qpR", rpm]).unwrap());
    assert!(
        !requires.contains(".so"),
        "the static binary's package requires libraries:\n{requires}"
    );
}

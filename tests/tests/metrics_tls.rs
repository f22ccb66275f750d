//! `/metrics` over TLS with authentication (`--web-config-file`, Prometheus
//! exporter-toolkit's format), scraped by a real Prometheus 2.53.3 and by curl.
//!
//! Two observers: A serves TLS with a basic-auth user (its web config laid out as a
//! Kubernetes Secret volume: `web.yml -> ..data/web.yml`, `..data -> ..v1`), B serves mTLS
//! (`RequireAndVerifyClientCert`). Certificates are made at test time (rcgen, through
//! rttscope's `test-pki` feature), bcrypt hashes by the bcrypt crate. Truths: Prometheus'
//! own `up` and target health, curl's status codes and TLS errors, the times the test
//! swapped the files. Every output (observers' stdout and stderr, every /metrics body and
//! curl answer) is searched for the passwords, the hashes and the key material.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rttscope::sinks::prometheus::web::{pki, POLL_EVERY};
use rttscope_e2e::prometheus::{free_port, Prometheus};
use rttscope_e2e::*;

/// What a reload may take beyond the poll interval (a poll, the file reads, a TLS set-up).
const RELOAD_SLACK: Duration = Duration::from_millis(1500);

/// curl's answer: (exit code, HTTP status or 0, headers and body, stderr).
struct Curl {
    exit: i32,
    code: u16,
    out: String,
    err: String,
}

/// curl https://127.0.0.1:port/metrics with `args` (the test CA trusted).
fn curl(port: u16, ca: &Path, args: &[&str]) -> Curl {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(args)
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl (scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let code = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Curl {
        exit: out.status.code().unwrap_or(-1),
        code,
        out: text,
        err: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// A web config laid out as Kubernetes mounts a Secret: `web.yml -> ..data/web.yml`,
/// `..data -> ..vN`; [`SecretDir::publish`] swaps `..data` atomically (a rename).
struct SecretDir {
    dir: PathBuf,
    n: u32,
}

impl SecretDir {
    fn new(dir: PathBuf, yaml: &str) -> SecretDir {
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = SecretDir { dir, n: 0 };
        s.publish(yaml);
        std::os::unix::fs::symlink("..data/web.yml", s.path()).unwrap();
        s
    }

    fn path(&self) -> PathBuf {
        self.dir.join("web.yml")
    }

    fn publish(&mut self, yaml: &str) {
        self.n += 1;
        let v = format!("..v{}", self.n);
        std::fs::create_dir_all(self.dir.join(&v)).unwrap();
        std::fs::write(self.dir.join(&v).join("web.yml"), yaml).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&v, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

fn start_observer(port: u16, web: &Path) -> ChildGuard {
    let mut cmd = Command::new(rttscope_bin());
    cmd.arg("observe")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--web-config-file")
        .arg(web)
        .args(["--quiet", "--interval", "500ms", "--duration", "300s"]);
    ChildGuard::spawn(&mut cmd).unwrap()
}

/// Wait until `f` holds (checked every 200 ms), at most `limit`: how long it took.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    t0.elapsed()
}

/// The test's files: the PKI (the key of A readable by group 65534 only, the key of B
/// world-readable), the password files Prometheus reads.
struct Files {
    dir: PathBuf,
    pki: pki::Pki,
    key_b: PathBuf,
}

fn files() -> Files {
    let dir = std::env::temp_dir().join(unique("rtstls"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pki = pki::make(&dir).unwrap();
    let id = rttscope::sys::caps::UNPRIVILEGED_ID;
    std::os::unix::fs::chown(&pki.server_key, Some(0), Some(id)).unwrap();
    std::fs::set_permissions(&pki.server_key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let key_b = dir.join("server-b.key");
    std::fs::copy(&pki.server_key, &key_b).unwrap();
    std::fs::set_permissions(&key_b, std::fs::Permissions::from_mode(0o644)).unwrap();
    Files { dir, pki, key_b }
}

/// The secrets no output may hold: passwords, hashes, and every base64 line of the keys.
fn secrets(f: &Files, words: &[&str]) -> Vec<String> {
    let mut s: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    for k in [&f.pki.server_key, &f.pki.client_key, &f.key_b] {
        let pem = std::fs::read_to_string(k).unwrap();
        s.extend(
            pem.lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(String::from),
        );
    }
    s
}

fn assert_no_secret(what: &str, text: &str, secrets: &[String]) {
    for s in secrets {
        assert!(
            !text.contains(s.as_str()),
            "{what} holds a secret ({} bytes of it)",
            s.len()
        );
    }
}

/// Prometheus' scrape jobs: A with the password (and with a wrong one, and none), B with
/// the client certificate (and with an untrusted one).
fn scrape_configs(f: &Files, pa: u16, pb: u16) -> String {
    let ca = f.pki.ca_cert.display();
    let job = |name: &str, port: u16, extra: &str| {
        format!("  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n{extra}    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    };
    let basic = |file: &str| {
        format!(
            "    basic_auth:\n      username: prom\n      password_file: {}\n",
            f.dir.join(file).display()
        )
    };
    let cert = |c: &Path, k: &Path| {
        format!(
            "      cert_file: {}\n      key_file: {}\n",
            c.display(),
            k.display()
        )
    };
    let p = &f.pki;
    [
        job("basic", pa, &basic("password.txt")),
        job("wrong", pa, &basic("wrong.txt")),
        job("none", pa, ""),
        job("mtls", pb, &cert(&p.client_cert, &p.client_key)),
        job("untrusted", pb, &cert(&p.untrusted_cert, &p.untrusted_key)),
    ]
    .concat()
}

/// `up` of each job once every target was scraped: job -> value.
fn up_by_job(prom: &Prometheus) -> std::collections::BTreeMap<String, f64> {
    prom.query("up")
        .into_iter()
        .map(|(m, v)| (m["job"].as_str().unwrap_or("").to_string(), v))
        .collect()
}

/// The scene: two observers (A: TLS + basic auth from a Secret-style directory; B: mTLS),
/// the passwords and hashes, and every answer seen (for the secrets check).
struct Scene {
    f: Files,
    pw1: String,
    pw2: String,
    wrong: String,
    h1: String,
    h2: String,
    secret_a: SecretDir,
    pa: u16,
    pb: u16,
    obs_a: Option<ChildGuard>,
    obs_b: Option<ChildGuard>,
    seen: Vec<String>,
}

impl Scene {
    fn yaml_a(&self, h: &str) -> String {
        let p = &self.f.pki;
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  prom: {h}\n",
            p.server_cert.display(),
            p.server_key.display()
        )
    }

    /// Files, then both observers started and serving.
    fn start() -> Scene {
        let f = files();
        let tag = std::process::id();
        let (pw1, pw2, wrong) = (
            format!("first-{tag}-pw"),
            format!("second-{tag}-pw"),
            format!("wrong-{tag}-pw"),
        );
        let (h1, h2) = (
            bcrypt::hash(&pw1, 10).unwrap(),
            bcrypt::hash(&pw2, 10).unwrap(),
        );
        let secret_a = SecretDir::new(f.dir.join("a"), "");
        let mut s = Scene {
            f,
            pw1,
            pw2,
            wrong,
            h1,
            h2,
            secret_a,
            pa: free_port(),
            pb: free_port(),
            obs_a: None,
            obs_b: None,
            seen: Vec::new(),
        };
        let yaml = s.yaml_a(&s.h1);
        s.secret_a.publish(&yaml);
        let web_b = s.f.dir.join("web-b.yml");
        std::fs::write(
            &web_b,
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server-b.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS12\n",
        )
        .unwrap();
        std::fs::write(s.f.dir.join("password.txt"), &s.pw1).unwrap();
        std::fs::write(s.f.dir.join("wrong.txt"), &s.wrong).unwrap();
        s.obs_a = Some(start_observer(s.pa, &s.secret_a.path()));
        s.obs_b = Some(start_observer(s.pb, &web_b));
        let user1 = s.user(&s.pw1);
        until(Duration::from_secs(20), "observer A serves", || {
            s.curl_a(&["-u", &user1]).code == 200
        });
        until(Duration::from_secs(20), "observer B serves", || {
            s.curl_b(&s.cert_args(true)).code == 200
        });
        s
    }

    fn user(&self, pw: &str) -> String {
        format!("prom:{pw}")
    }

    fn curl_a(&self, args: &[&str]) -> Curl {
        curl(self.pa, &self.f.pki.ca_cert, args)
    }

    fn curl_b(&self, args: &[String]) -> Curl {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(self.pb, &self.f.pki.ca_cert, &args)
    }

    /// curl's client-certificate arguments: the CA's client certificate, or an untrusted one.
    fn cert_args(&self, trusted: bool) -> Vec<String> {
        let p = &self.f.pki;
        let (c, k) = if trusted {
            (&p.client_cert, &p.client_key)
        } else {
            (&p.untrusted_cert, &p.untrusted_key)
        };
        vec![
            "--cert".to_string(),
            c.display().to_string(),
            "--key".into(),
            k.display().to_string(),
        ]
    }

    /// Prometheus: the two good jobs up, the three others down, each for its reason.
    fn prometheus_sees_two_up_and_three_refused(&self) -> Prometheus {
        let prom = Prometheus::start_with(&scrape_configs(&self.f, self.pa, self.pb));
        until(
            Duration::from_secs(30),
            "Prometheus scraped every target",
            || {
                let t = prom.targets();
                t.len() == 5 && t.iter().all(|(_, h, _)| h == "up" || h == "down")
            },
        );
        std::thread::sleep(Duration::from_secs(2));
        let up = up_by_job(&prom);
        let targets = prom.targets();
        let want: [(&str, f64); 5] = [
            ("basic", 1.0),
            ("mtls", 1.0),
            ("wrong", 0.0),
            ("none", 0.0),
            ("untrusted", 0.0),
        ];
        for (job, v) in want {
            assert_eq!(
                up.get(job),
                Some(&v),
                "up{{job={job}}}: {up:?}; targets {targets:?}"
            );
        }
        for (job, _, err) in &targets {
            match job.as_str() {
                "wrong" | "none" => assert!(err.contains("401"), "{job}: {err}"),
                "untrusted" => assert!(!err.is_empty(), "{job}: no error"),
                _ => assert!(err.is_empty(), "{job}: {err}"),
            }
        }
        let scraped = prom.query("process_cpu_seconds_total");
        let jobs: Vec<&str> = scraped
            .iter()
            .filter_map(|(m, _)| m["job"].as_str())
            .collect();
        assert!(
            jobs.contains(&"basic") && jobs.contains(&"mtls"),
            "{scraped:?}"
        );
        prom
    }

    /// curl: the same refusals, seen raw.
    fn curl_sees_the_same_refusals(&mut self) {
        let pa = self.pa;
        let none = self.curl_a(&[]);
        assert_eq!(none.code, 401, "{}", none.out);
        assert!(
            none.out
                .to_ascii_lowercase()
                .contains("www-authenticate: basic"),
            "{}",
            none.out
        );
        let bad = self.curl_a(&["-u", &self.user(&self.wrong)]);
        assert_eq!(bad.code, 401, "{}", bad.out);
        let ok = self.curl_a(&["-u", &self.user(&self.pw1)]);
        assert!(ok.code == 200 && ok.out.contains("rttscope_"), "{}", ok.out);
        let plain = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                &format!("http://127.0.0.1:{pa}/metrics"),
            ])
            .output()
            .unwrap();
        assert!(
            !plain.status.success(),
            "plain HTTP to the TLS port was answered: {}",
            String::from_utf8_lossy(&plain.stdout)
        );
        let no_cert = self.curl_b(&[]);
        assert!(
            no_cert.exit != 0 && no_cert.code == 0,
            "mTLS without a certificate: {} {}",
            no_cert.out,
            no_cert.err
        );
        let intruder = self.curl_b(&self.cert_args(false));
        assert!(
            intruder.exit != 0 && intruder.code == 0,
            "untrusted certificate: {} {}",
            intruder.out,
            intruder.err
        );
        let b_ok = self.curl_b(&self.cert_args(true));
        assert_eq!(b_ok.code, 200, "{}", b_ok.err);
        self.seen.extend([
            none.out,
            bad.out,
            ok.out,
            b_ok.out,
            no_cert.err,
            intruder.err,
        ]);
    }

    /// A new password, by a Secret-style symlink swap: in force within the poll interval.
    fn a_new_password_is_in_force_without_restart(&mut self, prom: &Prometheus) {
        let yaml = self.yaml_a(&self.h2);
        self.secret_a.publish(&yaml);
        let user2 = self.user(&self.pw2);
        let took = until(POLL_EVERY + RELOAD_SLACK, "the new password works", || {
            self.curl_a(&["-u", &user2]).code == 200
        });
        let old = self.curl_a(&["-u", &self.user(&self.pw1)]);
        assert_eq!(
            old.code, 401,
            "the old password after the change: {}",
            old.out
        );
        eprintln!("new password in force {took:?} after the swap (poll every {POLL_EVERY:?})");
        std::fs::write(self.f.dir.join("password.txt"), &self.pw2).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            up_by_job(prom).get("basic"),
            Some(&1.0),
            "Prometheus with the new password: {:?}",
            prom.targets()
        );
        self.seen.push(old.out);
    }

    /// A broken file: the previous config stays, counted, one warning.
    fn a_broken_file_keeps_the_previous_config(&mut self) {
        self.secret_a.publish("tls_server_config: [\n");
        std::thread::sleep(POLL_EVERY + RELOAD_SLACK);
        let still = self.curl_a(&["-u", &self.user(&self.pw2)]);
        assert_eq!(still.code, 200, "after a broken file: {}", still.out);
        for series in [
            "rttscope_web_config_reloads_total{result=\"success\"} 1",
            "rttscope_web_config_reloads_total{result=\"failure\"} 1",
            "rttscope_metrics_refused_total{reason=\"unauthorized\"}",
        ] {
            assert!(still.out.contains(series), "{series}: {}", still.out);
        }
        self.seen.push(still.out);
    }

    /// Both observers stopped: what they said, and no secret anywhere.
    fn stop_and_check_what_was_said(mut self) {
        let pa = self.pa;
        let out_a = stop(self.obs_a.take().unwrap());
        let out_b = stop(self.obs_b.take().unwrap());
        let err_a = String::from_utf8_lossy(&out_a.stderr).to_string();
        let err_b = String::from_utf8_lossy(&out_b.stderr).to_string();
        assert!(
            err_a.contains(&format!("serving /metrics on https://127.0.0.1:{pa}/metrics (https, no client certificates, basic auth (1 user))")),
            "{err_a}"
        );
        assert!(
            err_b.contains("client certificates required and verified"),
            "{err_b}"
        );
        // The reload above read the new file and the 0640 key as the daemon's uid after attach.
        assert!(err_a.contains("running as uid 65534"), "{err_a}");
        let count = |text: &str, what: &str| text.matches(what).count();
        assert_eq!(
            count(&err_a, "cannot be used"),
            1,
            "one warning for the broken file: {err_a}"
        );
        assert_eq!(count(&err_a, "can be read by every user"), 0, "{err_a}");
        assert_eq!(
            count(&err_b, "can be read by every user"),
            1,
            "one warning for B's 0644 key: {err_b}"
        );
        assert!(
            !err_a.contains("warning: /metrics on"),
            "loopback: no exposure warning: {err_a}"
        );
        let words = [&self.pw1, &self.pw2, &self.wrong, &self.h1, &self.h2];
        let secrets = secrets(&self.f, &words.map(String::as_str));
        for (what, text) in [
            ("observer A stderr", err_a.as_str()),
            ("observer B stderr", err_b.as_str()),
            ("observer A stdout", &String::from_utf8_lossy(&out_a.stdout)),
            ("observer B stdout", &String::from_utf8_lossy(&out_b.stdout)),
        ] {
            assert_no_secret(what, text, &secrets);
        }
        for (i, text) in self.seen.iter().enumerate() {
            assert_no_secret(&format!("answer {i}"), text, &secrets);
        }
        let _ = std::fs::remove_dir_all(&self.f.dir);
    }
}

#[test]
fn prometheus_scrapes_over_tls_with_basic_auth_and_mtls_and_the_rest_is_refused() {
    if !require_root() {
        return;
    }
    let mut scene = Scene::start();
    let prom = scene.prometheus_sees_two_up_and_three_refused();
    scene.curl_sees_the_same_refusals();
    scene.a_new_password_is_in_force_without_restart(&prom);
    scene.a_broken_file_keeps_the_previous_config();
    drop(prom);
    scene.stop_and_check_what_was_said();
}

/// SIGTERM, then the observer's output (it must exit by itself, successfully).
fn stop(g: ChildGuard) -> std::process::Output {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(g.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let out = g.wait_output(Duration::from_secs(20)).unwrap();
    assert!(
        out.status.success(),
        "observer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

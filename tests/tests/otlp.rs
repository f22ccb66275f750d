//! OTLP the way OpenTelemetry configures it, against a real Prometheus 2.53.3 whose OTLP
//! receiver sits behind TLS and basic auth (its own `--web.config.file`, exporter-toolkit's
//! format; certificates made here with rcgen, the password's bcrypt hash with the bcrypt
//! crate): pushed over https:// with an `Authorization` header, configured once by flags and
//! once only by `OTEL_EXPORTER_OTLP_*` variables; with mTLS; a wrong header refused. Truth:
//! the raw samples observe printed, against the count of the exponential histogram that
//! arrived. And receivers that never answer, refuse, or drop SYNs: the intervals still come
//! on time, drops are counted, and observe exits within 3 s of SIGTERM and of the end of
//! `--duration` (measured and printed). Every output is searched for the secrets.
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use rttscope_e2e::prometheus::{Prometheus, WebAccess};
use rttscope_e2e::*;

const PORT: u16 = 5311;
/// The longest exit observe may take after SIGTERM or the end of --duration.
const EXIT_BOUND: Duration = Duration::from_secs(3);

/// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    dir: tempfile_dir::Dir,
    ca_pem: String,
    client: (String, String),
}

mod tempfile_dir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        let dir = std::env::temp_dir().join(unique("rtsotlp-pki"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "rttscope test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let leaf = |san: &str, usage: ExtendedKeyUsagePurpose| {
            let mut p = CertificateParams::new(vec![san.to_string()]).unwrap();
            p.extended_key_usages = vec![usage];
            p.distinguished_name.push(DnType::CommonName, san);
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let server = leaf("127.0.0.1", ExtendedKeyUsagePurpose::ServerAuth);
        let client = leaf("rttscope-client", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("ca.pem", &ca_cert.pem());
        write("server.pem", &server.0);
        write("server.key", &server.1);
        write("client.pem", &client.0);
        write("client.key", &client.1);
        Pki {
            ca_pem: ca_cert.pem(),
            client,
            dir: tempfile_dir::Dir(dir),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// Prometheus' web config: TLS with this server certificate, the user's bcrypt hash, and
    /// client certificates of this CA required when `mtls`.
    fn web_config(&self, user: &str, password: &str, mtls: bool) -> String {
        let hash = bcrypt::hash(password, 4).unwrap();
        let mut y = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            self.arg("server.pem"),
            self.arg("server.key")
        );
        if mtls {
            y += &format!(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
                self.arg("ca.pem")
            );
        }
        y + &format!("basic_auth_users:\n  {user}: '{hash}'\n")
    }
}

/// Prometheus behind TLS and basic auth (and mTLS): (it, the password).
fn secure_prometheus(pki: &Pki, mtls: bool) -> (Prometheus, String) {
    let password = format!("pw-{}", unique("secret"));
    let web = WebAccess {
        ca_pem: pki.ca_pem.clone(),
        user: "rttscope".into(),
        password: password.clone(),
        client: mtls.then(|| pki.client.clone()),
    };
    let yaml = pki.web_config("rttscope", &password, mtls);
    (Prometheus::start_web("", Some((&yaml, web))), password)
}

fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// A running observer whose standard output lines are stamped as they arrive.
struct Observer {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    stdout: Option<std::thread::JoinHandle<()>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Observer {
    /// `rttscope observe ARGS` with exactly these OTEL_* variables.
    fn spawn(args: &[String], env: &[(&str, String)]) -> Observer {
        let mut cmd = Command::new(rttscope_bin());
        cmd.arg("observe").args(args);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, l2) = (child.stdout.take().unwrap(), lines.clone());
        let stdout = std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                l2.lock().unwrap().push((Instant::now(), line));
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            s
        });
        Observer {
            child,
            lines,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// Wait until `n` lines of this record type have arrived (the start record: attached).
    fn wait_for(&mut self, kind: &str, n: usize, timeout: Duration) {
        let t0 = Instant::now();
        while self.records(kind).len() < n {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "observer exited ({st}): {}",
                    self.stderr.take().unwrap().join().unwrap()
                );
            }
            assert!(
                t0.elapsed() < timeout,
                "no {n} {kind} records within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The records of a type, with their arrival times.
    fn records(&self, kind: &str) -> Vec<(Instant, serde_json::Value)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(t, l)| Some((*t, serde_json::from_str::<serde_json::Value>(l).ok()?)))
            .filter(|(_, v)| v["type"] == kind)
            .collect()
    }

    /// Wait for the exit (at most `timeout`): when it was seen, and what was printed.
    fn exit(mut self, timeout: Duration) -> Exited {
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "observer still running {timeout:?} later: {}",
                    self.stderr.take().unwrap().join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let at = Instant::now();
        self.stdout.take().unwrap().join().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        assert!(status.success(), "observer failed ({status}): {stderr}");
        let stdout = self
            .lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.1.clone() + "\n")
            .collect();
        Exited {
            at,
            stdout,
            stderr,
            observer: self,
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Exited {
    at: Instant,
    stdout: String,
    stderr: String,
    observer: Observer,
}

impl Exited {
    /// "N dropped in all" of the exit line.
    fn dropped(&self) -> u64 {
        let line = self
            .stderr
            .lines()
            .find(|l| l.contains("OTLP at exit"))
            .unwrap_or_else(|| panic!("no exit line: {}", self.stderr));
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "dropped").unwrap();
        words[at - 1].parse().unwrap()
    }

    fn assert_no_secret(&self, secrets: &[&str]) {
        for s in secrets {
            assert!(
                !self.stdout.contains(s) && !self.stderr.contains(s),
                "a secret was printed: {}",
                self.stderr
            );
        }
    }
}

/// Observe the pair's flows for 6 s, pushing OTLP every second, while a client runs 3 s of
/// requests (then stops, so the last read holds every sample); returns the output and the
/// count of raw TCP samples printed.
fn observe_traffic(p: &Pair, extra: &[String], env: &[(&str, String)]) -> (Exited, u64) {
    let mut args: Vec<String> = [
        "--netns",
        &p.a.name,
        "--netns",
        &p.b.name,
        "--port",
        &PORT.to_string(),
        "--interval",
        "1s",
        "--duration",
        "6s",
        "--format",
        "json",
        "--raw",
        "--otlp-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend_from_slice(extra);
    let mut o = Observer::spawn(&args, env);
    o.wait_for("start", 1, Duration::from_secs(30));
    let addr: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let client = RrClient::start(&p.a, addr, 100, Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    drop(client);
    let out = o.exit(Duration::from_secs(30));
    let lines = parse_lines(out.stdout.as_bytes()).unwrap();
    let c = last_interval_counters(&lines, "tcp");
    assert_eq!(c["raw_events_dropped"], 0, "raw stream complete: {c}");
    let raw = lines
        .iter()
        .filter(|l| l["type"] == "sample" && l["view"] == "tcp")
        .count() as u64;
    assert!(raw > 50, "only {raw} raw samples: {}", out.stderr);
    (out, raw)
}

/// The count of the pushed RTT histogram of service `svc` equals the raw samples: the last
/// state observe had arrived.
fn assert_arrived(prom: &Prometheus, svc: &str, raw: u64, out: &Exited) {
    let q = format!(
        "sum(histogram_count(rttscope_rtt_seconds{{job=\"{svc}\",rttscope_view=\"tcp\"}}))"
    );
    let got = prom.query(&q).first().map(|r| r.1).unwrap_or(0.0);
    eprintln!("{svc}: Prometheus holds {got} samples, observe printed {raw} raw samples");
    assert_eq!(
        got, raw as f64,
        "{q}: {got} vs {raw} raw samples\nstderr: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("the last request delivered"),
        "{}",
        out.stderr
    );
}

#[test]
fn otlp_over_tls_with_basic_auth_by_flags_by_environment_and_refused() {
    if !require_root() {
        return;
    }
    let pki = Pki::new();
    let (prom, password) = secure_prometheus(&pki, false);
    let good = basic("rttscope", &password);
    let wrong_password = format!("wrong-{}", unique("pw"));
    let wrong = basic("rttscope", &wrong_password);
    let secrets = [password.as_str(), &good, &wrong_password, &wrong];
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, format!("{B_ADDR}:{PORT}").parse().unwrap(), 100).unwrap();
    let url = format!("https://127.0.0.1:{}/api/v1/otlp/v1/metrics", prom.port);

    // By flags (gzip bodies).
    let svc = unique("rtsflags");
    let flags: Vec<String> = [
        "--otlp",
        &url,
        "--otlp-ca-file",
        &pki.arg("ca.pem"),
        "--otlp-header",
        &format!("Authorization=Basic {good}"),
        "--otlp-compression",
        "gzip",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (out, raw) = observe_traffic(&p, &flags, &[("OTEL_SERVICE_NAME", svc.clone())]);
    assert!(
        out.stderr.contains("headers Authorization") && out.stderr.contains("https://127.0.0.1"),
        "{}",
        out.stderr
    );
    assert_arrived(&prom, &svc, raw, &out);
    out.assert_no_secret(&secrets);

    // Only by the environment: bare --otlp; the generic endpoint gets /v1/metrics appended;
    // the header's space URL-encoded.
    let svc = unique("rtsenv");
    let env = [
        ("OTEL_SERVICE_NAME", svc.clone()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://127.0.0.1:{}/api/v1/otlp", prom.port),
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("Authorization=Basic%20{good}"),
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.arg("ca.pem")),
        ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip".into()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "5000".into()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
    ];
    let (out, raw) = observe_traffic(&p, &["--otlp".to_string()], &env);
    assert_arrived(&prom, &svc, raw, &out);
    out.assert_no_secret(&secrets);

    // A wrong password: 401, said once (without the secret), counted, nothing stored.
    let svc = unique("rtswrong");
    let mut args: Vec<String> = flags.clone();
    args[5] = format!("Authorization=Basic {wrong}");
    args.extend(
        [
            "--duration",
            "4s",
            "--interval",
            "500ms",
            "--otlp-interval",
            "500ms",
            "--port",
            "9",
        ]
        .map(String::from),
    );
    let o = Observer::spawn(&args, &[("OTEL_SERVICE_NAME", svc.clone())]);
    let out = o.exit(Duration::from_secs(30));
    let said = out.stderr.matches("failed (http_401)").count();
    assert_eq!(said, 1, "said once: {}", out.stderr);
    assert!(out.dropped() >= 5, "every request dropped: {}", out.stderr);
    out.assert_no_secret(&secrets);
    let stored = prom.series(&format!("{{job=\"{svc}\"}}"));
    assert!(stored.is_empty(), "{stored:?}");
    eprintln!(
        "wrong header: {}",
        out.stderr
            .lines()
            .filter(|l| l.contains("OTLP"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn otlp_with_a_client_certificate_when_prometheus_requires_one() {
    if !require_root() {
        return;
    }
    let pki = Pki::new();
    let (prom, password) = secure_prometheus(&pki, true);
    let good = basic("rttscope", &password);
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, format!("{B_ADDR}:{PORT}").parse().unwrap(), 100).unwrap();
    let url = format!("https://127.0.0.1:{}/api/v1/otlp/v1/metrics", prom.port);
    let svc = unique("rtsmtls");
    let args: Vec<String> = [
        "--otlp",
        &url,
        "--otlp-ca-file",
        &pki.arg("ca.pem"),
        "--otlp-client-cert",
        &pki.arg("client.pem"),
        "--otlp-client-key",
        &pki.arg("client.key"),
        "--otlp-header",
        &format!("Authorization=Basic {good}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (out, raw) = observe_traffic(&p, &args, &[("OTEL_SERVICE_NAME", svc.clone())]);
    assert_arrived(&prom, &svc, raw, &out);
    out.assert_no_secret(&[&password, &good]);
    // Without the client certificate: the handshake fails, counted, nothing stored.
    let svc = unique("rtsnocert");
    let mut args = args;
    args.drain(4..8);
    args.extend(["--duration", "3s", "--port", "9"].map(String::from));
    let out =
        Observer::spawn(&args, &[("OTEL_SERVICE_NAME", svc.clone())]).exit(Duration::from_secs(30));
    assert!(out.dropped() >= 1, "{}", out.stderr);
    assert!(out.stderr.contains("failed ("), "{}", out.stderr);
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains("OTLP")).collect();
    eprintln!("without the client certificate:\n{}", said.join("\n"));
    assert!(prom.series(&format!("{{job=\"{svc}\"}}")).is_empty());
    out.assert_no_secret(&[&password, &good]);
}

/// A receiver that accepts and never answers, one that refuses, one whose SYNs are dropped
/// (a listener with a full accept queue).
fn bad_receivers() -> Vec<(&'static str, String, Box<dyn std::any::Any>)> {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s_addr = silent.local_addr().unwrap();
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let r_addr = refused.local_addr().unwrap();
    drop(refused);
    let full = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    full.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    full.listen(0).unwrap();
    let f_addr = full.local_addr().unwrap().as_socket().unwrap();
    let filler = std::net::TcpStream::connect(f_addr).unwrap();
    vec![
        ("silent", format!("http://{s_addr}"), Box::new(silent)),
        ("refusing", format!("http://{r_addr}"), Box::new(())),
        (
            "dropping SYNs",
            format!("http://{f_addr}"),
            Box::new((full, filler)),
        ),
    ]
}

#[test]
fn bad_receivers_never_delay_reads_nor_the_exit() {
    if !require_root() {
        return;
    }
    let common = |url: &str| -> Vec<String> {
        [
            "--port",
            "9",
            "--interval",
            "500ms",
            "--format",
            "json",
            "--otlp",
            url,
            "--otlp-interval",
            "500ms",
        ]
        .map(String::from)
        .to_vec()
    };
    let mut report = Vec::new();
    for (what, url, _keep) in bad_receivers() {
        // The end of --duration: the exit after the last interval record.
        let mut args = common(&url);
        args.extend(["--duration", "5s"].map(String::from));
        let out = Observer::spawn(&args, &[]).exit(Duration::from_secs(60));
        let ivs = out.observer.records("interval");
        let (last_at, _) = ivs.last().unwrap_or_else(|| panic!("{what}: no intervals"));
        let after_duration = out.at - *last_at;
        let lens: Vec<f64> = ivs
            .iter()
            .map(|(_, v)| v["interval_s"].as_f64().unwrap())
            .collect();
        assert!(ivs.len() >= 9, "{what}: {} intervals in 5 s", ivs.len());
        assert!(
            lens.iter().all(|l| *l < 0.75),
            "{what}: intervals late: {lens:?}"
        );
        let dropped = out.dropped();
        assert!(dropped >= 1, "{what}: {}", out.stderr);
        // SIGTERM.
        let mut o = Observer::spawn(&common(&url), &[]);
        o.wait_for("interval", 6, Duration::from_secs(30));
        let sent = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(o.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let out2 = o.exit(Duration::from_secs(60));
        let after_sigterm = out2.at - sent;
        let line = format!(
            "{what:<14} exit {:.2} s after the end of --duration, {:.2} s after SIGTERM; {} intervals of at most {:.3} s; {dropped} requests dropped",
            after_duration.as_secs_f64(),
            after_sigterm.as_secs_f64(),
            ivs.len(),
            lens.iter().cloned().fold(0.0, f64::max),
        );
        eprintln!("{line}");
        assert!(after_duration < EXIT_BOUND, "{line}\n{}", out.stderr);
        assert!(after_sigterm < EXIT_BOUND, "{line}\n{}", out2.stderr);
        report.push(line);
    }
    eprintln!("{}", report.join("\n"));
}

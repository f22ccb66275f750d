//! A real Prometheus for the end-to-end tests: upstream 2.53.3 with its OTLP receiver, which
//! scripts/setup.sh builds into /var/cache/rttscope/prometheus-otlp (`RTTSCOPE_PROMETHEUS`
//! overrides), started on a free loopback port with the test's scrape configs, and asked
//! through its HTTP API.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{unique, ChildGuard};

pub fn prometheus_bin() -> PathBuf {
    let p = std::env::var_os("RTTSCOPE_PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/rttscope/prometheus-otlp/prometheus".into());
    assert!(
        p.exists(),
        "{} missing: scripts/setup.sh builds Prometheus 2.53.3 with its OTLP receiver there",
        p.display()
    );
    p
}

/// A free loopback port (bound right after by whoever asked).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET http://127.0.0.1:port{path}: (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(status_and_body(&out))
}

/// How to reach a Prometheus behind a web config file (exporter-toolkit's): TLS trusting
/// `ca_pem`, basic auth, and a client certificate when it asks for one.
#[derive(Clone)]
pub struct WebAccess {
    pub ca_pem: String,
    pub user: String,
    pub password: String,
    /// (certificate chain, key), PEM.
    pub client: Option<(String, String)>,
}

/// GET https://127.0.0.1:port{path} with `web`'s TLS and credentials: (status, body).
pub fn https_get(port: u16, path: &str, web: &WebAccess) -> std::io::Result<(u16, String)> {
    use base64::Engine;
    use rustls_pki_types::pem::PemObject;
    let bad = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(web.ca_pem.as_bytes()) {
        roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    // ring: deprecated in rustls 0.23.48 (no post-quantum key exchange), the crate's provider
    #[allow(deprecated)]
    let ring = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(ring)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_root_certificates(roots);
    let cfg = match &web.client {
        Some((cert, key)) => {
            let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(&e))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| bad(&e))?;
            b.with_client_auth_cert(chain, key).map_err(|e| bad(&e))?
        }
        None => b.with_no_client_auth(),
    };
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").map_err(|e| bad(&e))?;
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| bad(&e))?;
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", web.user, web.password));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Basic {basic}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        // a peer that closes without close_notify: what was read is the answer
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        r => {
            r?;
        }
    }
    Ok(status_and_body(&out))
}

/// An HTTP/1 answer's status and body.
fn status_and_body(out: &[u8]) -> (u16, String) {
    let out = String::from_utf8_lossy(out).to_string();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

pub fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    pub port: u16,
    _child: ChildGuard,
    dir: PathBuf,
    web: Option<WebAccess>,
}

impl Prometheus {
    /// Start with a short scrape interval, native histograms (classic
    /// buckets kept too) and the OTLP receiver, scraping `targets`.
    pub fn start(targets: &[u16]) -> Prometheus {
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        Prometheus::start_with(&format!(
            "  - job_name: rttscope-scrape\n    scrape_classic_histograms: true\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ))
    }

    /// Start as [`Prometheus::start`] with these entries of `scrape_configs` (YAML, each
    /// line indented by two spaces).
    pub fn start_with(scrape_configs: &str) -> Prometheus {
        Prometheus::start_web(scrape_configs, None)
    }

    /// Start as [`Prometheus::start_with`], behind `web`: (its web config file, YAML in
    /// exporter-toolkit's format; how the test reaches it).
    pub fn start_web(scrape_configs: &str, web: Option<(&str, WebAccess)>) -> Prometheus {
        let port = free_port();
        let dir = std::env::temp_dir().join(unique("rtsprom"));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
        );
        std::fs::write(dir.join("prometheus.yml"), cfg).unwrap();
        let mut cmd = Command::new(prometheus_bin());
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--enable-feature=native-histograms,otlp-write-receiver")
        .arg("--log.level=warn");
        if let Some((yaml, _)) = &web {
            std::fs::write(dir.join("web.yml"), yaml).unwrap();
            cmd.arg(format!(
                "--web.config.file={}",
                dir.join("web.yml").display()
            ));
        }
        let web = web.map(|w| w.1);
        let child = ChildGuard::spawn(&mut cmd).unwrap();
        let t0 = Instant::now();
        while get(port, web.as_ref(), "/-/ready").map(|r| r.0).ok() != Some(200) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "Prometheus not ready in 30 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Prometheus {
            port,
            _child: child,
            dir,
            web,
        }
    }

    /// GET a path of its API (over TLS with credentials when it is behind a web config).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        get(self.port, self.web.as_ref(), path)
    }

    /// An instant query: the result vector as (labels, value).
    pub fn query(&self, q: &str) -> Vec<(serde_json::Value, f64)> {
        let (code, body) = self
            .get(&format!("/api/v1/query?query={}", urlencode(q)))
            .expect("query Prometheus");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("query {q}: {code} {e}: {body}"));
        assert_eq!(v["status"], "success", "query {q}: {body}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let val = r["value"][1]
                    .as_str()
                    .unwrap_or("NaN")
                    .parse()
                    .unwrap_or(f64::NAN);
                (r["metric"].clone(), val)
            })
            .collect()
    }

    /// Label names of a series selector (each metric name and label a query uses exists).
    pub fn series(&self, selector: &str) -> Vec<serde_json::Value> {
        let (_, body) = self
            .get(&format!("/api/v1/series?match[]={}", urlencode(selector)))
            .expect("series");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"].as_array().cloned().unwrap_or_default()
    }

    /// The active targets as Prometheus' API lists them: (job, health, last error).
    pub fn targets(&self) -> Vec<(String, String, String)> {
        let (_, body) = self.get("/api/v1/targets?state=active").expect("targets");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or("").to_string();
                (
                    t["labels"]["job"].as_str().unwrap_or("").to_string(),
                    s("health"),
                    s("lastError"),
                )
            })
            .collect()
    }
}

fn get(port: u16, web: Option<&WebAccess>, path: &str) -> std::io::Result<(u16, String)> {
    match web {
        Some(w) => https_get(port, path, w),
        None => http_get(port, path),
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

use super::*;

fn err(text: &str) -> String {
    let e = file::parse(text).unwrap_err();
    assert!(!e.contains('\n'), "one line: {e:?}");
    e
}

/// A temporary directory with a test PKI and a web config file `web.yml` of `yaml`.
struct Dir {
    dir: tempfile::TempDir,
    pki: pki::Pki,
}

impl Dir {
    fn new() -> Dir {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::make(dir.path()).unwrap();
        Dir { dir, pki }
    }

    fn write(&self, yaml: &str) -> PathBuf {
        let p = self.dir.path().join("web.yml");
        std::fs::write(&p, yaml).unwrap();
        p
    }
}

#[test]
fn exporter_toolkit_files_parse() {
    let f = file::parse(
        "# node_exporter's example\ntls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS12\n  max_version: TLS13\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\nbasic_auth_users:\n  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n",
    )
    .unwrap();
    let t = f.tls_server_config.unwrap();
    assert_eq!(t.client_auth_type, ClientAuth::RequireAndVerifyClientCert);
    assert_eq!(t.min_version, Some(file::TlsVersion::TLS12));
    assert_eq!(f.basic_auth_users.unwrap().len(), 1);
    assert!(file::parse("").unwrap().tls_server_config.is_none());
    assert!(file::parse("# nothing\n")
        .unwrap()
        .basic_auth_users
        .is_none());
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    let e = err("tls_server_config:\n  cert_file: a\n  certfile: b\n");
    assert!(e.starts_with("line 3: ") && e.contains("certfile"), "{e}");
    let e = err("basic_auth_users: {}\ntls_config: {}\n");
    assert!(e.starts_with("line 2: ") && e.contains("tls_config"), "{e}");
    let e = err("tls_server_config:\n  client_auth_type: Maybe\n");
    assert!(e.contains("line 2") && e.contains("Maybe"), "{e}");
    let e = err("tls_server_config: [\n");
    assert!(e.starts_with("line "), "{e}");
}

#[test]
fn a_hash_of_the_wrong_kind_is_refused_without_quoting_it() {
    let e = err("basic_auth_users:\n  bob: 123456789\n");
    assert!(e.starts_with("line 2: ") && !e.contains("123456789"), "{e}");
    let e = err("basic_auth_users:\n  bob: [hunter2]\n");
    assert!(!e.contains("hunter2"), "{e}");
    let d = Dir::new();
    let p = d.write("basic_auth_users:\n  bob: hunter2-in-clear\n");
    let e = Web::load(&p).unwrap_err().to_string();
    assert!(e.contains("'bob' is not a bcrypt hash"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}

#[test]
fn missing_and_unusable_files_are_one_sentence_naming_them() {
    let d = Dir::new();
    let k = d.pki.server_key.display().to_string();
    let c = d.pki.server_cert.display().to_string();
    for (yaml, want) in [
        (format!("tls_server_config:\n  key_file: {k}\n"), "cert_file is missing".to_string()),
        (format!("tls_server_config:\n  cert_file: {c}\n"), "key_file is missing".into()),
        (
            format!("tls_server_config:\n  cert_file: nope.pem\n  key_file: {k}\n"),
            "nope.pem: No such file or directory".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {k}\n  key_file: {k}\n"),
            "holds no PEM certificate".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {c}\n  key_file: {c}\n"),
            "holds no PEM private key".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  client_auth_type: RequireAndVerifyClientCert\n"),
            "needs client_ca_file".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  client_ca_file: ca.pem\n"),
            "client_auth_type is NoClientCert".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  max_version: TLS11\n"),
            "max_version must be TLS12 or TLS13".into(),
        ),
        (
            format!("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  min_version: TLS13\n  max_version: TLS12\n"),
            "min_version is above max_version".into(),
        ),
        (
            "http_server_config:\n  headers:\n    Server: x\n".to_string(),
            "'Server' cannot be set".into(),
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n".to_string(),
            "X-Frame-Options must be one of deny, sameorigin".into(),
        ),
    ] {
        let p = d.write(&yaml);
        let e = Web::load(&p).unwrap_err().to_string();
        assert!(e.contains(&want), "{yaml:?}: got {e:?}, want {want:?}");
        assert!(e.starts_with("web config file "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(!e.contains("PRIVATE KEY"), "{e}");
    }
    let e = Web::load(&d.dir.path().join("absent.yml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent.yml: No such file or directory"), "{e}");
}

#[test]
fn relative_paths_are_from_the_files_directory_and_every_mode_loads() {
    let d = Dir::new();
    for auth in [
        "NoClientCert",
        "RequestClientCert",
        "RequireAnyClientCert",
        "VerifyClientCertIfGiven",
        "RequireAndVerifyClientCert",
    ] {
        let ca = match auth {
            "VerifyClientCertIfGiven" | "RequireAndVerifyClientCert" => {
                "\n  client_ca_file: ca.pem"
            }
            _ => "",
        };
        let p = d.write(&format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: {auth}{ca}\n  min_version: TLS10\n"
        ));
        let w = Web::load(&p).unwrap_or_else(|e| panic!("{auth}: {e}"));
        assert!(w.current().tls.is_some(), "{auth}");
        assert_eq!(format!("{:?}", w.current().client_auth), auth);
    }
}

/// A change of content is applied at the next poll; a broken change keeps the config in
/// force (counted); the same broken content is not reported again; a fix is applied.
#[test]
fn polling_applies_changes_and_keeps_the_old_config_on_a_broken_one() {
    let d = Dir::new();
    let h1 = bcrypt::hash("one", 4).unwrap();
    let p = d.write(&format!("basic_auth_users:\n  a: {h1}\n"));
    let w = Web::load(&p).unwrap();
    assert_eq!(w.poll(), None, "nothing changed");
    assert!(w.current().tls.is_none());
    d.write(&format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  a: {h1}\n  b: {h1}\n"
    ));
    assert_eq!(w.poll(), Some(true));
    assert!(w.current().tls.is_some());
    assert_eq!(w.current().users.as_ref().unwrap().len(), 2);
    d.write("basic_auth_users:\n  a: [\n");
    assert_eq!(w.poll(), Some(false));
    assert_eq!(w.poll(), None, "the same broken content: no second warning");
    assert!(w.current().tls.is_some(), "the previous config stays");
    // A file it names changes: noticed too (a rotated certificate).
    d.write(&format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  a: {h1}\n  b: {h1}\n"
    ));
    assert_eq!(w.poll(), Some(true));
    std::fs::write(&d.pki.server_cert, "not a certificate").unwrap();
    assert_eq!(w.poll(), Some(false));
    let mut r = prometheus_client::registry::Registry::default();
    w.stats.register(&mut r);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
    assert!(
        text.contains("rttscope_web_config_reloads_total{result=\"success\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("rttscope_web_config_reloads_total{result=\"failure\"} 2"),
        "{text}"
    );
    assert!(!text.contains(&h1), "{text}");
}

#[test]
fn active_says_what_it_asks_of_clients() {
    assert_eq!(Active::plain().describe(), "http");
    assert!(!Active::plain().authenticates());
    let d = Dir::new();
    let h = bcrypt::hash("x", 4).unwrap();
    let p = d.write(&format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\nbasic_auth_users:\n  a: {h}\n"
    ));
    let w = Web::load(&p).unwrap();
    assert_eq!(
        w.current().describe(),
        "https, client certificates required and verified, basic auth (1 user)"
    );
    assert!(!format!("{w:?}").contains(&h));
}

/// A TLS client trusting the test CA, with a client certificate if given.
fn client_config(d: &Dir, cert: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&d.pki.ca_cert).unwrap())
        .unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match cert {
        Some((c, k)) => b
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(c).unwrap()],
                PrivateKeyDer::from_pem_file(k).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

/// GET /metrics over TLS with `headers`: the status line and head, or the error.
async fn tls_get(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    headers: &str,
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    let out = String::from_utf8_lossy(&out).to_string();
    Ok(out.split("\r\n\r\n").next().unwrap_or("").to_string())
}

/// The server with TLS, client certificates and basic auth: a trusted client with the
/// password is answered; no or a wrong password is 401 with `WWW-Authenticate: Basic`; an
/// untrusted or missing client certificate and plain HTTP get no HTTP answer; every
/// refusal is counted; nothing of the secrets shows in /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_basic_auth_on_loopback() {
    use super::super::http::{serve_with, ServeLimits};
    use super::super::{Exporter, LabelPolicy};
    use base64::Engine;
    let d = Dir::new();
    let hash = bcrypt::hash("pa55word", 4).unwrap();
    let p = d.write(&format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\nhttp_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\nbasic_auth_users:\n  prom: {hash}\n"
    ));
    let web = Arc::new(Web::load(&p).unwrap());
    let mut ex = Exporter::new(LabelPolicy::default()).unwrap();
    web.stats.register(ex.registry_mut());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let limits = ServeLimits {
        max_conns: 8,
        header_read_timeout: Duration::from_millis(500),
        conn_timeout: Duration::from_secs(5),
    };
    let server = tokio::spawn(serve_with(l, ex.handle(), limits, Some(web.clone())));
    let basic = |u: &str, pw: &str| {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{pw}"));
        format!("Authorization: Basic {b}\r\n")
    };
    let trusted = client_config(&d, Some((&d.pki.client_cert, &d.pki.client_key)));
    let head = tls_get(addr, trusted.clone(), &basic("prom", "pa55word"))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(head.contains("X-Content-Type-Options: nosniff"), "{head}");
    for h in [
        String::new(),
        basic("prom", "wrong"),
        basic("eve", "pa55word"),
    ] {
        let head = tls_get(addr, trusted.clone(), &h).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 401 "), "{h:?}: {head}");
        assert!(head.contains("Www-Authenticate: Basic"), "{head}");
    }
    let untrusted = client_config(&d, Some((&d.pki.untrusted_cert, &d.pki.untrusted_key)));
    let r = tls_get(addr, untrusted, &basic("prom", "pa55word")).await;
    assert!(
        r.as_ref().map_or(true, |h| h.is_empty()),
        "untrusted: {r:?}"
    );
    let r = tls_get(addr, client_config(&d, None), &basic("prom", "pa55word")).await;
    assert!(r.as_ref().map_or(true, |h| h.is_empty()), "no cert: {r:?}");
    let (code, head, _) = plain_exchange(addr).await;
    assert_eq!(code, 0, "plain HTTP to the TLS port: {head}");
    // A client that never starts its handshake is closed at the header-read timeout.
    let t0 = std::time::Instant::now();
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 8];
    let n = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::io::AsyncReadExt::read(&mut idle, &mut b),
    )
    .await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );

    ex.render();
    let metrics = String::from_utf8_lossy(&ex.handle().scrape().openmetrics).to_string();
    assert!(
        metrics.contains("rttscope_metrics_refused_total{reason=\"unauthorized\"} 3"),
        "{metrics}"
    );
    let hs = metrics
        .lines()
        .find(|l| l.starts_with("rttscope_metrics_refused_total{reason=\"tls_handshake\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let n: f64 = hs.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 4.0, "untrusted, no cert, plain HTTP, idle: {hs}");
    assert!(!metrics.contains(&hash) && !metrics.contains("pa55word"));
    server.abort();
}

/// Plain HTTP GET: (status, head, body); status 0 when no HTTP answer came.
async fn plain_exchange(addr: std::net::SocketAddr) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out).to_string();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = match head.starts_with("HTTP/") {
        true => head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        false => 0,
    };
    (code, head.to_string(), body.to_string())
}

/// The cost of a scrape over TLS against plain HTTP: 1,000 sequential scrapes (a new
/// connection each, as Prometheus makes: one request per connection) of each kind, client and
/// server in this process. A measurement, not a check (docs/metrics.md quotes it):
/// `cargo test -p rttscope --lib scrape_cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn scrape_cost_plain_tls_basic_auth_mtls() {
    use super::super::http::{serve_with, ServeLimits};
    use super::super::{Exporter, LabelPolicy};
    use base64::Engine;
    const N: usize = 1000;
    let d = Dir::new();
    let hash = bcrypt::hash("pw", 10).unwrap();
    let basic = format!(
        "Authorization: Basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode("prom:pw")
    );
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    let mtls =
        format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n");
    let ex = Exporter::new(LabelPolicy::default()).unwrap();
    ex.render();
    let body = ex.handle().scrape().text.len();
    let cases: [(&str, Option<String>, bool, &str); 4] = [
        ("plain http", None, false, ""),
        ("https", Some(tls.to_string()), false, ""),
        (
            "https + basic auth (cached)",
            Some(format!("{tls}basic_auth_users:\n  prom: {hash}\n")),
            false,
            &basic,
        ),
        ("https + client certificate", Some(mtls), true, ""),
    ];
    for (what, yaml, cert, headers) in cases {
        let web = yaml.map(|y| Arc::new(Web::load(&d.write(&y)).unwrap()));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(serve_with(
            l,
            ex.handle(),
            ServeLimits::DEFAULT,
            web.clone(),
        ));
        let cfg = client_config(
            &d,
            cert.then_some((d.pki.client_cert.as_path(), d.pki.client_key.as_path())),
        );
        let t0 = std::time::Instant::now();
        for _ in 0..N {
            let head = match &web {
                Some(_) => tls_get(addr, cfg.clone(), headers).await.unwrap(),
                None => plain_exchange(addr).await.1,
            };
            assert!(head.starts_with("HTTP/1.1 200"), "{what}: {head}");
        }
        let took = t0.elapsed();
        eprintln!(
            "{what:<28} {N} scrapes in {:.3} s: {:.3} ms each ({body} B body)",
            took.as_secs_f64(),
            took.as_secs_f64() * 1e3 / N as f64
        );
        server.abort();
    }
}

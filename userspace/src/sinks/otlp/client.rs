//! One OTLP/HTTP POST: a new connection per request (plain TCP, or TLS
//! through rustls with the system's roots or a CA file, and a client
//! certificate for mTLS), the configured headers, gzip bodies, a timeout.
//! The TLS files are read at start (before observe drops its privileges) and
//! again whenever one of them changes (a Kubernetes Secret swaps a symlink),
//! as the unprivileged user then: the previous ones are kept if that fails.
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::settings::{Compression, Endpoint, Header, Settings, TlsFiles};

/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;
/// How much of an error answer's body a message quotes.
const BODY_QUOTE: usize = 160;

/// Why a request failed: `cause` is the counter's label, `why` one sentence
/// (never a header's value); `retryable`: a connection error, a timeout or
/// 429/502/503/504, worth another try after a backoff (at least
/// `retry_after` when the receiver said so).
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub cause: String,
    pub why: String,
    pub retryable: bool,
    pub retry_after: Option<Duration>,
}

impl Failure {
    pub fn retryable(cause: &str, why: impl Into<String>) -> Failure {
        Failure {
            cause: cause.into(),
            why: why.into(),
            retryable: true,
            retry_after: None,
        }
    }
}

/// The HTTP statuses after which OTLP asks for a retry.
pub fn retryable_status(code: u16) -> bool {
    matches!(code, 429 | 502 | 503 | 504)
}

/// `Retry-After`: seconds, or an HTTP date (`now`: the wall clock).
pub fn retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A file's identity and version: a change of any is a new file.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stamp(u64, u64, i64, i64, u64);

fn stamp(p: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(p).ok()?;
    Some(Stamp(m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

/// TLS: the files, their stamps when read, the connector built from them.
struct Tls {
    files: TlsFiles,
    stamps: Vec<Option<Stamp>>,
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    reload_failed: bool,
}

impl Tls {
    fn new(files: &TlsFiles, host: &str) -> Result<Tls> {
        let name = ServerName::try_from(host)
            .map_err(|_| anyhow!("'{host}' is not a TLS server name"))?
            .to_owned();
        warn_if_world_readable(files.client_key.as_deref());
        Ok(Tls {
            stamps: stamps(files),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client_config(files)?)),
            files: files.clone(),
            name,
            reload_failed: false,
        })
    }

    /// Re-read the files if one changed; keep the previous ones if they cannot be.
    fn reload_if_changed(&mut self) {
        let now = stamps(&self.files);
        if now == self.stamps {
            return;
        }
        match client_config(&self.files) {
            Ok(c) => {
                self.connector = tokio_rustls::TlsConnector::from(Arc::new(c));
                self.stamps = now;
                self.reload_failed = false;
                eprintln!("rttscope: OTLP: TLS certificate or key file changed: re-read");
            }
            Err(e) if !self.reload_failed => {
                self.reload_failed = true;
                eprintln!(
                    "rttscope: OTLP: a TLS file changed but cannot be read ({}); keeping the previous ones (said once until it can)",
                    crate::error::sentence(&e)
                );
            }
            Err(_) => {}
        }
    }
}

fn stamps(f: &TlsFiles) -> Vec<Option<Stamp>> {
    [&f.ca_file, &f.client_cert, &f.client_key]
        .iter()
        .map(|p| p.as_deref().and_then(stamp))
        .collect()
}

/// One warning for a key file every user can read.
fn warn_if_world_readable(key: Option<&Path>) {
    let Some(k) = key else { return };
    if std::fs::metadata(k).is_ok_and(|m| m.mode() & 0o004 != 0) {
        eprintln!(
            "rttscope: warning: the OTLP client key {} is readable by every user: make it mode 0640 (group 65534 keeps it readable after observe switches to uid 65534)",
            crate::analysis::input::escape_for_terminal(&k.display().to_string())
        );
    }
}

fn read_pem(p: &Path, what: &str) -> Result<String> {
    crate::sys::files::read_to_string_capped(p, MAX_PEM_BYTES).with_context(|| {
        format!(
            "{what} {}",
            crate::analysis::input::escape_for_terminal(&p.display().to_string())
        )
    })
}

/// rustls' ring provider: the crypto every branch builds with (no aws-lc). rustls 0.23.48
/// deprecated it for lacking post-quantum key exchange, which ring does not offer.
#[allow(deprecated)]
fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// rustls' client configuration of `files` (ring; TLS 1.2 and 1.3; HTTP/1.1).
/// Errors name the file and never quote what is in it.
pub fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("TLS: {e}"))?
        .with_root_certificates(roots(files.ca_file.as_deref())?);
    let mut cfg = match (&files.client_cert, &files.client_key) {
        (Some(c), Some(k)) => {
            let key = read_pem(k, "the OTLP client key")?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|_| {
                anyhow!(
                    "the OTLP client key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
                    k.display()
                )
            })?;
            builder
                .with_client_auth_cert(certs(c, "the OTLP client certificate")?, key)
                .map_err(|e| anyhow!("the OTLP client certificate and key: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

fn certs(p: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let text = read_pem(p, what)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow!("{what} {}: not PEM certificates", p.display()))?;
    if certs.is_empty() {
        bail!("{what} {}: no PEM certificate in it", p.display());
    }
    Ok(certs)
}

/// The CA file's certificates, else the system's.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    match ca_file {
        Some(p) => {
            for c in certs(p, "the OTLP CA file")? {
                store
                    .add(c)
                    .map_err(|e| anyhow!("the OTLP CA file {}: {e}", p.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                bail!("no trusted CA certificates found on this system (ca-certificates, SSL_CERT_FILE): give --otlp-ca-file or OTEL_EXPORTER_OTLP_CERTIFICATE");
            }
        }
    }
    Ok(store)
}

/// The client: where, with what, how long.
pub struct Client {
    endpoint: Endpoint,
    headers: Vec<Header>,
    timeout: Duration,
    compression: Compression,
    tls: Option<Tls>,
}

impl Client {
    /// Reads the TLS files now: a missing or bad one is an error at start.
    pub fn new(s: &Settings) -> Result<Client> {
        let tls = match s.endpoint.tls {
            true => Some(Tls::new(&s.tls, &s.endpoint.host)?),
            false => None,
        };
        Ok(Client {
            endpoint: s.endpoint.clone(),
            headers: s.headers.clone(),
            timeout: s.timeout,
            compression: s.compression,
            tls,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The request body as sent (gzip when asked).
    pub fn encode(&self, body: Vec<u8>) -> Bytes {
        use std::io::Write;
        if self.compression == Compression::None {
            return Bytes::from(body);
        }
        let mut z = flate2::write::GzEncoder::new(
            Vec::with_capacity(body.len() / 4),
            flate2::Compression::default(),
        );
        // writing into a Vec cannot fail
        let _ = z.write_all(&body);
        Bytes::from(z.finish().unwrap_or_default())
    }

    fn request(&self, body: Bytes) -> Result<hyper::Request<Full<Bytes>>, Failure> {
        use hyper::header::{HeaderName, HeaderValue};
        let mut b = hyper::Request::post(self.endpoint.path.as_str())
            .header(hyper::header::HOST, self.endpoint.host_header.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                hyper::header::USER_AGENT,
                concat!("rttscope/", env!("CARGO_PKG_VERSION")),
            );
        if self.compression == Compression::Gzip {
            b = b.header(hyper::header::CONTENT_ENCODING, "gzip");
        }
        for h in &self.headers {
            // both checked by Header::new
            let (Ok(n), Ok(mut v)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_str(h.value()),
            ) else {
                continue;
            };
            v.set_sensitive(true);
            b = b.header(n, v);
        }
        b.body(Full::new(body))
            .map_err(|e| Failure::retryable("io", e.to_string()))
    }

    /// POST one body (as [`Client::encode`] made it), within the timeout.
    pub async fn post(&mut self, body: &Bytes) -> Result<(), Failure> {
        if let Some(t) = self.tls.as_mut() {
            t.reload_if_changed();
        }
        let req = self.request(body.clone())?;
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::retryable(
                "timeout",
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }

    async fn exchange(&self, req: hyper::Request<Full<Bytes>>) -> Result<(), Failure> {
        let tcp = tokio::net::TcpStream::connect(&self.endpoint.authority)
            .await
            .map_err(|e| Failure::retryable("connect", e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let res = match &self.tls {
            None => send(tcp, req).await?,
            Some(t) => {
                let s = t
                    .connector
                    .connect(t.name.clone(), tcp)
                    .await
                    .map_err(|e| Failure::retryable("tls", e.to_string()))?;
                send(s, req).await?
            }
        };
        self.answer(res).await
    }

    /// 2xx: delivered; else a failure quoting the start of the answer.
    async fn answer(&self, res: hyper::Response<hyper::body::Incoming>) -> Result<(), Failure> {
        let code = res.status();
        if code.is_success() {
            return Ok(());
        }
        let after = res
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, SystemTime::now()));
        let body = http_body_util::Limited::new(res.into_body(), 16 << 10)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(Failure {
            cause: format!("http_{}", code.as_u16()),
            why: format!("answered {code}{}", self.quote(&body)),
            retryable: retryable_status(code.as_u16()),
            retry_after: after,
        })
    }

    /// The start of an answer's body for a message: one line, escaped, any
    /// header value in it (a receiver that echoes the request) hidden.
    fn quote(&self, body: &[u8]) -> String {
        let mut text = String::from_utf8_lossy(body)
            .trim()
            .replace(['\n', '\r'], " ");
        for h in &self.headers {
            if !h.value().is_empty() {
                text = text.replace(h.value(), "<secret>");
            }
        }
        if text.is_empty() {
            return String::new();
        }
        format!(
            ": {}",
            crate::analysis::input::quote_input_max(&text, BODY_QUOTE)
        )
    }
}

/// HTTP/1.1 over `io`: send `req`, return the answer's head.
async fn send<T>(
    io: T,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, Failure>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| Failure::retryable("io", e.to_string()))?;
    tokio::spawn(conn);
    send.send_request(req)
        .await
        .map_err(|e| Failure::retryable("io", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(30)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
        for c in [429, 502, 503, 504] {
            assert!(retryable_status(c));
        }
        for c in [400, 401, 403, 404, 413, 500] {
            assert!(!retryable_status(c));
        }
    }

    #[test]
    fn gzip_bodies_decode_to_the_request() {
        use std::io::Read;
        let mut s = Settings::resolve(
            &super::super::settings::Given {
                endpoint: "http://127.0.0.1:1",
                compression: Some(Compression::Gzip),
                ..Default::default()
            },
            &|_: &str| None,
        )
        .unwrap();
        let body: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let z = Client::new(&s).unwrap().encode(body.clone());
        assert!(z.len() < body.len() / 10, "{} bytes", z.len());
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, body);
        s.compression = Compression::None;
        assert_eq!(Client::new(&s).unwrap().encode(body.clone()), body);
    }

    #[test]
    fn bad_tls_files_are_one_sentence_without_their_content() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IGtleSBtYXRlcmlhbA==\n";
        std::fs::write(&key, secret).unwrap();
        let files = TlsFiles {
            ca_file: Some(dir.path().join("missing.pem")),
            ..Default::default()
        };
        let e = client_config(&files).unwrap_err();
        let e = crate::error::sentence(&e);
        assert!(e.contains("missing.pem") && !e.contains('\n'), "{e}");
        let files = TlsFiles {
            ca_file: Some(key.clone()),
            client_cert: Some(key.clone()),
            client_key: Some(key.clone()),
        };
        let e = crate::error::sentence(&client_config(&files).unwrap_err());
        assert!(!e.contains("c2VjcmV0") && !e.contains('\n'), "{e}");
    }
}

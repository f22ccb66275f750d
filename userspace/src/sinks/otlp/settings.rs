//! Where and how OTLP is pushed: `observe`'s flags and TOML keys, and under
//! them the OpenTelemetry environment (`OTEL_EXPORTER_OTLP_*`, each
//! `OTEL_EXPORTER_OTLP_METRICS_*` variant winning over the generic one, as
//! the OTLP exporter specification says). Header values are secrets: they are
//! never printed ([`Header`]'s `Debug`, every error names the header, never
//! its value).
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};

/// A request not answered within this time fails (cause `timeout`): the
/// specification's default of `OTEL_EXPORTER_OTLP_TIMEOUT`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The specification's default endpoint (OTLP/HTTP).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// Request body compression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// Where to send: scheme, host, port and path of an `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub tls: bool,
    /// The host (an IPv6 address without its brackets): the TLS server name.
    pub host: String,
    /// `HOST:PORT` to connect to (IPv6 in brackets).
    pub authority: String,
    /// The `Host` header: the authority as written (no port when it was left out).
    pub host_header: String,
    pub path: String,
}

/// How a URL without a path is completed.
#[derive(Clone, Copy, PartialEq)]
enum NoPath {
    /// `--otlp`: OTLP's `/v1/metrics` (a Collector's `http://HOST:4318`).
    Metrics,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`: used as is, the root `/`.
    Root,
}

impl Endpoint {
    /// `--otlp URL`: `http[s]://HOST[:PORT][/PATH]`; no path (or `/`) means the
    /// OTLP default `/v1/metrics`; no port means 80 or 443.
    pub fn parse(url: &str) -> Result<Endpoint> {
        Endpoint::parse_as(url, "--otlp", NoPath::Metrics)
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the base URL, `v1/metrics` appended to its path.
    fn parse_base(url: &str, from: &str) -> Result<Endpoint> {
        let mut e = Endpoint::parse_as(url, from, NoPath::Root)?;
        if !e.path.ends_with('/') {
            e.path.push('/');
        }
        e.path.push_str("v1/metrics");
        Ok(e)
    }

    fn parse_as(url: &str, from: &str, no_path: NoPath) -> Result<Endpoint> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            bail!(
                "{from} '{}' is not an http:// or https:// URL (e.g. http://127.0.0.1:4318)",
                shown_url(url)
            );
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            bail!("{from}: credentials in the URL are not supported: give them as a header (--otlp-header 'Authorization=Basic ...' or OTEL_EXPORTER_OTLP_HEADERS)");
        }
        let Some((host, port)) = host_port(authority, if tls { 443 } else { 80 }) else {
            bail!(
                "{from} '{}': give a host and optionally a port, e.g. http://127.0.0.1:4318",
                shown_url(url)
            );
        };
        let path = match (path.is_empty() || path == "/", no_path) {
            (true, NoPath::Metrics) => "/v1/metrics".to_string(),
            (true, NoPath::Root) => "/".to_string(),
            (false, _) if path.starts_with('?') => format!("/{path}"),
            (false, _) => path.to_string(),
        };
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Ok(Endpoint {
            tls,
            authority: format!("{bracketed}:{port}"),
            host,
            host_header: authority.to_string(),
            path,
        })
    }

    /// The URL for messages and records: without its query (which may carry a token).
    pub fn shown(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let path = match self.path.split_once('?') {
            Some((p, _)) => format!("{p}?..."),
            None => self.path.clone(),
        };
        crate::analysis::input::quote_input(&format!("{scheme}://{}{path}", self.host_header))
    }
}

/// A URL in a message: no query, no user information, cut to 80 characters.
fn shown_url(url: &str) -> String {
    let url = url.split(['?', '@']).next().unwrap_or("");
    crate::analysis::input::quote_input(url)
}

/// `HOST[:PORT]` or `[V6][:PORT]`: the host (no brackets) and port.
fn host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return None,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
        None => default,
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
    host_ok.then(|| (host.to_string(), port))
}

/// `--otlp-header K=V` as given: kept unparsed, so that clap never echoes a
/// malformed one (its value may be a token); checked by [`Settings::resolve`].
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderArg(pub String);

impl std::fmt::Debug for HeaderArg {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let name = self.0.split_once('=').map_or("?", |(k, _)| k);
        write!(f, "{name}=<secret>")
    }
}

/// clap's parser of `--otlp-header`: never fails (see [`HeaderArg`]).
pub fn header_arg(s: &str) -> Result<HeaderArg, std::convert::Infallible> {
    Ok(HeaderArg(s.to_string()))
}

/// TOML `otlp_headers = { Name = "value" }`: the values are secrets (`Debug`
/// shows the names only).
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct HeaderTable(pub std::collections::BTreeMap<String, String>);

impl std::fmt::Debug for HeaderTable {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.keys().map(|k| format!("{k}=<secret>")))
            .finish()
    }
}

impl HeaderTable {
    /// As `--otlp-header` values.
    pub fn args(&self) -> Vec<HeaderArg> {
        self.0
            .iter()
            .map(|(k, v)| HeaderArg(format!("{k}={v}")))
            .collect()
    }
}

/// One request header. The value is a secret: `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    value: String,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}: <secret>", self.name)
    }
}

/// Headers rttscope writes itself (framing, body): refused as `--otlp-header`.
const OWN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
];

impl Header {
    /// A checked header; `from` and `entry` say where it came from in an error,
    /// which never quotes the value.
    pub fn new(name: &str, value: &str, from: &str) -> Result<Header> {
        let name = name.trim();
        if name.is_empty() {
            bail!("{from}: a header has no name (give NAME=VALUE)");
        }
        let n = hyper::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            anyhow::anyhow!(
                "{from}: '{}' is not an HTTP header name",
                crate::analysis::input::quote_input(name)
            )
        })?;
        if OWN_HEADERS.contains(&n.as_str()) {
            bail!("{from}: header {name} is set by rttscope itself");
        }
        if hyper::header::HeaderValue::from_str(value.trim()).is_err() {
            bail!("{from}: the value of header {name} has characters a header cannot carry (control characters or non-ASCII; it is not shown)");
        }
        Ok(Header {
            name: name.to_string(),
            value: value.trim().to_string(),
        })
    }

    /// The secret value, for the request only.
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS` (and `OTEL_RESOURCE_ATTRIBUTES`): `k=v,k2=v2`,
/// values URL-encoded (W3C baggage). Errors never quote a value.
pub fn parse_pairs(text: &str, from: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, entry) in text.split(',').enumerate() {
        if entry.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = entry.split_once('=') else {
            bail!(
                "{from}: entry {} has no '=' (give key=value,key2=value2; values URL-encoded; not shown)",
                i + 1
            );
        };
        let Some(v) = percent_decode(v.trim()) else {
            bail!(
                "{from}: the value of {} is not URL-encoded text (not shown)",
                crate::analysis::input::quote_input(k.trim())
            );
        };
        out.push((k.trim().to_string(), v));
    }
    Ok(out)
}

/// `%XX` decoded; None for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The certificate and key files of TLS.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsFiles {
    /// Trusted CA certificates (PEM); none: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain (PEM) and its private key, for mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// What the flags and the TOML file gave (after `--config` was merged): None
/// or empty where nothing was given.
#[derive(Debug, Default, Clone, Copy)]
pub struct Given<'a> {
    /// `--otlp URL`; empty: bare `--otlp`, the endpoint from the environment.
    pub endpoint: &'a str,
    pub headers: &'a [HeaderArg],
    pub ca_file: Option<&'a Path>,
    pub client_cert: Option<&'a Path>,
    pub client_key: Option<&'a Path>,
    pub timeout: Option<Duration>,
    pub compression: Option<Compression>,
}

/// Everything the pusher needs, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub endpoint: Endpoint,
    pub headers: Vec<Header>,
    pub tls: TlsFiles,
    pub timeout: Duration,
    pub compression: Compression,
}

/// An environment: `std::env::var` or a test's map.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `OTEL_EXPORTER_OTLP_METRICS_<what>`, else `OTEL_EXPORTER_OTLP_<what>`
/// (empty counts as unset): (the variable's name, its value).
fn otel(env: Env, what: &str) -> Option<(String, String)> {
    [
        format!("OTEL_EXPORTER_OTLP_METRICS_{what}"),
        format!("OTEL_EXPORTER_OTLP_{what}"),
    ]
    .into_iter()
    .find_map(|name| {
        let v = env(&name)?;
        (!v.trim().is_empty()).then(|| (name, v.trim().to_string()))
    })
}

impl Settings {
    /// Flags and TOML (`given`) win over the environment, option by option;
    /// the specification's defaults last. Every error is one sentence
    /// without a header's value.
    pub fn resolve(given: &Given, env: Env) -> Result<Settings> {
        check_protocol(env)?;
        let endpoint = endpoint(given.endpoint, env)?;
        let headers = headers(given.headers, env)?;
        let file = |g: Option<&Path>, flag: &str, what: &str| -> Option<(String, PathBuf)> {
            match g {
                Some(p) => Some((flag.to_string(), p.to_path_buf())),
                None => otel(env, what).map(|(n, v)| (n, PathBuf::from(v))),
            }
        };
        let ca = file(given.ca_file, "--otlp-ca-file", "CERTIFICATE");
        let cert = file(
            given.client_cert,
            "--otlp-client-cert",
            "CLIENT_CERTIFICATE",
        );
        let key = file(given.client_key, "--otlp-client-key", "CLIENT_KEY");
        match (&cert, &key) {
            (Some((from, _)), None) => {
                bail!("{from}: a client certificate needs its key too (--otlp-client-key or OTEL_EXPORTER_OTLP_CLIENT_KEY)")
            }
            (None, Some((from, _))) => {
                bail!("{from}: a client key needs its certificate too (--otlp-client-cert or OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)")
            }
            _ => {}
        }
        if let (false, Some((from, _))) = (endpoint.tls, ca.iter().chain(&cert).next()) {
            bail!(
                "{from}: certificates are for an https:// endpoint, and {} is http://",
                endpoint.shown()
            );
        }
        Ok(Settings {
            endpoint,
            headers,
            tls: TlsFiles {
                ca_file: ca.map(|c| c.1),
                client_cert: cert.map(|c| c.1),
                client_key: key.map(|c| c.1),
            },
            timeout: timeout(given.timeout, env)?,
            compression: compression(given.compression, env)?,
        })
    }
}

/// `OTEL_EXPORTER_OTLP_PROTOCOL`: only `http/protobuf`.
fn check_protocol(env: Env) -> Result<()> {
    match otel(env, "PROTOCOL") {
        None => Ok(()),
        Some((_, p)) if p == "http/protobuf" => Ok(()),
        Some((n, p)) if p == "grpc" || p == "http/json" => bail!(
            "{n}={p}: rttscope sends OTLP over HTTP with protobuf bodies only (http/protobuf, a receiver's port 4318): unset it or set it to http/protobuf"
        ),
        Some((n, p)) => bail!(
            "{n}: '{}' is not an OTLP protocol (rttscope speaks http/protobuf)",
            crate::analysis::input::quote_input(&p)
        ),
    }
}

/// The flag's URL; else `..._METRICS_ENDPOINT` as is; else `..._ENDPOINT` with
/// `v1/metrics` appended; else the default.
fn endpoint(given: &str, env: Env) -> Result<Endpoint> {
    if !given.is_empty() {
        return Endpoint::parse(given);
    }
    if let Some(v) = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").filter(|v| !v.trim().is_empty()) {
        return Endpoint::parse_as(
            v.trim(),
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            NoPath::Root,
        );
    }
    match env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.trim().is_empty()) {
        Some(v) => Endpoint::parse_base(v.trim(), "OTEL_EXPORTER_OTLP_ENDPOINT"),
        None => Endpoint::parse_base(DEFAULT_ENDPOINT, "the default endpoint"),
    }
}

fn headers(given: &[HeaderArg], env: Env) -> Result<Vec<Header>> {
    let pairs = if !given.is_empty() {
        let mut pairs = Vec::new();
        for (i, h) in given.iter().enumerate() {
            let Some((k, v)) = h.0.split_once('=') else {
                bail!(
                    "--otlp-header number {} has no '=': give NAME=VALUE, e.g. 'Authorization=Bearer ...' (not shown)",
                    i + 1
                );
            };
            pairs.push((k.to_string(), v.to_string(), "--otlp-header".to_string()));
        }
        pairs
    } else if let Some((name, text)) = otel(env, "HEADERS") {
        parse_pairs(&text, &name)?
            .into_iter()
            .map(|(k, v)| (k, v, name.clone()))
            .collect()
    } else {
        Vec::new()
    };
    let mut out: Vec<Header> = Vec::new();
    for (k, v, from) in pairs {
        let h = Header::new(&k, &v, &from)?;
        // a name given twice: the last one wins
        out.retain(|o| !o.name.eq_ignore_ascii_case(&h.name));
        out.push(h);
    }
    Ok(out)
}

fn timeout(given: Option<Duration>, env: Env) -> Result<Duration> {
    if let Some(t) = given {
        if t.is_zero() {
            bail!("--otlp-timeout must be longer than 0");
        }
        return Ok(t);
    }
    match otel(env, "TIMEOUT") {
        None => Ok(DEFAULT_TIMEOUT),
        Some((n, v)) => match v.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => bail!(
                "{n}: '{}' is not a number of milliseconds above 0",
                crate::analysis::input::quote_input(&v)
            ),
        },
    }
}

fn compression(given: Option<Compression>, env: Env) -> Result<Compression> {
    if let Some(c) = given {
        return Ok(c);
    }
    match otel(env, "COMPRESSION") {
        None => Ok(Compression::None),
        Some((_, v)) if v == "gzip" => Ok(Compression::Gzip),
        Some((_, v)) if v == "none" => Ok(Compression::None),
        Some((n, v)) => bail!(
            "{n}: '{}' is not gzip or none",
            crate::analysis::input::quote_input(&v)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn resolve(given: Given, pairs: &[(&str, &str)]) -> Result<Settings> {
        Settings::resolve(&given, &env_of(pairs))
    }

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.path.as_str(), e.tls),
            ("127.0.0.1:4318", "/v1/metrics", false)
        );
        let e = Endpoint::parse("http://[::1]:9090/api/v1/otlp/v1/metrics").unwrap();
        assert_eq!(
            (e.path.as_str(), e.host.as_str(), e.authority.as_str()),
            ("/api/v1/otlp/v1/metrics", "::1", "[::1]:9090")
        );
        let e = Endpoint::parse("https://otlp.example.com/otlp/v1/metrics?key=s3cret").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.host_header.as_str(), e.tls),
            ("otlp.example.com:443", "otlp.example.com", true)
        );
        assert_eq!(e.shown(), "https://otlp.example.com/otlp/v1/metrics?...");
        for bad in [
            "ftp://x:1",
            "127.0.0.1:4318",
            "http://:1/",
            "http://h:0",
            "http://h:99999",
            "http://u:pw@h:1",
        ] {
            let e = Endpoint::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--otlp") && !e.contains('\n'), "{e}");
            assert!(!e.contains("pw"), "{e}");
        }
    }

    #[test]
    fn environment_endpoints_follow_the_specification() {
        let on = Given::default();
        let path = |pairs: &[(&str, &str)]| {
            let e = resolve(on, pairs).unwrap().endpoint;
            format!("{}{}", e.authority, e.path)
        };
        assert_eq!(path(&[]), "localhost:4318/v1/metrics");
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/api/otlp")];
        assert_eq!(path(&base), "c:4318/api/otlp/v1/metrics");
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")];
        assert_eq!(path(&base), "c:4318/v1/metrics");
        // the signal's own variable is used as is (no path: the root) and wins
        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:1"),
        ];
        assert_eq!(path(&both), "m:1/");
        let flag = Given {
            endpoint: "http://f:2",
            ..Given::default()
        };
        let e = resolve(flag, &both).unwrap().endpoint;
        assert_eq!(e.authority, "f:2");
    }

    #[test]
    fn headers_parse_decode_and_never_show_their_values() {
        let env = [(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Authorization=Basic%20dTpw , X-Scope-OrgID=a%2Cb,",
        )];
        let s = resolve(Given::default(), &env).unwrap();
        let hs: Vec<(&str, &str)> = s
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value()))
            .collect();
        assert_eq!(
            hs,
            [("Authorization", "Basic dTpw"), ("X-Scope-OrgID", "a,b")]
        );
        assert!(!format!("{s:?}").contains("dTpw"), "{s:?}");
        // the metrics variable wins whole; a flag wins over both
        let both = [
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,b=2"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "c=3"),
        ];
        let s = resolve(Given::default(), &both).unwrap();
        assert_eq!(s.headers.len(), 1);
        assert_eq!(
            (s.headers[0].name.as_str(), s.headers[0].value()),
            ("c", "3")
        );
        let flags = [HeaderArg("k=v=w".into()), HeaderArg("K=x".into())];
        let given = Given {
            headers: &flags,
            ..Given::default()
        };
        let s = resolve(given, &both).unwrap();
        assert_eq!(s.headers.len(), 1, "the later K replaces k");
        assert_eq!(s.headers[0].value(), "x");
        assert_eq!(format!("{:?}", flags[0]), "k=<secret>");
    }

    #[test]
    fn bad_headers_are_one_sentence_without_the_secret() {
        let secret = "s3cr3t";
        /// (flags, environment)
        type Case<'a> = (Vec<HeaderArg>, Vec<(&'a str, String)>);
        let cases: Vec<Case> = vec![
            (vec![HeaderArg(format!("Bearer {secret}"))], vec![]),
            (vec![HeaderArg(format!("Bad Name={secret}"))], vec![]),
            (
                vec![HeaderArg(format!("Authorization={secret}\u{1}x"))],
                vec![],
            ),
            (vec![HeaderArg(format!("content-length={secret}"))], vec![]),
            (
                vec![],
                vec![("OTEL_EXPORTER_OTLP_HEADERS", format!("a=1,{secret}"))],
            ),
            (
                vec![],
                vec![("OTEL_EXPORTER_OTLP_HEADERS", format!("a={secret}%zz"))],
            ),
            (
                vec![],
                vec![("OTEL_EXPORTER_OTLP_HEADERS", format!("a={secret}%01x"))],
            ),
        ];
        for (flags, env) in cases {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let given = Given {
                headers: &flags,
                ..Given::default()
            };
            let e = resolve(given, &env).unwrap_err().to_string();
            assert!(!e.contains(secret) && !e.contains('\n'), "{e}");
            assert!(e.contains("header") || e.contains("HEADERS"), "{e}");
        }
    }

    #[test]
    fn timeout_compression_protocol_and_files() {
        let env = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/env/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/env/c.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/env/k.pem"),
        ];
        let s = resolve(Given::default(), &env).unwrap();
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(s.compression, Compression::Gzip);
        assert_eq!(s.tls.ca_file, Some("/env/ca.pem".into()));
        assert_eq!(s.tls.client_key, Some("/env/k.pem".into()));
        let given = Given {
            timeout: Some(Duration::from_secs(1)),
            compression: Some(Compression::None),
            ca_file: Some(Path::new("/flag/ca.pem")),
            ..Given::default()
        };
        let s = resolve(given, &env).unwrap();
        assert_eq!(s.timeout, Duration::from_secs(1));
        assert_eq!(s.compression, Compression::None);
        assert_eq!(s.tls.ca_file, Some("/flag/ca.pem".into()));
        assert_eq!(
            resolve(Given::default(), &[]).unwrap().timeout,
            DEFAULT_TIMEOUT
        );
        for (env, want) in [
            (
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "http/protobuf",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")],
                "protobuf bodies only",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")],
                "not an OTLP protocol",
            ),
            (vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")], "milliseconds"),
            (
                vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
                "not gzip or none",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k")],
                "needs its certificate",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca")],
                "https:// endpoint",
            ),
        ] {
            let e = resolve(Given::default(), &env).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{env:?}: {e}");
        }
        let ok = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")];
        assert!(resolve(Given::default(), &ok).is_ok());
    }
}

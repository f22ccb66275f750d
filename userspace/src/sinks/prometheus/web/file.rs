//! The web config file as written: Prometheus exporter-toolkit's YAML keys
//! (`tls_server_config`, `http_server_config`, `basic_auth_users`), unknown keys refused.
//! Errors are one sentence with the line where the YAML parser knows it; no password hash
//! is ever quoted in one.
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The whole file (every key optional: an empty file serves plain HTTP without auth).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfigFile {
    pub tls_server_config: Option<TlsServerConfig>,
    pub http_server_config: Option<HttpServerConfig>,
    /// User name -> bcrypt hash of the password.
    pub basic_auth_users: Option<BTreeMap<String, PasswordHash>>,
}

/// `tls_server_config`: the certificate and key /metrics presents, and what it asks of
/// clients. Relative paths are relative to the config file's directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServerConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub client_auth_type: ClientAuth,
    pub client_ca_file: Option<PathBuf>,
    pub min_version: Option<TlsVersion>,
    pub max_version: Option<TlsVersion>,
}

/// `client_auth_type`: Go's `tls.ClientAuthType` names, as exporter-toolkit takes them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ClientAuth {
    /// No client certificate asked for.
    #[default]
    NoClientCert,
    /// Asked for, not required, not verified.
    RequestClientCert,
    /// Required, not verified.
    RequireAnyClientCert,
    /// Verified against `client_ca_file` when given.
    VerifyClientCertIfGiven,
    /// Required and verified against `client_ca_file` (mTLS).
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    /// Whether a certificate is checked against `client_ca_file`.
    pub fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }

    /// Whether a client without a certificate is refused.
    pub fn required(self) -> bool {
        matches!(
            self,
            ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// `min_version` / `max_version`. rustls speaks TLS 1.2 and 1.3: a minimum of TLS10 or
/// TLS11 (accepted by exporter-toolkit) means 1.2 here; a maximum below 1.2 is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    TLS10,
    TLS11,
    TLS12,
    TLS13,
}

/// `http_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    /// Accepted for exporter-toolkit's files; /metrics speaks HTTP/1.1 only.
    #[serde(default)]
    pub http2: Option<bool>,
    /// Headers added to every answer (exporter-toolkit's list of allowed ones).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// A bcrypt hash from the file: never printed (Debug says `<hash>`), and a value of the
/// wrong type is refused without quoting it.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash(pub String);

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("<hash>")
    }
}

impl<'de> Deserialize<'de> for PasswordHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(HashVisitor)
    }
}

struct HashVisitor;

const NOT_A_HASH: &str = "a password must be given as its bcrypt hash, a string";

/// Every non-string kind of value: one message that quotes nothing.
macro_rules! refuse_quietly {
    ($($name:ident: $t:ty),*) => {
        $(fn $name<E: serde::de::Error>(self, _: $t) -> Result<PasswordHash, E> {
            Err(E::custom(NOT_A_HASH))
        })*
    };
}

impl<'de> serde::de::Visitor<'de> for HashVisitor {
    type Value = PasswordHash;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a bcrypt hash")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PasswordHash, E> {
        Ok(PasswordHash(v.to_string()))
    }
    refuse_quietly!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64,
        visit_bytes: &[u8]);
    fn visit_unit<E: serde::de::Error>(self) -> Result<PasswordHash, E> {
        Err(E::custom(NOT_A_HASH))
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<PasswordHash, E> {
        Err(E::custom(NOT_A_HASH))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<PasswordHash, A::Error> {
        Err(serde::de::Error::custom(NOT_A_HASH))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<PasswordHash, A::Error> {
        Err(serde::de::Error::custom(NOT_A_HASH))
    }
}

/// Longest web config file read (exporter-toolkit's are a few hundred bytes).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Parse the YAML text: one sentence, `line N: ...` where the parser knows the line.
pub fn parse(text: &str) -> Result<WebConfigFile, String> {
    let options = serde_saphyr::options! {
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    };
    match serde_saphyr::from_str_with_options::<Option<WebConfigFile>>(text, options) {
        Ok(f) => Ok(f.unwrap_or_default()),
        Err(e) => Err(yaml_error(&e)),
    }
}

/// The parser's message as one line, its own "at line N, column M" replaced by a leading
/// `line N: `, cut to 300 characters.
fn yaml_error(e: &serde_saphyr::Error) -> String {
    let msg = e.to_string().replace('\n', " ");
    let msg = match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    let msg = crate::analysis::input::quote_input_max(msg.trim(), 270);
    match e.location().map(|l| l.line()).filter(|l| *l > 0) {
        Some(line) => format!("line {line}: {msg}"),
        None => msg,
    }
}

/// The headers `http_server_config.headers` may set, and the values allowed where the
/// list is closed (exporter-toolkit's `extraHTTPHeaders`).
const HEADERS: &[(&str, &[&str])] = &[
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Check `http_server_config.headers` and turn them into header values.
pub fn headers(
    h: &BTreeMap<String, String>,
) -> Result<Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>, String> {
    let q = crate::analysis::input::quote_input;
    let mut out = Vec::new();
    for (name, value) in h {
        let Some((canon, allowed)) = HEADERS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))
        else {
            let names: Vec<&str> = HEADERS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "http_server_config.headers: '{}' cannot be set (only {})",
                q(name),
                names.join(", ")
            ));
        };
        if !allowed.is_empty() && !allowed.iter().any(|a| a.eq_ignore_ascii_case(value)) {
            return Err(format!(
                "http_server_config.headers: {canon} must be one of {}, not '{}'",
                allowed.join(", "),
                q(value)
            ));
        }
        let v = hyper::header::HeaderValue::from_str(value).map_err(|_| {
            format!(
                "http_server_config.headers: {canon}: '{}' is not a header value",
                q(value)
            )
        })?;
        let name = hyper::header::HeaderName::from_bytes(canon.as_bytes())
            .expect("the allowed header names are valid");
        out.push((name, v));
    }
    Ok(out)
}

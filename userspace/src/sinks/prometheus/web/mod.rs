//! `--web-config-file`: `/metrics` over TLS (client certificates too) and basic
//! authentication, configured in Prometheus exporter-toolkit's web config format and re-read
//! when the content of the file, or of a file it names, changes (polled every
//! [`POLL_EVERY`]: a Kubernetes Secret changes by swapping a symlink, which no inotify watch on
//! the file sees). A new file that does not load leaves the old configuration in force, with
//! one warning and `rttscope_web_config_reloads_total{result="failure"}`.
//!
//! No password, hash or key is ever printed: errors name paths and keys, never values of
//! `basic_auth_users` nor anything of a key file.
pub mod auth;
pub mod file;
#[cfg(any(test, feature = "test-pki"))]
pub mod pki;
mod reader;
mod tls;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use reader::{shown, Reader};

pub use file::ClientAuth;
pub use tls::provider;

/// How often the files are read again to see whether they changed.
pub const POLL_EVERY: Duration = Duration::from_secs(2);

/// One loaded configuration: what each connection accepted is served with.
pub struct Active {
    /// None: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub client_auth: ClientAuth,
    /// None: no basic authentication.
    pub users: Option<auth::Users>,
    /// `http_server_config.headers`, added to every answer.
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
}

impl Active {
    /// Plain HTTP, no authentication (no web config file).
    pub fn plain() -> Active {
        Active {
            tls: None,
            client_auth: ClientAuth::NoClientCert,
            users: None,
            headers: Vec::new(),
        }
    }

    /// Whether a client proves who it is (basic auth or a verified certificate).
    pub fn authenticates(&self) -> bool {
        self.users.is_some() || (self.tls.is_some() && self.client_auth.verifies())
    }

    /// "https, client certificates required and verified, basic auth (1 user)" and the like.
    pub fn describe(&self) -> String {
        let mut parts = vec![if self.tls.is_some() { "https" } else { "http" }.to_string()];
        if self.tls.is_some() {
            parts.push(
                match self.client_auth {
                    ClientAuth::NoClientCert => "no client certificates",
                    ClientAuth::RequestClientCert => "client certificates asked for, not verified",
                    ClientAuth::RequireAnyClientCert => {
                        "client certificates required, not verified"
                    }
                    ClientAuth::VerifyClientCertIfGiven => "client certificates verified if given",
                    ClientAuth::RequireAndVerifyClientCert => {
                        "client certificates required and verified"
                    }
                }
                .to_string(),
            );
        }
        if let Some(u) = &self.users {
            let s = if u.len() == 1 { "" } else { "s" };
            parts.push(format!("basic auth ({} user{s})", u.len()));
        }
        parts.join(", ")
    }
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The web config's counters, registered in the exporter's registry once it exists.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Reloads by `result`: success, failure.
    pub reloads: Family<Vec<(String, String)>, Counter>,
    /// Connections and requests refused, by `reason`: tls_handshake, unauthorized.
    pub refused: Family<Vec<(String, String)>, Counter>,
}

impl Stats {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "rttscope_web_config_reloads",
            "Changes of the web config file (or a file it names) applied (result=success) or refused, the previous configuration kept (result=failure)",
            self.reloads.clone(),
        );
        r.register(
            "rttscope_metrics_refused",
            "Connections and requests to /metrics refused, by reason (tls_handshake: no TLS, a bad or missing client certificate; unauthorized: missing or wrong basic-auth credentials)",
            self.refused.clone(),
        );
    }

    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    fn reloaded(&self, result: &str) {
        self.reloads
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
    }
}

/// The web config file in force, and what it takes to notice a change.
pub struct Web {
    path: PathBuf,
    current: RwLock<Arc<Active>>,
    /// Digest of everything read the last time (applied or refused).
    seen: Mutex<[u8; 32]>,
    /// Key files already warned about (world-readable): once each.
    warned: Mutex<HashSet<PathBuf>>,
    pub cache: Arc<auth::Cache>,
    pub stats: Stats,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Web({}: {:?})", shown(&self.path), self.current())
    }
}

/// Read and load the web config at `path` (one sentence on error) and the digest of all it read.
fn load(path: &Path) -> ([u8; 32], Vec<PathBuf>, Result<Active, String>) {
    let mut r = Reader::new(path);
    let active = load_with(path, &mut r);
    let (digest, world_readable) = r.finish();
    (digest, world_readable, active)
}

fn load_with(path: &Path, r: &mut Reader) -> Result<Active, String> {
    let bytes = r.read(path, "web config file", file::MAX_FILE_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| "the file is not UTF-8 text".to_string())?;
    let f = file::parse(&text)?;
    let headers = match &f.http_server_config {
        Some(h) => file::headers(&h.headers)?,
        None => Vec::new(),
    };
    let users = match f.basic_auth_users {
        Some(u) if !u.is_empty() => Some(auth::Users::new(u)?),
        _ => None,
    };
    let (tls, client_auth) = match &f.tls_server_config {
        Some(t) => (
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                tls::server_config(t, r)?,
            ))),
            t.client_auth_type,
        ),
        None => (None, ClientAuth::NoClientCert),
    };
    Ok(Active {
        tls,
        client_auth,
        users,
        headers,
    })
}

impl Web {
    /// Load the web config file at `path`: an error is one sentence that names the file.
    pub fn load(path: &Path) -> anyhow::Result<Web> {
        let (seen, world_readable, active) = load(path);
        let active = active.map_err(|e| anyhow::anyhow!("web config file {}: {e}", shown(path)))?;
        let web = Web {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(active)),
            seen: Mutex::new(seen),
            warned: Mutex::new(HashSet::new()),
            cache: Arc::new(auth::Cache::default()),
            stats: Stats::default(),
        };
        web.warn_world_readable(world_readable);
        Ok(web)
    }

    /// The configuration a new connection is served with.
    pub fn current(&self) -> Arc<Active> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Read the files again; when anything read differs from the last time, apply the new
    /// configuration, or keep the old one with one warning. Returns whether it was applied.
    pub fn poll(&self) -> Option<bool> {
        let (digest, world_readable, active) = load(&self.path);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == digest {
                return None;
            }
            *seen = digest;
        }
        self.warn_world_readable(world_readable);
        match active {
            Ok(a) => {
                let what = a.describe();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(a);
                self.stats.reloaded("success");
                tracing::info!("web config file {} reloaded: {what}", shown(&self.path));
                Some(true)
            }
            Err(e) => {
                self.stats.reloaded("failure");
                let id = crate::sys::caps::UNPRIVILEGED_ID;
                let hint = match e.contains("Permission denied") && nix::unistd::geteuid().as_raw() == id {
                    true => format!(" (the daemon runs as uid {id} after attach: make the files mode 0640, group {id})"),
                    false => String::new(),
                };
                tracing::warn!(
                    "web config file {} read again cannot be used, the previous configuration stays in force: {e}{hint}",
                    shown(&self.path)
                );
                Some(false)
            }
        }
    }

    /// Poll every `every` until the task is dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.poll();
        }
    }

    fn warn_world_readable(&self, paths: Vec<PathBuf>) {
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        for p in paths {
            if warned.insert(p.clone()) {
                tracing::warn!(
                    "key file {} can be read by every user of this host: make it mode 0640, group {} (the daemon's after attach)",
                    shown(&p),
                    crate::sys::caps::UNPRIVILEGED_ID
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;

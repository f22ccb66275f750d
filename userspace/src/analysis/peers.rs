//! Remote addresses named as operators name them (`--names FILE`, issue 45 item 2): a names
//! file in one of two forms, told apart by its first character.
//!
//! - **Simple**: one `ADDRESS[/BITS][:PORT] NAME` per line (`#` starts a comment; IPv6 with a
//!   port in brackets, `[fd00::/64]:443 web`). `10.100.0.0/16:80 payments` names every address of
//!   10.100.0.0/16 on port 80 `payments`; without a port, every port.
//! - **Kubernetes**: the JSON `kubectl get services,pods,endpointslices -A -o json` prints (a
//!   `v1` `List`, or one object), read as the API documents the objects: a Service names its
//!   `spec.clusterIP(s)` and `spec.externalIPs` on each TCP `spec.ports[].port` as
//!   `NAMESPACE/SERVICE`; an EndpointSlice names its `endpoints[].addresses` on each TCP
//!   `ports[].port` after its `kubernetes.io/service-name` label (`NAMESPACE/SERVICE`); a Pod
//!   names its `status.podIP(s)` on every port `NAMESPACE/POD` (not a `hostNetwork` pod: its
//!   address is the node's). Other kinds and fields are skipped.
//!
//! The most specific entry wins: the longest prefix, then one with a port over one without;
//! between equals, the first in the file. Names are 1 to [`MAX_NAME`] bytes of printable
//! characters. A file is at most [`MAX_FILE_BYTES`] and [`MAX_ENTRIES`] entries; over either it
//! is refused whole, as is a malformed one and one that changed while it was read (the caller
//! keeps the names it had).
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::Deserialize;

use crate::analysis::input::quote_input_max;

/// The largest names file read (bytes): `kubectl ... -o json` of a cluster of ~10,000 pods.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// The most entries a names file may give (each ~100 bytes in memory).
pub const MAX_ENTRIES: usize = 262_144;
/// The longest name (bytes): a DNS name's.
pub const MAX_NAME: usize = 253;

/// The names of remote addresses, looked up by address and port.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PeerNames {
    /// Single addresses (/32, /128) by (address, port; None: any port).
    hosts: HashMap<(IpAddr, Option<u16>), String>,
    /// Wider prefixes, most specific first.
    nets: Vec<(IpNet, Option<u16>, String)>,
}

impl PeerNames {
    /// Parse a names file's text (either form); an error is one sentence.
    pub fn parse(text: &str) -> Result<PeerNames, String> {
        if text.trim_start().starts_with('{') {
            kube(text)
        } else {
            simple(text)
        }
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.hosts.len() + self.nets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name of a remote address, if any entry covers it.
    pub fn name(&self, addr: SocketAddr) -> Option<&str> {
        let ip = match addr.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let port = addr.port();
        if let Some(n) = self
            .hosts
            .get(&(ip, Some(port)))
            .or_else(|| self.hosts.get(&(ip, None)))
        {
            return Some(n);
        }
        self.nets
            .iter()
            .find(|(net, p, _)| net.contains(&ip) && p.is_none_or(|p| p == port))
            .map(|(_, _, n)| n.as_str())
    }

    /// Add an entry (the first of equals stays); an error past [`MAX_ENTRIES`].
    fn add(&mut self, net: IpNet, port: Option<u16>, name: &str) -> Result<(), String> {
        if self.len() >= MAX_ENTRIES {
            return Err(format!(
                "more than {MAX_ENTRIES} entries, the most a names file may give"
            ));
        }
        if net.prefix_len() == net.max_prefix_len() {
            self.hosts
                .entry((net.addr(), port))
                .or_insert_with(|| name.to_string());
        } else if !self.nets.iter().any(|(n, p, _)| *n == net && *p == port) {
            self.nets.push((net.trunc(), port, name.to_string()));
        }
        Ok(())
    }

    /// Order the prefixes most specific first (stable: the file's order between equals).
    fn finish(mut self) -> PeerNames {
        self.nets
            .sort_by_key(|(n, p, _)| (std::cmp::Reverse(n.prefix_len()), p.is_none()));
        self
    }
}

/// A name as the file gives it: checked, or why not.
fn check_name(name: &str) -> Result<&str, String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "a name must be 1 to {MAX_NAME} bytes, not {}",
            name.len()
        ));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "the name {} holds a space or control character",
            quote_input_max(name, 80)
        ));
    }
    Ok(name)
}

/// `ADDRESS[/BITS][:PORT]`, IPv6 with a port as `[ADDRESS[/BITS]]:PORT`.
fn parse_place(s: &str) -> Option<(IpNet, Option<u16>)> {
    let (net, port) = if let Some(rest) = s.strip_prefix('[') {
        let (net, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        (net, port)
    } else if s.matches(':').count() == 1 {
        let (net, p) = s.split_once(':')?;
        (net, Some(p.parse().ok()?))
    } else {
        (s, None)
    };
    let net = match net.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => IpNet::from(net.parse::<IpAddr>().ok()?),
    };
    Some((net, port))
}

/// The simple form.
fn simple(text: &str) -> Result<PeerNames, String> {
    let mut names = PeerNames::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", i + 1);
        let mut it = line.split_whitespace();
        let (place, name) = (it.next().unwrap_or(""), it.next());
        let Some(name) = name.filter(|_| it.next().is_none()) else {
            return Err(at(format!(
                "{} is not `ADDRESS[/BITS][:PORT] NAME`",
                quote_input_max(line, 80)
            )));
        };
        let (net, port) = parse_place(place).ok_or_else(|| {
            at(format!(
                "{} is not an address, a CIDR prefix, or either with :PORT",
                quote_input_max(place, 80)
            ))
        })?;
        names
            .add(net, port, check_name(name).map_err(at)?)
            .map_err(at)?;
    }
    Ok(names.finish())
}

/// The objects of `kubectl get ... -o json`, as far as naming reads them (every other field is
/// skipped by the parser without being kept).
#[derive(Deserialize, Default)]
#[serde(default)]
struct KObject {
    kind: String,
    items: Vec<KObject>,
    metadata: Meta,
    spec: Spec,
    status: Status,
    /// EndpointSlice.
    endpoints: Vec<Endpoint>,
    ports: Option<Vec<Port>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: String,
    labels: HashMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    #[serde(rename = "externalIPs")]
    external_ips: Vec<String>,
    ports: Vec<Port>,
    host_network: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Status {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<PodIp>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Endpoint {
    addresses: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Port {
    /// Absent or null in an EndpointSlice: every port.
    port: Option<u16>,
    /// TCP when absent (the API's default).
    protocol: Option<String>,
}

/// The Kubernetes form.
fn kube(text: &str) -> Result<PeerNames, String> {
    let top: KObject = serde_json::from_str(text).map_err(|e| {
        format!(
            "not the JSON of `kubectl get ... -o json` (line {}: {})",
            e.line(),
            quote_input_max(&e.to_string(), 120)
        )
    })?;
    let mut names = PeerNames::default();
    let items = match top.kind.as_str() {
        "List" | "ServiceList" | "PodList" | "EndpointSliceList" => top.items,
        _ => vec![top],
    };
    for o in &items {
        let full = |n: &str| format!("{}/{n}", o.metadata.namespace);
        match o.kind.as_str() {
            "Service" => {
                let ips = o.spec.cluster_ip.iter().chain(&o.spec.cluster_ips);
                let ips = ips.chain(&o.spec.external_ips);
                add_ips(
                    &mut names,
                    ips,
                    tcp_ports(&o.spec.ports),
                    &full(&o.metadata.name),
                )?;
            }
            "EndpointSlice" => {
                let Some(svc) = o.metadata.labels.get("kubernetes.io/service-name") else {
                    continue;
                };
                let ports = o.ports.as_deref().map(tcp_ports).unwrap_or_default();
                let ips = o.endpoints.iter().flat_map(|e| &e.addresses);
                add_ips(&mut names, ips, ports, &full(svc))?;
            }
            "Pod" if !o.spec.host_network => {
                let ips = o.status.pod_ip.iter();
                let ips = ips.chain(o.status.pod_ips.iter().map(|p| &p.ip));
                add_ips(&mut names, ips, vec![None], &full(&o.metadata.name))?;
            }
            _ => {}
        }
    }
    Ok(names.finish())
}

/// The TCP ports of a port list (`[None]`: no port listed, or one without a number, means all).
fn tcp_ports(ports: &[Port]) -> Vec<Option<u16>> {
    let tcp = ports
        .iter()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"));
    let out: Vec<Option<u16>> = tcp.map(|p| p.port).collect();
    if ports.is_empty() || out.contains(&None) {
        vec![None]
    } else {
        out
    }
}

/// Name each valid address (`None`, "None" of a headless Service, or junk: skipped) on each port.
fn add_ips<'a>(
    names: &mut PeerNames,
    ips: impl Iterator<Item = &'a String>,
    ports: Vec<Option<u16>>,
    name: &str,
) -> Result<(), String> {
    let name = check_name(name)?;
    for ip in ips {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            continue;
        };
        for p in &ports {
            names.add(IpNet::from(ip), *p, name)?;
        }
    }
    Ok(())
}

/// How often [`PeerFile::poll`] looks at the file at most (as the web config's reader).
pub const POLL_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// What [`PeerFile::poll`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// New content, in force now: its entries.
    Loaded(usize),
    /// New content that cannot be used (the one sentence why): the old names stay.
    Failed(String),
}

/// Reloads of the names file, by result (the exporter's `rttscope_names_reloads_total`).
#[derive(Debug, Default)]
pub struct ReloadCounts {
    pub success: std::sync::atomic::AtomicU64,
    /// Malformed (or unreadable) content.
    pub failure: std::sync::atomic::AtomicU64,
    /// Over [`MAX_FILE_BYTES`] or [`MAX_ENTRIES`].
    pub too_large: std::sync::atomic::AtomicU64,
}

/// The names file `--names` points at, in force, and re-read when its content changes (a
/// sidecar or CronJob refreshing it, a ConfigMap's symlink swap): polled at most every
/// [`POLL_EVERY`], read when its size, time or inode changed (through symlinks), applied when
/// the content differs. A new content that does not parse, or is over the caps, keeps the old
/// names in force with one warning.
pub struct PeerFile {
    path: std::path::PathBuf,
    current: std::sync::RwLock<std::sync::Arc<PeerNames>>,
    seen: std::sync::Mutex<Seen>,
    pub counts: ReloadCounts,
}

#[derive(Default)]
struct Seen {
    /// (size, mtime ns, inode) when last read.
    stamp: Option<(u64, i128, u64)>,
    /// The hash of the content last read.
    digest: u64,
    polled: Option<std::time::Instant>,
}

fn stamp(path: &std::path::Path) -> Option<(u64, i128, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.len(),
        m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        m.ino(),
    ))
}

/// Why a names file's content was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Unreadable, not UTF-8, or malformed.
    Failure,
    /// Over [`MAX_FILE_BYTES`] or [`MAX_ENTRIES`].
    TooLarge,
    /// Written while it was read (an in-place rewrite caught half-way): read again later.
    Changed,
}

/// A refusal: its one sentence and why.
type Refusal = (String, Why);

/// How many times [`PeerFile::load`] reads a file that changes while it is read.
const LOAD_TRIES: u32 = 3;

/// The file's text: at most [`MAX_FILE_BYTES`] read (a regular file larger than that is refused
/// by its size, unread; another kind, a device or a pipe, after that many bytes), refused when
/// its size or time changed while it was read (`mid` runs after the read: tests put a writer
/// there).
fn read(path: &std::path::Path, mid: impl FnOnce()) -> Result<String, Refusal> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let cannot = |e: std::io::Error| (format!("cannot read it: {e}"), Why::Failure);
    let too_large = |size: String| {
        let most = MAX_FILE_BYTES >> 20;
        let e = format!("it is {size} than {most} MiB, the most read of a names file");
        (e, Why::TooLarge)
    };
    let f = std::fs::File::open(path).map_err(cannot)?;
    let before = f.metadata().map_err(cannot)?;
    if before.is_file() && before.len() > MAX_FILE_BYTES {
        return Err(too_large(format!("{} bytes, more", before.len())));
    }
    let mut bytes = Vec::new();
    (&f).take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large("larger".into()));
    }
    mid();
    let after = f.metadata().map_err(cannot)?;
    let when = |m: &std::fs::Metadata| (m.len(), m.mtime(), m.mtime_nsec());
    if before.is_file() && (when(&after) != when(&before) || bytes.len() as u64 != after.len()) {
        let e = format!(
            "it changed while it was read ({} bytes read, {} bytes now; write it to another file and rename that over it)",
            bytes.len(),
            after.len()
        );
        return Err((e, Why::Changed));
    }
    String::from_utf8(bytes).map_err(|_| ("it is not UTF-8 text".to_string(), Why::Failure))
}

/// Parse a names file's text, the refusal said why.
fn parse(text: &str) -> Result<PeerNames, Refusal> {
    PeerNames::parse(text).map_err(|e| {
        let why = if e.contains("entries, the most") {
            Why::TooLarge
        } else {
            Why::Failure
        };
        (e, why)
    })
}

fn digest(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl PeerFile {
    /// Load the file at `path`: an error is one sentence naming it. A file that changes
    /// while it is read is read again, [`LOAD_TRIES`] times at most.
    pub fn load(path: &std::path::Path) -> anyhow::Result<PeerFile> {
        let shown = quote_input_max(&path.display().to_string(), 200);
        let mut tries = 1;
        let (stamp, text) = loop {
            let stamp = stamp(path);
            match read(path, || {}) {
                Ok(t) => break (stamp, t),
                Err((_, Why::Changed)) if tries < LOAD_TRIES => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err((e, _)) => anyhow::bail!("names file {shown}: {e}"),
            }
        };
        let names = parse(&text).map_err(|(e, _)| anyhow::anyhow!("names file {shown}: {e}"))?;
        Ok(PeerFile {
            path: path.to_path_buf(),
            current: std::sync::RwLock::new(std::sync::Arc::new(names)),
            seen: std::sync::Mutex::new(Seen {
                stamp,
                digest: digest(&text),
                polled: Some(std::time::Instant::now()),
            }),
            counts: ReloadCounts::default(),
        })
    }

    /// The names in force.
    pub fn current(&self) -> std::sync::Arc<PeerNames> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Look at the file again (at most every [`POLL_EVERY`]): None when nothing changed.
    pub fn poll(&self) -> Option<Reload> {
        self.poll_with(|| {})
    }

    /// [`PeerFile::poll`], `mid` run after the file was read (tests: a writer there).
    fn poll_with(&self, mid: impl FnOnce()) -> Option<Reload> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.polled.is_some_and(|t| t.elapsed() < POLL_EVERY) {
            return None;
        }
        seen.polled = Some(std::time::Instant::now());
        let now = stamp(&self.path);
        if now.is_some() && now == seen.stamp {
            return None;
        }
        seen.stamp = now;
        let text = match read(&self.path, mid) {
            Ok(t) => t,
            Err(r) => {
                seen.digest = 0;
                if r.1 == Why::Changed {
                    seen.stamp = None; // read again at the next poll, even if it stays so
                }
                return Some(self.refused(r));
            }
        };
        let d = digest(&text);
        if d == seen.digest {
            return None;
        }
        seen.digest = d;
        match parse(&text) {
            Ok(n) => {
                let len = n.len();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(n);
                self.counts
                    .success
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let shown = quote_input_max(&self.path.display().to_string(), 200);
                tracing::info!("names file {shown} reloaded: {len} entries");
                Some(Reload::Loaded(len))
            }
            Err(r) => Some(self.refused(r)),
        }
    }

    /// A new content refused: counted, said once, the names in force stay.
    fn refused(&self, (e, why): Refusal) -> Reload {
        let c = match why {
            Why::TooLarge => &self.counts.too_large,
            Why::Failure | Why::Changed => &self.counts.failure,
        };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shown = quote_input_max(&self.path.display().to_string(), 200);
        tracing::warn!(
            "names file {shown} read again cannot be used, the previous names stay in force: {e}"
        );
        Reload::Failed(e)
    }

    /// Forget when it was last polled (tests: the next poll looks at once).
    pub fn poll_now(&self) -> Option<Reload> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).polled = None;
        self.poll()
    }
}

#[cfg(test)]
mod tests;

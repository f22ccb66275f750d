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
//! is refused whole, as is a malformed one (the caller keeps the names it had).
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

/// The file's text (at most [`MAX_FILE_BYTES`]) and whether it was refused for its size.
fn read(path: &std::path::Path) -> Result<String, (String, bool)> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| (format!("cannot read it: {e}"), false))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| (format!("cannot read it: {e}"), false))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err((
            format!(
                "it is larger than {} MiB, the most read of a names file",
                MAX_FILE_BYTES >> 20
            ),
            true,
        ));
    }
    String::from_utf8(bytes).map_err(|_| ("it is not UTF-8 text".to_string(), false))
}

fn digest(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl PeerFile {
    /// Load the file at `path`: an error is one sentence naming it.
    pub fn load(path: &std::path::Path) -> anyhow::Result<PeerFile> {
        let shown = quote_input_max(&path.display().to_string(), 200);
        let stamp = stamp(path);
        let text = read(path).map_err(|(e, _)| anyhow::anyhow!("names file {shown}: {e}"))?;
        let names =
            PeerNames::parse(&text).map_err(|e| anyhow::anyhow!("names file {shown}: {e}"))?;
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
        let shown = quote_input_max(&self.path.display().to_string(), 200);
        use std::sync::atomic::Ordering::Relaxed;
        let text = match read(&self.path) {
            Ok(t) => t,
            Err((e, big)) => {
                seen.digest = 0;
                let c = if big {
                    &self.counts.too_large
                } else {
                    &self.counts.failure
                };
                c.fetch_add(1, Relaxed);
                tracing::warn!("names file {shown} read again cannot be used, the previous names stay in force: {e}");
                return Some(Reload::Failed(e));
            }
        };
        let d = digest(&text);
        if d == seen.digest {
            return None;
        }
        seen.digest = d;
        match PeerNames::parse(&text) {
            Ok(n) => {
                let len = n.len();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(n);
                self.counts.success.fetch_add(1, Relaxed);
                tracing::info!("names file {shown} reloaded: {len} entries");
                Some(Reload::Loaded(len))
            }
            Err(e) => {
                let big = e.contains("entries, the most");
                let c = if big {
                    &self.counts.too_large
                } else {
                    &self.counts.failure
                };
                c.fetch_add(1, Relaxed);
                tracing::warn!("names file {shown} read again cannot be used, the previous names stay in force: {e}");
                Some(Reload::Failed(e))
            }
        }
    }

    /// Forget when it was last polled (tests: the next poll looks at once).
    pub fn poll_now(&self) -> Option<Reload> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).polled = None;
        self.poll()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn simple_form_most_specific_wins() {
        let n = PeerNames::parse(
            "# operators' names\n\
             10.100.0.0/16:80 payments\n\
             10.100.0.0/16 infra   # every port\n\
             10.100.7.0/24 edge\n\
             10.100.7.9:80 one-pod\n\
             [fd00::/64]:443 web\n\
             fd00::1 db\n\
             \n",
        )
        .unwrap();
        assert_eq!(n.len(), 6);
        assert_eq!(n.name(sa("10.100.0.10:80")), Some("payments"));
        assert_eq!(n.name(sa("10.100.0.10:81")), Some("infra"));
        assert_eq!(
            n.name(sa("10.100.7.1:80")),
            Some("edge"),
            "the longer prefix"
        );
        assert_eq!(n.name(sa("10.100.7.9:80")), Some("one-pod"));
        assert_eq!(n.name(sa("[fd00::2]:443")), Some("web"));
        assert_eq!(
            n.name(sa("[fd00::1]:443")),
            Some("db"),
            "a host over a prefix"
        );
        assert_eq!(n.name(sa("[::ffff:10.100.0.1]:80")), Some("payments"));
        assert_eq!(n.name(sa("10.101.0.1:80")), None);
    }

    #[test]
    fn simple_form_refusals_are_one_sentence() {
        for (text, want) in [
            ("10.0.0.0/33 x", "line 1: "),
            ("10.0.0.1", "is not `ADDRESS"),
            ("\n10.0.0.1 a b", "line 2: "),
            ("10.0.0.1:99999 x", "not an address"),
            ("[fd00::1:80 x", "not an address"),
            ("10.0.0.1 \u{7}bell", "control character"),
        ] {
            let e = PeerNames::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let long = format!("10.0.0.1 {}", "n".repeat(MAX_NAME + 1));
        assert!(PeerNames::parse(&long)
            .unwrap_err()
            .contains("1 to 253 bytes"));
    }

    /// A List as `kubectl get services,pods,endpointslices -A -o json` prints it, written from
    /// the API's documented schema (core/v1 Service and Pod, discovery.k8s.io/v1 EndpointSlice).
    pub const KUBECTL_LIST: &str = include_str!("../../../tests/fixtures/names/kubectl-list.json");

    #[test]
    fn kubectl_list_names_services_slices_and_pods() {
        let n = PeerNames::parse(KUBECTL_LIST).unwrap();
        // Service: its ClusterIP on its TCP port, both families
        assert_eq!(n.name(sa("10.96.12.34:80")), Some("shop/payments"));
        assert_eq!(n.name(sa("[fd00:10:96::1234]:80")), Some("shop/payments"));
        assert_eq!(
            n.name(sa("10.96.12.34:53")),
            None,
            "a UDP port names nothing"
        );
        // EndpointSlice: the backends on the target port, named after the service
        assert_eq!(n.name(sa("10.244.1.17:8080")), Some("shop/payments"));
        // Pod: its address on any other port
        assert_eq!(
            n.name(sa("10.244.1.17:9090")),
            Some("shop/payments-7d4b9c-x2x9q")
        );
        // a headless service ("None") and a hostNetwork pod name nothing
        assert_eq!(n.name(sa("192.168.1.10:10250")), None);
        assert_eq!(n.name(sa("10.244.2.5:5432")), Some("shop/db"));
    }

    #[test]
    fn kube_form_refusals_and_single_objects() {
        let e = PeerNames::parse("{\"kind\": \"List\", \"items\": 3}").unwrap_err();
        assert!(e.starts_with("not the JSON of `kubectl get"), "{e}");
        let one = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"n"},
            "spec":{"clusterIP":"10.0.0.1","ports":[{"port":443}]}}"#;
        let n = PeerNames::parse(one).unwrap();
        assert_eq!(n.name(sa("10.0.0.1:443")), Some("n/a"));
    }

    /// The file changed on disk: re-read; malformed: the old names stay, said once; too large:
    /// refused and counted; a symlink swapped to another file (a ConfigMap's update) is seen.
    #[test]
    fn reload_keeps_old_names_on_a_bad_file() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = std::env::temp_dir().join(format!("rttscope-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, link) = (dir.join("a"), dir.join("b"), dir.join("names"));
        std::fs::write(&a, "10.100.0.0/16:80 payments\n").unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let f = PeerFile::load(&link).unwrap();
        let svc = sa("10.100.0.10:80");
        assert_eq!(f.current().name(svc), Some("payments"));
        assert_eq!(f.poll_now(), None, "unchanged");
        std::fs::write(&a, "10.100.0.0/16:80 payments-v2\n10.0.0.0/8 corp\n").unwrap();
        assert_eq!(f.poll_now(), Some(Reload::Loaded(2)));
        assert_eq!(f.current().name(svc), Some("payments-v2"));
        std::fs::write(&a, "10.100.0.0/16:80\n").unwrap();
        assert!(matches!(f.poll_now(), Some(Reload::Failed(e)) if e.starts_with("line 1: ")));
        assert_eq!(
            f.current().name(svc),
            Some("payments-v2"),
            "the old names stay"
        );
        assert_eq!(f.poll_now(), None, "said once");
        // the ConfigMap way: the link now points at another file
        std::fs::write(&b, KUBECTL_LIST).unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&b, &link).unwrap();
        assert!(matches!(f.poll_now(), Some(Reload::Loaded(n)) if n > 3));
        assert_eq!(
            f.current().name(sa("10.96.12.34:80")),
            Some("shop/payments")
        );
        // over the cap: refused, counted, the names stay
        let big = std::fs::File::create(&a).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(matches!(f.poll_now(), Some(Reload::Failed(e)) if e.contains("64 MiB")));
        assert_eq!(
            f.current().name(sa("10.96.12.34:80")),
            Some("shop/payments")
        );
        let c = &f.counts;
        let got = (
            c.success.load(Relaxed),
            c.failure.load(Relaxed),
            c.too_large.load(Relaxed),
        );
        assert_eq!(got, (2, 1, 1));
        let absent = PeerFile::load(&dir.join("absent"))
            .err()
            .unwrap()
            .to_string();
        assert!(absent.starts_with("names file "), "{absent}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

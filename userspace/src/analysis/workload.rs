//! Who owns a socket, from its cgroup v2 path alone (pure: no file is read).
//!
//! The path is relative to the cgroup v2 root (`/` is the root itself), as
//! `/proc/PID/cgroup`'s `0::` line prints it. Recognised layouts:
//!
//! - systemd units: the innermost `*.service` or `*.scope` component that is
//!   not a container's scope (`/system.slice/nginx.service`,
//!   `/user.slice/user-1000.slice/session-3.scope`);
//! - containers, systemd naming: `cri-containerd-<id>.scope` (containerd),
//!   `crio-<id>.scope` (CRI-O), `docker-<id>.scope` (Docker),
//!   `libpod-<id>.scope` (Podman); their runtime's helpers
//!   (`crio-conmon-<id>.scope`, `libpod-conmon-<id>.scope`) are not containers;
//! - containers, cgroupfs naming: a 64-hex-digit directory (under a pod, or
//!   under `/docker/`), `libpod-<id>` under `/libpod_parent/`;
//! - Kubernetes pods, systemd driver:
//!   `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice`
//!   (the uid's `-` written as `_`; Guaranteed pods sit directly in
//!   `kubepods.slice` as `kubepods-pod<uid>.slice`);
//! - Kubernetes pods, cgroupfs driver: `/kubepods/<qos>/pod<uid>` (Guaranteed:
//!   `/kubepods/pod<uid>`).
//!
//! Anything else is a plain cgroup (no unit, container or pod).
use serde::Serialize;

/// A Kubernetes pod's quality-of-service class (its cgroup parent).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "guaranteed",
            Qos::Burstable => "burstable",
            Qos::BestEffort => "besteffort",
        }
    }
    fn parse(s: &str) -> Option<Qos> {
        match s {
            "burstable" => Some(Qos::Burstable),
            "besteffort" => Some(Qos::BestEffort),
            _ => None,
        }
    }
}

/// What the cgroup path says about its owner.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema,
)]
pub struct Workload {
    /// The cgroup path relative to the v2 root.
    pub cgroup: String,
    /// A systemd unit (`nginx.service`, `session-3.scope`), not a container's scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The container runtime (`containerd`, `cri-o`, `docker`, `podman`, or
    /// `cgroupfs` when only a bare id tells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<&'static str>,
    /// The container id (full, as the runtime names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The Kubernetes pod's UID (with dashes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<Qos>,
    /// The pod's namespace and name, when the host can tell (not from the path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
}

impl Workload {
    /// The container id cut to the 12 characters runtimes print (`docker ps`, `crictl ps`).
    pub fn container_short(&self) -> Option<&str> {
        self.container.as_deref().map(|c| &c[..c.len().min(12)])
    }

    /// The pod as operators name it: `namespace/name` when known, else `pod-<uid>`.
    pub fn pod(&self) -> Option<String> {
        match (&self.pod_namespace, &self.pod_name, &self.pod_uid) {
            (Some(ns), Some(n), _) => Some(format!("{ns}/{n}")),
            (_, _, Some(uid)) => Some(format!("pod-{uid}")),
            _ => None,
        }
    }

    /// A name for a network namespace this workload holds: the pod, else
    /// the container (`container:<id12>`).
    pub fn netns_name(&self) -> Option<String> {
        if let Some(p) = self.pod() {
            return Some(format!("pod:{p}"));
        }
        self.container_short().map(|c| format!("container:{c}"))
    }
}

fn is_hex_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A container scope (systemd naming) or a bare id (cgroupfs naming).
fn container_of(comp: &str, parent: Option<&str>) -> Option<(&'static str, String)> {
    const SCOPES: [(&str, &str); 4] = [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
        ("libpod-", "podman"),
    ];
    let base = comp.strip_suffix(".scope").unwrap_or(comp);
    for (prefix, runtime) in SCOPES {
        if let Some(id) = base.strip_prefix(prefix) {
            if is_hex_id(id) {
                return Some((runtime, id.to_string()));
            }
        }
    }
    if is_hex_id(comp) {
        let runtime = match parent {
            Some("docker") => "docker",
            _ => "cgroupfs",
        };
        return Some((runtime, comp.to_string()));
    }
    None
}

/// A pod's (uid, qos) from one path component.
fn pod_of(comp: &str, parent: Option<&str>) -> Option<(String, Qos)> {
    // systemd driver: kubepods-pod<uid>.slice, kubepods-<qos>-pod<uid>.slice
    if let Some(rest) = comp
        .strip_prefix("kubepods-")
        .and_then(|r| r.strip_suffix(".slice"))
    {
        let (qos, uid) = match rest.split_once("-pod") {
            Some((q, uid)) => (Qos::parse(q)?, uid),
            None => (Qos::Guaranteed, rest.strip_prefix("pod")?),
        };
        return valid_uid(&uid.replace('_', "-")).map(|u| (u, qos));
    }
    // cgroupfs driver: kubepods/pod<uid>, kubepods/<qos>/pod<uid>
    let uid = comp.strip_prefix("pod")?;
    let qos = match parent {
        Some("kubepods") => Qos::Guaranteed,
        Some(p) => Qos::parse(p)?,
        None => return None,
    };
    valid_uid(uid).map(|u| (u, qos))
}

/// A pod UID: 36 characters, hex digits and dashes (8-4-4-4-12).
fn valid_uid(u: &str) -> Option<String> {
    let groups: Vec<&str> = u.split('-').collect();
    let shape = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    let hex = u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    (shape && hex).then(|| u.to_ascii_lowercase())
}

fn is_unit(comp: &str) -> bool {
    comp.ends_with(".service") || comp.ends_with(".scope")
}

/// Parse a cgroup v2 path (relative to the root).
pub fn parse(path: &str) -> Workload {
    let mut w = Workload {
        cgroup: if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
        ..Default::default()
    };
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, comp) in comps.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| comps[p]);
        let in_kubepods = comps[..i]
            .iter()
            .any(|c| *c == "kubepods" || *c == "kubepods.slice");
        if let Some((uid, qos)) = in_kubepods.then(|| pod_of(comp, parent)).flatten() {
            w.pod_uid = Some(uid);
            w.qos = Some(qos);
            w.container = None;
            w.runtime = None;
            w.unit = None;
        } else if let Some((runtime, id)) = container_of(comp, parent) {
            w.runtime = Some(runtime);
            w.container = Some(id);
            w.unit = None;
        } else if is_unit(comp) {
            // A unit below a container (systemd inside it) names the unit;
            // the container stays.
            w.unit = Some(comp.to_string());
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f6a2a0c8d5e7b1f9e3c2d1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";
    const UID: &str = "0b6c3a8e-2f41-4d7a-9c55-1e2f3a4b5c6d";

    #[test]
    fn kubelet_systemd_driver_containerd() {
        let uid_ = UID.replace('-', "_");
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        );
        let w = parse(&p);
        assert_eq!(w.pod_uid.as_deref(), Some(UID));
        assert_eq!(w.qos, Some(Qos::Burstable));
        assert_eq!(w.runtime, Some("containerd"));
        assert_eq!(w.container.as_deref(), Some(ID));
        assert_eq!(w.container_short(), Some(&ID[..12]));
        assert_eq!(w.unit, None, "a container's scope is not a unit");
        assert_eq!(w.pod().unwrap(), format!("pod-{UID}"));
        // The pod's own cgroup (the pause container's parent): the pod, no container.
        let pod = parse(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice"
        ));
        assert_eq!(pod.qos, Some(Qos::BestEffort));
        assert_eq!(pod.container, None);
        // Guaranteed: directly below kubepods.slice.
        let g = parse(&format!(
            "/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"
        ));
        assert_eq!((g.qos, g.runtime), (Some(Qos::Guaranteed), Some("cri-o")));
        assert_eq!(g.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn kubelet_cgroupfs_driver() {
        let w = parse(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(w.pod_uid.as_deref(), Some(UID));
        assert_eq!(w.qos, Some(Qos::Burstable));
        assert_eq!(w.container.as_deref(), Some(ID));
        assert_eq!(w.runtime, Some("cgroupfs"));
        let g = parse(&format!("/kubepods/pod{UID}/{ID}"));
        assert_eq!(g.qos, Some(Qos::Guaranteed));
        let b = parse(&format!("/kubepods/besteffort/pod{UID}"));
        assert_eq!((b.qos, b.container), (Some(Qos::BestEffort), None));
    }

    #[test]
    fn crio_and_conmon() {
        let w = parse(&format!("/machine.slice/crio-{ID}.scope"));
        assert_eq!(
            (w.runtime, w.container.as_deref()),
            (Some("cri-o"), Some(ID))
        );
        // conmon is the runtime's monitor, not the container: a plain scope unit.
        let c = parse(&format!("/machine.slice/crio-conmon-{ID}.scope"));
        assert_eq!(c.container, None);
        assert_eq!(c.unit, Some(format!("crio-conmon-{ID}.scope")));
    }

    #[test]
    fn docker_and_podman() {
        let d = parse(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(d.runtime, Some("docker"));
        let d = parse(&format!("/docker/{ID}"));
        assert_eq!(
            (d.runtime, d.container.as_deref()),
            (Some("docker"), Some(ID))
        );
        let p = parse(&format!("/machine.slice/libpod-{ID}.scope/container"));
        assert_eq!(
            (p.runtime, p.container.as_deref()),
            (Some("podman"), Some(ID))
        );
        let p = parse(&format!("/libpod_parent/libpod-{ID}"));
        assert_eq!(p.runtime, Some("podman"));
        assert_eq!(p.netns_name(), Some(format!("container:{}", &ID[..12])));
    }

    #[test]
    fn systemd_units() {
        let w = parse("/system.slice/nginx.service");
        assert_eq!(w.unit.as_deref(), Some("nginx.service"));
        assert_eq!((w.container, w.pod_uid), (None, None));
        let s = parse("/user.slice/user-1000.slice/session-3.scope");
        assert_eq!(s.unit.as_deref(), Some("session-3.scope"));
        let u = parse("/user.slice/user-1000.slice/user@1000.service/app.slice/app-foo.scope");
        assert_eq!(u.unit.as_deref(), Some("app-foo.scope"));
        // systemd inside a container: the unit and the container.
        let n = parse(&format!(
            "/system.slice/docker-{ID}.scope/system.slice/redis.service"
        ));
        assert_eq!(n.unit.as_deref(), Some("redis.service"));
        assert_eq!(n.runtime, Some("docker"));
        assert_eq!(n.netns_name(), Some(format!("container:{}", &ID[..12])));
    }

    #[test]
    fn plain_and_malformed() {
        for p in [
            "/",
            "",
            "/init.scope.d",
            "/mygroup/sub",
            "/kubepods",
            "/pod123",
        ] {
            let w = parse(p);
            assert_eq!(
                (w.unit.clone(), w.container.clone(), w.pod_uid.clone()),
                (None, None, None),
                "{p}: {w:?}"
            );
        }
        assert_eq!(parse("").cgroup, "/");
        // Not 64 hex digits, not a uid: no container, no pod.
        assert_eq!(parse("/system.slice/docker-abc.scope").container, None);
        assert_eq!(
            parse("/system.slice/docker-abc.scope").unit.as_deref(),
            Some("docker-abc.scope")
        );
        assert_eq!(
            parse("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podxyz.slice")
                .pod_uid,
            None
        );
        assert_eq!(
            parse(&format!("/kubepods/gold/pod{UID}")).pod_uid,
            None,
            "unknown QoS directory"
        );
        // A pod-looking directory outside kubepods is not a pod.
        assert_eq!(parse(&format!("/other/burstable/pod{UID}")).pod_uid, None);
    }

    #[test]
    fn pod_names_when_known() {
        let mut w = parse(&format!("/kubepods/pod{UID}/{ID}"));
        w.pod_namespace = Some("db".into());
        w.pod_name = Some("postgres-0".into());
        assert_eq!(w.pod().as_deref(), Some("db/postgres-0"));
        assert_eq!(w.netns_name().as_deref(), Some("pod:db/postgres-0"));
    }
}

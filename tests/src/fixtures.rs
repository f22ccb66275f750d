//! Setups several test files share: the CNI stand-in program (tests/fixtures/cni_standin.bpf.c)
//! compiled, two namespaces joined by a kernel VXLAN, and a pod behind a host-side `lxc` veth.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{sh, unique, NetNs};

/// `ip -n NS ARGS` (ARGS split at whitespace); panics with the namespace, the command and the
/// error.
pub fn ip(ns: &NetNs, args: &str) {
    let mut v = vec!["ip", "-n", &ns.name];
    v.extend(args.split_whitespace());
    sh(&v).unwrap_or_else(|e| panic!("{}: ip {args}: {e}", ns.name));
}

/// A file of the test's own in the temporary directory, removed on drop.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path as tc's arguments take it.
    pub fn to_str(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// tests/fixtures/cni_standin.bpf.c (a tc program that ends the chain, as a CNI's does)
/// compiled by clang-19 to a file of this call's own, removed when the value drops (tc has
/// loaded it by then).
pub fn cni_standin_object() -> TempFile {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/cni_standin.bpf.c");
    let out = TempFile(std::env::temp_dir().join(format!("{}.o", unique("cni-standin-"))));
    let st = Command::new("clang-19")
        .args(["-O2", "-g", "-target", "bpf", "-c"])
        .arg(&src)
        .arg("-o")
        .arg(out.path())
        .status()
        .expect("clang-19 (scripts/setup.sh installs it)");
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// What [`KernelVxlan::new`] builds.
pub struct VxlanSpec<'a> {
    /// The namespaces' name prefix ([`NetNs::new`]).
    pub ns_prefix: &'a str,
    /// The underlay veth's two ends, one in each namespace.
    pub under: [String; 2],
    /// The underlay's /24 (`192.168.79`: the ends are .1 and .2).
    pub underlay: &'a str,
    /// The VXLAN devices' /24 (`10.45.255`: .1 and .2).
    pub inner: &'a str,
    /// The VXLAN's UDP port and VNI.
    pub port: u16,
    pub vni: u32,
}

/// Two namespaces joined by a veth underlay (`under[k]` in `ns[k]`, `UNDERLAY.{k+1}/24`) and a
/// kernel VXLAN device `vx0` in each (our host kernels have the vxlan module, 2026-12-07): MAC
/// `02:42:00:00:00:0{k+1}`, `INNER.{k+1}/24`, the peer's inner address a permanent neighbour
/// (no ARP through the tunnel). The namespaces are deleted on drop.
pub struct KernelVxlan {
    pub ns: [NetNs; 2],
    pub under: [String; 2],
}

impl KernelVxlan {
    pub fn new(spec: VxlanSpec<'_>) -> KernelVxlan {
        let ns = [
            NetNs::new(spec.ns_prefix).unwrap(),
            NetNs::new(spec.ns_prefix).unwrap(),
        ];
        let [ua, ub] = &spec.under;
        sh(&[
            "ip",
            "link",
            "add",
            ua,
            "netns",
            &ns[0].name,
            "type",
            "veth",
            "peer",
            "name",
            ub,
            "netns",
            &ns[1].name,
        ])
        .unwrap();
        let (u, inner) = (spec.underlay, spec.inner);
        for (k, n) in ns.iter().enumerate() {
            let (me, peer, dev) = (k + 1, 2 - k, &spec.under[k]);
            ip(n, &format!("addr add {u}.{me}/24 dev {dev}"));
            ip(n, &format!("link set {dev} up"));
            ip(
                n,
                &format!(
                    "link add vx0 address 02:42:00:00:00:0{me} type vxlan id {} dstport {} \
                     remote {u}.{peer} local {u}.{me} dev {dev}",
                    spec.vni, spec.port
                ),
            );
            ip(n, &format!("addr add {inner}.{me}/24 dev vx0"));
            ip(n, "link set vx0 up");
            ip(
                n,
                &format!(
                    "neigh add {inner}.{peer} lladdr 02:42:00:00:00:0{peer} dev vx0 nud permanent"
                ),
            );
        }
        KernelVxlan {
            ns,
            under: spec.under,
        }
    }
}

/// A pod as Cilium wires it: a namespace (`prefix`, unique) whose `eth0` (MAC `mac`, address
/// `addr`/32, MTU `mtu`) is the peer of `lxc` in `node`; the node routes `addr` to `lxc`, the pod
/// routes everything through 169.254.1.1 on `lxc`'s MAC (ee:ee:ee:ee:ee:ee), neighbours
/// permanent: no ARP. The veth goes with the pod's namespace.
pub fn lxc_pod(node: &NetNs, prefix: &str, lxc: &str, addr: &str, mac: &str, mtu: u32) -> NetNs {
    let ns = NetNs::new(prefix).unwrap();
    ip(
        node,
        &format!(
            "link add {lxc} address ee:ee:ee:ee:ee:ee type veth peer name eth0 address {mac} netns {}",
            ns.name
        ),
    );
    ip(node, &format!("link set {lxc} up"));
    ip(
        node,
        &format!("neigh add {addr} lladdr {mac} dev {lxc} nud permanent"),
    );
    ip(node, &format!("route add {addr}/32 dev {lxc}"));
    ip(&ns, &format!("addr add {addr}/32 dev eth0"));
    ip(&ns, &format!("link set eth0 mtu {mtu} up"));
    ip(
        &ns,
        "neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent",
    );
    ip(&ns, "route add 169.254.1.1 dev eth0 scope link");
    ip(&ns, "route add default via 169.254.1.1 dev eth0");
    ns
}

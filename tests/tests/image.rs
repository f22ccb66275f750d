//! The container image (docs/deploy.md): built offline by
//! scripts/build-image.sh (reused when its inputs did not change), then run
//! under podman exactly as examples/deploy/ (through its kustomization) runs
//! it: the DaemonSet's capabilities and nothing more, its seccomp, no new
//! privileges, read-only root, uid, resource limits, host PID namespace,
//! every volume it mounts, its image and arguments. The node's network
//! namespace (hostNetwork) is a namespace the test made, so the test adds no
//! interface to the real host: namespace A plays the node, B a peer.
//! Truths: the transactions the test's client completed, the programs the
//! container's process held (bpftool), tc/tcx on the interface.
use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value};
use rttscope_e2e::*;
use serde_json::Value as Json;

const PORT: u16 = 5001;
const METRICS_PORT: u16 = 9464;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The manifests as `kubectl kustomize examples/deploy` renders them, as JSON.
fn rendered_manifests() -> Vec<Json> {
    let out = sh(&[
        "kubectl",
        "kustomize",
        repo().join("examples/deploy").to_str().unwrap(),
    ])
    .expect("kubectl kustomize examples/deploy (scripts/setup.sh installs kubectl)");
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with yaml (scripts/setup.sh installs python3-yaml)");
    py.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(out.status.success(), "YAML to JSON failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn kind<'a>(docs: &'a [Json], k: &str) -> &'a Json {
    docs.iter()
        .find(|d| d["kind"] == k)
        .unwrap_or_else(|| panic!("no {k} in the rendered manifests"))
}

/// `podman run` arguments for the DaemonSet's pod, with the node's network
/// namespace at `node_netns`; files the ConfigMap holds are written under `tmp`.
fn podman_args(docs: &[Json], node_netns: &str, tmp: &Path) -> (Vec<String>, Vec<String>) {
    let ds = kind(docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    let mut a: Vec<String> = Vec::new();
    let mut push = |v: &[&str]| a.extend(v.iter().map(|s| s.to_string()));
    assert_eq!(
        pod["hostNetwork"], true,
        "the DaemonSet runs in the node's network namespace"
    );
    push(&["--network", &format!("ns:/var/run/netns/{node_netns}")]);
    if pod["hostPID"] == true {
        push(&["--pid", "host"]);
    }
    assert_eq!(sc["privileged"], false);
    push(&["--cap-drop", "all"]);
    let add: Vec<String> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("CAP_{}", c.as_str().unwrap()))
        .collect();
    push(&["--cap-add", &add.join(",")]);
    if sc["allowPrivilegeEscalation"] == false {
        push(&["--security-opt", "no-new-privileges"]);
    }
    if sc["seccompProfile"]["type"] == "Unconfined" {
        push(&["--security-opt", "seccomp=unconfined"]);
    }
    if sc["readOnlyRootFilesystem"] == true {
        // Kubernetes adds no tmpfs of its own.
        push(&["--read-only", "--read-only-tmpfs=false"]);
    }
    push(&["--user", &sc["runAsUser"].as_u64().unwrap().to_string()]);
    let lim = &c["resources"]["limits"];
    let mem = lim["memory"].as_str().unwrap().trim_end_matches("Mi");
    let cpu: f64 = lim["cpu"]
        .as_str()
        .unwrap()
        .trim_end_matches('m')
        .parse::<f64>()
        .unwrap()
        / 1000.0;
    push(&["--memory", &format!("{mem}m"), "--cpus", &cpu.to_string()]);
    // Kubernetes sets no rlimits of its own: containerd's default spec gives
    // RLIMIT_NOFILE 1024:1024 and inherits the rest. podman instead raises
    // NOFILE and NPROC to maxima a container without CAP_SYS_RESOURCE may not
    // set ("setrlimit RLIMIT_NOFILE: Operation not permitted"; conmon here
    // holds NPROC 32768, the host 96365): give containerd's NOFILE and an
    // NPROC below conmon's. NPROC does not bind uid 0 (kernel/fork.c exempts
    // the initial user's root), the DaemonSet's runAsUser.
    push(&[
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name} mounted but not declared"));
        let src = volume_source(docs, vol, tmp);
        let mut opts = vec![if m["readOnly"] == true { "ro" } else { "rw" }];
        if m["mountPropagation"] == "HostToContainer" {
            opts.push("rslave");
        }
        push(&[
            "-v",
            &format!(
                "{}:{}:{}",
                src.display(),
                m["mountPath"].as_str().unwrap(),
                opts.join(",")
            ),
        ]);
    }
    let image = c["image"].as_str().unwrap().to_string();
    let mut cmd = vec![image];
    cmd.extend(
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string()),
    );
    (a, cmd)
}

/// A volume's host side: a hostPath (a missing DirectoryOrCreate one is a
/// fresh directory of the test's, not created on the host), or the
/// ConfigMap's or Secret's files written out (a Secret's as the kubelet writes
/// them with the pod's fsGroup: group 65534, its defaultMode).
fn volume_source(docs: &[Json], vol: &Json, tmp: &Path) -> PathBuf {
    if let Some(name) = vol["secret"]["secretName"].as_str() {
        return secret_files(docs, name, vol["secret"]["defaultMode"].as_u64(), tmp);
    }
    if let Some(cm) = vol["configMap"]["name"].as_str() {
        let dir = tmp.join(cm);
        std::fs::create_dir_all(&dir).unwrap();
        let cmap = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == cm)
            .unwrap();
        for (file, text) in cmap["data"].as_object().unwrap() {
            std::fs::write(dir.join(file), text.as_str().unwrap()).unwrap();
        }
        return dir;
    }
    let hp = &vol["hostPath"];
    let path = PathBuf::from(hp["path"].as_str().expect("hostPath or configMap volume"));
    if !path.exists() {
        assert_eq!(
            hp["type"],
            "DirectoryOrCreate",
            "{} missing on this host",
            path.display()
        );
        let dir = tmp.join(vol["name"].as_str().unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        return dir;
    }
    path
}

/// The Secret `name`'s files under `tmp/name`, its placeholders filled: the test PKI's server
/// certificate and key, and the bcrypt hash of [`PASSWORD`].
fn secret_files(docs: &[Json], name: &str, mode: Option<u64>, tmp: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let pki = rttscope::sinks::prometheus::web::pki::make(tmp).unwrap();
    let secret = docs
        .iter()
        .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == name)
        .unwrap();
    let hash = bcrypt::hash(PASSWORD, 10).unwrap();
    for (file, text) in secret["stringData"].as_object().unwrap() {
        let text = match file.as_str() {
            "tls.crt" => std::fs::read_to_string(&pki.server_cert).unwrap(),
            "tls.key" => std::fs::read_to_string(&pki.server_key).unwrap(),
            _ => text
                .as_str()
                .unwrap()
                .replace("REPLACE-with-the-bcrypt-hash-from-htpasswd", &hash),
        };
        let p = dir.join(file);
        std::fs::write(&p, text).unwrap();
        std::os::unix::fs::chown(&p, Some(0), Some(65534)).unwrap();
        let mode = mode.unwrap_or(0o644) as u32;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    dir
}

/// The password the test puts in the Secret (its bcrypt hash) and scrapes with.
const PASSWORD: &str = "image-test-password";

/// GET https://127.0.0.1:9464/metrics from inside `ns` with curl, as the Secret's user,
/// trusting the test CA `tmp/ca.pem`: the head and body.
fn scrape_in(ns: &NetNs, tmp: &Path) -> std::io::Result<String> {
    let ca = tmp.join("ca.pem");
    let url = format!("https://127.0.0.1:{METRICS_PORT}/metrics");
    let user = format!("prometheus:{PASSWORD}");
    // Not ns.exec: its error would quote the arguments, the password among them.
    let out = ns
        .command("curl")
        .args(["-sS", "-i", "--max-time", "5", "--cacert"])
        .arg(&ca)
        .args(["-u", &user, &url])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match out.status.success() && text.starts_with("HTTP/1.1 200") {
        true => Ok(text),
        false => Err(std::io::Error::other(format!(
            "{}{}",
            text.lines().next().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr)
        ))),
    }
}

/// (count, sum in seconds) of the RTT histograms of `view` and `side` in the
/// network namespaces `netns` (labels): other tests' flows on the host are
/// seen too (the DaemonSet watches every namespace) and must not be counted.
fn rtt(body: &str, view: &str, side: Option<&str>, netns: &[&str]) -> (f64, f64) {
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    let s = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    let mut out = (0.0, 0.0);
    for x in s.samples.iter().filter(|x| {
        (x.metric == "rttscope_rtt_seconds" || x.metric == "rttscope_rtt_seconds_sum")
            && x.labels.get("view") == Some(view)
            && side.is_none_or(|sd| x.labels.get("side") == Some(sd))
            && x.labels.get("netns").is_some_and(|n| netns.contains(&n))
    }) {
        match &x.value {
            Value::Histogram(h) => out.0 += h.last().map_or(0.0, |b| b.count),
            Value::Untyped(v) | Value::Gauge(v) | Value::Counter(v)
                if x.metric.ends_with("_sum") =>
            {
                out.1 += v
            }
            _ => {}
        }
    }
    out
}

/// A podman container removed on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.0])
            .output();
    }
}

/// The container's output: podman logs replays its stdout and stderr on its own.
fn logs_of(ctr: &str) -> String {
    let o = sh(&["podman", "logs", ctr]).unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn podman(args: &[&str]) -> String {
    let mut v = vec!["podman"];
    v.extend_from_slice(args);
    String::from_utf8_lossy(&sh(&v).unwrap().stdout)
        .trim()
        .to_string()
}

/// Program and link ids held by `pid`, from its file descriptors' fdinfo
/// (`prog_id:` / `link_id:`; Debian 12's bpftool lists no holders).
fn held_by(pid: u32) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let dir = format!("/proc/{pid}/fdinfo");
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if let Some(id) = field("link_id:") {
            out.insert(format!("link {id}"));
        } else if let Some(id) = field("prog_id:") {
            out.insert(format!("prog {id}"));
        }
    }
    out
}

fn still_loaded(ids: &BTreeSet<String>) -> Vec<String> {
    ids.iter()
        .filter(|id| {
            let (what, n) = id.split_once(' ').unwrap();
            Command::new("bpftool")
                .args([what, "show", "id", n])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .cloned()
        .collect()
}

/// Build (or reuse) the image; its name must be the one the manifests use.
/// `--check-reproducible`: the root, layer and commit made a second time
/// from the same inputs give the same image id and digest (~4.5 s).
fn build_image() -> String {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE.get_or_init(build_image_once).clone()
}

fn build_image_once() -> String {
    let t0 = Instant::now();
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg("--check-reproducible")
        .output()
        .expect("scripts/build-image.sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{err}"
    );
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!(
        "image {name} ready in {:.1} s:\n{}",
        t0.elapsed().as_secs_f64(),
        err.lines()
            .filter(|l| l.starts_with("=="))
            .collect::<Vec<_>>()
            .join("\n")
    );
    name
}

/// The OCI runtime: runc, as under containerd on most Kubernetes nodes. crun
/// (podman's default here) refuses hosts with cgroups in hybrid mode ("cgroups
/// in hybrid mode not supported, drop all controllers from cgroupv2"), as our
/// machines are (v1 controllers, hugetlb on the v2 hierarchy).
const RUNTIME: &str = "runc";

/// The node's side of the pair renamed as bridge CNIs name a pod's host-side veth (`veth…`), so
/// that the ConfigMap's own interface patterns find it.
fn as_pod_veth(p: &mut Pair) {
    let name = format!("veth{}", &p.a_if[2..]);
    for args in [
        vec!["ip", "link", "set", p.a_if.as_str(), "down"],
        vec!["ip", "link", "set", p.a_if.as_str(), "name", name.as_str()],
        vec!["ip", "link", "set", name.as_str(), "up"],
    ] {
        p.a.exec(&args).unwrap();
    }
    p.a_if = name;
}

/// The clsact filters on `dev`'s two hooks (tcx links are not filters: the programs left
/// loaded say those).
fn tc_filters(ns: &NetNs, dev: &str) -> Vec<String> {
    ["ingress", "egress"]
        .iter()
        .map(|d| {
            let out = ns.exec(&["tc", "filter", "show", "dev", dev, d]).unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn image_runs_as_the_daemonset_declares() {
    if !require_root() {
        return;
    }
    let image = build_image();
    let docs = rendered_manifests();
    let tmp = std::env::temp_dir().join(unique("rtsimg"));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut p = Pair::new().unwrap();
    as_pod_veth(&mut p);
    let server: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let (ctr, ready) = run_as_the_daemonset_declares(&docs, &image, &p, &tmp);
    let pid: u32 = podman(&["inspect", "--format", "{{.State.Pid}}", &ctr.0])
        .parse()
        .unwrap();
    let held = held_by(pid);

    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cli.pause();
    std::thread::sleep(Duration::from_millis(900));
    let body = scrape_in(&p.a, &tmp).expect("scrape");
    let transactions = cli.transactions.load(Ordering::Relaxed) as f64;
    // The node's namespace is named after the container that joined it.
    let id = podman(&["inspect", "--format", "{{.Id}}", &ctr.0]);
    let node_label = format!("container:{}", &id[..12.min(id.len())]);
    let ours = [p.a.name.as_str(), p.b.name.as_str(), node_label.as_str()];
    let (tcp_c, tcp_sum) = rtt(&body, "tcp", Some("client"), &ours);
    let (tcp_all, _) = rtt(&body, "tcp", None, &ours);
    let (sampler, _) = rtt(&body, "sampler", None, &ours);
    let ss = ss_minrtt_ms(&p.a, cli.local.port()).ok().flatten();
    drop(cli);

    let t1 = Instant::now();
    podman(&["stop", "-t", "10", &ctr.0]);
    let stop = t1.elapsed();
    let code = podman(&["inspect", "--format", "{{.State.ExitCode}}", &ctr.0]);
    let logs = logs_of(&ctr.0);
    let left = still_loaded(&held);
    let tc = tc_filters(&p.a, &p.a_if);
    let mean_ms = if tcp_c > 0.0 {
        tcp_sum / tcp_c * 1e3
    } else {
        f64::NAN
    };
    eprintln!(
        "container ready in {ready:?}, stopped in {stop:?} (exit {code}); held {held:?}; client: {tcp_c} tcp samples (mean {mean_ms:.3} ms, ss min_rtt {ss:?} ms) for {transactions} transactions; tcp all {tcp_all}, sampler {sampler}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        held.iter().any(|h| h.starts_with("prog")),
        "the container's process held no program: {held:?}"
    );
    // One RTT sample per completed transaction on the client (the data sender of each request).
    let tol = (0.05 * transactions).max(3.0);
    assert!(
        transactions >= 50.0 && (tcp_c - transactions).abs() <= tol,
        "client samples {tcp_c} vs transactions {transactions} (tolerance {tol}); scrape:\n{body}\nlogs:\n{logs}"
    );
    // A veth without delay: the mean RTT is far below the 2 ms think time and at least the path's minimum.
    assert!(
        mean_ms < 2.0 && ss.is_none_or(|m| mean_ms >= 0.5 * m),
        "client mean RTT {mean_ms} ms, ss min_rtt {ss:?}"
    );
    assert!(
        sampler >= 50.0,
        "sampler samples of the same traffic: {sampler}; logs:\n{logs}"
    );
    assert_eq!(
        code, "0",
        "SIGTERM (podman stop) ends it cleanly; logs:\n{logs}"
    );
    assert!(
        left.is_empty() && tc.is_empty(),
        "left loaded after stop: {left:?}, tc filters: {tc:?}"
    );
}

/// The image run as examples/deploy/ declares it (podman, the DaemonSet's arguments, the
/// ConfigMap's file) with the pod-side namespace of `p` as its node's, and the test's interval
/// (300 ms): the container (removed on drop) once it serves /metrics, and how long that took.
fn run_as_the_daemonset_declares(
    docs: &[Json],
    image: &str,
    p: &Pair,
    tmp: &Path,
) -> (Container, Duration) {
    let (run_args, cmd) = podman_args(docs, &p.a.name, tmp);
    assert_eq!(
        cmd[0], image,
        "examples/deploy/ runs the image the recipe produces"
    );

    let name = unique("rtsimg");
    let mut args: Vec<String> = ["--runtime", RUNTIME, "run", "-d", "--name", &name]
        .map(String::from)
        .to_vec();
    args.extend(run_args.iter().cloned());
    args.extend(cmd.iter().cloned());
    // The test's own interval, as a flag (it wins over the ConfigMap's file); the views and the
    // sampler's interfaces are the ConfigMap's (its patterns find the pod-side veth).
    args.extend(["--interval", "300ms"].map(String::from));
    eprintln!("podman {}", args.join(" "));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    // Removed on drop also when `podman run` fails (it may leave the container created).
    let ctr = Container(name.clone());
    podman(&argv);
    while scrape_in(&p.a, tmp).is_err() {
        let running = podman(&["inspect", "--format", "{{.State.Running}}", &ctr.0]);
        if t0.elapsed() > Duration::from_secs(30) || running != "true" {
            panic!(
                "the container did not serve /metrics within 30 s (running: {running}):\n{}",
                logs_of(&ctr.0)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let ready = t0.elapsed();
    (ctr, ready)
}

/// The image under the runtime's default seccomp profile (the DaemonSet's pod without its
/// `seccompProfile: Unconfined`: everything else as declared, the same capabilities): podman's
/// default profile refuses bpf() to a container without CAP_SYS_ADMIN. `features` and `observe`
/// must each stop (exit 1) and say in one sentence on stderr that the seccomp filter refuses
/// bpf(), never blaming RLIMIT_MEMLOCK or answering "no" for what the kernel allows.
#[test]
fn image_under_the_default_seccomp_profile_names_it() {
    if !require_root() {
        return;
    }
    let image = build_image();
    let docs = rendered_manifests();
    let tmp = std::env::temp_dir().join(unique("rtsimg"));
    std::fs::create_dir_all(&tmp).unwrap();
    let p = Pair::new().unwrap();
    let (run_args, cmd) = podman_args(&docs, &p.a.name, &tmp);
    let unconfined = run_args.iter().position(|a| a == "seccomp=unconfined");
    let i = unconfined.expect("the DaemonSet declares seccompProfile Unconfined");
    let mut run_args = run_args;
    run_args.drain(i - 1..=i);
    assert!(
        !run_args.iter().any(|a| a.contains("seccomp")),
        "{run_args:?}"
    );
    let runs: [(&str, Vec<String>); 3] = [
        ("features", vec!["features".into()]),
        ("features --json", vec!["features".into(), "--json".into()]),
        ("observe (the DaemonSet's command)", {
            let mut c = cmd[1..].to_vec();
            c.extend(["--duration".into(), "2s".into()]);
            c
        }),
    ];
    for (what, args) in runs {
        let name = unique("rtsimg");
        let mut argv: Vec<String> = ["--runtime", RUNTIME, "run", "--name", &name]
            .map(String::from)
            .to_vec();
        argv.extend(run_args.iter().cloned());
        argv.push(image.clone());
        argv.extend(args);
        let _ctr = Container(name.clone());
        let o = Command::new("podman").args(&argv).output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        );
        eprintln!(
            "podman {}: exit {:?}\n{out}{err}",
            argv.join(" "),
            o.status.code()
        );
        assert_eq!(o.status.code(), Some(1), "{what}: exit 1:\n{out}{err}");
        assert!(
            err.trim().lines().count() == 1
                && err.contains("bpf() is refused by this process's seccomp filter")
                && !err.contains("RLIMIT_MEMLOCK at"),
            "{what}: one sentence on stderr naming seccomp:\n{err}"
        );
        if what == "features --json" {
            let v: Json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert!(
                v["bpf_refused"]
                    .as_str()
                    .is_some_and(|s| s.contains("Seccomp: 2")),
                "{v}"
            );
            let caps = v["capabilities"].as_array().unwrap();
            let said_no: Vec<&Json> = caps
                .iter()
                .filter(|c| c["ok"] == false && c["probed"] != false && c["name"] != "privileges")
                .collect();
            assert!(said_no.is_empty(), "unknown, not refused: {said_no:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The manifests render offline (kustomize) and declare what the image test runs.
#[test]
fn manifests_render_and_use_the_recipe_image() {
    let docs = rendered_manifests();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Namespace", "ConfigMap", "Secret", "DaemonSet"]);
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg("--print-name")
        .output()
        .unwrap();
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let ds = kind(&docs, "DaemonSet");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        name.as_str()
    );
    // The Containerfile builds the same thing: entrypoint, command, port.
    let cf = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let script = std::fs::read_to_string(repo().join("scripts/build-image.sh")).unwrap();
    assert!(
        cf.contains("ENTRYPOINT [\"/usr/local/bin/rttscope\"]")
            && script.contains("--entrypoint '[\"/usr/local/bin/rttscope\"]'")
    );
    assert!(cf.contains("CMD [\"observe\", \"--config\", \"/etc/rttscope/rttscope.toml\"]"));
    assert!(script.contains("--cmd '[\"observe\", \"--config\", \"/etc/rttscope/rttscope.toml\"]'"));
    assert!(cf.contains("EXPOSE 9464/tcp") && script.contains("--port 9464/tcp"));
    assert!(cf.contains("scripts/build-image.sh --root /rootfs"));
    // The flow tables are preallocated kernel memory charged to the pod's
    // memory cgroup: with the observer's own memory they must fit the limit
    // (the DaemonSet once asked 65536 flows under 256Mi and could not start).
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let limit_mib: u64 = c["resources"]["limits"]["memory"]
        .as_str()
        .unwrap()
        .trim_end_matches("Mi")
        .parse()
        .unwrap();
    let cm = kind(&docs, "ConfigMap")["data"]["rttscope.toml"]
        .as_str()
        .unwrap();
    let flows: u64 = cm
        .lines()
        .find_map(|l| l.trim().strip_prefix("max_flows = "))
        .map_or(16384, |v| v.trim().parse().unwrap());
    let per_flow = (std::mem::size_of::<rttscope::bpf::TcpFlow>()
        + std::mem::size_of::<rttscope::bpf::sampler::types::rttscope_sampler_entry>())
        as u64;
    // each view's fine-histogram pool (the sampler's sized by its table: a power of two)
    use rttscope::views::fine::{pool_bytes, pool_entries};
    let table = (flows as u32).next_power_of_two();
    let pools = pool_bytes(pool_entries(flows as u32)) + pool_bytes(pool_entries(table));
    let kernel_mib = (flows * per_flow + pools) / (1 << 20);
    // The observer's RSS at 16384 flows stays under 40 MB (docs/PERFORMANCE.md); 64 MiB of room.
    assert!(
        kernel_mib + 64 <= limit_mib,
        "max_flows {flows} x {per_flow} B + {pools} B of histogram pools = {kernel_mib} MiB of kernel maps + 64 MiB for the observer exceed the {limit_mib}Mi memory limit"
    );
}

/// What can be checked of the Containerfile without a registry (its base
/// images cannot be pulled here): the same labels and version as the
/// offline recipe's, a runtime stage of the recipe's root and nothing else,
/// the packages its build stage installs cover the tools the recipe and
/// build.rs call and exist in Debian bookworm (this host's package lists),
/// and the build context leaves the build directories out.
#[test]
fn containerfile_matches_the_offline_recipe() {
    let cf = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let script = std::fs::read_to_string(repo().join("scripts/build-image.sh")).unwrap();
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap();
    // Labels: the script's (less its reuse label), the same values.
    for l in script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("--label "))
    {
        let l = l.trim_end_matches(" \\").replace("\"$VERSION\"", version);
        if l.starts_with("io.rttscope.inputs") {
            continue;
        }
        assert!(cf.contains(&l), "the Containerfile lacks the label {l}");
    }
    // The runtime stage: scratch plus the recipe's root.
    let runtime = cf
        .split("FROM scratch AS runtime")
        .nth(1)
        .expect("a scratch runtime stage");
    let steps: Vec<&str> = runtime
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("org."))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        steps,
        ["COPY", "EXPOSE", "LABEL", "ENTRYPOINT", "CMD"],
        "{runtime}"
    );
    assert!(runtime.contains("COPY --from=build /rootfs/ /"));
    // The build stage's packages: what build.rs (clang-19, bpftool for
    // vmlinux.h, libbpf's build) and the recipe (mmdebstrap, readelf/strip)
    // call, each in bookworm.
    let install = cf
        .split("apt-get install -y --no-install-recommends")
        .nth(1)
        .and_then(|s| s.split("&&").next())
        .expect("an apt-get install in the build stage");
    let pkgs: Vec<&str> = install.split_whitespace().filter(|w| *w != "\\").collect();
    for need in [
        "clang-19",
        "bpftool",
        "libelf-dev",
        "zlib1g-dev",
        "pkg-config",
        "mmdebstrap",
        "binutils",
    ] {
        assert!(
            pkgs.contains(&need),
            "the build stage does not install {need}: {pkgs:?}"
        );
    }
    let bookworm = std::fs::read_to_string("/etc/os-release")
        .is_ok_and(|s| s.contains("VERSION_CODENAME=bookworm"));
    if bookworm {
        // One `apt-cache policy` (it exits 0 when some are missing): each
        // package's block must name a candidate version.
        let mut args = vec!["apt-cache", "policy"];
        args.extend(&pkgs);
        let out = sh(&args).expect("apt-cache policy");
        let text = String::from_utf8_lossy(&out.stdout);
        let candidate = |p: &str| {
            text.split(&format!("\n{p}:\n"))
                .nth(1)
                .or_else(|| text.strip_prefix(&format!("{p}:\n")))
                .and_then(|b| b.lines().find_map(|l| l.trim().strip_prefix("Candidate: ")))
                .is_some_and(|v| v != "(none)")
        };
        let missing: Vec<&&str> = pkgs.iter().filter(|p| !candidate(p)).collect();
        assert!(
            missing.is_empty(),
            "packages of the Containerfile missing from bookworm's lists: {missing:?}"
        );
    } else {
        eprintln!("not a bookworm host: the Containerfile's packages were not looked up");
    }
    // The build context: no target directories (`COPY . .`).
    let ignore = std::fs::read_to_string(repo().join(".containerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"));
}

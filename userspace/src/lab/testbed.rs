//! The lab's testbed: three network namespaces in a line.
//!
//! ```text
//!   <prefix>-cli            <prefix>-rtr             <prefix>-srv
//!   eth0 10.79.1.2 ---- rc 10.79.1.1 | rs 10.79.2.1 ---- eth0 10.79.2.2
//!        fd79:1::2         fd79:1::1 | fd79:2::1              fd79:2::2
//! ```
//!
//! The veth ends are created directly inside their namespaces, so interface
//! names never exist in the host namespace and the host's network
//! configuration is never touched. The prefix is `rtlab<pid>x<n>`: a stale
//! testbed (its owner died, e.g. SIGKILL) is recognised by the dead pid and
//! removed by [`cleanup_stale`] at the next start. A state file
//! `/run/rttscope/lab/<prefix>.json` also records the owner's start time so
//! a reused pid is not mistaken for the owner.
//!
//! `Drop` removes everything: child processes (SIGTERM, then SIGKILL), any
//! other process still inside the namespaces, then the namespaces — and
//! with them their veths, qdiscs and nftables tables.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Namespace names of every testbed start with this.
pub const PREFIX: &str = "rtlab";
const STATE_DIR: &str = "/run/rttscope/lab";
const NETNS_DIR: &str = "/run/netns";

pub const CLI_ADDR: Ipv4Addr = Ipv4Addr::new(10, 79, 1, 2);
pub const RTR_CLI_ADDR: Ipv4Addr = Ipv4Addr::new(10, 79, 1, 1);
pub const RTR_SRV_ADDR: Ipv4Addr = Ipv4Addr::new(10, 79, 2, 1);
pub const SRV_ADDR: Ipv4Addr = Ipv4Addr::new(10, 79, 2, 2);
pub const CLI_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd79, 1, 0, 0, 0, 0, 0, 2);
pub const RTR_CLI_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd79, 1, 0, 0, 0, 0, 0, 1);
pub const RTR_SRV_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd79, 2, 0, 0, 0, 0, 0, 1);
pub const SRV_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd79, 2, 0, 0, 0, 0, 0, 2);
/// TCP congestion control the lab's bulk flows should use. This host's
/// default is BBR, which keeps queues short and would hide bufferbloat;
/// a namespace cannot change its default to one outside the host's
/// `tcp_allowed_congestion_control` (and the host's is not ours to change),
/// so workloads set it per socket ([`set_tcp_congestion`], `iperf3 -C cubic`).
pub const CONGESTION_CONTROL: &str = "cubic";

/// Set a TCP socket's congestion control (root may pick any built one).
pub fn set_tcp_congestion(sock: &impl std::os::fd::AsRawFd, name: &str) -> std::io::Result<()> {
    // SAFETY: name points to name.len() valid bytes for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
/// The client's and server's interface name.
pub const HOST_IF: &str = "eth0";
/// The router's interface towards the client (egress of the down direction).
pub const RTR_CLI_IF: &str = "rc";
/// The router's interface towards the server (egress of the up direction).
pub const RTR_SRV_IF: &str = "rs";

/// The three places of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Cli,
    Rtr,
    Srv,
}

impl Role {
    pub fn suffix(self) -> &'static str {
        match self {
            Role::Cli => "cli",
            Role::Rtr => "rtr",
            Role::Srv => "srv",
        }
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Run a command; fail with one sentence and its stderr if it fails.
pub fn run(args: &[&str]) -> Result<Output> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} (is it installed?)", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Run a command inside a named namespace (`ip netns exec`).
pub fn run_in(ns: &str, args: &[&str]) -> Result<Output> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v)
}

/// Start time (clock ticks since boot) of a process, field 22 of /proc/PID/stat.
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces: fields after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The owner pid encoded in a testbed namespace name (`rtlab<pid>x<n>-role`).
pub fn owner_pid(ns_name: &str) -> Option<u32> {
    let rest = ns_name.strip_prefix(PREFIX)?;
    let end = rest.find('x')?;
    rest[..end].parse().ok()
}

fn prefix_of(ns_name: &str) -> &str {
    ns_name.rsplit_once('-').map(|(p, _)| p).unwrap_or(ns_name)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StateFile {
    pid: u32,
    start_time: u64,
    namespaces: Vec<String>,
}

/// Is the owner of a testbed prefix still alive (same pid, same start time)?
fn owner_alive(prefix: &str) -> bool {
    let Some(pid) = owner_pid(prefix) else {
        return true; // not ours to judge: leave it
    };
    let Some(start) = proc_start_time(pid) else {
        return false;
    };
    let state = Path::new(STATE_DIR).join(format!("{prefix}.json"));
    match std::fs::read(&state)
        .ok()
        .and_then(|b| serde_json::from_slice::<StateFile>(&b).ok())
    {
        Some(st) => st.pid == pid && st.start_time == start,
        // No state file yet (being created right now) or unreadable: the pid is alive, trust it.
        None => true,
    }
}

/// Kill (SIGKILL) every process inside a named namespace.
fn kill_all_in(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                if pid as u32 != std::process::id() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

fn delete_ns(ns: &str) {
    kill_all_in(ns);
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

/// Names of all namespaces whose name starts with `rtlab`.
pub fn lab_namespaces() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    v.sort();
    v
}

/// Remove testbeds whose owner process is dead. Returns the namespaces removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut removed = Vec::new();
    for ns in lab_namespaces() {
        if !owner_alive(prefix_of(&ns)) {
            tracing::info!("removing stale lab namespace {ns}");
            delete_ns(&ns);
            removed.push(ns);
        }
    }
    // State files of dead owners whose namespaces are already gone.
    for e in std::fs::read_dir(STATE_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(prefix) = name.strip_suffix(".json") {
            if prefix.starts_with(PREFIX) && !owner_alive(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    removed
}

/// A child process started inside the testbed.
struct Tracked {
    what: String,
    child: Child,
}

/// The three namespaces and their links. Dropping it removes everything.
pub struct Testbed {
    pub prefix: String,
    children: Mutex<Vec<Tracked>>,
    created: Vec<String>,
    state_file: PathBuf,
}

impl Testbed {
    /// Build the testbed (after removing stale ones). Needs root.
    pub fn new() -> Result<Self> {
        if !nix::unistd::geteuid().is_root() {
            bail!("the lab needs root (it creates network namespaces)");
        }
        cleanup_stale();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("{PREFIX}{}x{n}", std::process::id());
        let mut tb = Testbed {
            state_file: Path::new(STATE_DIR).join(format!("{prefix}.json")),
            prefix,
            children: Mutex::new(Vec::new()),
            created: Vec::new(),
        };
        tb.build().context("building the lab testbed")?;
        Ok(tb)
    }

    /// Name of the namespace of `role`.
    pub fn ns(&self, role: Role) -> String {
        format!("{}-{}", self.prefix, role.suffix())
    }

    /// Path of the namespace of `role` (for setns).
    pub fn ns_path(&self, role: Role) -> PathBuf {
        Path::new(NETNS_DIR).join(self.ns(role))
    }

    pub fn server_addr(&self) -> IpAddr {
        IpAddr::V4(SRV_ADDR)
    }

    pub fn client_addr(&self) -> IpAddr {
        IpAddr::V4(CLI_ADDR)
    }

    fn write_state(&self) -> Result<()> {
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("creating {STATE_DIR}"))?;
        let st = StateFile {
            pid: std::process::id(),
            start_time: proc_start_time(std::process::id()).unwrap_or(0),
            namespaces: [Role::Cli, Role::Rtr, Role::Srv]
                .iter()
                .map(|r| self.ns(*r))
                .collect(),
        };
        crate::sys::files::write_atomically(&self.state_file, &serde_json::to_vec_pretty(&st)?)
            .with_context(|| format!("writing {}", self.state_file.display()))
    }

    fn build(&mut self) -> Result<()> {
        self.write_state()?;
        for role in [Role::Cli, Role::Rtr, Role::Srv] {
            let ns = self.ns(role);
            run(&["ip", "netns", "add", &ns])?;
            self.created.push(ns.clone());
            run_in(&ns, &["ip", "link", "set", "lo", "up"])?;
        }
        let (cli, rtr, srv) = (self.ns(Role::Cli), self.ns(Role::Rtr), self.ns(Role::Srv));
        // veth ends are created in their target namespaces directly.
        run(&[
            "ip", "link", "add", HOST_IF, "netns", &cli, "type", "veth", "peer", "name",
            RTR_CLI_IF, "netns", &rtr,
        ])?;
        run(&[
            "ip", "link", "add", RTR_SRV_IF, "netns", &rtr, "type", "veth", "peer", "name",
            HOST_IF, "netns", &srv,
        ])?;
        address_links(&cli, &rtr, &srv)?;
        route_through_router(&cli, &rtr, &srv)
    }

    /// A `Command` that runs `program` inside the namespace of `role`.
    pub fn command(&self, role: Role, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(role), program]);
        c
    }

    /// Run a command inside `role`'s namespace and wait for it.
    pub fn exec(&self, role: Role, args: &[&str]) -> Result<Output> {
        run_in(&self.ns(role), args)
    }

    /// Start a long-running child inside `role`'s namespace; it is stopped
    /// (SIGTERM, then SIGKILL after 1 s) when the testbed is dropped, and it
    /// gets SIGKILL if this process dies first (PR_SET_PDEATHSIG — note the
    /// signal follows the *thread* that spawned it, so spawn from a thread
    /// that outlives the child). Returns its pid.
    pub fn spawn(&self, role: Role, args: &[&str]) -> Result<u32> {
        use std::os::unix::process::CommandExt;
        let mut cmd = self.command(role, args[0]);
        cmd.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} in {}", args[0], self.ns(role)))?;
        let pid = child.id();
        self.children.lock().unwrap().push(Tracked {
            what: args.join(" "),
            child,
        });
        Ok(pid)
    }

    /// Run `f` on a thread that has entered `role`'s namespace and wait for it.
    pub fn run_in<T: Send + 'static>(
        &self,
        role: Role,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let path = self.ns_path(role);
        let h = std::thread::spawn(move || -> Result<T> {
            crate::sys::netns::enter_path(&path, &path.to_string_lossy())?;
            Ok(f())
        });
        h.join()
            .map_err(|_| anyhow::anyhow!("thread inside the namespace panicked"))?
    }

    /// Stop the children started with `spawn` (SIGTERM, SIGKILL after `grace`).
    pub fn stop_children(&self, grace: Duration) {
        let mut kids = std::mem::take(&mut *self.children.lock().unwrap());
        for t in &kids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(t.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + grace;
        for t in &mut kids {
            loop {
                match t.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => {
                        tracing::debug!("killing {} (no exit after SIGTERM)", t.what);
                        let _ = t.child.kill();
                        let _ = t.child.wait();
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.stop_children(Duration::from_secs(1));
        for ns in self.created.iter().rev() {
            delete_ns(ns);
        }
        let _ = std::fs::remove_file(&self.state_file);
    }
}

/// IPv4 and IPv6 addresses on both veth pairs (DAD off, so they are usable
/// at once), links up.
fn address_links(cli: &str, rtr: &str, srv: &str) -> Result<()> {
    let addr = |ns: &str, a: String, dev: &str| -> Result<()> {
        run_in(ns, &["ip", "addr", "add", &a, "dev", dev])?;
        Ok(())
    };
    let addr6 = |ns: &str, a: String, dev: &str| -> Result<()> {
        run_in(ns, &["ip", "-6", "addr", "add", &a, "dev", dev, "nodad"])?;
        Ok(())
    };
    // IPv6 first: disable DAD so addresses are usable at once.
    for ns in [cli, rtr, srv] {
        run_in(ns, &["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0"])?;
        run_in(ns, &["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])?;
    }
    addr(cli, format!("{CLI_ADDR}/24"), HOST_IF)?;
    addr(rtr, format!("{RTR_CLI_ADDR}/24"), RTR_CLI_IF)?;
    addr(rtr, format!("{RTR_SRV_ADDR}/24"), RTR_SRV_IF)?;
    addr(srv, format!("{SRV_ADDR}/24"), HOST_IF)?;
    addr6(cli, format!("{CLI_ADDR6}/64"), HOST_IF)?;
    addr6(rtr, format!("{RTR_CLI_ADDR6}/64"), RTR_CLI_IF)?;
    addr6(rtr, format!("{RTR_SRV_ADDR6}/64"), RTR_SRV_IF)?;
    addr6(srv, format!("{SRV_ADDR6}/64"), HOST_IF)?;
    run_in(cli, &["ip", "link", "set", HOST_IF, "up"])?;
    run_in(srv, &["ip", "link", "set", HOST_IF, "up"])?;
    run_in(rtr, &["ip", "link", "set", RTR_CLI_IF, "up"])?;
    run_in(rtr, &["ip", "link", "set", RTR_SRV_IF, "up"])?;
    Ok(())
}

/// Default routes of the client and the server through the router, which forwards.
fn route_through_router(cli: &str, rtr: &str, srv: &str) -> Result<()> {
    let via = |ns: &str, family: &[&str], gw: String| -> Result<()> {
        let mut cmd = vec!["ip"];
        cmd.extend_from_slice(family);
        cmd.extend_from_slice(&["route", "add", "default", "via", gw.as_str()]);
        run_in(ns, &cmd)?;
        Ok(())
    };
    via(cli, &[], RTR_CLI_ADDR.to_string())?;
    via(srv, &[], RTR_SRV_ADDR.to_string())?;
    via(cli, &["-6"], RTR_CLI_ADDR6.to_string())?;
    via(srv, &["-6"], RTR_SRV_ADDR6.to_string())?;
    run_in(rtr, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    run_in(rtr, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_owner_pid() {
        assert_eq!(owner_pid("rtlab1234x0-rtr"), Some(1234));
        assert_eq!(owner_pid("rtlab77x12"), Some(77));
        assert_eq!(owner_pid("rtlabx0-rtr"), None);
        assert_eq!(owner_pid("other1x0"), None);
        assert_eq!(prefix_of("rtlab1234x0-rtr"), "rtlab1234x0");
    }

    #[test]
    fn reads_own_start_time() {
        assert!(proc_start_time(std::process::id()).is_some());
        assert_eq!(proc_start_time(u32::MAX), None);
    }
}

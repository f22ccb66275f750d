//! Daemon mode inside `observe`: the exporter, the `/metrics` server task and
//! the program statistics.
use std::collections::BTreeMap;

use anyhow::Result;

use super::http::{serve_on_thread, ServerThread};
use super::{Exporter, LabelPolicy};
use crate::sys::bpf::ProgStats;
use crate::views::view::{FlowDelta, FlowSink};
use crate::views::ViewKind;

/// Daemon mode inside `observe`: the exporter, the `/metrics` server thread,
/// the OTLP pusher and the program statistics. Started after attach (it
/// drops capabilities).
pub struct Daemon {
    pub exporter: Exporter,
    progs: ProgStats,
    server: Option<ServerThread>,
    otlp: Option<Otlp>,
    /// Namespace names known at start (with full privileges: the host's
    /// namespace is named through /proc/1, which needs CAP_SYS_PTRACE later).
    start_names: BTreeMap<u32, String>,
}

/// `--otlp`: where and how often to push.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    pub endpoint: crate::sinks::otlp::Endpoint,
    pub interval: std::time::Duration,
}

/// The OTLP side of the daemon.
struct Otlp {
    pusher: crate::sinks::otlp::Pusher,
    resource: crate::sinks::otlp::proto::Resource,
    interval: std::time::Duration,
    last: Option<std::time::Instant>,
    start_ns: u64,
}

impl Otlp {
    /// Start the pusher of `c` (its statistics registered in the exporter's registry).
    fn start(exporter: &mut Exporter, c: OtlpConfig) -> Result<Otlp> {
        let stats = crate::sinks::otlp::Stats::register(exporter.registry_mut());
        let host = crate::analysis::results::HostInfo::current().hostname;
        eprintln!(
            "rttscope: pushing OTLP to http://{}{} every {:?}",
            c.endpoint.authority, c.endpoint.path, c.interval
        );
        Ok(Otlp {
            pusher: crate::sinks::otlp::Pusher::start(c.endpoint, stats)?,
            resource: crate::sinks::otlp::resource(&host),
            interval: c.interval,
            last: None,
            start_ns: crate::sinks::otlp::unix_ns(),
        })
    }

    /// Queue a request of this render when the push interval is due (or `force`).
    fn maybe_push(&mut self, r: &super::Rendered, force: bool) {
        let due = self.last.is_none_or(|t| t.elapsed() >= self.interval);
        if !(due || force) {
            return;
        }
        self.last = Some(std::time::Instant::now());
        let times = crate::sinks::otlp::Times {
            start_ns: self.start_ns,
            now_ns: crate::sinks::otlp::unix_ns(),
        };
        let req = crate::sinks::otlp::request(r, &self.resource, times);
        self.pusher.push(prost::Message::encode_to_vec(&req));
    }
}

impl Daemon {
    /// Start serving on `listener` (bound before attach) and pushing OTLP
    /// (`otlp`), enable program statistics if asked, print what was
    /// attached, then drop capabilities. Needs a tokio runtime (the server
    /// is a task on it).
    pub fn start(
        listener: Option<tokio::net::TcpListener>,
        otlp: Option<OtlpConfig>,
        policy: LabelPolicy,
        bpf_stats: bool,
        views: &[Box<dyn crate::views::view::View>],
    ) -> Result<Daemon> {
        let mut exporter = Exporter::new(policy)?;
        let otlp = match otlp {
            Some(c) => Some(Otlp::start(&mut exporter, c)?),
            None => None,
        };
        let (progs, notes) = prog_stats(views, bpf_stats);
        let lines = attach_lines(
            crate::views::tcp::track::of(views),
            crate::views::sampler::track::of(views),
            &notes,
        );
        let addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        let start_names = crate::sys::netns::names();
        for l in lines {
            eprintln!("rttscope: {l}");
        }
        drop_privileges()?;
        if let Some(a) = addr {
            let note = if a.ip().is_loopback() {
                ""
            } else {
                " (not loopback: reachable from other hosts)"
            };
            eprintln!("rttscope: serving /metrics on http://{a}/metrics{note}");
        }
        exporter.render();
        // after the privileges are dropped: the thread inherits what is left
        let server = listener
            .map(|l| serve_on_thread(l, exporter.handle()))
            .transpose()?;
        Ok(Daemon {
            exporter,
            progs,
            server,
            otlp,
            start_names,
        })
    }

    fn ns_label(&self, inode: u32, name: String) -> String {
        if name.starts_with("net:") {
            if let Some(n) = self.start_names.get(&inode) {
                return n.clone();
            }
        }
        name
    }

    /// The interval's counters of every view (observe's `counters` map), and
    /// the program statistics; expire idle series; render what `/metrics`
    /// serves until the next interval and push OTLP when due.
    pub fn counters(&mut self, counters: &crate::analysis::records::Counters) {
        for (view, c) in counters {
            let Some(v) = ViewKind::from_name(view) else {
                continue;
            };
            let c: BTreeMap<&str, u64> = c.iter().map(|(k, n)| (k.as_ref(), *n)).collect();
            self.exporter.set_counters(v, &c);
        }
        self.exporter.set_prog_stats(&self.progs);
        self.exporter.set_process_stats();
        self.exporter.expire_idle();
        let r = self.exporter.render();
        if let Some(o) = self.otlp.as_mut() {
            o.maybe_push(&r, false);
        }
    }
}

impl FlowSink for Daemon {
    /// One TCP flow of this read: `prev` is observe's snapshot of the flow's
    /// cumulative histogram at the previous read (None: a new flow).
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>) {
        let ns = self.ns_label(d.flow.netns, d.netns_name.to_string());
        self.exporter
            .observe_owned_flow(view, d.flow, d.side, &ns, d.owner, d.delta, None);
    }
}

impl Drop for Daemon {
    /// Stop serving; push the last counts (the pusher sends what is queued).
    fn drop(&mut self) {
        drop(self.server.take());
        if let Some(o) = self.otlp.as_mut() {
            let r = self.exporter.render();
            o.maybe_push(&r, true);
        }
    }
}

/// Our programs' statistics (kernel run-time statistics enabled when
/// `bpf_stats`), and notes on what they cannot tell.
fn prog_stats(
    views: &[Box<dyn crate::views::view::View>],
    bpf_stats: bool,
) -> (ProgStats, Vec<(&'static str, String)>) {
    let ids: Vec<(String, u32)> = views.iter().flat_map(|v| v.passive().prog_ids()).collect();
    let id_refs: Vec<(&str, u32)> = ids.iter().map(|(n, i)| (n.as_str(), *i)).collect();
    let mut progs = ProgStats::from_ids(&id_refs);
    let mut notes: Vec<(&str, String)> = Vec::new();
    if bpf_stats {
        if let Err(e) = progs.enable_kernel_stats() {
            notes.push(("bpf run-time statistics", crate::error::sentence(&e)));
        }
    } else if !progs.kernel_stats_enabled() {
        notes.push((
            "bpf run-time statistics",
            "off (kernel.bpf_stats_enabled=0; use --bpf-stats or set the sysctl): run time/count read 0".to_string(),
        ));
    }
    if progs.programs().len() < ids.len() {
        notes.push((
            "program statistics",
            format!(
                "found {} of {} programs among our file descriptors",
                progs.programs().len(),
                ids.len()
            ),
        ));
    }
    (progs, notes)
}

/// The lines that say what was attached (or why not), then the notes.
fn attach_lines(
    tcp: Option<&dyn crate::views::tcp::TcpView>,
    sampler: Option<&dyn crate::views::sampler::SamplerView>,
    notes: &[(&str, String)],
) -> Vec<String> {
    let mut lines = hooks_report(tcp.map(|t| t.info()), notes);
    match sampler {
        Some(s) => {
            for a in s.attach_info() {
                lines.insert(
                    lines.len() - notes.len(),
                    format!(
                        "attached: sampler view: {} ingress+egress on {} in {} ({} link)",
                        a.how, a.iface, a.netns, a.link
                    ),
                );
            }
        }
        None => lines.push(
            "unavailable: sampler view: not requested (--view tcp,sampler --iface NAME)".into(),
        ),
    }
    if tcp.is_none() {
        if let Some(l) = lines
            .iter_mut()
            .find(|l| l.starts_with("unavailable: tcp view"))
        {
            *l = "unavailable: tcp view: not requested (--view)".into();
        }
    }
    lines
}

/// Run as nobody from here on: the maps and programs are read through file
/// descriptors already open (docs/security.md). Says what is left.
fn drop_privileges() -> Result<()> {
    let id = crate::sys::caps::UNPRIVILEGED_ID;
    if crate::sys::caps::switch_user(id, id)? {
        eprintln!("rttscope: running as uid {id}, gid {id}");
    } else if crate::sys::caps::is_root() {
        eprintln!("rttscope: still uid 0: no CAP_SETUID/CAP_SETGID to switch to uid {id} (see docs/security.md)");
    }
    let state = crate::sys::caps::drop_to_needed()?;
    eprintln!("rttscope: {}", crate::sys::caps::describe(&state));
    let more =
        crate::sys::caps::threads_holding_more(crate::sys::caps::mask(&crate::sys::caps::KEEP));
    if !more.is_empty() {
        eprintln!("rttscope: warning: threads {more:?} still hold other capabilities");
    }
    Ok(())
}

/// Startup lines: hooks attached and unavailable (with the reason), for
/// daemon mode's log.
fn hooks_report(
    tcp: Option<&crate::views::tcp::TcpHookInfo>,
    unavailable: &[(&str, String)],
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(i) = tcp {
        out.push(format!(
            "attached: tcp view: {} at cgroup {} (programs {:?}, flow map {} entries)",
            i.hook, i.cgroup, i.prog_ids, i.max_flows
        ));
        out.push(format!(
            "attached: tcp view: iter/tcp enabled {} existing connections in {}",
            i.existing_enabled,
            if i.iter_netns.is_empty() {
                "no namespace".to_string()
            } else {
                i.iter_netns.join(",")
            }
        ));
        out.push(format!("existing connections: {}", i.existing_path));
        if i.existing_not_timed > 0 {
            out.push(format!(
                "unavailable: tcp view: {} connections open before attach are not timed (this kernel refuses bpf_setsockopt from iter/tcp and the per-ACK hook)",
                i.existing_not_timed
            ));
        }
        if i.rtt_source.starts_with("srtt") {
            out.push(format!("degraded: tcp view: {}", i.rtt_source));
        }
        if let Some(why) = i.ack_hook.strip_prefix("refused: ") {
            out.push(format!(
                "unavailable: tcp view: per-ACK hook {}: {why}",
                crate::views::tcp::ACK_HOOK
            ));
        }
    } else {
        out.push("unavailable: tcp view: not attached".into());
    }
    for (what, why) in unavailable {
        out.push(format!("unavailable: {what}: {why}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_report_lists_unavailable() {
        let lines = hooks_report(
            None,
            &[("sampler view", "not requested (--view sampler)".into())],
        );
        assert!(lines[0].contains("unavailable: tcp view"));
        assert!(lines[1].contains("sampler view: not requested"));
    }

    #[test]
    fn hooks_report_says_why_the_ack_hook_is_missing() {
        let cfg = crate::views::tcp::TcpViewConfig::default();
        let mut info =
            crate::views::tcp::TcpHookInfo::new(&cfg, std::path::Path::new("/sys/fs/cgroup"), 16);
        info.set_ack_hook(Err("refused: Operation not permitted (os error 1)".into()));
        let lines = hooks_report(Some(&info), &[]);
        assert!(
            lines.iter().any(|l| l
                == "unavailable: tcp view: per-ACK hook fexit/tcp_ack_update_rtt: Operation not permitted (os error 1)"),
            "{lines:?}"
        );
        info.set_ack_hook(Ok(()));
        let lines = hooks_report(Some(&info), &[]);
        assert!(
            lines[0].contains("RTT samples: fexit/tcp_ack_update_rtt"),
            "{lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("unavailable")),
            "{lines:?}"
        );
        assert_eq!(info.rtt_source_short(), "fexit tcp_ack_update_rtt");
    }
}

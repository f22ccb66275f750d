//! Daemon mode inside `observe`: the exporter, the `/metrics` server task and
//! the program statistics.
use std::collections::BTreeMap;

use anyhow::Result;

use super::http::{serve_on_thread, Listener, ServerThread};
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

/// `--otlp`: where, how and how often to push.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    pub settings: crate::sinks::otlp::Settings,
    pub interval: std::time::Duration,
}

/// The OTLP side of the daemon.
struct Otlp {
    pusher: crate::sinks::otlp::Pusher,
    stats: crate::sinks::otlp::Stats,
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
        let s = &c.settings;
        let names: Vec<&str> = s.headers.iter().map(|h| h.name.as_str()).collect();
        eprintln!(
            "rttscope: pushing OTLP to {} every {:?} (timeout {:?}{}{}{})",
            s.endpoint.shown(),
            c.interval,
            s.timeout,
            match s.compression {
                crate::sinks::otlp::settings::Compression::Gzip => ", gzip",
                crate::sinks::otlp::settings::Compression::None => "",
            },
            match names.is_empty() {
                true => String::new(),
                false => format!(", headers {}", names.join(", ")),
            },
            match s.tls.client_cert.is_some() {
                true => ", client certificate",
                false => "",
            }
        );
        Ok(Otlp {
            pusher: crate::sinks::otlp::Pusher::start(s, stats.clone())?,
            stats,
            resource: crate::sinks::otlp::resource(&host),
            interval: c.interval,
            last: None,
            start_ns: crate::sinks::otlp::unix_ns(),
        })
    }

    /// A request of this render, encoded.
    fn encode(&self, r: &super::Rendered) -> Vec<u8> {
        let times = crate::sinks::otlp::Times {
            start_ns: self.start_ns,
            now_ns: crate::sinks::otlp::unix_ns(),
        };
        let req = crate::sinks::otlp::request(r, &self.resource, times);
        prost::Message::encode_to_vec(&req)
    }

    /// Queue a request of this render when the push interval is due (within a tenth: with
    /// `--otlp-interval` equal to `--interval`, a read a little early still pushes).
    fn maybe_push(&mut self, r: &super::Rendered) {
        if self
            .last
            .is_some_and(|t| t.elapsed() + self.interval / 10 < self.interval)
        {
            return;
        }
        self.last = Some(std::time::Instant::now());
        self.pusher.push(self.encode(r));
    }

    /// Exit: only this last render is sent, within the exit deadline; say how it went.
    fn finish(&mut self, r: &super::Rendered) {
        let t0 = std::time::Instant::now();
        let failed = self.pusher.finish(Some(self.encode(r)));
        let last = match failed {
            None => "the last request delivered".to_string(),
            Some(why) => format!("the last request not delivered: {why}"),
        };
        eprintln!(
            "rttscope: OTLP at exit: {last} ({:.2} s); {} delivered, {} dropped in all (rttscope_otlp_dropped_total)",
            t0.elapsed().as_secs_f64(),
            self.stats.sent.get(),
            self.stats.dropped_total()
        );
    }
}

impl Daemon {
    /// Start serving on `listener` (bound before attach) and pushing OTLP
    /// (`otlp`), enable program statistics if asked, print what was
    /// attached, then drop capabilities. Needs a tokio runtime (the server
    /// is a task on it).
    pub fn start(
        listener: Option<Listener>,
        otlp: Option<OtlpConfig>,
        policy: LabelPolicy,
        bpf_stats: bool,
        session: &crate::session::Session,
        names: Option<std::sync::Arc<crate::analysis::peers::PeerFile>>,
    ) -> Result<Daemon> {
        let mut exporter = Exporter::new(policy)?;
        if let Some(n) = names {
            exporter.set_names(n);
        }
        let otlp = match otlp {
            Some(c) => Some(Otlp::start(&mut exporter, c)?),
            None => None,
        };
        let (progs, notes) = prog_stats(session.views(), bpf_stats);
        let lines = attach_lines(session.attached(), &notes);
        if let Some(w) = listener.as_ref().and_then(|l| l.web.as_ref()) {
            w.stats.register(exporter.registry_mut());
        }
        let serving = listener.as_ref().map(serving_line);
        let start_names = crate::sys::netns::names();
        for l in lines {
            eprintln!("rttscope: {l}");
        }
        drop_privileges()?;
        for l in serving.into_iter().flatten() {
            eprintln!("rttscope: {l}");
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

    /// The handshakes the views saw this interval, by side (before [`Daemon::counters`]).
    pub fn handshakes(&mut self, hs: &BTreeMap<ViewKind, crate::views::view::SideTotals>) {
        for (side, h) in hs.values().flatten() {
            self.exporter.observe_handshakes(*side, h);
        }
    }

    /// The views' hooks as checked this interval (before [`Daemon::counters`], which renders).
    pub fn hooks(&mut self, hooks: &[crate::analysis::records::HookStatus]) {
        self.exporter.set_hooks(hooks);
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
        self.exporter.update_names();
        self.exporter.expire_idle();
        let r = self.exporter.render();
        if let Some(o) = self.otlp.as_mut() {
            o.maybe_push(&r);
        }
    }
}

impl FlowSink for Daemon {
    /// One TCP flow of this read: `prev` is observe's snapshot of the flow's
    /// cumulative histogram at the previous read (None: a new flow).
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>) {
        let ns = self.ns_label(d.flow.netns, d.netns_name.to_string());
        self.exporter.observe_delta(view, d, &ns);
    }
}

impl Drop for Daemon {
    /// Stop serving; push the last counts (only them, within the exit deadline).
    fn drop(&mut self) {
        drop(self.server.take());
        if let Some(o) = self.otlp.as_mut() {
            let r = self.exporter.render();
            o.finish(&r);
        }
    }
}

/// What `/metrics` is served as, and a warning when it is open to other hosts without TLS
/// or authentication, or takes passwords over plain HTTP from them.
fn serving_line(l: &Listener) -> Vec<String> {
    let Ok(a) = l.tcp.local_addr() else {
        return Vec::new();
    };
    let plain = super::web::Active::plain();
    let active = l.web.as_ref().map(|w| w.current());
    let active = active.as_deref().unwrap_or(&plain);
    let scheme = if active.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut lines = vec![format!(
        "serving /metrics on {scheme}://{a}/metrics ({})",
        active.describe()
    )];
    if a.ip().is_loopback() {
        return lines;
    }
    if active.tls.is_none() && !active.authenticates() {
        lines.push(format!("warning: /metrics on {a} is not loopback and has neither TLS nor authentication: every host that reaches it reads the flows' addresses and workloads (give --web-config-file, docs/metrics.md#tls-and-authentication)"));
    } else if active.tls.is_none() {
        lines.push(format!("warning: /metrics on {a} takes basic-auth passwords over plain HTTP from other hosts (add tls_server_config to the web config file)"));
    }
    lines
}

/// Our programs' statistics (kernel run-time statistics enabled when
/// `bpf_stats`), and notes on what they cannot tell.
fn prog_stats(
    views: &[Box<dyn crate::views::view::View>],
    bpf_stats: bool,
) -> (ProgStats, Vec<(&'static str, String)>) {
    let ids: Vec<(String, u32)> = views.iter().flat_map(|v| v.prog_ids()).collect();
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

/// The lines that say what each view attached, in registry order (a view not asked for: how to
/// ask for it), with the notes after the first view's lines and the last lines an attached view
/// wrote.
fn attach_lines(views: &[crate::views::view::Attached], notes: &[(&str, String)]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut at = 0;
    for (i, kind) in ViewKind::ALL.iter().enumerate() {
        let attached = match views.iter().find(|v| v.kind == *kind) {
            Some(v) => v.log.clone(),
            None => Vec::new(),
        };
        let said = !attached.is_empty();
        lines.extend(attached);
        if !views.iter().any(|v| v.kind == *kind) {
            lines.extend(crate::views::not_requested(*kind).map(String::from));
        }
        if i == 0 || said {
            at = lines.len();
        }
    }
    let notes = notes
        .iter()
        .map(|(what, why)| format!("unavailable: {what}: {why}"));
    lines.splice(at..at, notes);
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
    let allowed = crate::sys::caps::mask(&crate::sys::caps::KEEP);
    let mut more = crate::sys::caps::threads_holding_more(allowed);
    if !more.is_empty() {
        // the sampler's interface followers drop theirs at their next wake (100 ms)
        std::thread::sleep(std::time::Duration::from_millis(300));
        more = crate::sys::caps::threads_holding_more(allowed);
    }
    if !more.is_empty() {
        eprintln!("rttscope: warning: threads {more:?} still hold other capabilities");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_lines_say_what_was_not_requested_then_the_notes() {
        let lines = attach_lines(&[], &[("bpf run-time statistics", "off".into())]);
        assert_eq!(
            lines,
            [
                "unavailable: tcp view: not requested (--view)",
                "unavailable: bpf run-time statistics: off",
                "unavailable: sampler view: not requested (--view tcp,sampler --iface NAME)",
            ]
        );
    }
}

//! Daemon mode inside `observe`: the exporter, the `/metrics` server task and
//! the program statistics.
use std::collections::BTreeMap;

use anyhow::Result;

use super::http::serve;
use super::{Exporter, LabelPolicy, View};
use crate::analysis::hist::Hist;
use crate::sys::bpf::ProgStats;
use crate::views::flow::{Flow, Side};

/// Daemon mode inside `observe`: the exporter, the `/metrics` server task and
/// the program statistics. Started after attach (it drops capabilities).
pub struct Daemon {
    pub exporter: Exporter,
    progs: ProgStats,
    server: tokio::task::JoinHandle<()>,
    /// Namespace names known at start (with full privileges: the host's
    /// namespace is named through /proc/1, which needs CAP_SYS_PTRACE later).
    start_names: BTreeMap<u32, String>,
}

impl Daemon {
    /// Start serving on `listener` (bound before attach), enable program
    /// statistics if asked, print what was attached, then drop capabilities.
    /// Needs a tokio runtime (the server is a task on it).
    pub fn start(
        listener: tokio::net::TcpListener,
        policy: LabelPolicy,
        bpf_stats: bool,
        tcp: Option<&dyn crate::views::tcp::TcpView>,
        sampler: Option<&dyn crate::views::sampler::SamplerView>,
    ) -> Result<Daemon> {
        let exporter = Exporter::new(policy)?;
        let mut ids: Vec<(String, u32)> = Vec::new();
        if let Some(t) = tcp {
            ids.extend(t.prog_ids().into_iter().map(|(n, i)| (n.to_string(), i)));
        }
        if let Some(s) = sampler {
            ids.extend(s.prog_ids());
        }
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
        let mut lines = crate::sys::caps::hooks_report(tcp.map(|t| t.info()), &notes);
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
        let addr = listener.local_addr().ok();
        let start_names = crate::sys::netns::names();
        for l in lines {
            eprintln!("rttscope: {l}");
        }
        let state = crate::sys::caps::drop_to_needed()?;
        eprintln!("rttscope: {}", crate::sys::caps::describe(&state));
        let more =
            crate::sys::caps::threads_holding_more(crate::sys::caps::mask(&crate::sys::caps::KEEP));
        if !more.is_empty() {
            eprintln!("rttscope: warning: threads {more:?} still hold other capabilities");
        }
        if let Some(a) = addr {
            let note = if a.ip().is_loopback() {
                ""
            } else {
                " (not loopback: reachable from other hosts)"
            };
            eprintln!("rttscope: serving /metrics on http://{a}/metrics{note}");
        }
        let server = tokio::spawn(serve(listener, exporter.handle()));
        Ok(Daemon {
            exporter,
            progs,
            server,
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

    /// One TCP flow of this read: `prev` is observe's snapshot of the flow's
    /// cumulative histogram at the previous read (None: a new flow).
    pub fn tcp_flow(
        &mut self,
        f: &crate::views::tcp::TcpFlowState,
        prev: Option<&crate::analysis::hist::Snapshot>,
        mut netns_name: impl FnMut(u32) -> String,
    ) {
        let delta = match prev {
            Some(p) => p.delta(&f.counts, f.sum_us),
            None => f.hist(),
        };
        if delta.count() == 0 {
            return;
        }
        let ns = netns_name(f.flow.netns);
        let ns = self.ns_label(f.flow.netns, ns);
        self.exporter
            .observe_flow(View::Tcp, &f.flow, f.side, &ns, &delta, None);
    }

    /// One sampler flow's samples since the previous read.
    pub fn sampler_delta(&mut self, flow: &Flow, side: Side, netns_name: &str, delta: &Hist) {
        let ns = self.ns_label(flow.netns, netns_name.to_string());
        self.exporter
            .observe_flow(View::Sampler, flow, side, &ns, delta, None);
    }

    /// The interval's counters of every view (observe's `counters` map), and
    /// the program statistics; expire idle series.
    pub fn counters(&mut self, counters: &BTreeMap<&str, BTreeMap<&str, u64>>) {
        for (view, c) in counters {
            let v = match *view {
                "tcp" => View::Tcp,
                "sampler" => View::Sampler,
                _ => continue,
            };
            self.exporter.set_counters(v, c);
        }
        self.exporter.set_prog_stats(&self.progs);
        self.exporter.set_process_stats();
        self.exporter.expire_idle();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.server.abort();
    }
}

//! `rttscope features`: what this kernel allows (the feature probes of
//! `crate::views::probe`, run now) and what each view will do here, as
//! `bpftool feature probe` reports a kernel. Exits non-zero when `observe`
//! could not load its views on this host.
use std::io::Write;

use anyhow::Result;

use crate::views::probe::{ExistingPath, Features, TcpRttPath};

/// Print what this kernel allows and which path each view takes here.
#[derive(Debug, clap::Args)]
pub struct FeaturesArgs {
    /// One JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The path each view takes on a kernel with these features, and what is
/// missing, in sentences (the report's second half, and the JSON's `views`).
#[derive(Debug, serde::Serialize)]
pub struct Plan {
    pub tcp_rtt_source: TcpRttPath,
    pub tcp_existing_connections: ExistingPath,
    pub sampler_attach: &'static str,
    /// The TCP view's object build: "tcp" (BPF atomics with a result) or
    /// "tcp_noatomic" (built without them, where the kernel refuses them).
    pub tcp_object: &'static str,
    /// Whether `observe --sampler` can load here: since its build without
    /// BPF atomics, wherever `observe` runs at all.
    pub sampler_available: bool,
    /// The sampler's object build: "sampler" (BPF atomics with a result) or
    /// "sampler_noatomic" (built without them, where the kernel refuses them).
    pub sampler_object: &'static str,
    pub lines: Vec<String>,
    pub missing: Vec<String>,
    /// Why `observe` cannot run here (None: it can).
    pub blocker: Option<String>,
}

impl Plan {
    pub fn of(f: &Features) -> Plan {
        let atomics = f.atomics_choice();
        let rtt = f.tcp_rtt_path();
        let existing = f.existing_path();
        // the build without atomics' hook times only connections open before attach
        let table = existing == ExistingPath::AckHookTable;
        let mut lines = vec![
            if table && rtt == TcpRttPath::SrttFallback {
                "tcp view: RTT samples from the srtt fallback for connections opened after attach (no RTT_CB arguments; the per-ACK hook, without socket storage here, times only those open before attach)".to_string()
            } else {
                format!("tcp view: RTT samples from {}", rtt_words(rtt))
            },
            format!(
                "tcp view: connections open before attach: {}",
                if atomics.used || existing != ExistingPath::None {
                    existing_words(existing)
                } else {
                    "NOT timed (the build without BPF atomics, for kernels < 5.12, times them only through the per-ACK hook, refused here: iter/tcp can neither turn their callbacks on nor give them socket storage)"
                }
            ),
            format!(
                "sampler view: attaches by {} under both loaders (--attach auto)",
                f.sampler_attach()
            ),
        ];
        let mut missing = Vec::new();
        if !atomics.used {
            lines.insert(2, format!("tcp view: kernel programs built without BPF atomics with a result ({}): fresh flow slots and fine-histogram entries come from stacks rttscope fills; the same samples and histograms", atomics.why));
        }
        if !atomics.used {
            lines.push(format!("sampler view: kernel programs built without BPF atomics with a result ({}): each table way's lock is a bpf_spin_lock, fine-histogram entries come from stacks rttscope fills; the same samples and histograms", atomics.why));
        }
        if !f.atomics.ok {
            missing.push("BPF atomics with a result (BPF_CMPXCHG/BPF_XCHG, 5.12 upstream): both views run their builds without them (tcp_noatomic, sampler_noatomic)".into());
        }
        if rtt == TcpRttPath::SrttFallback {
            missing.push(if table {
                "per-sample RTT for connections opened after attach: no RTT_CB arguments, and no socket storage in fexit programs for the per-ACK hook; their samples are TCP's srtt before each update".into()
            } else {
                "per-sample RTT: neither RTT_CB arguments nor the per-ACK hook; samples are TCP's srtt before each update".into()
            });
        }
        if existing == ExistingPath::None {
            missing.push(
                "connections open before attach are not timed (they are counted and reported)"
                    .into(),
            );
        }
        for c in f.all().into_iter().filter(|c| !c.probed) {
            missing.push(format!(
                "{} {} (the path above is a guess, not the kernel's answer)",
                c.name, c.detail
            ));
        }
        if !f.tcx.ok {
            missing.push("tcx links: the sampler uses clsact filters (removed on exit; a killed observer's are removed by the next start)".into());
        }
        Plan {
            tcp_rtt_source: rtt,
            tcp_existing_connections: existing,
            sampler_attach: f.sampler_attach(),
            tcp_object: if atomics.used { "tcp" } else { "tcp_noatomic" },
            sampler_available: true,
            sampler_object: if atomics.used {
                "sampler"
            } else {
                "sampler_noatomic"
            },
            lines,
            missing,
            blocker: f.blocker(),
        }
    }
}

pub fn rtt_words(p: TcpRttPath) -> &'static str {
    match p {
        TcpRttPath::RttCbArgs => "the sock_ops RTT callback's arguments (rtt_cb_args)",
        TcpRttPath::AckHook => {
            "the per-ACK hook fexit/tcp_ack_update_rtt (no RTT_CB arguments here)"
        }
        TcpRttPath::SrttFallback => "the srtt fallback (no RTT_CB arguments, per-ACK hook refused)",
        TcpRttPath::RttCb => {
            "the sock_ops RTT callback: its arguments where passed, else srtt (not probed here)"
        }
    }
}

pub fn existing_words(p: ExistingPath) -> &'static str {
    match p {
        ExistingPath::Iterator => "enabled by iter/tcp (bpf_setsockopt)",
        ExistingPath::AckHook => {
            "found by iter/tcp, timed by the per-ACK hook (bpf_setsockopt from iter/tcp refused)"
        }
        ExistingPath::AckHookTable => {
            "found by iter/tcp and recorded by socket address in a bounded table (tcp_existing, up to --max-flows), timed by the per-ACK hook fexit/tcp_ack_update_rtt from their first ACK after attach (the build without BPF atomics: no bpf_setsockopt nor socket storage in iter/tcp, no socket storage in fexit)"
        }
        ExistingPath::None => {
            "NOT timed (bpf_setsockopt from iter/tcp and the per-ACK hook both refused)"
        }
    }
}

pub fn run(args: FeaturesArgs) -> Result<()> {
    let f = Features::get();
    let plan = Plan::of(f);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let doc = serde_json::json!({
            "kernel": f.kernel,
            "capabilities": f.all(),
            "views": plan,
            "observe_can_run": plan.blocker.is_none(),
        });
        writeln!(out, "{doc}")?;
    } else {
        writeln!(
            out,
            "kernel {} (probed: programs loaded and attached, not version numbers)",
            f.kernel
        )?;
        for c in f.all() {
            writeln!(
                out,
                "  {:<16} {:<3}  {}",
                c.name,
                match (c.ok, c.probed) {
                    (true, _) => "yes",
                    (false, true) => "no",
                    (false, false) => "?",
                },
                c.detail
            )?;
        }
        writeln!(out)?;
        for l in &plan.lines {
            writeln!(out, "{l}")?;
        }
        for m in &plan.missing {
            writeln!(out, "missing: {m}")?;
        }
    }
    out.flush()?;
    if let Some(b) = plan.blocker {
        anyhow::bail!("observe cannot load its views on this host ({b})");
    }
    Ok(())
}

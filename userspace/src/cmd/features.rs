//! `rttscope features`: what this kernel allows (the feature probes of
//! `crate::views::features`, run now) and what each view will do here, as
//! `bpftool feature probe` reports a kernel. Exits non-zero when `observe`
//! could not load its views on this host.
use std::io::Write;

use anyhow::Result;

use crate::views::features::Features;

/// Print what this kernel allows and which path each view takes here.
#[derive(Debug, clap::Args)]
pub struct FeaturesArgs {
    /// One JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also list what already runs on this interface's tc hooks (XDP, tcx programs and clsact
    /// filters, in the order they run) and whether the packet sampler would see the packets
    /// there ([NETNS:]DEV; repeatable). DEV may be a pattern (`'lxc*'`): each interface that
    /// matches it now.
    #[arg(long, value_name = "[NETNS:]DEV")]
    pub iface: Vec<String>,
}

/// The path each view takes on a kernel with these features, and what is
/// missing, in sentences (the report's second half, and the JSON's `views`): each view's own
/// fields (`tcp_rtt_source`, `sampler_attach`, ..., from its folder's `plan`), then the lines
/// and what is missing, in registry order.
#[derive(Debug, serde::Serialize)]
pub struct Plan {
    #[serde(flatten)]
    pub views: serde_json::Map<String, serde_json::Value>,
    pub lines: Vec<String>,
    pub missing: Vec<String>,
    /// Why `observe` cannot run here (None: it can).
    pub blocker: Option<String>,
}

impl Plan {
    pub fn of(f: &Features) -> Plan {
        let mut plan = Plan {
            views: serde_json::Map::new(),
            lines: Vec::new(),
            missing: Vec::new(),
            blocker: f.blocker(),
        };
        if f.bpf_refused.is_some() {
            // No probe reached the kernel: no path to announce. The reason is said once, as
            // the privileges check's answer.
            plan.missing.push(
                "what this kernel allows is unknown here, not refused: this process's seccomp \
                 filter refuses bpf() to every probe (privileges, above)"
                    .into(),
            );
            return plan;
        }
        if !f.atomics.ok {
            plan.missing.push("BPF atomics with a result (BPF_CMPXCHG/BPF_XCHG, 5.12 upstream): both views run their builds without them (tcp_noatomic, sampler_noatomic)".into());
        }
        for v in crate::views::plans(f) {
            plan.views.extend(v.fields);
            plan.lines.extend(v.lines);
            plan.missing.extend(v.missing);
        }
        for c in f.all().into_iter().filter(|c| !c.probed) {
            plan.missing.push(format!(
                "{} {} (the path above is a guess, not the kernel's answer)",
                c.name, c.detail
            ));
        }
        plan
    }
}

pub fn run(args: FeaturesArgs) -> Result<()> {
    let f = Features::get();
    let plan = Plan::of(f);
    let mut iface_lines = Vec::new();
    let mut iface_docs = Vec::new();
    for i in &args.iface {
        let (lines, docs) = crate::views::iface_hooks(i, f)?;
        iface_lines.extend(lines);
        iface_docs.extend(docs);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let doc = serde_json::json!({
            "kernel": f.kernel,
            "bpf_refused": f.bpf_refused,
            "capabilities": f.all(),
            "views": plan,
            "observe_can_run": plan.blocker.is_none(),
            "ifaces": iface_docs,
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
        for l in &iface_lines {
            writeln!(out, "{l}")?;
        }
    }
    out.flush()?;
    if let Some(b) = plan.blocker {
        anyhow::bail!("observe cannot load its views on this host ({b})");
    }
    Ok(())
}

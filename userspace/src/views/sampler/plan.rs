//! What the sampler will do on a kernel with these features (`rttscope features`): how it
//! attaches, which object build it loads, and what it misses here.
use serde_json::json;

use crate::views::features::{Features, ViewPlan};

pub fn plan(f: &Features) -> ViewPlan {
    let atomics = f.atomics_choice();
    let mut lines = vec![format!(
        "sampler view: attaches by {} under both loaders (--attach auto)",
        f.sampler_attach()
    )];
    if !atomics.used {
        lines.push(format!("sampler view: kernel programs built without BPF atomics with a result ({}): each table way's lock is a bpf_spin_lock, fine-histogram entries come from stacks rttscope fills; the same samples and histograms", atomics.why));
    }
    let mut missing = Vec::new();
    if !f.tcx.ok {
        missing.push("tcx links: the sampler uses clsact filters (removed on exit; a killed observer's are removed by the next start)".into());
    }
    let fields = json!({
        "sampler_attach": f.sampler_attach(),
        // whether `observe --view sampler` can load here: since its build without BPF atomics,
        // wherever `observe` runs at all
        "sampler_available": true,
        // "sampler" (BPF atomics with a result) or "sampler_noatomic" (built without them)
        "sampler_object": if atomics.used { "sampler" } else { "sampler_noatomic" },
    });
    ViewPlan::new(fields, lines, missing)
}

//! What the TCP view will do on a kernel with these features (`rttscope features`): where its
//! RTT samples come from, how it times connections open before attach, which object build it
//! loads, and what it misses here.
use serde_json::json;

use crate::views::features::{ExistingPath, Features, TcpRttPath, ViewPlan};

pub fn plan(f: &Features) -> ViewPlan {
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
    ];
    if !atomics.used {
        lines.push(format!("tcp view: kernel programs built without BPF atomics with a result ({}): fresh flow slots and fine-histogram entries come from stacks rttscope fills; the same samples and histograms", atomics.why));
    }
    let mut missing = Vec::new();
    if rtt == TcpRttPath::SrttFallback {
        missing.push(if table {
            "per-sample RTT for connections opened after attach: no RTT_CB arguments, and no socket storage in fexit programs for the per-ACK hook; their samples are TCP's srtt before each update".into()
        } else {
            "per-sample RTT: neither RTT_CB arguments nor the per-ACK hook; samples are TCP's srtt before each update".into()
        });
    }
    if existing == ExistingPath::None {
        missing.push(
            "connections open before attach are not timed (they are counted and reported)".into(),
        );
    }
    let fields = json!({
        "tcp_rtt_source": rtt,
        "tcp_existing_connections": existing,
        // "tcp" (BPF atomics with a result) or "tcp_noatomic" (built without them, where the
        // kernel refuses them)
        "tcp_object": if atomics.used { "tcp" } else { "tcp_noatomic" },
    });
    ViewPlan::new(fields, lines, missing)
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

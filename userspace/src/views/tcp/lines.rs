//! What the TCP view says when it starts: the table's lines under the
//! header (what it will and will not see) and daemon mode's log lines (what
//! it attached, or why a part of it could not be).
use super::{TcpHookInfo, ACK_HOOK};

/// What the view will and will not see: new connections (every namespace, or the `--netns`
/// ones: `netns`), connections already open (only where the iterator ran), and how to see more
/// (`all_netns`: `--all-netns` was given).
pub fn seen_line(netns: &[&str], all_netns: bool, info: &TcpHookInfo) -> String {
    let new = if netns.is_empty() {
        "new connections: every namespace".to_string()
    } else {
        format!("new connections: in {}", netns.join(","))
    };
    let open = format!(
        "connections already open: {} enabled, in {} only ({})",
        info.existing_enabled,
        info.iter_netns.join(","),
        info.existing_path
    );
    let hint = if all_netns {
        ""
    } else if netns.is_empty() {
        " (those open in other namespaces give no samples: --all-netns enables them everywhere, --netns NAME watches one namespace)"
    } else {
        " (those open in other namespaces give no samples: --all-netns enables them everywhere)"
    };
    format!("{new}; {open}{hint}")
}

/// The table's lines under the header: [`seen_line`], the build without atomics, the
/// connections open before attach that are not timed.
pub fn start_lines(netns: &[&str], all_netns: bool, info: &TcpHookInfo) -> Vec<String> {
    let mut out = vec![seen_line(netns, all_netns, info)];
    if let Some(w) = &info.without_atomics {
        out.push(format!("tcp view without BPF atomics: {w}"));
    }
    if info.existing_not_timed > 0 {
        out.push(format!(
            "existing connections NOT timed: {} (this kernel refuses bpf_setsockopt from iter/tcp and the per-ACK hook; see `rttscope features`)",
            info.existing_not_timed
        ));
    }
    out
}

/// Daemon mode's lines: the hooks attached and those unavailable (with the reason).
pub fn attach_lines(i: &TcpHookInfo) -> Vec<String> {
    let mut out = Vec::new();
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
            "unavailable: tcp view: per-ACK hook {ACK_HOOK}: {why}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::tcp::TcpViewConfig;

    #[test]
    fn attach_lines_say_why_the_ack_hook_is_missing() {
        let cfg = TcpViewConfig::default();
        let mut info = TcpHookInfo::new(&cfg, std::path::Path::new("/sys/fs/cgroup"), 16);
        info.set_ack_hook(Err("refused: Operation not permitted (os error 1)".into()));
        let lines = attach_lines(&info);
        assert!(
            lines.iter().any(|l| l
                == "unavailable: tcp view: per-ACK hook fexit/tcp_ack_update_rtt: Operation not permitted (os error 1)"),
            "{lines:?}"
        );
        info.set_ack_hook(Ok(()));
        let lines = attach_lines(&info);
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

    #[test]
    fn seen_line_hints_what_is_missed() {
        let cfg = TcpViewConfig::default();
        let info = TcpHookInfo::new(&cfg, std::path::Path::new("/sys/fs/cgroup"), 16);
        let every = seen_line(&[], false, &info);
        assert!(
            every.starts_with(
                "new connections: every namespace; connections already open: 0 enabled, in  only ("
            ),
            "{every}"
        );
        assert!(
            every.ends_with(
                "--all-netns enables them everywhere, --netns NAME watches one namespace)"
            ),
            "{every}"
        );
        let some = seen_line(&["a", "b"], false, &info);
        assert!(some.starts_with("new connections: in a,b; "), "{some}");
        assert!(
            some.ends_with("--all-netns enables them everywhere)"),
            "{some}"
        );
        assert!(seen_line(&["a"], true, &info).ends_with(')'));
        assert!(!seen_line(&["a"], true, &info).contains("--all-netns"));
    }
}

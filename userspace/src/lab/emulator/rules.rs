//! What the kernel does on the router: the nftables loss rules, the iptables rules that steer
//! each delayed direction to its queue, tbf for the bottleneck, their counters read back, and
//! `ip netns exec` with a ruleset on stdin.
use anyhow::{bail, Context, Result};

use super::link::{Direction, LinkConfig};

/// The nftables table the lab owns inside the router namespace.
pub const NFT_TABLE: &str = "rttscope_lab";

/// The nftables ruleset for both directions: random loss, at priority -200
/// (before the mangle-table queue rules at -150, so lost packets never
/// reach the emulator).
pub fn nft_ruleset(cfg: &[LinkConfig; 2]) -> String {
    let mut rules = String::new();
    for d in Direction::BOTH {
        let c = &cfg[d.idx()];
        let iif = d.ingress_if();
        let thresh = (c.loss_pct * 100.0).round() as u32;
        if thresh > 0 {
            rules.push_str(&format!(
                "    iifname \"{iif}\" numgen random mod 10000 < {thresh} counter drop comment \"loss-{d:?}\"\n"
            ));
        }
    }
    // add + delete + define in one transaction: atomic replace, also when absent.
    format!(
        "add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{\n  chain lab_forward {{\n    type filter hook forward priority -200; policy accept;\n{rules}  }}\n}}\n"
    )
}

/// The `iptables-restore` input (same for ip6tables) that steers each
/// delayed direction to its queue. This kernel has no nftables `queue`
/// expression (CONFIG_NFT_QUEUE unset) but has the xtables NFQUEUE target,
/// which iptables-nft loads through nft_compat. The router namespace is
/// ours, so the lab owns its whole mangle table.
pub fn iptables_rules(cfg: &[LinkConfig; 2], queues: [u16; 2]) -> String {
    let mut s = String::from(
        "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    );
    for d in Direction::BOTH {
        if cfg[d.idx()].needs_queue() {
            s.push_str(&format!(
                "-A FORWARD -i {} -j NFQUEUE --queue-num {} --queue-bypass\n",
                d.ingress_if(),
                queues[d.idx()]
            ));
        }
    }
    s.push_str("COMMIT\n");
    s
}

/// Packets counted by the NFQUEUE rules of `iptables-save -c -t mangle`, per direction.
pub fn parse_iptables_save(text: &str, queues: [u16; 2]) -> [u64; 2] {
    let mut n = [0u64; 2];
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((counts, rule)) = rest.split_once(']') else {
            continue;
        };
        let pkts: u64 = counts
            .split(':')
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        for (i, q) in queues.iter().enumerate() {
            if rule.contains(&format!("--queue-num {q} "))
                || rule.ends_with(&format!("--queue-num {q}"))
            {
                n[i] += pkts;
            }
        }
    }
    n
}

/// tbf arguments for a rate and queue limit: burst = max(2 ms at rate, 3 kB).
pub fn tbf_args(rate_bps: u64, queue_limit: Option<u64>) -> Vec<String> {
    let burst = ((rate_bps / 8) / 500).max(3028);
    let limit = queue_limit.unwrap_or(64 * 1024).max(burst);
    vec![
        "tbf".into(),
        "rate".into(),
        format!("{rate_bps}bit"),
        "burst".into(),
        burst.to_string(),
        "limit".into(),
        limit.to_string(),
    ]
}

/// Sum the `counter` packets of the rules commented `loss-Up` / `loss-Down`.
pub fn parse_nft_counters(json: &str) -> [u64; 2] {
    let mut loss = [0u64; 2];
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return loss;
    };
    for item in v["nftables"].as_array().into_iter().flatten() {
        let rule = &item["rule"];
        let Some(comment) = rule["comment"].as_str() else {
            continue;
        };
        let packets = rule["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e["counter"]["packets"].as_u64())
            .unwrap_or(0);
        match comment {
            "loss-Up" => loss[0] += packets,
            "loss-Down" => loss[1] += packets,
            _ => {}
        }
    }
    loss
}

/// Run `args` inside namespace `ns` with `input` on stdin.
pub(super) fn feed(ns: &str, args: &[&str], input: &str) -> Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {} (is it installed?)", args[0]))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .with_context(|| format!("writing to {}", args[0]))?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ruleset_has_loss_and_queue_per_direction() {
        let up = LinkConfig {
            delay: Duration::from_millis(50),
            loss_pct: 2.5,
            ..Default::default()
        };
        let down = LinkConfig::default();
        let s = nft_ruleset(&[up, down]);
        assert!(
            s.contains("iifname \"rc\" numgen random mod 10000 < 250 counter drop"),
            "{s}"
        );
        assert!(
            !s.contains("iifname \"rs\""),
            "a clean direction has no rules: {s}"
        );
        assert!(s.contains("priority -200"), "{s}");
        assert!(s.starts_with("add table inet rttscope_lab\ndelete table inet rttscope_lab\n"));
        let q = iptables_rules(&[up, down], [10, 11]);
        assert!(
            q.contains("-A FORWARD -i rc -j NFQUEUE --queue-num 10 --queue-bypass\n"),
            "{q}"
        );
        assert!(!q.contains("-i rs"), "{q}");
        assert!(q.starts_with("*mangle\n") && q.ends_with("COMMIT\n"));
    }

    #[test]
    fn tbf_burst_and_limit() {
        let a = tbf_args(10_000_000, Some(1_000_000));
        assert_eq!(
            a,
            [
                "tbf",
                "rate",
                "10000000bit",
                "burst",
                "3028",
                "limit",
                "1000000"
            ]
        );
        let a = tbf_args(1_000_000_000, None);
        assert_eq!(a[4], "250000");
        assert_eq!(a[6], "250000", "limit is at least the burst");
    }

    #[test]
    fn parses_counters() {
        let j = r#"{"nftables":[{"metainfo":{}},{"table":{"family":"inet","name":"rttscope_lab"}},
        {"rule":{"chain":"lab_forward","comment":"loss-Up","expr":[{"match":{}},{"counter":{"packets":7,"bytes":700}},{"drop":null}]}},
        {"rule":{"chain":"lab_forward","comment":"delay-Down","expr":[{"counter":{"packets":40,"bytes":4000}},{"queue":{}}]}}]}"#;
        assert_eq!(parse_nft_counters(j), [7, 0]);
        assert_eq!(parse_nft_counters("garbage"), [0, 0]);
        let save = "*mangle\n:FORWARD ACCEPT [5:500]\n[12:1200] -A FORWARD -i rc -j NFQUEUE --queue-num 10 --queue-bypass\n[3:300] -A FORWARD -i rs -j NFQUEUE --queue-num 11 --queue-bypass\nCOMMIT\n";
        assert_eq!(parse_iptables_save(save, [10, 11]), [12, 3]);
    }
}

//! Per-interval reports of the passive views: one row per flow, columns per
//! view, a totals row; as a table or as JSON Lines (schema: docs/observe.md).
use std::io::Write;

use crate::analysis::units::fmt_ms;
use crate::session::{Interval, ViewStats};

/// Table output: a header line with the settings, then rows.
pub fn print_table(
    w: &mut impl Write,
    header: &str,
    iv: &Interval,
    views: &[&str],
) -> std::io::Result<()> {
    writeln!(w, "{header} | t={:.1}s", iv.t)?;
    let mut h = format!(
        "{:<10} {:<22} {:<22} {:<6}",
        "NETNS", "LOCAL", "REMOTE", "SIDE"
    );
    for v in views {
        let v = v.to_uppercase();
        h += &format!(
            " | {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            format!("{v} N"),
            "MIN",
            "MEAN",
            "P50",
            "P90",
            "P99",
            "MAX"
        );
        if v == "TCP" {
            h += &format!(" {:>8} {:>4}", "SRTT", "RETR");
        }
    }
    writeln!(w, "{h}   (ms)")?;
    for r in &iv.flows {
        let mut line = format!(
            "{:<10} {:<22} {:<22} {:<6}",
            trunc(&r.netns_name, 10),
            trunc(&r.local, 22),
            trunc(&r.remote, 22),
            if r.closed {
                format!("{}*", r.side.as_str())
            } else {
                r.side.as_str().to_string()
            }
        );
        for v in views {
            let s = match *v {
                "tcp" => r.tcp.as_ref(),
                "sampler" => r.sampler.as_ref(),
                _ => None,
            };
            line += &cols(s, *v == "tcp");
        }
        writeln!(w, "{line}")?;
    }
    // One TOTAL row per side: the two ends of a connection see different
    // RTTs (the responding side times the other's think time), so a total
    // over both would describe neither.
    for side in ["client", "server", "unknown"] {
        if !iv.totals.values().any(|t| t.contains_key(side)) {
            continue;
        }
        let n = iv.flows.iter().filter(|r| r.side.as_str() == side).count();
        let mut tot = format!(
            "{:<10} {:<22} {:<22} {:<6}",
            "TOTAL",
            format!("{n} {}", if n == 1 { "flow" } else { "flows" }),
            "",
            side
        );
        for v in views {
            tot += &cols(iv.totals.get(v).and_then(|t| t.get(side)), *v == "tcp");
        }
        writeln!(w, "{tot}")?;
    }
    writeln!(w)?;
    Ok(())
}

fn cols(s: Option<&ViewStats>, tcp: bool) -> String {
    let mut out = match s {
        Some(s) if s.summary.n > 0 => {
            let m = &s.summary;
            format!(
                " | {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
                m.n,
                fmt_ms(m.min_us),
                fmt_ms(m.mean_us),
                fmt_ms(m.p50_us),
                fmt_ms(m.p90_us),
                fmt_ms(m.p99_us),
                fmt_ms(m.max_us)
            )
        }
        _ => format!(
            " | {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            0, "-", "-", "-", "-", "-", "-"
        ),
    };
    if tcp {
        let srtt = s
            .and_then(|s| s.srtt_us)
            .map(|v| fmt_ms(v as f64))
            .unwrap_or_else(|| "-".into());
        let retr = s
            .and_then(|s| s.retrans)
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into());
        out += &format!(" {srtt:>8} {retr:>4}");
    }
    out
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "~"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::hist::Hist;
    use crate::session::FlowRow;
    use crate::views::flow::Side;
    use std::collections::BTreeMap;

    #[test]
    fn table_has_header_rows_and_totals() {
        let mut h = Hist::default();
        for v in [100, 120, 140] {
            h.record(v);
        }
        let mut vs = ViewStats::from_hist(&h);
        vs.srtt_us = Some(120);
        vs.retrans = Some(0);
        let row = FlowRow {
            netns: 1,
            netns_name: "ns-a".into(),
            local: "10.0.0.1:40000".into(),
            remote: "10.0.0.2:5001".into(),
            side: Side::Client,
            origin: Some("established"),
            state: Some("ESTABLISHED"),
            closed: false,
            tcp: Some(vs.clone()),
            sampler: None,
            flow: None,
        };
        let iv = Interval {
            kind: "interval",
            t: 1.0,
            ts: 0.0,
            interval_s: 1.0,
            flows: vec![row],
            totals: [("tcp", [("client", vs)].into_iter().collect())]
                .into_iter()
                .collect(),
            counters: BTreeMap::new(),
        };
        let mut out = Vec::new();
        print_table(&mut out, "view tcp", &iv, &["tcp"]).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("TCP N"), "{s}");
        assert!(s.contains("10.0.0.1:40000"));
        assert!(s.contains("0.120"), "{s}");
        assert!(s.contains("TOTAL"));
        let j = serde_json::to_value(&iv).unwrap();
        assert_eq!(j["flows"][0]["tcp"]["n"], 3);
        assert_eq!(j["flows"][0]["side"], "client");
        assert_eq!(j["type"], "interval");
    }

    /// The table and the JSON record of one fixed interval, to the byte:
    /// a change in either output's shape shows up here first.
    #[test]
    fn golden_table_and_json_record() {
        let mut h = Hist::default();
        for v in [100, 120, 140, 20_000] {
            h.record(v);
        }
        let mut tcp = ViewStats::from_hist(&h);
        tcp.srtt_us = Some(2_500);
        tcp.retrans = Some(1);
        let smp = ViewStats::from_hist(&h);
        let row = FlowRow {
            netns: 4026531840,
            netns_name: "ns-a".into(),
            local: "10.0.0.1:40000".into(),
            remote: "10.0.0.2:5001".into(),
            side: Side::Client,
            origin: Some("established"),
            state: Some("ESTABLISHED"),
            closed: false,
            tcp: Some(tcp.clone()),
            sampler: Some(smp.clone()),
            flow: None,
        };
        let iv = Interval {
            kind: "interval",
            t: 2.0,
            ts: 1_700_000_000.5,
            interval_s: 1.0,
            flows: vec![row],
            totals: [
                ("tcp", [("client", tcp)].into_iter().collect()),
                ("sampler", [("client", smp)].into_iter().collect()),
            ]
            .into_iter()
            .collect(),
            counters: [("tcp", [("samples", 4u64)].into_iter().collect())]
                .into_iter()
                .collect(),
        };
        let mut out = Vec::new();
        print_table(
            &mut out,
            "rttscope observe | interval 1s",
            &iv,
            &["tcp", "sampler"],
        )
        .unwrap();
        let table = String::from_utf8(out).unwrap();
        let json = serde_json::to_string(&iv).unwrap();
        assert_eq!(table, GOLDEN_TABLE, "table:\n{table}");
        assert_eq!(json, GOLDEN_JSON, "json:\n{json}");
    }

    const GOLDEN_TABLE: &str = "rttscope observe | interval 1s | t=2.0s\nNETNS      LOCAL                  REMOTE                 SIDE   |  TCP N      MIN     MEAN      P50      P90      P99      MAX     SRTT RETR | SAMPLER N      MIN     MEAN      P50      P90      P99      MAX   (ms)\nns-a       10.0.0.1:40000         10.0.0.2:5001          client |      4    0.100    5.090    0.120   20.000   20.000   20.000    2.500    1 |      4    0.100    5.090    0.120   20.000   20.000   20.000\nTOTAL      1 flow                                        client |      4    0.100    5.090    0.120   20.000   20.000   20.000    2.500    1 |      4    0.100    5.090    0.120   20.000   20.000   20.000\n\n";

    const GOLDEN_JSON: &str = "{\"type\":\"interval\",\"t\":2.0,\"ts\":1700000000.5,\"interval_s\":1.0,\"flows\":[{\"netns\":4026531840,\"netns_name\":\"ns-a\",\"local\":\"10.0.0.1:40000\",\"remote\":\"10.0.0.2:5001\",\"side\":\"client\",\"origin\":\"established\",\"state\":\"ESTABLISHED\",\"closed\":false,\"tcp\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0,\"srtt_us\":2500,\"retrans\":1},\"sampler\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0}}],\"totals\":{\"sampler\":{\"client\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0}},\"tcp\":{\"client\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0,\"srtt_us\":2500,\"retrans\":1}}},\"counters\":{\"tcp\":{\"samples\":4}}}";
}

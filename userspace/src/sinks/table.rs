//! The one table type every command renders through ([`Table`]: text, CSV, Markdown), and
//! observe's per-interval report: one row per flow, columns per view, a totals row.
use std::io::Write;

use crate::analysis::records::{FlowRow, Interval, ViewStats};
use crate::analysis::results::csv_field;
use crate::analysis::units::fmt_ms;
use crate::views::ViewKind;

/// How a column lines its cells up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A text table whose columns are as wide as their widest cell (header
/// included), so long namespace names and IPv6 endpoints stay aligned.
/// Columns are two spaces apart; a column may open a group with ` | `.
/// Units go in the headers (`MIN ms`), cells hold bare numbers.
#[derive(Debug, Clone, Default)]
pub struct Table {
    heads: Vec<String>,
    align: Vec<Align>,
    group: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a column.
    pub fn col(mut self, head: impl Into<String>, align: Align) -> Self {
        self.heads.push(head.into());
        self.align.push(align);
        self.group.push(false);
        self
    }

    /// Add a column that starts a group (a ` | ` before it).
    pub fn group(mut self, head: impl Into<String>, align: Align) -> Self {
        self = self.col(head, align);
        *self.group.last_mut().expect("a column") = true;
        self
    }

    /// Add a row (missing cells are empty, extra ones dropped).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut r: Vec<String> = cells.into_iter().map(Into::into).collect();
        r.resize(self.heads.len(), String::new());
        self.rows.push(r);
    }

    /// The header and the rows, one line each, no trailing spaces.
    pub fn render(&self) -> String {
        let width = |c: &str| c.chars().count();
        let widths: Vec<usize> = (0..self.heads.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| width(&r[i]))
                    .chain([width(&self.heads[i])])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    l += if self.group[i] { " | " } else { "  " };
                }
                let pad = " ".repeat(widths[i] - width(c));
                match self.align[i] {
                    Align::Left => l += &format!("{c}{pad}"),
                    Align::Right => l += &format!("{pad}{c}"),
                }
            }
            l.trim_end().to_string() + "\n"
        };
        let mut out = line(&self.heads);
        for r in &self.rows {
            out += &line(r);
        }
        out
    }

    /// Markdown: the header, the alignment row (`---:` right, `:---` left), the rows.
    pub fn markdown(&self) -> String {
        let align: String = self
            .align
            .iter()
            .map(|a| match a {
                Align::Right => "---:|",
                Align::Left => ":---|",
            })
            .collect();
        let mut out = format!("| {} |\n|{align}\n", self.heads.join(" | "));
        for r in &self.rows {
            out += &format!("| {} |\n", r.join(" | "));
        }
        out
    }

    /// CSV (RFC 4180: a field holding a comma, a quote or a line break is quoted), the header
    /// first.
    pub fn csv(&self) -> String {
        let line = |cells: &[String]| {
            let f: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
            f.join(",") + "\n"
        };
        let mut out = line(&self.heads);
        for r in &self.rows {
            out += &line(r);
        }
        out
    }
}

pub use crate::analysis::units::count;

/// The statistic columns of a view, units in the headers.
const STATS: [&str; 7] = [
    "N", "MIN ms", "MEAN ms", "P50 ms", "P90 ms", "P99 ms", "MAX ms",
];

/// Table output: a header line with the settings, then rows.
pub fn print_table(
    w: &mut impl Write,
    header: &str,
    iv: &Interval,
    views: &[&str],
) -> std::io::Result<()> {
    writeln!(w, "{header} | t={:.1}s", iv.t)?;
    let kinds: Vec<Option<ViewKind>> = views.iter().map(|v| ViewKind::from_name(v)).collect();
    let mut t = interval_columns(views, &kinds);
    for r in &iv.flows {
        t.row(flow_cells(r, &kinds));
    }
    total_rows(&mut t, iv, views, &kinds);
    write!(w, "{}", t.render())?;
    writeln!(w)?;
    Ok(())
}

/// The interval table's columns: the flow's, then a group per view.
fn interval_columns(views: &[&str], kinds: &[Option<ViewKind>]) -> Table {
    let mut t = Table::new()
        .col("NETNS", Align::Left)
        .col("LOCAL", Align::Left)
        .col("REMOTE", Align::Left)
        .col("SIDE", Align::Left);
    for (v, k) in views.iter().zip(kinds) {
        t = t.group(format!("{} {}", v.to_uppercase(), STATS[0]), Align::Right);
        for h in &STATS[1..] {
            t = t.col(*h, Align::Right);
        }
        if k.is_some_and(|k| k.socket_columns()) {
            t = t.col("SRTT ms", Align::Right).col("RETR", Align::Right);
        }
    }
    t
}

/// A flow's row: its namespace, ends and side (`*` once closed), then each view's cells.
fn flow_cells(r: &FlowRow, kinds: &[Option<ViewKind>]) -> Vec<String> {
    let side = if r.closed {
        format!("{}*", r.side.as_str())
    } else {
        r.side.as_str().to_string()
    };
    // the remote's name (`--names`) after its address
    let remote = match &r.remote_name {
        Some(n) => format!("{} ({n})", r.remote),
        None => r.remote.clone(),
    };
    let mut cells = vec![r.netns_name.clone(), r.local.clone(), remote, side];
    for k in kinds {
        let s = k.and_then(|k| r.views.get(k));
        cells.extend(cols(s, k.is_some_and(|k| k.socket_columns())));
    }
    cells
}

/// The TOTAL rows, one per side that has totals.
fn total_rows(t: &mut Table, iv: &Interval, views: &[&str], kinds: &[Option<ViewKind>]) {
    // One TOTAL row per side: the two ends of a connection see different
    // RTTs (the responding side times the other's think time), so a total
    // over both would describe neither.
    for side in ["client", "server", "unknown", "pinger", "pinged"] {
        if !iv.totals.values().any(|t| t.contains_key(side)) {
            continue;
        }
        let n = iv.flows.iter().filter(|r| r.side.as_str() == side).count();
        let mut cells = vec![
            "TOTAL".to_string(),
            count(n as u64, "flow"),
            String::new(),
            side.to_string(),
        ];
        for (v, k) in views.iter().zip(kinds) {
            cells.extend(cols(
                iv.totals.get(*v).and_then(|t| t.get(side)),
                k.is_some_and(|k| k.socket_columns()),
            ));
        }
        t.row(cells);
    }
}

/// A view's cells of one row: N, the statistics in ms, and for a view with
/// socket columns (`ViewKind::socket_columns`) the socket's srtt and retransmissions.
fn cols(s: Option<&ViewStats>, socket_columns: bool) -> Vec<String> {
    let mut out = match s {
        Some(s) if s.summary.n > 0 => {
            let m = &s.summary;
            vec![
                m.n.to_string(),
                fmt_ms(m.min),
                fmt_ms(m.mean),
                fmt_ms(m.p50),
                fmt_ms(m.p90),
                fmt_ms(m.p99),
                fmt_ms(m.max),
            ]
        }
        _ => ["0", "-", "-", "-", "-", "-", "-"]
            .map(String::from)
            .to_vec(),
    };
    if socket_columns {
        let srtt = s
            .and_then(|s| s.srtt_us)
            .map(|v| fmt_ms(v as f64))
            .unwrap_or_else(|| "-".into());
        let retr = s
            .and_then(|s| s.retrans)
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into());
        out.extend([srtt, retr]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::columns::Columns;
    use crate::analysis::flow::Side;
    use crate::analysis::hist::Hist;
    use crate::analysis::records::FlowRow;
    use std::collections::BTreeMap;

    /// The lab's table through the one table type: text, Markdown and its unquoted CSV are the
    /// bytes the lab's own table wrote (expected strings computed by its former code); the
    /// quoted CSV is RFC 4180.
    #[test]
    fn text_markdown_and_csv_forms() {
        let mut t = ["phase (KiB queue, 0 = idle)", "RR_N", "RR_P50 ms"]
            .into_iter()
            .fold(Table::new(), |t, h| t.col(h, Align::Right));
        t.row(["idle", "3", "0.120"]);
        t.row(["deep 1MiB", "10", "12.5"]);
        t.row(["a,b", "1", "-"]);
        assert_eq!(
            t.render(),
            "phase (KiB queue, 0 = idle)  RR_N  RR_P50 ms\n                       idle     3      0.120\n                  deep 1MiB    10       12.5\n                        a,b     1          -\n"
        );
        assert_eq!(
            t.markdown(),
            "| phase (KiB queue, 0 = idle) | RR_N | RR_P50 ms |\n|---:|---:|---:|\n| idle | 3 | 0.120 |\n| deep 1MiB | 10 | 12.5 |\n| a,b | 1 | - |\n"
        );
        assert_eq!(
            t.csv(),
            "\"phase (KiB queue, 0 = idle)\",RR_N,RR_P50 ms\nidle,3,0.120\ndeep 1MiB,10,12.5\n\"a,b\",1,-\n"
        );
        let left = Table::new().col("VIEW", Align::Left).col("N", Align::Right);
        assert_eq!(left.markdown(), "| VIEW | N |\n|:---|---:|\n");
    }

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
            tunnel: None,
            netns: 1,
            netns_name: "ns-a".into(),
            local: "10.0.0.1:40000".into(),
            remote: "10.0.0.2:5001".into(),
            side: Side::Client,
            proto: None,
            origin: Some("established".into()),
            state: Some("ESTABLISHED".into()),
            closed: false,
            views: Columns::default().with(ViewKind::Tcp, vs.clone()),
            workload: None,
            nat: None,
            remote_name: None,
            flow: None,
        };
        let iv = Interval {
            t: 1.0,
            ts: 0.0,
            interval_s: 1.0,
            read_s: None,
            flows: vec![row],
            totals: [("tcp".into(), [("client".into(), vs)].into_iter().collect())]
                .into_iter()
                .collect(),
            counters: BTreeMap::new(),
            hooks: vec![],
            handshakes: BTreeMap::new(),
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
        let line = serde_json::to_string(&iv).unwrap();
        assert!(line.starts_with(r#"{"type":"interval","#), "{line}");
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
            tunnel: None,
            netns: 4026531840,
            netns_name: "ns-a".into(),
            local: "10.0.0.1:40000".into(),
            remote: "10.0.0.2:5001".into(),
            side: Side::Client,
            proto: None,
            origin: Some("established".into()),
            state: Some("ESTABLISHED".into()),
            closed: false,
            views: Columns::default()
                .with(ViewKind::Tcp, tcp.clone())
                .with(ViewKind::Sampler, smp.clone()),
            workload: None,
            nat: None,
            remote_name: None,
            flow: None,
        };
        let iv = Interval {
            t: 2.0,
            ts: 1_700_000_000.5,
            interval_s: 1.0,
            read_s: None,
            flows: vec![row],
            totals: [
                ("tcp".into(), [("client".into(), tcp)].into_iter().collect()),
                (
                    "sampler".into(),
                    [("client".into(), smp)].into_iter().collect(),
                ),
            ]
            .into_iter()
            .collect(),
            counters: [(
                "tcp".into(),
                [("samples".into(), 4u64)].into_iter().collect(),
            )]
            .into_iter()
            .collect(),
            hooks: vec![],
            handshakes: BTreeMap::new(),
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

    /// An IPv6 flow in a namespace with a long name beside an IPv4 one: every
    /// column stays aligned (each as wide as its widest cell), the names are
    /// whole, one flow per side says "1 flow".
    #[test]
    fn golden_table_ipv6_and_long_netns_name() {
        let mut h = Hist::default();
        for v in [100, 120, 140, 20_000] {
            h.record(v);
        }
        let mut tcp = ViewStats::from_hist(&h);
        tcp.srtt_us = Some(2_500);
        tcp.retrans = Some(12);
        let row = |name: &str, local: &str, remote: &str, side| FlowRow {
            tunnel: None,
            netns: 1,
            netns_name: name.into(),
            local: local.into(),
            remote: remote.into(),
            side,
            proto: None,
            origin: Some("established".into()),
            state: Some("ESTABLISHED".into()),
            closed: false,
            views: Columns::default().with(ViewKind::Tcp, tcp.clone()),
            workload: None,
            nat: None,
            remote_name: None,
            flow: None,
        };
        let iv = Interval {
            t: 3.0,
            ts: 0.0,
            interval_s: 1.0,
            read_s: None,
            flows: vec![
                row(
                    "rttscope-e2e-client-namespace-42",
                    "[fd00:1234:5678:9abc::1]:40000",
                    "[fd00:1234:5678:9abc::2]:5001",
                    Side::Client,
                ),
                row("ns-b", "10.0.0.2:5001", "10.0.0.1:40000", Side::Server),
            ],
            totals: [(
                "tcp".into(),
                [
                    ("client".into(), tcp.clone()),
                    ("server".into(), tcp.clone()),
                ]
                .into_iter()
                .collect(),
            )]
            .into_iter()
            .collect(),
            counters: BTreeMap::new(),
            hooks: vec![],
            handshakes: BTreeMap::new(),
        };
        let mut out = Vec::new();
        print_table(&mut out, "rttscope observe", &iv, &["tcp"]).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert_eq!(table, GOLDEN_IPV6, "table:\n{table}");
        // Every line's "|" in the same column.
        let bars: Vec<usize> = table
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| l.find('|').unwrap())
            .collect();
        assert!(bars.windows(2).all(|w| w[0] == w[1]), "{bars:?}\n{table}");
    }

    const GOLDEN_IPV6: &str = "rttscope observe | t=3.0s\nNETNS                             LOCAL                           REMOTE                         SIDE   | TCP N  MIN ms  MEAN ms  P50 ms  P90 ms  P99 ms  MAX ms  SRTT ms  RETR\nrttscope-e2e-client-namespace-42  [fd00:1234:5678:9abc::1]:40000  [fd00:1234:5678:9abc::2]:5001  client |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500    12\nns-b                              10.0.0.2:5001                   10.0.0.1:40000                 server |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500    12\nTOTAL                             1 flow                                                         client |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500    12\nTOTAL                             1 flow                                                         server |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500    12\n\n";

    #[test]
    fn table_widths_and_plurals() {
        let mut t = Table::new()
            .col("A", Align::Left)
            .group("B ms", Align::Right);
        t.row(["long-name", "1.000"]);
        t.row(["x", "10.5"]);
        assert_eq!(
            t.render(),
            "A         |  B ms\nlong-name | 1.000\nx         |  10.5\n"
        );
        assert_eq!(count(1, "flow"), "1 flow");
        assert_eq!(count(0, "flow"), "0 flows");
        assert_eq!(count(2, "packet"), "2 packets");
    }

    const GOLDEN_TABLE: &str = "rttscope observe | interval 1s | t=2.0s\nNETNS  LOCAL           REMOTE         SIDE   | TCP N  MIN ms  MEAN ms  P50 ms  P90 ms  P99 ms  MAX ms  SRTT ms  RETR | SAMPLER N  MIN ms  MEAN ms  P50 ms  P90 ms  P99 ms  MAX ms\nns-a   10.0.0.1:40000  10.0.0.2:5001  client |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500     1 |         4   0.100    5.090   0.120  20.000  20.000  20.000\nTOTAL  1 flow                         client |     4   0.100    5.090   0.120  20.000  20.000  20.000    2.500     1 |         4   0.100    5.090   0.120  20.000  20.000  20.000\n\n";

    const GOLDEN_JSON: &str = "{\"type\":\"interval\",\"t\":2.0,\"ts\":1700000000.5,\"interval_s\":1.0,\"flows\":[{\"netns\":4026531840,\"netns_name\":\"ns-a\",\"local\":\"10.0.0.1:40000\",\"remote\":\"10.0.0.2:5001\",\"side\":\"client\",\"origin\":\"established\",\"state\":\"ESTABLISHED\",\"closed\":false,\"tcp\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0,\"srtt_us\":2500,\"retrans\":1},\"sampler\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0}}],\"totals\":{\"sampler\":{\"client\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0}},\"tcp\":{\"client\":{\"n\":4,\"min_us\":100.0,\"mean_us\":5090.0,\"p50_us\":120.0,\"p90_us\":20000.0,\"p99_us\":20000.0,\"max_us\":20000.0,\"srtt_us\":2500,\"retrans\":1}}},\"counters\":{\"tcp\":{\"samples\":4}}}";
}

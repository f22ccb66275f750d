//! The sampler benchmark's output (sampler.rs): one line per round and
//! chain, then per ePPing option set and protocol a Markdown table of the
//! rounds with their median and spread, and one JSON line with every figure.
use std::collections::BTreeMap;

use serde_json::{json, Value};

/// One protocol's traffic in one chain: its rate (transactions or echo
/// replies per second) and ns per run by (member, `egr` | `ing`).
pub struct Proto {
    pub rate: f64,
    pub ns: BTreeMap<(String, String), f64>,
}

/// One chain of one round: the members in attach order, TCP then ICMP.
pub struct Phase {
    pub order: Vec<String>,
    pub tcp: Proto,
    pub icmp: Proto,
}

/// The rounds of one ePPing option set (empty: no ePPing).
pub struct Table {
    pub set: String,
    pub rounds: Vec<Phase>,
}

impl Table {
    pub fn new(set: &str) -> Table {
        Table {
            set: set.to_string(),
            rounds: Vec::new(),
        }
    }
}

/// A column: its header and its (egress, ingress) value in one chain.
type Column = (&'static str, fn(&Proto) -> (f64, f64));

impl Proto {
    fn get(&self, member: &str, dir: &str) -> f64 {
        let k = (member.to_string(), dir.to_string());
        self.ns.get(&k).copied().unwrap_or(f64::NAN)
    }
    fn pair(&self, member: &str) -> (f64, f64) {
        (self.get(member, "egr"), self.get(member, "ing"))
    }
    /// (ours - floor) / (ePPing - floor), per direction.
    fn ratio(&self, ours: &str) -> (f64, f64) {
        let r = |d| {
            let f = self.get("floor", d);
            (self.get(ours, d) - f) / (self.get("epping", d) - f)
        };
        (r("egr"), r("ing"))
    }
}

const COLUMNS: [Column; 6] = [
    ("floor", |p| p.pair("floor")),
    ("rttscope", |p| p.pair("after")),
    ("previous", |p| p.pair("before")),
    ("ePPing", |p| p.pair("epping")),
    ("ratio", |p| p.ratio("after")),
    ("previous ratio", |p| p.ratio("before")),
];

/// The columns with a figure in any round.
fn columns(rounds: &[&Proto]) -> Vec<Column> {
    COLUMNS
        .iter()
        .filter(|(_, f)| rounds.iter().any(|p| f(p).0.is_finite()))
        .copied()
        .collect()
}

fn fmt(v: f64, ratio: bool) -> String {
    match (v.is_finite(), ratio) {
        (false, _) => "-".into(),
        (true, true) => format!("{v:.2}"),
        (true, false) => format!("{v:.1}"),
    }
}

fn fmt_pair(h: &str, (e, i): (f64, f64)) -> String {
    let ratio = h.contains("ratio");
    format!("{} / {}", fmt(e, ratio), fmt(i, ratio))
}

/// Median, min and max of the finite values.
fn spread(v: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (m, v[0], v[v.len() - 1])
}

fn set_label(set: &str) -> String {
    if set.is_empty() {
        "no ePPing".into()
    } else {
        format!("ePPing `{set}`")
    }
}

/// One line per protocol of a chain, as it is measured.
pub fn print_round(r: usize, set: &str, ph: &Phase) {
    for (what, unit, p) in [("TCP", "TPS", &ph.tcp), ("ICMP", "replies/s", &ph.icmp)] {
        let cols: String = columns(&[p])
            .iter()
            .map(|(h, f)| format!("; {h} {}", fmt_pair(h, f(p))))
            .collect();
        println!(
            "  round {} [{}] {}: {what} {:.0} {unit}{cols}",
            r + 1,
            ph.order.join(" > "),
            set_label(set),
            p.rate
        );
    }
}

/// One protocol's Markdown table for one option set: a row per round, then
/// the median, min and max of each column over the rounds (a ratio's median
/// is that of its per-round values).
fn print_table(set: &str, what: &str, unit: &str, rounds: &[(&[String], &Proto)]) {
    let protos: Vec<&Proto> = rounds.iter().map(|r| r.1).collect();
    let cols = columns(&protos);
    println!(
        "\n{what}, {} (ns per run, egress / ingress):\n",
        set_label(set)
    );
    let heads: String = cols.iter().map(|(h, _)| format!(" {h} |")).collect();
    println!("| round | order | {unit} |{heads}");
    println!("|---|---|---|{}", "---|".repeat(cols.len()));
    for (i, (order, p)) in rounds.iter().enumerate() {
        let row: String = cols
            .iter()
            .map(|(h, f)| format!(" {} |", fmt_pair(h, f(p))))
            .collect();
        println!("| {} | {} | {:.0} |{row}", i + 1, order.join(" > "), p.rate);
    }
    let stat = |pick: fn((f64, f64, f64)) -> f64| -> String {
        let rate = pick(spread(protos.iter().map(|p| p.rate)));
        let row: String = cols
            .iter()
            .map(|(h, f)| {
                let e = pick(spread(protos.iter().map(|p| f(p).0)));
                let i = pick(spread(protos.iter().map(|p| f(p).1)));
                format!(" {} |", fmt_pair(h, (e, i)))
            })
            .collect();
        format!(" {rate:.0} |{row}")
    };
    println!("| median | |{}", stat(|s| s.0));
    println!("| min | |{}", stat(|s| s.1));
    println!("| max | |{}", stat(|s| s.2));
}

/// The tables of every option set and protocol, the test-run figures and
/// the JSON line.
pub fn print_all(tables: &[Table], test_run: &[(String, f64)]) {
    let mut sets = Vec::new();
    for t in tables {
        let mut j = serde_json::Map::new();
        j.insert("epping_args".into(), Value::from(t.set.clone()));
        for (what, unit, pick) in [
            (
                "TCP request/response",
                "TPS",
                (|p: &Phase| &p.tcp) as fn(&Phase) -> &Proto,
            ),
            ("ICMP echo flood", "replies/s", |p: &Phase| &p.icmp),
        ] {
            let rounds: Vec<(&[String], &Proto)> =
                t.rounds.iter().map(|p| (&p.order[..], pick(p))).collect();
            print_table(&t.set, what, unit, &rounds);
            j.insert(
                what.split(' ').next().unwrap().to_lowercase(),
                json_rounds(&rounds),
            );
        }
        sets.push(Value::Object(j));
    }
    println!();
    for (name, ns) in test_run {
        println!("  {name}: {ns:.1} ns/run in BPF_PROG_TEST_RUN (1e6 repeats of one packet)");
    }
    let tr: Vec<Value> = test_run
        .iter()
        .map(|(n, ns)| json!({"name": n, "ns_per_run": ns}))
        .collect();
    println!(
        "{}",
        json!({"type": "bench_sampler", "version": 2, "sets": sets, "test_run_ns": tr})
    );
}

/// Per round: order, rate, and every column's (egress, ingress) pair.
fn json_rounds(rounds: &[(&[String], &Proto)]) -> Value {
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    let protos: Vec<&Proto> = rounds.iter().map(|r| r.1).collect();
    let cols = columns(&protos);
    let rows: Vec<Value> = rounds
        .iter()
        .map(|(order, p)| {
            let mut o = serde_json::Map::new();
            o.insert("order".into(), json!(order));
            o.insert("rate".into(), num(p.rate));
            for (h, f) in &cols {
                let (e, i) = f(p);
                o.insert(h.replace(' ', "_"), json!({"egr": num(e), "ing": num(i)}));
            }
            Value::Object(o)
        })
        .collect();
    Value::from(rows)
}

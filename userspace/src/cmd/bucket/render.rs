//! `bucket`'s text forms: the table of one report (its distribution's buckets, the lenses, the
//! aligned series), `--format csv`, and the cells and tables the cloud points' text shares.
use super::lenses::{BucketReport, Lens};
use crate::analysis::dist::{self, Distribution, ValueUnit};
use crate::sinks::table::{count, Align, Table};

/// A value in `unit` with the unit, at a precision that suits it.
fn fmt_in(us: f64, unit: ValueUnit) -> String {
    format!("{} {unit}", fmt_num(us, unit))
}

/// A value in `unit`, bare (a table cell: the unit is in the header).
fn fmt_num(us: f64, unit: ValueUnit) -> String {
    let v = unit.from_us(us);
    match unit {
        ValueUnit::Us => format!("{v:.1}"),
        ValueUnit::Ms => format!("{v:.3}"),
        ValueUnit::S => format!("{v:.6}"),
    }
}

/// A percentile cell: `-` when none, `>=` when only a lower bound is known.
pub(super) fn pct_cell(v: Option<f64>, open: bool, unit: ValueUnit) -> String {
    match v {
        Some(v) => format!("{}{}", if open { ">=" } else { "" }, fmt_num(v, unit)),
        None => "-".into(),
    }
}

/// A table whose first column is `first` and then one column per percentile
/// (`p50 ms`), then `rest`.
pub(super) fn pct_table(first: &str, pcts: &[f64], unit: ValueUnit, rest: &[&str]) -> Table {
    let mut t = Table::new().col(first, Align::Left);
    for &p in pcts {
        t = t.col(format!("{} {unit}", pct_label(p)), Align::Right);
    }
    for r in rest {
        t = t.col(*r, Align::Left);
    }
    t
}

pub(super) fn fmt_bound(v: f64) -> String {
    if v == f64::NEG_INFINITY {
        "-inf".into()
    } else if v == f64::INFINITY {
        "+inf".into()
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

pub(super) fn pct_label(p: f64) -> String {
    format!("p{}", fmt_bound(p))
}

/// The bucket rows of a distribution (non-empty ones unless `all_buckets`).
pub(super) fn write_buckets(o: &mut String, d: &Distribution, all_buckets: bool) {
    use std::fmt::Write as _;
    let mut t = Table::new()
        .col("BUCKET", Align::Right)
        .col(format!("RANGE {}", d.unit), Align::Left)
        .col("COUNT", Align::Right)
        .col("%", Align::Right)
        .col("CUM %", Align::Right);
    let mut cum = 0u64;
    let n = d.bucket_counts.len();
    let total = d.count.max(1) as f64;
    for (i, &c) in d.bucket_counts.iter().enumerate() {
        cum += c;
        if c == 0 && !all_buckets {
            continue;
        }
        let tag = match i {
            0 => " underflow",
            i if i == n - 1 => " overflow",
            _ => "",
        };
        t.row([
            i.to_string(),
            format!(
                "[{}, {}){tag}",
                fmt_bound(d.bucket_options.lower(i)),
                fmt_bound(d.bucket_options.upper(i))
            ),
            c.to_string(),
            format!("{:.1}", 100.0 * c as f64 / total),
            format!("{:.1}", 100.0 * cum as f64 / total),
        ]);
    }
    indent(o, &t);
    if d.count == 0 {
        let _ = writeln!(o, "  (no samples)");
    }
    if d.rejected > 0 {
        let _ = writeln!(o, "  {} rejected (not finite)", count(d.rejected, "value"));
    }
}

/// A table's lines, indented by two spaces.
pub(super) fn indent(o: &mut String, t: &Table) {
    for l in t.render().lines() {
        o.push_str("  ");
        o.push_str(l);
        o.push('\n');
    }
}

/// `--format csv`: one row per bucket (empty ones too) of every view's distribution, bounds in
/// microseconds (empty for the infinite ends).
pub fn buckets_csv(reports: &[BucketReport]) -> String {
    let heads = [
        "view",
        "bucket",
        "lower_us",
        "upper_us",
        "count",
        "cumulative_fraction",
    ];
    let mut t = heads
        .into_iter()
        .fold(Table::new(), |t, h| t.col(h, Align::Right));
    for r in reports {
        let d = &r.distribution;
        let bound = |b: f64| {
            if b.is_finite() {
                d.unit.to_us(b).to_string()
            } else {
                String::new()
            }
        };
        let mut cum = 0u64;
        for (i, &c) in d.bucket_counts.iter().enumerate() {
            cum += c;
            let frac = if d.count > 0 {
                cum as f64 / d.count as f64
            } else {
                0.0
            };
            t.row([
                r.name.clone(),
                i.to_string(),
                bound(d.bucket_options.lower(i)),
                bound(d.bucket_options.upper(i)),
                c.to_string(),
                frac.to_string(),
            ]);
        }
    }
    t.csv()
}

/// The human table for one report.
pub fn render_table(r: &BucketReport, all_buckets: bool) -> String {
    use std::fmt::Write as _;
    let d = &r.distribution;
    let unit = d.unit;
    let mut o = String::new();
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| fmt_in(v, unit));
    let _ = writeln!(
        o,
        "{}: {} sample{}, min {}, mean {}, max {}",
        r.name,
        r.count,
        if r.count == 1 { "" } else { "s" },
        opt(r.min_us),
        opt(r.mean_us),
        opt(r.max_us)
    );
    let preset = if d.bucket_options == dist::vm_flow_preset() {
        " = vm_flow preset (an ASSUMED layout: only its 0-1 ms first bucket is known)"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "cloud distribution, layout {}{preset}, {} buckets incl. underflow/overflow, unit {}",
        d.bucket_options.spec(),
        d.bucket_options.num_buckets(),
        unit
    );
    write_buckets(&mut o, d, all_buckets);
    let _ = writeln!(o, "percentiles:");
    let mut t = pct_table("LENS", &r.percentiles, unit, &["METHOD"]);
    for l in &r.lenses {
        let name = match l.lens {
            Lens::Exact => "exact",
            Lens::Cloud => "cloud",
            Lens::Netperf => "netperf",
        };
        let mut cells = vec![name.to_string()];
        for (v, open) in l.values_us.iter().zip(&l.open_above) {
            cells.push(pct_cell(*v, *open, unit));
        }
        cells.push(l.method.clone());
        t.row(cells);
    }
    indent(&mut o, &t);
    if r.aligned.len() > 1 {
        write_aligned(&mut o, r);
    }
    o
}

/// The aligned series: the cloud's percentiles per alignment period.
fn write_aligned(o: &mut String, r: &BucketReport) {
    use std::fmt::Write as _;
    let unit = r.distribution.unit;
    let _ = writeln!(
        o,
        "aligned series (period {} s, ALIGN_PERCENTILE per period, stamped at the period end):",
        fmt_bound(r.alignment_period_s)
    );
    let mut t = Table::new()
        .col("END s", Align::Right)
        .col("COUNT", Align::Right);
    for &p in &r.percentiles {
        t = t.col(format!("{} {unit}", pct_label(p)), Align::Right);
    }
    for row in &r.aligned {
        let mut cells = vec![fmt_bound(row.end_s), row.count.to_string()];
        cells.extend(row.values_us.iter().map(|v| pct_cell(*v, false, unit)));
        t.row(cells);
    }
    indent(o, &t);
}

//! The text forms: the table with the TCP view's footer, `--format csv`, the `--explain` block.
use std::io::Write;

use super::rows::Row;
use crate::analysis::units::fmt_ms;
use crate::views::LoaderKind;

/// What the table's last line says about the TCP view.
pub(super) struct Footer {
    /// Samples of other traffic left out (said by `--explain`).
    pub(super) others: u64,
    pub(super) retrans: u64,
    pub(super) hook: String,
    pub(super) loader: LoaderKind,
}

/// The table: title, header, one line per row, the TCP view's footer.
pub(super) fn render_table(
    out: &mut dyn Write,
    title: &str,
    rows: &[Row],
    footer: &Footer,
) -> std::io::Result<()> {
    use crate::sinks::table::{Align, Table};
    writeln!(out, "rttscope {title}")?;
    let mut t = Table::new().col("VIEW", Align::Left).col("N", Align::Right);
    for h in ["MIN ms", "MEAN ms", "P50 ms", "P90 ms", "P99 ms", "MAX ms"] {
        t = t.col(h, Align::Right);
    }
    t = t.col("WHAT", Align::Left);
    for r in rows {
        let s = &r.summary;
        t.row([
            r.view.clone(),
            s.n.to_string(),
            fmt_ms(s.min),
            fmt_ms(s.mean),
            fmt_ms(s.p50),
            fmt_ms(s.p90),
            fmt_ms(s.p99),
            fmt_ms(s.max),
            r.what.clone(),
        ]);
    }
    write!(out, "{}", t.render())?;
    writeln!(
        out,
        "TCP view: {} retransmissions on the probe's connections; hook: {} ({} loader)",
        footer.retrans, footer.hook, footer.loader
    )
}

/// `--format csv`: one row per view summary, RTTs in microseconds (empty when not known).
pub(super) fn rows_csv(rows: &[Row]) -> String {
    use crate::sinks::table::{Align, Table};
    let us = |v: f64| {
        if v.is_nan() {
            String::new()
        } else {
            v.to_string()
        }
    };
    let heads = [
        "view",
        "count",
        "min_us",
        "mean_us",
        "p50_us",
        "p90_us",
        "p99_us",
        "max_us",
        "stddev_us",
        "bucketed",
        "what",
    ];
    let mut t = heads
        .into_iter()
        .fold(Table::new(), |t, h| t.col(h, Align::Right));
    for r in rows {
        let s = &r.summary;
        t.row([
            r.view.clone(),
            s.n.to_string(),
            us(s.min),
            us(s.mean),
            us(s.p50),
            us(s.p90),
            us(s.p99),
            us(s.max),
            us(s.stddev),
            r.bucketed.clone().unwrap_or_default(),
            r.what.clone(),
        ]);
    }
    t.csv()
}

/// The `--explain` block: a blank line, then the notes (or the sentence
/// saying there are none).
pub(super) fn render_notes(out: &mut dyn Write, notes: &[String]) -> std::io::Result<()> {
    writeln!(out)?;
    if notes.is_empty() {
        writeln!(
            out,
            "explain: no known cause of a difference is evident in this data."
        )?;
    }
    for n in notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

//! Reading what the measuring commands wrote: result documents, `observe --format json --raw`
//! JSON Lines (through [`crate::analysis::records`]) and plain sample lists, as sample sets
//! (`bucket`) or as a result document (`bucket`, `chart`).
use std::path::Path;

use anyhow::Context;

use crate::analysis::records::Record;
use crate::analysis::results::{ResultError, RunResult, Sample, ViewKind};

/// Reads an older format into a result document (rttscope 0.1's `probe --json`: its types live
/// with the probes, above this layer, so the command passes the reader in).
pub type LegacyReader = fn(&str) -> Option<RunResult>;

/// A named set of RTT samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleSet {
    pub name: String,
    pub kind: Option<ViewKind>,
    /// Whether `t_s` is meaningful (result files) or not (plain lists).
    pub timed: bool,
    /// Unix time of `t_s = 0`, when known (a result's `start_unix_s`, observe's start record).
    pub start_unix_s: Option<f64>,
    pub samples: Vec<Sample>,
}

/// Parse one RTT as typed in a sample list: a number, optional unit, bare = milliseconds.
/// Returns microseconds.
pub fn parse_rtt_us(s: &str) -> Option<f64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let us_per = match unit.trim() {
        "" | "ms" => 1e3,
        "ns" => 1e-3,
        "us" | "µs" => 1.0,
        "s" => 1e6,
        _ => return None,
    };
    let us = v * us_per;
    (us.is_finite() && us >= 0.0).then_some(us)
}

/// Longest piece of an input line an error message repeats.
const QUOTE_CHARS: usize = 80;

/// A piece of input for an error message: at most `QUOTE_CHARS` characters, then how much more
/// there was; control characters escaped (`\u{1b}`), so a file's escape sequences never reach the
/// terminal raw and a 200 MB line does not become a 200 MB message.
pub fn quote_input(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.char_indices();
    for (_, c) in chars.by_ref().take(QUOTE_CHARS) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if let Some((at, _)) = chars.next() {
        out.push_str(&format!("... ({} more bytes)", s.len() - at));
    }
    out
}

/// Parse a plain sample list (one value per line).
pub fn parse_sample_list(text: &str, name: &str) -> anyhow::Result<SampleSet> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let us = parse_rtt_us(line).with_context(|| {
            format!(
                "{name} line {}: '{}' is not an RTT (use a number with an optional unit ns, us, ms, s; bare numbers are ms)",
                i + 1,
                quote_input(line)
            )
        })?;
        samples.push(Sample::at_s(0.0, us));
    }
    anyhow::ensure!(!samples.is_empty(), "{name} contains no samples");
    Ok(SampleSet {
        name: name.to_string(),
        kind: None,
        timed: false,
        start_unix_s: None,
        samples,
    })
}

/// Whether a text is `observe --format json` output (JSON Lines starting with the start record).
pub fn is_observe_output(text: &str) -> bool {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    first.trim_start().starts_with('{') && matches!(Record::parse(first), Ok(Record::Start(_)))
}

/// The raw samples of `observe --format json --raw` output: one set per view and side, anchored
/// at the start record's `ts`.
pub fn parse_observe_output(text: &str, name: &str) -> anyhow::Result<Vec<SampleSet>> {
    let mut start = None;
    let mut sets: Vec<SampleSet> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record =
            Record::parse(line).map_err(|e| anyhow::anyhow!("{name} line {}: {e}", i + 1))?;
        match record {
            Record::Start(s) => start = start.or(s.ts),
            Record::Sample(smp) => {
                let set_name = match smp.side {
                    Some(side) => format!("{} {}", smp.view, side.as_str()),
                    None => smp.view.to_string(),
                };
                let set = match sets.iter().position(|s| s.name == set_name) {
                    Some(k) => &mut sets[k],
                    None => {
                        sets.push(SampleSet {
                            name: set_name,
                            kind: Some(match smp.view.as_ref() {
                                "tcp" => ViewKind::Tcp,
                                "sampler" => ViewKind::Sampler,
                                _ => ViewKind::Other,
                            }),
                            timed: true,
                            start_unix_s: None,
                            samples: Vec::new(),
                        });
                        sets.last_mut().expect("just pushed")
                    }
                };
                set.samples.push(Sample::at_s(smp.t_s(), smp.rtt_us));
            }
            _ => {}
        }
    }
    anyhow::ensure!(
        !sets.is_empty(),
        "{name} is observe output without raw samples: run observe with --format json --raw, or give a result file"
    );
    for s in &mut sets {
        s.start_unix_s = start;
    }
    Ok(sets)
}

/// Any measuring command's output as a result document: a result (version 1 or 2, what `probe`,
/// `observe`, `compare` and `lab` write with `--json`), rttscope 0.1's `probe --json`, or
/// `observe --format json --raw` JSON Lines (one view per view and side).
pub fn result_from_text(
    text: &str,
    name: &str,
    legacy: Option<LegacyReader>,
) -> anyhow::Result<RunResult> {
    if is_observe_output(text) {
        let sets = parse_observe_output(text, name)?;
        let mut r = RunResult::new("observe", serde_json::json!({"source": name}));
        r.start_unix_s = sets.first().and_then(|s| s.start_unix_s);
        r.views = sets
            .into_iter()
            .map(|s| {
                let mut v = crate::analysis::results::ViewSeries::new(
                    s.name,
                    s.kind.unwrap_or(ViewKind::Other),
                );
                v.samples = s.samples;
                v
            })
            .collect();
        return Ok(r);
    }
    match RunResult::from_json(text, name) {
        Ok(r) => Ok(r),
        Err(e) => match legacy.and_then(|read| read(text)) {
            Some(r) => Ok(r),
            None => Err(e.into()),
        },
    }
}

/// Read the sample sets of a file: a result document (one set per view), `observe --format json
/// --raw` output (one set per view and side) or a plain list.
pub fn load_sample_sets(
    text: &str,
    name: &str,
    legacy: Option<LegacyReader>,
) -> anyhow::Result<Vec<SampleSet>> {
    if is_observe_output(text) {
        parse_observe_output(text, name)
    } else if text.trim_start().starts_with('{') {
        let r = result_from_text(text, name, legacy)?;
        let start = r.start_unix_s;
        Ok(r.views
            .into_iter()
            .map(|v| SampleSet {
                name: v.name,
                kind: Some(v.kind),
                timed: true,
                start_unix_s: start,
                samples: v.samples,
            })
            .collect())
    } else {
        Ok(vec![parse_sample_list(text, name)?])
    }
}

/// A result file (streamed), or any other measuring command's output read as one (an older
/// format through `legacy`, `observe --format json --raw` JSON Lines).
pub fn load_result(path: &Path, legacy: Option<LegacyReader>) -> anyhow::Result<RunResult> {
    match RunResult::load(path) {
        Ok(r) => Ok(r),
        Err(e @ ResultError::NotAResult { .. }) => {
            let name = path.display().to_string();
            match crate::sys::files::read_to_string(path) {
                Ok(t) if !t.trim_start().starts_with('{') => Err(e.into()),
                Ok(t) if is_observe_output(&t) => result_from_text(&t, &name, legacy),
                Ok(t) => result_from_text(&t, &name, legacy).map_err(|_| e.into()),
                Err(_) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

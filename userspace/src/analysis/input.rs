//! Reading what the measuring commands wrote: result documents, `observe --format json --raw`
//! JSON Lines (through [`crate::analysis::records`]) and plain sample lists, as sample sets
//! (`bucket`) or as a result document (`bucket`, `chart`).
use std::path::Path;

use anyhow::Context;

use crate::analysis::records::Record;
use crate::analysis::results::{ResultError, RunResult, Sample, ViewKind};

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
/// Returns microseconds; None for text that is no RTT or an RTT outside 0..=1e12 us (the result
/// reader's bounds: issue 26, found by fuzzing).
pub fn parse_rtt_us(s: &str) -> Option<f64> {
    number_us(s).filter(|us| (0.0..=crate::analysis::results::MAX_RTT_US).contains(us))
}

/// A number with an optional unit, in microseconds (any finite value, negative or huge).
fn number_us(s: &str) -> Option<f64> {
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
    us.is_finite().then_some(us)
}

/// Longest piece of an input line an error message repeats.
const QUOTE_CHARS: usize = 80;

/// A piece of input for an error message: at most `QUOTE_CHARS` characters, then how much more
/// there was; control and bidirectional formatting characters escaped (`\u{1b}`, `\u{202e}`), so
/// a file's escape sequences never reach the terminal raw and a 200 MB line does not become a
/// 200 MB message.
pub fn quote_input(s: &str) -> String {
    quote_input_max(s, QUOTE_CHARS)
}

/// [`quote_input`] with another limit (a whole message that may hold a value: at most `max`
/// characters).
pub fn quote_input_max(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut chars = s.char_indices();
    for (_, c) in chars.by_ref().take(max) {
        push_shown(&mut out, c);
    }
    if let Some((at, _)) = chars.next() {
        out.push_str(&format!("... ({} more bytes)", s.len() - at));
    }
    out
}

/// Text from a file or a command line, shown on a terminal: control characters and the
/// bidirectional formatting characters (a right-to-left override makes `exe.txt` read `txt.exe`)
/// escaped as `\u{...}`; everything else as it is.
pub fn escape_for_terminal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_shown(&mut out, c);
    }
    out
}

fn push_shown(out: &mut String, c: char) {
    let bidi = matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if c.is_control() || bidi {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// Parse a plain sample list (one value per line).
pub fn parse_sample_list(text: &str, name: &str) -> anyhow::Result<SampleSet> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let us = parse_rtt_us(line).with_context(|| match number_us(line) {
            Some(_) => format!(
                "{name} line {}: '{}' is not an RTT from 0 to {:e} us",
                i + 1,
                quote_input(line),
                crate::analysis::results::MAX_RTT_US
            ),
            None => format!(
                "{name} line {}: '{}' is not an RTT (use a number with an optional unit ns, us, ms, s; bare numbers are ms)",
                i + 1,
                quote_input(line)
            ),
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
///
/// The first line's `type` is looked at first, every other field skipped unread: a result
/// document written on one line is one huge first line, and parsing it as a [`Record`] (an
/// internally tagged enum, which buffers the whole object into a generic tree before it can see
/// the tag) cost ~700 bytes per sample (issue 26 item 11).
pub fn is_observe_output(text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Tag<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    first.trim_start().starts_with('{')
        && matches!(serde_json::from_str::<Tag>(first), Ok(Tag { kind: Some(k) }) if k == "start")
        && matches!(Record::parse(first), Ok(Record::Start(_)))
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
                            kind: Some(ViewKind::from_name(&smp.view)),
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

/// Any measuring command's output as a result document: a result (what `probe`, `observe`,
/// `compare` and `lab` write with `--json`) or `observe --format json --raw` JSON Lines (one view
/// per view and side). rttscope 0.1's `probe --json` is refused in one sentence ([`from_0_1`]).
pub fn result_from_text(text: &str, name: &str) -> anyhow::Result<RunResult> {
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
        Err(_) if from_0_1(text) => Err(written_by_0_1(name)),
        Err(e) => Err(e.into()),
    }
}

/// Whether `text` is what rttscope 0.1's `probe --json` wrote (before the result document: no
/// `format`, the probe's own `summary_source` and `netperf` keys), no longer read.
fn from_0_1(text: &str) -> bool {
    use serde::de::IgnoredAny;
    #[derive(serde::Deserialize)]
    struct Keys {
        format: Option<IgnoredAny>,
        summary_source: Option<IgnoredAny>,
        netperf: Option<IgnoredAny>,
    }
    serde_json::from_str::<Keys>(text)
        .is_ok_and(|k| k.format.is_none() && k.summary_source.is_some() && k.netperf.is_some())
}

/// The sentence that refuses a file of rttscope 0.1 (CHANGELOG.md).
fn written_by_0_1(name: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} was written by rttscope 0.1's probe --json, which this version no longer reads; re-run the probe with this version",
        escape_for_terminal(name)
    )
}

/// Read the sample sets of a file: a result document (one set per view), `observe --format json
/// --raw` output (one set per view and side) or a plain list.
pub fn load_sample_sets(text: &str, name: &str) -> anyhow::Result<Vec<SampleSet>> {
    if is_observe_output(text) {
        parse_observe_output(text, name)
    } else if text.trim_start().starts_with('{') {
        let r = result_from_text(text, name)?;
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

/// The sample sets of a result document in a regular file, read streamed (issue 26 item 11):
/// straight from the file into the compact samples (16 bytes each, no whole-file string, no
/// generic JSON tree). None when `path` is standard input (`-`), not a regular file, or does not
/// hold a valid result document: the caller then reads the text as before (a Cloud Monitoring
/// file, JSON Lines, a sample list, an older format), and an invalid document is reported from
/// there in the same words.
pub fn stream_result_sets(path: &Path) -> Option<Vec<SampleSet>> {
    if path.as_os_str() == "-" || !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    // The first bytes decide: a result document is one JSON object, and not a Cloud Monitoring
    // file (whose reader comes first) nor observe's JSON Lines.
    let mut head = Vec::with_capacity(4096);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(path).ok()?, 4096),
        &mut head,
    )
    .ok()?;
    let head = String::from_utf8_lossy(&head);
    if !head.trim_start().starts_with('{')
        || crate::analysis::cloud_monitoring::looks_like_cloud(&head)
    {
        return None;
    }
    let r = RunResult::load(path).ok()?;
    let start = r.start_unix_s;
    Some(
        r.views
            .into_iter()
            .map(|v| {
                let mut samples = v.samples;
                samples.shrink_to_fit();
                SampleSet {
                    name: v.name,
                    kind: Some(v.kind),
                    timed: true,
                    start_unix_s: start,
                    samples,
                }
            })
            .collect(),
    )
}

/// A result file (streamed), or any other measuring command's output read as one (`observe
/// --format json --raw` JSON Lines; rttscope 0.1's `probe --json` refused in one sentence).
pub fn load_result(path: &Path) -> anyhow::Result<RunResult> {
    match RunResult::load(path) {
        Ok(r) => Ok(r),
        Err(e @ ResultError::NotAResult { .. }) => {
            let name = path.display().to_string();
            match crate::sys::files::read_to_string(path) {
                Ok(t) if !t.trim_start().starts_with('{') => Err(e.into()),
                Ok(t) if is_observe_output(&t) => result_from_text(&t, &name),
                Ok(t) if from_0_1(&t) => Err(written_by_0_1(&name)),
                _ => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::view_kind::ViewKind as PassiveKind;

    fn scratch(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("rts-input-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A result document on one line is not observe output (its first line is not parsed as a
    /// record), is read streamed from a regular file into the same sets as from its text, and
    /// every other input is left to the text readers.
    #[test]
    fn result_documents_stream_and_the_rest_is_left_to_the_text_readers() {
        let mut r = RunResult::new("observe", serde_json::json!({}));
        let mut v = crate::analysis::results::ViewSeries::new(
            "tcp client",
            ViewKind::Passive(PassiveKind::Tcp),
        );
        v.samples = vec![Sample::at_s(0.5, 80.0), Sample::at_s(1.0, 95.5)];
        r.views.push(v);
        r.start_unix_s = Some(1_795_240_800.0);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!is_observe_output(&text));
        let p = scratch("one-line.json", &text);
        let streamed = stream_result_sets(&p).expect("a result document streams");
        assert_eq!(streamed, load_sample_sets(&text, "x").unwrap());
        assert_eq!(streamed[0].samples.len(), 2);
        std::fs::remove_file(&p).unwrap();
        let start = r#"{"type":"start","ts":1795240800.0,"version":1,"views":["tcp"]}"#;
        let sample = r#"{"local":"10.0.0.1:1","remote":"10.0.0.2:2","rtt_us":80,"t":0.5,"type":"sample","view":"tcp"}"#;
        for (name, other) in [
            ("jsonl", format!("{start}\n{sample}\n")),
            ("cloud", r#"{"timeSeries":[]}"#.to_string()),
            ("list", "1ms\n2ms\n".to_string()),
            (
                "invalid",
                text.replace("\"rtt_us\":80.0", "\"rtt_us\":-1.0"),
            ),
        ] {
            assert!(name != "invalid" || other.contains("-1.0"), "{other}");
            let p = scratch(name, &other);
            assert!(stream_result_sets(&p).is_none(), "{name}");
            std::fs::remove_file(&p).unwrap();
        }
        assert!(is_observe_output(&format!("{start}\n{sample}\n")));
        assert!(stream_result_sets(Path::new("-")).is_none());
        assert!(stream_result_sets(Path::new("/dev/null")).is_none());
    }

    /// Fuzzing found the sample list taking any finite number (`6666...6` ms, 6.7e48 us) where
    /// the result and JSON Lines readers refuse RTTs above 1e12 us: the same bounds, one sentence.
    #[test]
    fn sample_lists_refuse_rtts_the_result_reader_refuses() {
        assert_eq!(
            parse_rtt_us("1000000000"),
            Some(1e12),
            "1e9 ms = 1e12 us, the bound"
        );
        for bad in ["10000000000", "1000001s", &"6".repeat(46)] {
            assert_eq!(parse_rtt_us(bad), None, "{bad}");
            let e = parse_sample_list(&format!("1\n{bad}\n"), "f.txt")
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "f.txt line 2: '{}' is not an RTT from 0 to 1e12 us",
                    quote_input(bad)
                )),
                "{e}"
            );
        }
        let e = parse_sample_list("-1\n", "f.txt").unwrap_err().to_string();
        assert_eq!(e, "f.txt line 1: '-1' is not an RTT (use a number with an optional unit ns, us, ms, s; bare numbers are ms)");
    }

    /// A sample (or start) record with a value observe cannot have measured is refused in one
    /// sentence naming the line, as a line that does not parse already was; the bounds are the
    /// result reader's (RTT 0..=1e12 us, times within +-1e12 s; t may be negative: a sample
    /// taken just before the start record).
    #[test]
    fn nonsense_values_in_observe_output_are_refused_naming_the_line() {
        let start = r#"{"type":"start","ts":1795240800.0,"version":1,"views":["tcp"]}"#;
        let smp = |rtt: &str, t: &str| {
            format!(
                r#"{{"local":"10.0.0.1:1","remote":"10.0.0.2:2","rtt_us":{rtt},"t":{t},"type":"sample","view":"tcp"}}"#
            )
        };
        let good = smp("80", "-0.25");
        let sets = parse_observe_output(
            &format!(
                "{start}
{good}
"
            ),
            "o.jsonl",
        )
        .unwrap();
        assert_eq!(sets[0].samples, vec![Sample::at_s(-0.25, 80.0)]);
        for (line, want) in [
            (smp("-1", "0.5"), "o.jsonl line 3: not a valid observe record: rtt_us -1 is not an RTT from 0 to 1e12 us"),
            (smp("1e308", "0.5"), "o.jsonl line 3: not a valid observe record: rtt_us 1e308 is not an RTT from 0 to 1e12 us"),
            (smp("80", "1e300"), "o.jsonl line 3: not a valid observe record: t 1e300 is not a time within +-1e12"),
            (
                smp("80", "0.5").replace(r#""t":0.5"#, r#""t":0.5,"t_us":-1e19"#),
                "o.jsonl line 3: not a valid observe record: t_us -1e19 is not a time within +-1e18",
            ),
        ] {
            let text = format!("{start}
{good}
{line}
");
            let e = parse_observe_output(&text, "o.jsonl").unwrap_err().to_string();
            assert_eq!(e, want);
            let e = load_sample_sets(&text, "o.jsonl").unwrap_err().to_string();
            assert_eq!(e, want);
        }
        let bad_start = start.replace("1795240800.0", "1e300");
        assert!(!is_observe_output(&format!(
            "{bad_start}
{good}
"
        )));
    }
}

//! The saved-result format: one versioned JSON document per run (`RunResult`).
//!
//! Record and report are separate steps: a command that measures (`probe`, `observe`, `compare`,
//! a `lab` experiment) writes a `RunResult` (`--json FILE`, `-` for standard output); `bucket` and
//! `chart` read it later without privileges. The document carries its own settings so a chart or a
//! table can say how it was measured. `docs/results.md` describes the format field by field and
//! `docs/result.schema.json` is its JSON Schema, generated from these types ([`schema_json`]).
//!
//! Conventions (version 2): every time and RTT in the document is in microseconds, in a field whose
//! name ends in `_us` (`t_us` is microseconds since the start of the run); wall-clock anchors keep
//! their own unit in their names (`start_unix_s`); missing statistics are `null`. Version 1 files
//! (samples as `t_s`, seconds) still load: their times are converted on reading.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod kind;
pub use kind::ViewKind;

/// The value of the `format` field.
pub const FORMAT: &str = "rttscope-result";
/// The format version this build writes; it reads this version and older ones.
pub const VERSION: u32 = 3;
/// Largest result file `load` accepts (bounded memory for a file that is charted later).
pub const MAX_FILE_BYTES: u64 = crate::sys::files::MAX_READ_BYTES;
/// Largest magnitude of a time (`t_us`, in seconds) or a sweep's `x` that `load` accepts: about
/// 31,700 years, room for Unix times, and far from the float range where axis arithmetic breaks.
pub const MAX_ABS_TIME: f64 = 1e12;
/// Largest RTT (`*_us`) that `load` accepts: 1e12 us, about 11.6 days.
pub const MAX_RTT_US: f64 = 1e12;

#[derive(Debug, Error)]
pub enum ResultError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} is larger than {}, the most rttscope reads of one input",
        crate::sys::files::human_bytes(MAX_FILE_BYTES)
    )]
    TooLarge { path: String },
    #[error("{path} is not an rttscope result: {why}")]
    NotAResult { path: String, why: String },
    #[error("{path} is format version {found}, newer than this rttscope reads ({VERSION}); use a newer rttscope")]
    TooNew { path: String, found: u32 },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
}

/// The two fields that say what a document is, read alone when the typed parse fails.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    format: Option<serde_json::Value>,
    #[serde(default)]
    version: Option<serde_json::Value>,
}

impl Head {
    fn check(&self, path: &str) -> Result<(), ResultError> {
        match self.format.as_ref().map(|f| f.as_str()) {
            Some(Some(FORMAT)) => {}
            Some(Some(other)) => {
                return Err(ResultError::NotAResult {
                    path: path.to_string(),
                    why: format!("its format is '{}', not '{FORMAT}'", cut(other, 40)),
                })
            }
            _ => {
                return Err(ResultError::NotAResult {
                    path: path.to_string(),
                    why: format!("no \"format\": \"{FORMAT}\" field"),
                })
            }
        }
        if let Some(found) = self.version.as_ref().and_then(|f| f.as_u64()) {
            if found > VERSION as u64 {
                return Err(ResultError::TooNew {
                    path: path.to_string(),
                    found: found.min(u32::MAX as u64) as u32,
                });
            }
        }
        Ok(())
    }
}

fn time_ok(t: f64) -> bool {
    t.is_finite() && t.abs() <= MAX_ABS_TIME
}

fn time_us_ok(t_us: f64) -> bool {
    t_us.is_finite() && t_us.abs() <= MAX_ABS_TIME * 1e6
}

fn rtt_ok(us: f64) -> bool {
    (0.0..=MAX_RTT_US).contains(&us)
}

/// At most `max` characters of `s`, control characters escaped (text from a file, for an error).
fn cut(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).flat_map(char::escape_default).collect();
    if s.chars().nth(max).is_some() {
        out.push_str("...");
    }
    out
}

/// One run: the views side by side, optionally a sweep over a parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "rttscope result", extend("$id" = "https://example.invalid/rttscope/result.schema.json"))]
pub struct RunResult {
    /// Always `"rttscope-result"`.
    #[schemars(extend("const" = "rttscope-result"))]
    pub format: String,
    /// Format version: 3 (this build); readers also accept 2 and 1 (times then in seconds, `t_s`).
    #[schemars(range(min = 1))]
    pub version: u32,
    /// The program that wrote the file.
    pub tool: Tool,
    /// When the file was written, RFC 3339 UTC (`2026-11-21T06:00:00Z`).
    pub created: String,
    /// Wall-clock time (Unix seconds) of `t_us = 0`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_s: Option<f64>,
    /// The machine the run was made on.
    pub host: HostInfo,
    /// The command that produced the result (`probe tcp-rr`, `observe`, `compare`, `lab loss`, ...).
    pub command: String,
    /// A human title for charts; charts fall back to `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The run's settings as the producing command records them (interval, burst, sizes, sampling,
    /// netem delay, ...): a JSON object, keys chosen by the command.
    #[serde(default)]
    pub settings: serde_json::Value,
    /// The measured series, one per view (and per flow or side where that matters).
    #[serde(default)]
    pub views: Vec<ViewSeries>,
    /// Present when the run swept a parameter: per-point summaries of every view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
    /// Counters of the whole run by component (`observe`: the kernel views' samples, flows
    /// created, map-full drops, ...); every drop has a counter here or in a view's `dropped`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, BTreeMap<String, u64>>,
    /// `observe`: each view's hooks on interfaces at the end of the run (packets seen against
    /// the interface's own, `blind`, what runs ahead). Added without a version change: older
    /// readers ignore it (docs/results.md, "Compatibility").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<crate::analysis::records::HookStatus>,
}

/// The program that wrote a document, as its `--version` says it (the last four fields are
/// empty in documents written before they were added).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tool {
    pub name: String,
    pub version: String,
    /// The commit it was built from (`git rev-parse --short HEAD`; `unknown` outside a checkout).
    #[serde(default)]
    pub commit: String,
    /// The BPF loaders built in (`libbpf`, `aya`).
    #[serde(default)]
    pub loaders: Vec<String>,
    /// The cargo features built in (`aya`, `lab`, `libbpf`, ...), sorted.
    #[serde(default)]
    pub features: Vec<String>,
    /// `static` (no dynamic dependencies: built with the target feature `crt-static`) or `dynamic`.
    #[serde(default)]
    pub linkage: String,
}

impl Tool {
    /// This binary (what build.rs found: `rttscope --version` prints the same).
    pub fn current() -> Tool {
        let list = |s: &str| {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        };
        Tool {
            name: env!("CARGO_PKG_NAME").to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("RTTSCOPE_GIT_COMMIT").to_string(),
            loaders: list(env!("RTTSCOPE_LOADERS")),
            features: list(env!("RTTSCOPE_FEATURES")),
            linkage: env!("RTTSCOPE_LINKAGE").to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HostInfo {
    #[serde(default)]
    pub hostname: String,
    /// `uname -r`.
    #[serde(default)]
    pub kernel_release: String,
    /// `uname -v`.
    #[serde(default)]
    pub kernel_version: String,
    /// `uname -m` (the architecture rttscope was built for).
    #[serde(default)]
    pub machine: String,
}

impl HostInfo {
    /// The running machine, read from /proc (empty strings where unreadable).
    pub fn current() -> HostInfo {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        HostInfo {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel_release: read("/proc/sys/kernel/osrelease"),
            kernel_version: read("/proc/sys/kernel/version"),
            machine: std::env::consts::ARCH.to_string(),
        }
    }
}

/// One RTT sample: microseconds since the start of the run (`t_us`), and the RTT in microseconds.
/// Version 1 files wrote `t_s` (seconds); reading one converts it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Sample {
    /// Microseconds since the start of the run (`start_unix_s`), when the sample was taken.
    pub t_us: f64,
    /// The round-trip time, microseconds.
    #[schemars(range(min = 0.0, max = 1e12))]
    pub rtt_us: f64,
}

impl Sample {
    /// A sample at `t_s` seconds since the start.
    pub fn at_s(t_s: f64, rtt_us: f64) -> Sample {
        Sample {
            t_us: t_s * 1e6,
            rtt_us,
        }
    }

    /// Seconds since the start of the run.
    pub fn t_s(&self) -> f64 {
        self.t_us / 1e6
    }
}

impl<'de> Deserialize<'de> for Sample {
    /// `{t_us, rtt_us}` (version 2) or `{t_s, rtt_us}` (version 1).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sample, D::Error> {
        #[derive(Deserialize)]
        struct Either {
            t_us: Option<f64>,
            t_s: Option<f64>,
            rtt_us: f64,
        }
        let e = Either::deserialize(d)?;
        let t_us = match (e.t_us, e.t_s) {
            (Some(t), _) => t,
            (None, Some(s)) => s * 1e6,
            (None, None) => return Err(serde::de::Error::missing_field("t_us")),
        };
        Ok(Sample {
            t_us,
            rtt_us: e.rtt_us,
        })
    }
}

/// The samples of one view (for one flow / one side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ViewSeries {
    /// Unique within the run; the legend label (`tcp client`, `sampler`, `TCP_RR`).
    pub name: String,
    pub kind: ViewKind,
    /// Which end measured (`client`, `server`, `a`, `b`), when it matters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<String>,
    /// The flow, e.g. `10.77.0.1:40000 -> 10.77.0.2:5001`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// View-specific settings (sampling rate, probe interval, request/response sizes, ...).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub settings: serde_json::Value,
    /// Samples the view dropped or could not take (map full, ring buffer full, lost probes, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dropped: BTreeMap<String, u64>,
    /// The view's statistics over the whole run, as the producing command computed them (from
    /// every sample, or from its histogram when it kept no samples: observe without --raw).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<ViewSummary>,
    /// What else the producing tool measured, in its own terms (a probe's counts, throughput and
    /// netperf percentiles; irtt's statistics; a flow's namespace, state, srtt): a JSON object.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
    /// The samples, in recording order (may be empty when only the summary was kept).
    #[serde(default)]
    pub samples: Vec<Sample>,
}

impl ViewSeries {
    pub fn new(name: impl Into<String>, kind: ViewKind) -> ViewSeries {
        ViewSeries {
            name: name.into(),
            kind,
            side: None,
            flow: None,
            settings: serde_json::Value::Null,
            dropped: BTreeMap::new(),
            summary: None,
            details: serde_json::Value::Null,
            samples: Vec::new(),
        }
    }

    /// The RTTs in microseconds, in recording order.
    pub fn rtts_us(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.rtt_us).collect()
    }
}

/// A sweep: the same measurement repeated for several values of one parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sweep {
    /// The swept parameter (`response/request interval`, `netem delay`, `loss`).
    pub parameter: String,
    /// Its unit as printed on the axis (`ms`, `%`, `bytes`); empty for a pure number.
    #[serde(default)]
    pub unit: String,
    pub points: Vec<SweepPoint>,
}

/// One value of the swept parameter, with a summary per view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepPoint {
    pub x: f64,
    /// Per-point settings that differ from the run's (e.g. the number of parallel streams).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub settings: serde_json::Value,
    pub views: Vec<ViewSummary>,
}

/// Summary statistics of one view (over the run, or at one sweep point), microseconds.
/// Percentiles are exact percentiles of the samples unless `method` says otherwise; `null` when
/// `count` is 0 or the producing command did not compute that statistic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
pub struct ViewSummary {
    /// Name of the view (matches `ViewSeries::name`).
    pub view: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ViewKind>,
    pub count: u64,
    pub min_us: Option<f64>,
    pub mean_us: Option<f64>,
    #[serde(default)]
    pub p5_us: Option<f64>,
    pub p50_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_us: Option<f64>,
    #[serde(default)]
    pub p95_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub max_us: Option<f64>,
    /// Population standard deviation, when computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stddev_us: Option<f64>,
    /// How the percentiles were computed when not exactly from the samples (`hdr histogram`,
    /// `log-linear histogram ..., <= 1.6% wide`: within 0.8% of the exact percentiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Further named values in microseconds (`cloud_p50_us`, `netperf_p90_us`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

impl ViewSummary {
    /// Exact statistics of `rtts_us` (nearest-rank percentiles, population stddev).
    pub fn of_samples(view: &str, kind: Option<ViewKind>, rtts_us: &[f64]) -> ViewSummary {
        use crate::analysis::stats::{percentile_sorted, sorted, Summary};
        let sorted = sorted(rtts_us);
        let mut v = ViewSummary::from_stats(view, kind, &Summary::from_sorted(&sorted));
        v.p5_us = nan_none(percentile_sorted(&sorted, 5.0));
        v.p95_us = nan_none(percentile_sorted(&sorted, 95.0));
        v
    }

    /// From a computed [`crate::analysis::stats::Summary`] (NaN = not known).
    pub fn from_stats(
        view: &str,
        kind: Option<ViewKind>,
        s: &crate::analysis::stats::Summary,
    ) -> ViewSummary {
        ViewSummary {
            view: view.to_string(),
            kind,
            count: s.n,
            min_us: nan_none(s.min),
            mean_us: nan_none(s.mean),
            p50_us: nan_none(s.p50),
            p90_us: nan_none(s.p90),
            p99_us: nan_none(s.p99),
            max_us: nan_none(s.max),
            stddev_us: nan_none(s.stddev),
            ..Default::default()
        }
    }
}

fn nan_none(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

impl RunResult {
    /// An empty result for `command`, stamped with this tool, the current time and host.
    pub fn new(command: impl Into<String>, settings: serde_json::Value) -> RunResult {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        RunResult {
            format: FORMAT.to_string(),
            version: VERSION,
            tool: Tool::current(),
            created: rfc3339_utc(now),
            start_unix_s: Some(now),
            host: HostInfo::current(),
            command: command.into(),
            title: None,
            settings,
            views: Vec::new(),
            sweep: None,
            counters: BTreeMap::new(),
            hooks: Vec::new(),
        }
    }

    /// Parse and check a result document; `path` names it in errors.
    pub fn from_json(text: &str, path: &str) -> Result<RunResult, ResultError> {
        RunResult::parse(path, serde_json::from_str(text), || {
            Ok(serde_json::from_str(text))
        })
    }

    /// Read a result file. The document is deserialized straight from the file into the typed
    /// result (no whole-file string, no generic JSON tree: a 5M-sample file needs about 200 MB, not
    /// 4 GB); only a file that does not parse is read a second time, to say why.
    pub fn load(path: &Path) -> Result<RunResult, ResultError> {
        let name = path.display().to_string();
        let read_err = |source| ResultError::Read {
            path: name.clone(),
            source,
        };
        let open = || {
            std::fs::File::open(path)
                .map(|f| {
                    let capped = crate::sys::files::Capped::new(f, &name, MAX_FILE_BYTES);
                    std::io::BufReader::with_capacity(1 << 16, capped)
                })
                .map_err(read_err)
        };
        let typed = serde_json::from_reader(open()?);
        RunResult::parse(&name, typed, || Ok(serde_json::from_reader(open()?)))
    }

    /// The typed parse first; when it fails, the format and version fields alone (`head`) tell
    /// "not a result" and "too new" apart from a result with a bad field.
    fn parse(
        path: &str,
        typed: Result<RunResult, serde_json::Error>,
        head: impl FnOnce() -> Result<Result<Head, serde_json::Error>, ResultError>,
    ) -> Result<RunResult, ResultError> {
        let io = |e: serde_json::Error| {
            let e = std::io::Error::from(e);
            match e.kind() {
                std::io::ErrorKind::FileTooLarge => ResultError::TooLarge {
                    path: path.to_string(),
                },
                _ => ResultError::Read {
                    path: path.to_string(),
                    source: e,
                },
            }
        };
        let r = match typed {
            Ok(r) => r,
            Err(e) if e.is_io() => return Err(io(e)),
            Err(typed_err) => {
                let h = match head()? {
                    Ok(h) => h,
                    Err(e) if e.is_io() => return Err(io(e)),
                    Err(e) => {
                        return Err(ResultError::NotAResult {
                            path: path.to_string(),
                            why: serde_why(&e),
                        })
                    }
                };
                h.check(path)?;
                return Err(ResultError::Invalid {
                    path: path.to_string(),
                    why: serde_why(&typed_err),
                });
            }
        };
        Head {
            format: Some(serde_json::Value::String(r.format.clone())),
            version: Some(r.version.into()),
        }
        .check(path)?;
        r.validate().map_err(|why| ResultError::Invalid {
            path: path.to_string(),
            why,
        })?;
        Ok(r)
    }

    /// Write the result as pretty JSON, atomically and never through a planted link
    /// (`sys::files::write_atomically`: a reader never sees half a file).
    pub fn save(&self, path: &Path) -> Result<(), ResultError> {
        let werr = |source| ResultError::Write {
            path: path.display().to_string(),
            source,
        };
        let text = self
            .to_json()
            .map_err(|e| werr(std::io::Error::other(e.to_string())))?;
        crate::sys::files::write_atomically(path, text.as_bytes()).map_err(werr)
    }

    /// The consistency rules `load` enforces.
    pub fn validate(&self) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        for v in &self.views {
            if v.name.is_empty() {
                return Err("a view has an empty name".into());
            }
            if !names.insert(v.name.as_str()) {
                return Err(format!("two views are named '{}'", v.name));
            }
            if let Some((i, s)) = v
                .samples
                .iter()
                .enumerate()
                .find(|(_, s)| !(time_us_ok(s.t_us) && rtt_ok(s.rtt_us)))
            {
                return Err(format!(
                    "view '{}' sample {i} is not a time within +-{MAX_ABS_TIME:e} s and an RTT \
                     from 0 to {MAX_RTT_US:e} us: t_us={:e}, rtt_us={:e}",
                    cut(&v.name, 80),
                    s.t_us,
                    s.rtt_us
                ));
            }
            if let Some(s) = &v.summary {
                check_summary(s)
                    .map_err(|w| format!("view '{}' summary: {w}", cut(&v.name, 80)))?;
            }
        }
        if let Some(sw) = &self.sweep {
            for (i, p) in sw.points.iter().enumerate() {
                if !time_ok(p.x) {
                    return Err(format!(
                        "sweep point {i} has x={:e}, not a number within +-{MAX_ABS_TIME:e}",
                        p.x
                    ));
                }
                for s in &p.views {
                    check_summary(s)
                        .map_err(|w| format!("sweep point {i} view '{}' {w}", cut(&s.view, 80)))?;
                }
            }
        }
        Ok(())
    }

    /// The JSON text of the document (pretty, newline-terminated), as `save` writes it.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self).map(|t| t + "\n")
    }

    /// `--json FILE`: write the document to FILE, or to standard output for `-`.
    pub fn write_to(&self, path: &Path) -> Result<(), ResultError> {
        if path.as_os_str() == "-" {
            let werr = |source| ResultError::Write {
                path: "standard output".into(),
                source,
            };
            let text = self
                .to_json()
                .map_err(|e| werr(std::io::Error::other(e.to_string())))?;
            let mut out = std::io::stdout().lock();
            return out
                .write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(werr);
        }
        self.save(path)
    }

    /// `--format csv` of a measuring command: one row per sample, `view,t_us,rtt_us`.
    pub fn samples_csv(&self) -> String {
        let mut out = String::from("view,t_us,rtt_us\n");
        for v in &self.views {
            let name = csv_field(&v.name);
            for s in &v.samples {
                out.push_str(&format!("{name},{},{}\n", s.t_us, s.rtt_us));
            }
        }
        out
    }

    /// The title charts and tables show.
    pub fn display_title(&self) -> String {
        self.title.clone().unwrap_or_else(|| self.command.clone())
    }

    /// The run settings as a short `key=value, ...` line (scalars only, nested objects flattened
    /// one level), for chart titles.
    pub fn settings_line(&self) -> String {
        settings_line(&self.settings)
    }
}

/// `--json -` for a command that prints while it runs (observe, lab): the real standard output,
/// kept for the document, while fd 1 is pointed at stderr so that everything else the command
/// prints goes there.
pub fn stdout_for_document() -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    std::io::stdout().flush()?;
    let saved = std::io::stdout().as_fd().try_clone_to_owned()?;
    nix::unistd::dup2(2, 1).map_err(std::io::Error::from)?;
    Ok(std::fs::File::from(saved))
}

/// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The statistics of a summary are RTTs from 0 to MAX_RTT_US.
fn check_summary(s: &ViewSummary) -> Result<(), String> {
    let vals = [
        s.min_us,
        s.mean_us,
        s.p5_us,
        s.p50_us,
        s.p90_us,
        s.p95_us,
        s.p99_us,
        s.max_us,
        s.stddev_us,
    ];
    if vals.iter().flatten().any(|v| !rtt_ok(*v)) {
        return Err(format!(
            "has a statistic that is not an RTT from 0 to {MAX_RTT_US:e} us"
        ));
    }
    Ok(())
}

/// The JSON Schema of the result document (draft 2020-12), generated from the Rust types; checked
/// in as `docs/result.schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(RunResult);
    serde_json::to_string_pretty(&schema).expect("a schema serializes") + "\n"
}

/// `key=value, ...` for the scalar members of a JSON object (nested objects as `a.b=value`).
pub fn settings_line(v: &serde_json::Value) -> String {
    fn scalar(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            serde_json::Value::Bool(b) => Some(b.to_string()),
            serde_json::Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
                Some(a.iter().filter_map(scalar).collect::<Vec<_>>().join("/"))
            }
            _ => None,
        }
    }
    let mut parts = Vec::new();
    if let serde_json::Value::Object(m) = v {
        for (k, x) in m {
            if let serde_json::Value::Object(inner) = x {
                for (k2, y) in inner {
                    if let Some(s) = scalar(y) {
                        parts.push(format!("{k}.{k2}={s}"));
                    }
                }
            } else if let Some(s) = scalar(x) {
                parts.push(format!("{k}={s}"));
            }
        }
    }
    parts.join(", ")
}

/// Unix seconds as RFC 3339 UTC with whole seconds (`1970-01-01T00:00:00Z`).
pub fn rfc3339_utc(unix_s: f64) -> String {
    let secs = unix_s.floor() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// serde_json's reason, cut: it quotes a string value whole (`invalid type: string "..."`), and
/// fuzzing found a 600-character value echoed in the refusal (a 50 MB one would be too).
fn serde_why(e: &serde_json::Error) -> String {
    crate::analysis::input::quote_input_max(&e.to_string(), 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::view_kind::ViewKind as PassiveKind;
    use serde_json::json;

    pub(crate) fn sample_result() -> RunResult {
        let mut r = RunResult::new(
            "compare",
            json!({"interval": "10ms", "netem": {"delay": "5ms"}}),
        );
        let mut tcp = ViewSeries::new("tcp client", ViewKind::Passive(PassiveKind::Tcp));
        tcp.side = Some("client".into());
        tcp.samples = (0..10)
            .map(|i| Sample::at_s(i as f64 * 0.5, 150.0 + i as f64))
            .collect();
        let mut sampler = ViewSeries::new("sampler", ViewKind::Passive(PassiveKind::Sampler));
        sampler.dropped.insert("map_full".into(), 2);
        sampler.samples = vec![Sample::at_s(1.0, 900.0)];
        r.views = vec![tcp, sampler];
        r
    }

    #[test]
    fn round_trips_through_a_file() {
        let mut r = sample_result();
        // Awkward floats: a saved result must load bit-exact (serde_json's float_roundtrip).
        let mut awkward = ViewSeries::new("awkward", ViewKind::Probe);
        awkward.samples = (1..2000)
            .map(|i| {
                Sample::at_s(
                    1_795_241_473.0 + i as f64 / 7.0,
                    (i as f64).sqrt() * 1e-3 + 1.0 / 3.0,
                )
            })
            .collect();
        r.views.push(awkward);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("run.json");
        r.save(&path).unwrap();
        let back = RunResult::load(&path).unwrap();
        assert_eq!(back, r);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"format\": \"rttscope-result\""), "{text}");
        assert!(text.contains("\"kind\": \"sampler\""), "{text}");
    }

    #[test]
    fn reads_a_hand_written_minimal_document() {
        let text = r#"{"format":"rttscope-result","version":1,
            "tool":{"name":"rttscope","version":"0.1.0"},"created":"2026-11-21T06:00:00Z",
            "host":{},"command":"compare",
            "views":[{"name":"ping","kind":"ping","samples":[{"t_s":1.5,"rtt_us":80.5}]},
                     {"name":"x","kind":"quantum","samples":[]}],
            "sweep":{"parameter":"interval","unit":"ms","points":[
              {"x":0,"views":[{"view":"ping","count":1,"min_us":80.5,"mean_us":80.5,
               "p5_us":80.5,"p50_us":80.5,"p95_us":80.5,"p99_us":80.5,"max_us":80.5}]}]}}"#;
        let r = RunResult::from_json(text, "t.json").unwrap();
        assert_eq!(r.views[0].kind, ViewKind::Ping);
        // version 1 wrote seconds: read as microseconds
        assert_eq!(r.views[0].samples[0].t_us, 1.5e6);
        assert_eq!(r.views[1].kind, ViewKind::Other);
        assert_eq!(r.sweep.unwrap().points[0].views[0].p50_us, Some(80.5));
        assert!(r.settings.is_null());
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        let cases = [
            ("not json", "not an rttscope result"),
            (r#"{"version":1}"#, "no \"format\""),
            (r#"{"format":"pcap"}"#, "its format is 'pcap'"),
            (
                r#"{"format":"rttscope-result","version":99}"#,
                "newer than this rttscope",
            ),
            (
                r#"{"format":"rttscope-result","version":1}"#,
                "missing field",
            ),
        ];
        for (text, want) in cases {
            let e = RunResult::from_json(text, "f.json")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let mut r = sample_result();
        r.views[0].samples[3].rtt_us = -1.0;
        let e = RunResult::from_json(&serde_json::to_string(&r).unwrap(), "f.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sample 3"), "{e}");
        let mut r = sample_result();
        r.views[1].name = "tcp client".into();
        assert!(r.validate().unwrap_err().contains("two views"));
        let e = RunResult::load(Path::new("/nonexistent/r.json")).unwrap_err();
        assert!(
            e.to_string().starts_with("cannot read /nonexistent/r.json"),
            "{e}"
        );
    }

    /// Issue 18 item 3: values that broke the chart's axis arithmetic are refused on load, with
    /// the offending value in the sentence; a subnormal RTT is a valid (tiny) RTT.
    #[test]
    fn rejects_extreme_times_rtts_and_sweep_values() {
        let bad = |f: &dyn Fn(&mut RunResult), want: &str| {
            let mut r = sample_result();
            f(&mut r);
            let text = serde_json::to_string(&r).unwrap();
            let e = RunResult::from_json(&text, "f.json")
                .map(|_| "accepted".to_string())
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains(want), "want '{want}', got: {e}");
        };
        bad(
            &|r| r.views[0].samples[2].t_us = 1e308,
            "sample 2 is not a time",
        );
        bad(&|r| r.views[0].samples[2].t_us = -1e308, "t_us=-1e308");
        bad(&|r| r.views[1].samples[0].rtt_us = 1e13, "rtt_us=1e13");
        bad(
            &|r| {
                r.sweep = Some(Sweep {
                    parameter: "p".into(),
                    unit: String::new(),
                    points: vec![SweepPoint {
                        x: 1e308,
                        settings: serde_json::Value::Null,
                        views: vec![],
                    }],
                })
            },
            "sweep point 0 has x=1e308",
        );
        let mut r = sample_result();
        r.views[0].samples[0].rtt_us = 1e-310;
        r.views[0].samples[1].t_us = -1e18;
        let back = RunResult::from_json(&serde_json::to_string(&r).unwrap(), "f.json").unwrap();
        assert_eq!(back, r);
        // The typed parse failing still tells a foreign document from a bad result.
        let e = RunResult::from_json(r#"{"format":"pcap","samples":[1]}"#, "f.json").unwrap_err();
        assert!(e.to_string().contains("its format is 'pcap'"), "{e}");
    }

    /// `load` streams the file into the typed result; its errors are those of `from_json`.
    #[test]
    fn load_streams_and_reports_like_from_json() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("r.json");
        let r = sample_result();
        r.save(&path).unwrap();
        assert_eq!(RunResult::load(&path).unwrap(), r);
        for (text, want) in [
            ("{\"format\":\"x\"}", "its format is 'x'"),
            (
                "{\"format\":\"rttscope-result\",\"version\":7}",
                "newer than",
            ),
            (
                "{\"format\":\"rttscope-result\",\"version\":1}",
                "missing field",
            ),
            ("[1, 2", "not an rttscope result"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = RunResult::load(&path).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn settings_line_and_dates() {
        let r = sample_result();
        assert_eq!(r.settings_line(), "interval=10ms, netem.delay=5ms");
        assert_eq!(rfc3339_utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_795_245_153.7), "2026-11-21T07:12:33Z");
        assert!(
            r.created.ends_with('Z') && r.created.len() == 20,
            "{}",
            r.created
        );
        assert!(!r.host.kernel_release.is_empty());
    }

    /// docs/result.schema.json is what the Rust types generate; the test fails when a type changed
    /// and the checked-in schema did not. The checked-in schema is the shipped build's: with the
    /// example view built in, a series' kind has one more value (`count`: every view of
    /// `ViewKind::ALL` is one), so the file is compared only without it.
    #[test]
    fn checked_in_schema_matches_the_types() {
        let want = schema_json();
        if cfg!(not(feature = "example-view")) {
            crate::analysis::assert_checked_in_schema(
                "docs/result.schema.json",
                &want,
                "checked_in_schema_matches_the_types",
            );
        }
        // The schema names the v2 sample encoding and the document's required fields.
        let v: serde_json::Value = serde_json::from_str(&want).unwrap();
        let sample = &v["$defs"]["Sample"];
        assert_eq!(
            sample["required"],
            serde_json::json!(["t_us", "rtt_us"]),
            "{sample}"
        );
        assert_eq!(v["properties"]["format"]["const"], FORMAT);
    }

    /// The document says which build wrote it, as `--version` does: commit, loaders, features
    /// and linkage; documents written before those fields read with them empty.
    #[test]
    fn tool_names_the_build() {
        let v: serde_json::Value =
            serde_json::from_str(&sample_result().to_json().unwrap()).unwrap();
        let tool = &v["tool"];
        assert_eq!(tool["commit"], env!("RTTSCOPE_GIT_COMMIT"), "{tool}");
        let features: Vec<&str> = tool["features"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f.as_str())
            .collect();
        assert_eq!(
            features.contains(&"libbpf"),
            cfg!(feature = "libbpf"),
            "{tool}"
        );
        assert_eq!(features.contains(&"lab"), cfg!(feature = "lab"), "{tool}");
        assert!(!features.contains(&"default"), "{tool}");
        assert_eq!(
            tool["loaders"].as_array().unwrap().len(),
            usize::from(cfg!(feature = "libbpf")) + usize::from(cfg!(feature = "aya")),
            "{tool}"
        );
        let linkage = if cfg!(target_feature = "crt-static") {
            "static"
        } else {
            "dynamic"
        };
        assert_eq!(tool["linkage"], linkage, "{tool}");
        let old: Tool = serde_json::from_str(r#"{"name":"rttscope","version":"0.1.0"}"#).unwrap();
        assert!(old.commit.is_empty() && old.features.is_empty() && old.linkage.is_empty());
    }

    /// Version 2 writes `t_us`; a version-1 reader's `t_s` is gone from the output.
    #[test]
    fn writes_microsecond_samples() {
        let r = sample_result();
        let text = r.to_json().unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["version"], 3);
        assert_eq!(
            v["views"][0]["samples"][1],
            serde_json::json!({"t_us": 500000.0, "rtt_us": 151.0})
        );
        assert!(!text.contains("t_s"), "{text}");
    }

    /// Fuzzing found a document that is one long JSON string refused with the string whole in
    /// the message; the reason is now cut at 200 characters.
    #[test]
    fn a_long_value_is_not_echoed_whole() {
        let text = format!("\"{}\"", "x".repeat(1 << 20));
        let e = RunResult::from_json(&text, "p.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.json is not an rttscope result: invalid type: string"),
            "{e}"
        );
        assert!(
            e.contains("more bytes)") && e.chars().count() < 300,
            "{} chars",
            e.len()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Any sample list, written as version 2 (`t_us`) or version 1 (`t_s`), parses to the
        /// same microseconds or is refused in one sentence; the parser never panics.
        #[test]
        fn samples_in_either_version_parse_or_are_refused(
            samples in proptest::collection::vec(
                (proptest::num::f64::ANY, proptest::num::f64::ANY), 0..8),
            v1 in proptest::bool::ANY,
        ) {
            let enc: Vec<String> = samples
                .iter()
                .map(|(t, r)| {
                    let t = if v1 { format!("\"t_s\":{t:e}") } else { format!("\"t_us\":{t:e}") };
                    format!("{{{t},\"rtt_us\":{r:e}}}")
                })
                .collect();
            let text = format!(
                r#"{{"format":"rttscope-result","version":{},"tool":{{"name":"x","version":"1"}},
                   "created":"","host":{{}},"command":"c",
                   "views":[{{"name":"v","kind":"probe","samples":[{}]}}]}}"#,
                if v1 { 1 } else { 2 },
                enc.join(",")
            );
            match RunResult::from_json(&text, "p.json") {
                Ok(r) => {
                    for (s, (t, rtt)) in r.views[0].samples.iter().zip(&samples) {
                        let want = if v1 { t * 1e6 } else { *t };
                        proptest::prop_assert!(s.t_us == want && s.rtt_us == *rtt);
                        proptest::prop_assert!(time_us_ok(s.t_us) && rtt_ok(s.rtt_us));
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    proptest::prop_assert!(e.starts_with("p.json") && !e.contains('\n'), "{}", e);
                }
            }
        }
    }
}

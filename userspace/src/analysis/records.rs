//! The records of `observe --format json` (JSON Lines, docs/observe.md): one type per record
//! kind, written by `observe` and read back into the same types by `bucket`, `chart` and the lab.
//!
//! Each record is a derived struct: its `type` first (`#[serde(tag)]` on the struct), then its
//! fields in declaration order. The start record's `version` says which shape it is (4 since
//! `type` comes first everywhere and an unattached view's key is left out; CHANGELOG.md).
//!
//! Reading is tolerant: unknown fields are ignored, an unknown record type is [`Record::Other`],
//! and what older output or a hand-written file may lack has a default (only what a reader needs
//! is required: a sample's `t`, `rtt_us`, `local` and `remote`).
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

use crate::analysis::columns::Columns;
use crate::analysis::flow::Side;
use crate::analysis::hist::Hist;
pub use crate::analysis::hook_status::HookStatus;
pub use crate::analysis::nat::{Endpoints, Nat};
use crate::analysis::stats::Summary;
use crate::analysis::view_kind::ViewKind;
use crate::analysis::workload::Workload;

/// A name in a record: a `&'static str` when written, owned when read back.
pub type Name = Cow<'static, str>;

/// Per view (`tcp`, `sampler`), each counter by name.
pub type Counters = BTreeMap<Name, BTreeMap<Name, u64>>;

/// One line of `observe --format json`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[schemars(
    title = "rttscope observe record",
    description = "One line of `rttscope observe --format json` (JSON Lines, docs/observe.md).",
    extend("$id" = "https://example.invalid/rttscope/observe-record.schema.json")
)]
pub enum Record {
    Start(Start),
    Interval(Box<Interval>),
    Sample(Sample),
    Cloud(Cloud),
    End(Box<End>),
    /// A record type this version does not know (skipped by every reader).
    #[serde(other)]
    Other,
}

impl Serialize for Record {
    /// As its kind's struct writes it (each writes its own `type`); [`Record::Other`] cannot be
    /// written.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Record::Start(r) => r.serialize(s),
            Record::Interval(r) => r.serialize(s),
            Record::Sample(r) => r.serialize(s),
            Record::Cloud(r) => r.serialize(s),
            Record::End(r) => r.serialize(s),
            Record::Other => Err(serde::ser::Error::custom("an unknown record")),
        }
    }
}

/// The type a view gives its key of the start record (None: any JSON), the views' registry's
/// `crate::views::start_schema`.
pub type ViewStartSchema =
    dyn Fn(ViewKind, &mut schemars::SchemaGenerator) -> Option<schemars::Schema>;

/// The JSON Schema of the records (draft 2020-12, what observe writes), generated from these
/// types, each view's key of the start record typed by `view_start`; checked in as
/// `docs/observe-record.schema.json`.
pub fn schema_json(view_start: &ViewStartSchema) -> String {
    let mut gen = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    let typed: Vec<(ViewKind, &str, Option<schemars::Schema>)> = start_keys()
        .map(|(kind, about)| (kind, about, view_start(kind, &mut gen)))
        .collect();
    let mut schema = gen.into_root_schema_for::<Record>();
    let props = schema
        .get_mut("$defs")
        .and_then(|d| d.get_mut("Start"))
        .and_then(|s| s.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
        .expect("the start record's schema has properties");
    for (kind, about, t) in typed {
        let mut key = serde_json::json!({ "description": about });
        let obj = key.as_object_mut().unwrap();
        let t = t.as_ref().and_then(|t| t.as_object());
        obj.extend(t.into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        props.insert(kind.as_str().into(), key);
    }
    serde_json::to_string_pretty(&schema).expect("a schema serializes") + "\n"
}

/// Why a line is not a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("not a JSON record")]
    NotJson(#[source] serde_json::Error),
    #[error("not a valid observe record ({0})")]
    Invalid(#[source] serde_json::Error),
    #[error("not a valid observe record: {0}")]
    BadValue(String),
}

impl Record {
    /// One line of JSON Lines. A record whose values cannot be what observe measured (a
    /// sample's RTT outside 0..=1e12 us, a time that is not finite or beyond +-1e12 s: the result
    /// reader's bounds, [`crate::analysis::results::MAX_RTT_US`]) is refused as
    /// [`RecordError::BadValue`]; each reader applies its own bad-record policy to it.
    pub fn parse(line: &str) -> Result<Record, RecordError> {
        let r: Record = serde_json::from_str(line).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => RecordError::Invalid(e),
            _ => RecordError::NotJson(e),
        })?;
        r.check().map_err(RecordError::BadValue)?;
        Ok(r)
    }

    /// The values a reader uses are within the result reader's bounds.
    fn check(&self) -> Result<(), String> {
        use crate::analysis::results::{MAX_ABS_TIME, MAX_RTT_US};
        // -1 as -1, 1e308 as 1e308 (not 309 digits)
        let num = |v: f64| {
            if v.abs() < 1e15 {
                format!("{v}")
            } else {
                format!("{v:e}")
            }
        };
        let time = |what: &str, v: f64, max: f64| {
            if v.is_finite() && v.abs() <= max {
                Ok(())
            } else {
                Err(format!("{what} {} is not a time within +-{max:e}", num(v)))
            }
        };
        match self {
            Record::Sample(s) => {
                if !(0.0..=MAX_RTT_US).contains(&s.rtt_us) {
                    return Err(format!(
                        "rtt_us {} is not an RTT from 0 to {MAX_RTT_US:e} us",
                        num(s.rtt_us)
                    ));
                }
                time("t", s.t, MAX_ABS_TIME)?;
                s.t_us
                    .map_or(Ok(()), |t| time("t_us", t, MAX_ABS_TIME * 1e6))
            }
            Record::Start(s) => s.ts.map_or(Ok(()), |t| time("ts", t, MAX_ABS_TIME)),
            _ => Ok(()),
        }
    }
}

/// The first record: versions, views, settings and what each view attached.
///
/// Each view that says what it attached here ([`crate::analysis::view_kind::ViewInfo::start_about`])
/// has a key of its own, its name (`tcp`, `sampler`), present when the view is attached; its
/// value is the view's own, and its type is the view's to say ([`schema_json`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename = "start")]
#[schemars(
    rename = "Start",
    description = "The first record: versions, views, settings and what each view attached."
)]
pub struct Start {
    #[serde(default)]
    pub clock: String,
    /// The command's settings (keys chosen by `observe`).
    #[serde(default)]
    pub settings: serde_json::Value,
    /// Unix time (seconds) of t = 0 (always written).
    pub ts: Option<f64>,
    /// Seconds from `ts` until every view was read for the window's start: the views are read
    /// one after the other, so each view's window starts somewhere in `ts` .. `ts + read_s`
    /// (version 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_s: Option<f64>,
    #[serde(default)]
    pub version: u32,
    pub views: Vec<String>,
    /// Each attached view's value under its name (what it attached, its settings), as the
    /// view's `View::start_value` gives it.
    #[serde(flatten)]
    pub view_values: Columns<serde_json::Value>,
}

/// The views with a key of their own in the start record, and what the key holds.
fn start_keys() -> impl Iterator<Item = (ViewKind, &'static str)> {
    ViewKind::ALL
        .iter()
        .filter_map(|&k| k.info().start_about.map(|about| (k, about)))
}

/// One raw sample (`--raw`): the TCP view's (with TCP's srtt), the sampler's (with its
/// matching), or a flow's end (`view: flow_end`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename = "sample")]
#[schemars(rename = "Sample")]
pub struct Sample {
    pub local: String,
    /// Sampler: how the ACK was matched (`seq`, `ts`; ICMP: `echo`).
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matching: Option<Name>,
    #[serde(default)]
    pub netns: u32,
    /// Sampler, ICMP echo only: `icmp` or `icmpv6`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<Name>,
    pub remote: String,
    /// Microseconds (whole numbers as observe writes them; fractions are read too).
    #[serde(serialize_with = "whole")]
    pub rtt_us: f64,
    /// Always written.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub side: Option<Side>,
    /// TCP view: TCP's smoothed RTT after the sample (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srtt_us: Option<u32>,
    /// Seconds since the start record's `ts`.
    pub t: f64,
    /// The same in microseconds (older output has only `t`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_us: Option<f64>,
    pub view: Name,
}

impl Sample {
    /// Seconds since the start: from `t_us` (exact), else `t`.
    pub fn t_s(&self) -> f64 {
        self.t_us.map(|us| us / 1e6).unwrap_or(self.t)
    }
}

/// `--cloud-buckets`: one view's cloud-metric period (so far, or completed).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename = "cloud")]
#[schemars(rename = "Cloud")]
pub struct Cloud {
    pub point: CloudPoint,
    pub view: Name,
}

/// A cloud period's percentiles through the cloud layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CloudPoint {
    /// Whether the period is over (else: so far).
    pub complete: bool,
    pub count: u64,
    pub layout: String,
    pub p50_us: Option<f64>,
    pub p95_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub period_s: f64,
    pub period_start_s: f64,
    pub t: f64,
}

/// The last record: every flow's whole run and the counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, tag = "type", rename = "end")]
#[schemars(rename = "End")]
pub struct End {
    pub counters: Counters,
    pub flows: Vec<EndFlow>,
    /// Each view's hooks at the last check (as in `interval`); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookStatus>,
    /// Per view, per side: the handshake RTTs of the whole run (as in `interval`), with their
    /// histogram; absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handshakes: BTreeMap<Name, BTreeMap<Name, EndView>>,
    pub t: f64,
    pub ts: f64,
}

/// One flow's whole run in the end record.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EndFlow {
    /// TCP flows: whether it closed during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed: Option<bool>,
    pub local: String,
    pub netns: u32,
    pub netns_name: String,
    /// TCP flows: how the TCP view found it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<Name>,
    /// Sampler flows of ICMP echo: `icmp` or `icmpv6`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<Name>,
    /// The sampler's tunnel identity of the flow (issue 41): the VLAN id, and the VXLAN/Geneve
    /// VNI and encapsulation, when it was seen tagged or inside a tunnel (absent: plain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<crate::analysis::flow::Tunnel>,
    pub remote: String,
    #[schemars(with = "String")]
    pub side: Side,
    /// Each view's whole run of the flow (`tcp`, `sampler`, ...).
    #[serde(flatten)]
    pub views: Columns<EndView>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_deref",
        skip_deserializing
    )]
    pub workload: Option<Arc<Workload>>,
    /// As in [`FlowRow`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<Nat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_name: Option<String>,
}

/// One view's whole run of a flow: summary and histogram.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EndView {
    /// Non-empty buckets as [lower_us, upper_us (-1: open), count].
    pub histogram: Vec<(f64, f64, u64)>,
    /// Sampler: the interface whose samples these are (of several: views/sampler/join.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iface: Option<String>,
    /// Sampler: the flow's samples on each interface, when seen on more than one (each timed
    /// the same packet exchanges; the histogram is `iface`'s alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iface_samples: Option<BTreeMap<String, u64>>,
    /// TCP: the connection's handshake RTT (us; client SYN -> SYN-ACK, server SYN-ACK -> ACK);
    /// absent for a connection open before attach or whose handshake left no sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_us: Option<u32>,
    /// TCP: retransmissions over the flow's life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrans: Option<u32>,
    /// TCP: smoothed RTT at the end (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srtt_us: Option<u32>,
    #[serde(with = "summary_record")]
    #[schemars(with = "SummaryRecord")]
    pub summary: Summary,
}

impl EndView {
    pub fn of(h: &Hist) -> Self {
        EndView {
            histogram: sparse(h),
            handshake_us: None,
            iface: None,
            iface_samples: None,
            retrans: None,
            srtt_us: None,
            summary: h.summary(),
        }
    }
}

/// Non-empty histogram buckets as [lower_us, upper_us, count] (upper -1: the open bucket).
pub fn sparse(h: &Hist) -> Vec<(f64, f64, u64)> {
    h.buckets()
        .map(|(i, c)| {
            let (lo, hi) = crate::analysis::hist::bucket_bounds(i);
            (lo, if hi.is_finite() { hi } else { -1.0 }, c)
        })
        .collect()
}

/// Statistics of one view for one flow over one interval: the histogram's summary and, for the
/// TCP view, TCP's own srtt and retransmissions (a row's cells, not a summary of its own).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ViewStats {
    #[serde(flatten, with = "summary_record")]
    #[schemars(with = "SummaryRecord")]
    pub summary: Summary,
    /// TCP view only: TCP's smoothed RTT after the last sample (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub srtt_us: Option<u32>,
    /// TCP view only: retransmissions over the flow's life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrans: Option<u32>,
    /// TCP view only: the connection's handshake RTT (us); absent for a connection open before
    /// attach or whose handshake left no sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_us: Option<u32>,
}

impl ViewStats {
    pub fn from_hist(h: &Hist) -> Self {
        ViewStats {
            summary: h.summary(),
            srtt_us: None,
            retrans: None,
            handshake_us: None,
        }
    }
}

/// One flow's row of an interval.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FlowRow {
    pub netns: u32,
    pub netns_name: String,
    pub local: String,
    pub remote: String,
    #[schemars(with = "String")]
    pub side: Side,
    /// Sampler flows of ICMP echo: `icmp` or `icmpv6` (absent: a TCP flow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<Name>,
    /// The sampler's tunnel identity of the flow (issue 41): the VLAN id, and the VXLAN/Geneve
    /// VNI and encapsulation, when it was seen tagged or inside a tunnel (absent: plain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<crate::analysis::flow::Tunnel>,
    /// How the TCP view found the flow: established (after attach), existing (iterator), late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Name>,
    pub closed: bool,
    /// Each view's statistics (`tcp`, `sampler`, ...), in registry order.
    #[serde(flatten)]
    pub views: Columns<ViewStats>,
    /// `--label-workload`: who owns the local socket (its cgroup as a unit, container, pod).
    /// Not read back (no reader uses it).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_deref",
        skip_deserializing
    )]
    pub workload: Option<Arc<Workload>>,
    /// A connection the sampler saw translated (NAT, issue 45): both tuples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<Nat>,
    /// The remote address's name from `--names` (issue 45).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_name: Option<String>,
    #[serde(skip)]
    #[schemars(skip)]
    pub flow: Option<crate::analysis::flow::Flow>,
}

impl FlowRow {
    /// A flow's row with no view's statistics yet.
    pub fn new(f: &crate::analysis::flow::Flow, netns_name: String, side: Side) -> FlowRow {
        FlowRow {
            tunnel: (!f.tunnel.is_none()).then_some(f.tunnel),
            netns: f.netns,
            netns_name,
            local: f.local.to_string(),
            remote: f.remote.to_string(),
            side,
            proto: None,
            origin: None,
            state: None,
            closed: false,
            views: Columns::default(),
            workload: None,
            nat: None,
            remote_name: None,
            flow: Some(*f),
        }
    }
}

impl EndFlow {
    /// A flow's `end` entry with no view's statistics yet.
    pub fn new(f: &crate::analysis::flow::Flow, netns_name: String, side: Side) -> EndFlow {
        EndFlow {
            tunnel: (!f.tunnel.is_none()).then_some(f.tunnel),
            closed: None,
            local: f.local.to_string(),
            netns: f.netns,
            netns_name,
            origin: None,
            proto: None,
            remote: f.remote.to_string(),
            side,
            views: Columns::default(),
            workload: None,
            nat: None,
            remote_name: None,
        }
    }
}

/// One interval (`type: interval`; the whole-run table uses the same shape as `summary`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, tag = "type", rename = "interval")]
#[schemars(rename = "Interval")]
pub struct Interval {
    /// Seconds since the observer started (end of the interval).
    pub t: f64,
    /// Unix time (seconds) at the end of the interval.
    pub ts: f64,
    pub interval_s: f64,
    /// Seconds from `ts` until every view was read: the views are read one after the other, so
    /// each view's interval ends somewhere in `ts` .. `ts + read_s`, and a sample taken in that
    /// span can be in this interval of one view and the next interval of another (version 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_s: Option<f64>,
    pub flows: Vec<FlowRow>,
    /// Per view, per side (`client`, `server`, `unknown`): never both ends together.
    pub totals: BTreeMap<Name, BTreeMap<Name, ViewStats>>,
    pub counters: Counters,
    /// Each view's hooks on interfaces (the sampler's: per interface and direction), as
    /// checked this interval; absent when no view has any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookStatus>,
    /// Per view, per side: the handshake RTTs of the connections it saw established in this
    /// interval (the TCP view: client SYN -> SYN-ACK, server SYN-ACK -> ACK); absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handshakes: BTreeMap<Name, BTreeMap<Name, ViewStats>>,
}

/// Counters keyed by static names (as the views give them) as a record's [`Counters`].
pub fn counters(c: &BTreeMap<&'static str, BTreeMap<&'static str, u64>>) -> Counters {
    c.iter()
        .map(|(v, m)| (Cow::Borrowed(*v), names(m.clone())))
        .collect()
}

/// One view's counters keyed by static names, as a record's.
pub fn names(c: BTreeMap<&'static str, u64>) -> BTreeMap<Name, u64> {
    c.into_iter().map(|(k, n)| (Cow::Borrowed(k), n)).collect()
}

/// A whole number of microseconds as an integer (as observe always wrote it), else as is.
fn whole<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && *v >= 0.0 && *v <= u64::MAX as f64 {
        s.serialize_u64(*v as u64)
    } else {
        s.serialize_f64(*v)
    }
}

/// How observe's records write a [`Summary`]: its values in microseconds, named `*_us`, without
/// the standard deviation (its histograms keep none). The schema's `HistSummary`.
#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(
    rename = "HistSummary",
    description = "Percentiles and moments of a histogram (microseconds)."
)]
struct SummaryRecord {
    n: u64,
    min_us: f64,
    mean_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    max_us: f64,
}

impl SummaryRecord {
    fn of(s: &Summary) -> Self {
        SummaryRecord {
            n: s.n,
            min_us: s.min,
            mean_us: s.mean,
            p50_us: s.p50,
            p90_us: s.p90,
            p99_us: s.p99,
            max_us: s.max,
        }
    }

    fn summary(self) -> Summary {
        Summary {
            n: self.n,
            min: self.min_us,
            mean: self.mean_us,
            p50: self.p50_us,
            p90: self.p90_us,
            p99: self.p99_us,
            max: self.max_us,
            stddev: f64::NAN,
        }
    }
}

/// A [`Summary`] as [`SummaryRecord`], its keys in that order (a row's cells).
mod summary_record {
    use super::{Deserialize, Serialize, Serializer, Summary, SummaryRecord};
    pub fn serialize<S: Serializer>(v: &Summary, s: S) -> Result<S::Ok, S::Error> {
        SummaryRecord::of(v).serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Summary, D::Error> {
        SummaryRecord::deserialize(d).map(SummaryRecord::summary)
    }
}

fn as_deref<S: Serializer>(w: &Option<Arc<Workload>>, s: S) -> Result<S::Ok, S::Error> {
    w.as_deref().serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample whose RTT or time cannot be a measurement is not a record: every reader's
    /// bad-record policy applies to it (bucket and chart refuse the file naming the line; the
    /// lab's observer reader counts it in `bad_lines` and skips it).
    #[test]
    fn samples_with_nonsense_values_are_not_records() {
        let smp = |rtt: &str| {
            format!(
                r#"{{"local":"a","remote":"b","rtt_us":{rtt},"t":0.5,"type":"sample","view":"tcp"}}"#
            )
        };
        assert!(matches!(Record::parse(&smp("0")), Ok(Record::Sample(_))));
        assert!(matches!(Record::parse(&smp("1e12")), Ok(Record::Sample(_))));
        for bad in ["-1", "1e308", "1000000000001", "-0.5"] {
            let e = Record::parse(&smp(bad)).unwrap_err();
            assert!(matches!(e, RecordError::BadValue(_)), "{bad}: {e}");
        }
    }

    /// Lines of `observe --format json --raw --cloud-buckets` (records version 4: start, samples
    /// of both views and ICMP, flow_end, intervals, cloud points with and without values, end):
    /// each is read into its record and written back to the same bytes.
    #[test]
    fn observe_output_reads_back_to_the_same_bytes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/observe/raw.jsonl"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        for line in text.lines() {
            let r = Record::parse(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            kinds.insert(match &r {
                Record::Start(_) => "start",
                Record::Interval(_) => "interval",
                Record::Sample(s) => match s.view.as_ref() {
                    "tcp" => "sample tcp",
                    "sampler" if s.proto.is_some() => "sample icmp",
                    "sampler" => "sample sampler",
                    _ => "sample flow_end",
                },
                Record::Cloud(_) => "cloud",
                Record::End(_) => "end",
                Record::Other => "other",
            });
            assert_eq!(serde_json::to_string(&r).unwrap(), line);
        }
        assert_eq!(kinds.len(), 8, "{kinds:?}");
    }

    /// The views' keys of the start record: a view's value is kept under its kind, a null or
    /// missing one is not attached and left out when written, a key no view owns is ignored;
    /// `type` comes first, then the struct's fields in their order.
    #[test]
    fn start_record_views_keys() {
        let line = r#"{"clock":"c","future":{"a":1},"sampler":null,"settings":{},"tcp":{"hook":"h"},"ts":1.5,"type":"start","version":1,"views":["tcp"]}"#;
        let Record::Start(s) = Record::parse(line).unwrap() else {
            panic!()
        };
        assert_eq!(
            s.view_values.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            [ViewKind::Tcp]
        );
        assert_eq!(s.view_values.get(ViewKind::Tcp).unwrap()["hook"], "h");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"type":"start","clock":"c","settings":{},"ts":1.5,"version":1,"views":["tcp"],"tcp":{"hook":"h"}}"#
        );
        let Record::Start(s) = Record::parse(r#"{"type":"start","views":[]}"#).unwrap() else {
            panic!()
        };
        assert!(s.view_values.is_empty());
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"type":"start","clock":"","settings":null,"ts":null,"version":0,"views":[]}"#
        );
        assert!(
            Record::parse(r#"{"type":"start"}"#).is_err(),
            "views is required"
        );
    }

    #[test]
    fn reading_is_tolerant() {
        let r = Record::parse(r#"{"type":"future","x":1}"#).unwrap();
        assert!(matches!(r, Record::Other));
        // Unknown fields, no side, no t_us, no srtt: what a reader needs is there.
        let r = Record::parse(
            r#"{"type":"sample","view":"tcp","t":0.5,"local":"a","remote":"b","rtt_us":150.5,"new":[1]}"#,
        )
        .unwrap();
        let Record::Sample(s) = r else { panic!() };
        assert_eq!((s.t_s(), s.rtt_us, s.side), (0.5, 150.5, None));
        let Record::Interval(iv) = Record::parse(r#"{"type":"interval","t":1.0}"#).unwrap() else {
            panic!()
        };
        assert_eq!((iv.t, iv.flows.len()), (1.0, 0));
        let Record::Start(st) = Record::parse(r#"{"type":"start","views":["tcp"]}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!((st.ts, st.views.len()), (None, 1));
        assert!(matches!(
            Record::parse("{not json"),
            Err(RecordError::NotJson(_))
        ));
        let e = Record::parse(r#"{"type":"sample","view":"tcp","t":1,"local":"a","remote":"b"}"#)
            .unwrap_err();
        assert!(matches!(e, RecordError::Invalid(_)), "{e}");
        assert!(e.to_string().contains("rtt_us"), "{e}");
    }

    /// A workload is written the same in the end record's flows as in the interval's rows (its
    /// fields in their order), as is a view's summary.
    #[test]
    fn workload_in_end_as_in_interval() {
        let w = Arc::new(Workload {
            cgroup: "system.slice/nginx.service".into(),
            unit: Some("nginx.service".into()),
            ..Default::default()
        });
        let a = "10.0.0.1:1".parse().unwrap();
        let f = crate::analysis::flow::Flow::new(1, a, a);
        let mut flow = EndFlow::new(&f, "n".into(), Side::Client);
        flow.views = Columns::default().with(ViewKind::Tcp, EndView::of(&Hist::default()));
        flow.workload = Some(w.clone());
        let end = serde_json::to_string(&flow).unwrap();
        let mut row = FlowRow::new(&f, "n".into(), Side::Client);
        row.views = Columns::default().with(ViewKind::Tcp, ViewStats::from_hist(&Hist::default()));
        row.workload = Some(w.clone());
        let interval = serde_json::to_string(&row).unwrap();
        let written = format!(r#""workload":{}"#, serde_json::to_string(&*w).unwrap());
        assert!(end.contains(&written), "{end}");
        assert!(interval.contains(&written), "{interval}");
        assert!(end.contains(r#""summary":{"n":0,"min_us":"#), "{end}");
    }
}

//! What a phase measured (its samples by view and side, its own connections, what the observer
//! saw that its rows leave out) and the statistics of its samples. The passive views' samples
//! are kept by the view's kind and side, the lab's columns made from the registry's names
//! ([`lab_views`]): no view is named here.
use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use super::PORT;
use crate::analysis::flow::Side;
use crate::analysis::results::{ViewKind, ViewSummary};
use crate::cmd::lab::observer::{lab_kinds, ObsShared};
use crate::lab::testbed::SRV_ADDR;
use crate::views::ViewKind as PassiveKind;

/// A phase's request/response connection: the probe socket's own address (with the responder's
/// address and port, the connection's 4-tuple) and its window, Unix seconds from the first
/// transaction's send to the end of the last one (the probe's own CLOCK_MONOTONIC times).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct OwnFlow {
    pub(super) local: SocketAddr,
    pub(super) start: f64,
    pub(super) end: f64,
}

/// The observer's samples of the lab's port that a phase's rows do not hold, and why.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
pub(super) struct LeftOut {
    /// Samples of the phase's own connections before its first transaction or after its last:
    /// the handshake, the probe's hello, the close, a last response's late ACK.
    pub(super) own_outside_window: u64,
    /// Samples of other connections to the lab's port while the phase ran (a connection that
    /// was open before the lab, another client in the testbed's namespaces).
    pub(super) other_connections: u64,
}

impl LeftOut {
    pub(super) fn total(&self) -> u64 {
        self.own_outside_window + self.other_connections
    }
}

/// What one phase measured: samples as (unix time, RTT us).
#[derive(Debug, Default, Clone)]
pub(super) struct PhaseData {
    pub(super) start_unix: f64,
    pub(super) end_unix: f64,
    pub(super) rr: Vec<(f64, f64)>,
    pub(super) ping: Vec<(f64, f64)>,
    /// `probe tcp-connect`'s handshakes (the phases that run ping run it beside).
    pub(super) connect: Vec<(f64, f64)>,
    /// The passive views' samples of the phase's own connections, by view and side
    /// ([`PhaseData::passive`]).
    pub(super) passive: BTreeMap<(PassiveKind, Side), Series>,
    pub(super) rr_failed: u64,
    pub(super) ping_lost: u64,
    /// Handshakes refused or timed out.
    pub(super) connect_failed: u64,
    pub(super) bulk: Option<Value>,
    /// The phase's own connections with samples in their windows.
    pub(super) flows: usize,
    /// The phase's request/response connections (from its probes).
    pub(super) own: Vec<OwnFlow>,
    pub(super) left_out: LeftOut,
    /// The observer's ring-buffer drops (any connection's samples) while the phase ran: its
    /// rows may lack up to this many. `drops_before`: the count when it started.
    pub(super) observer_dropped: u64,
    pub(super) drops_before: u64,
}

impl PhaseData {
    /// The observer's samples of this phase's own connections (by 4-tuple) inside their
    /// windows, by view and side; the rest of what the observer saw on the lab's port while the
    /// phase ran (`start_unix` to `end`) and its own connections' samples outside their windows
    /// are counted in `left_out`.
    pub(super) fn take_observed(&mut self, s: &ObsShared, end: f64) {
        let srv = SocketAddr::from((SRV_ADDR, PORT));
        let mut seen: Vec<SocketAddr> = Vec::new();
        for r in &s.samples {
            let own = self.own.iter().find(|o| {
                (r.local == o.local && r.remote == srv) || (r.local == srv && r.remote == o.local)
            });
            let Some(o) = own else {
                if r.t_unix >= self.start_unix && r.t_unix <= end {
                    self.left_out.other_connections += 1;
                }
                continue;
            };
            if r.t_unix < o.start || r.t_unix > o.end {
                self.left_out.own_outside_window += 1;
                continue;
            }
            if !seen.contains(&o.local) {
                seen.push(o.local);
            }
            // the side whose socket took the sample: the responder's, or the probe's
            let side = if r.local == srv {
                Side::Server
            } else {
                Side::Client
            };
            self.passive
                .entry((r.view, side))
                .or_default()
                .push((r.t_unix, r.rtt_us));
        }
        self.flows = seen.len();
    }

    /// A passive view's samples on one side (none when it took none).
    pub(super) fn passive(&self, kind: PassiveKind, side: Side) -> &[(f64, f64)] {
        self.passive
            .get(&(kind, side))
            .map_or(&[], |s| s.as_slice())
    }

    /// The samples of one of the lab's views.
    pub(super) fn series(&self, v: &LabView) -> &[(f64, f64)] {
        match v.source {
            Source::Rr => &self.rr,
            Source::Ping => &self.ping,
            Source::Connect => &self.connect,
            Source::Passive(k) => self.passive(k, v.side),
        }
    }
}

/// The cloud metric's bucketed median (vm_flow/rtt layout) of RTTs in us.
pub fn cloud_p50_us(values: &[f64]) -> Option<f64> {
    use crate::analysis::dist::{vm_flow_preset, Distribution, ValueUnit};
    let mut d = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
    for &x in values {
        d.add_us(x);
    }
    let p = d.percentile(50.0).ok()??;
    Some(ValueUnit::Ms.to_us(p.value))
}

pub(super) fn rtts(s: &[(f64, f64)]) -> Vec<f64> {
    s.iter().map(|x| x.1).collect()
}

/// A view's phase statistics in the phase record: n, min, mean, p5, p50, p90, p95, p99, max
/// (us) from [`ViewSummary::of_samples`], the one exact summary (nearest-rank percentiles,
/// docs/results.md).
pub(super) fn summary_json(s: &[(f64, f64)]) -> Value {
    let v = ViewSummary::of_samples("", None, &rtts(s));
    if v.count == 0 {
        return json!({"n": 0});
    }
    json!({
        "n": v.count, "min": v.min_us, "mean": v.mean_us, "p5": v.p5_us, "p50": v.p50_us,
        "p90": v.p90_us, "p95": v.p95_us, "p99": v.p99_us, "max": v.max_us,
    })
}

/// Samples as (unix time, RTT us).
pub(super) type Series = Vec<(f64, f64)>;

/// Where a lab view's samples come from: the request/response probe, ping, `probe tcp-connect`,
/// or a passive view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Source {
    Rr,
    Ping,
    Connect,
    Passive(PassiveKind),
}

/// One of the lab's views, a column of its table and a series of its result: the
/// request/response probe, ping, then each passive view's client and server side.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LabView {
    /// Its name in the result and the observations (`rr`, `ping`, `<view> client`).
    pub(super) name: String,
    /// Its column header's stem (`RR`, `PING`, `<VIEW>_CLI`).
    pub(super) short: String,
    pub(super) kind: ViewKind,
    pub(super) side: Side,
    pub(super) source: Source,
}

impl LabView {
    /// Whether its samples are also read as the cloud's flow metric (`*_CLOUD_P50`).
    pub(super) fn cloud(&self) -> bool {
        matches!(self.source, Source::Passive(k) if k.cloud_metric())
    }
}

/// The sides of a connection a passive view's samples are split by, in column order.
const SIDES: [(Side, &str); 2] = [(Side::Client, "CLI"), (Side::Server, "SRV")];

/// The lab's views in table order: `rr`, `ping`, `tcp-connect`, then each passive view the lab runs (registry
/// order), client side then server side, named by the registry (`tcp client`, `TCP_CLI`).
pub(super) fn lab_views() -> Vec<LabView> {
    let active = |name: &str, kind, source| LabView {
        name: name.into(),
        short: name.to_uppercase(),
        kind,
        side: Side::Client,
        source,
    };
    let mut v = vec![
        active("rr", ViewKind::Probe, Source::Rr),
        active("ping", ViewKind::Ping, Source::Ping),
        LabView {
            short: "TCP_CONNECT".into(),
            ..active("tcp-connect", ViewKind::Probe, Source::Connect)
        },
    ];
    for k in lab_kinds() {
        for (side, short) in SIDES {
            v.push(LabView {
                name: k.label(side),
                short: format!("{}_{short}", k.short_name()),
                kind: ViewKind::Passive(k),
                side,
                source: Source::Passive(k),
            });
        }
    }
    v
}

/// The views of a phase, in table order, with their samples.
pub(super) fn views_of(d: &PhaseData) -> Vec<(LabView, &[(f64, f64)])> {
    lab_views()
        .into_iter()
        .map(|v| {
            let s = d.series(&v);
            (v, s)
        })
        .collect()
}

/// A view's summary in the lab's result: the one exact summary, with p90 among the extras and
/// no stddev (as the lab's result always had them), and for a view read as the cloud's metric
/// too ([`PassiveKind::cloud_metric`]) the metric's bucketed median.
pub(super) fn view_summary(name: &str, kind: ViewKind, s: &[(f64, f64)]) -> ViewSummary {
    let mut vs = ViewSummary::of_samples(name, Some(kind), &rtts(s));
    vs.stddev_us = None;
    if let Some(p90) = vs.p90_us.take() {
        vs.extra.insert("p90_us".into(), p90);
        if PassiveKind::from_name(kind.as_str()).is_some_and(|k| k.cloud_metric()) {
            if let Some(c) = cloud_p50_us(&rtts(s)) {
                vs.extra.insert("cloud_p50_us".into(), c);
            }
        }
    }
    vs
}

/// The samples left out over all phases.
pub(super) fn left_out_total(data: &[PhaseData]) -> LeftOut {
    data.iter().fold(LeftOut::default(), |a, d| LeftOut {
        own_outside_window: a.own_outside_window + d.left_out.own_outside_window,
        other_connections: a.other_connections + d.left_out.other_connections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let at = |v: &[f64]| v.iter().map(|&r| (0.0, r)).collect::<Vec<_>>();
        let v: Vec<f64> = (1..=101).map(|x| x as f64).collect();
        let s = view_summary("tcp client", ViewKind::Passive(PassiveKind::Tcp), &at(&v));
        assert_eq!(s.count, 101);
        assert_eq!(s.p50_us, Some(51.0));
        assert_eq!(s.p5_us, Some(6.0));
        assert_eq!(s.p95_us, Some(96.0));
        assert_eq!(s.min_us, Some(1.0));
        assert_eq!(s.max_us, Some(101.0));
        assert!((s.mean_us.unwrap() - 51.0).abs() < 1e-9);
        assert_eq!(
            (s.p90_us, s.stddev_us, s.extra["p90_us"]),
            (None, None, 91.0)
        );
        let e = view_summary("tcp client", ViewKind::Passive(PassiveKind::Tcp), &[]);
        assert_eq!((e.count, e.p50_us, e.extra.len()), (0, None, 0));
        assert_eq!(summary_json(&[]).to_string(), r#"{"n":0}"#);
        // An even count: an observed value (the lower middle one), never a mean of two.
        let j = summary_json(&at(&[10.0, 40.0, 20.0, 30.0])).to_string();
        assert_eq!(
            j,
            r#"{"max":40.0,"mean":25.0,"min":10.0,"n":4,"p5":10.0,"p50":20.0,"p90":40.0,"p95":40.0,"p99":40.0}"#
        );
    }

    /// The lab's p50 of a view is the statistic observe (and compare) report for the same
    /// samples: observe's result summarises a raw series with `ViewSummary::of_samples`, its
    /// tables with `Summary`.
    #[test]
    fn lab_and_observe_give_the_same_p50() {
        let samples: Vec<f64> = (0..1000)
            .map(|i| 40.0 + ((i * 7919) % 997) as f64 * 0.37)
            .collect();
        for n in [1, 2, 3, 4, 10, 101, 1000] {
            let v = &samples[..n];
            let lab = view_summary(
                "tcp client",
                ViewKind::Passive(PassiveKind::Tcp),
                &v.iter().map(|&r| (0.0, r)).collect::<Vec<_>>(),
            );
            let observe =
                ViewSummary::of_samples("tcp client", Some(ViewKind::Passive(PassiveKind::Tcp)), v);
            let table = crate::analysis::stats::Summary::from_us(v);
            assert_eq!(lab.p50_us, observe.p50_us, "n={n}");
            assert_eq!(lab.p50_us, Some(table.p50), "n={n}");
            assert_eq!(
                (lab.p5_us, lab.p95_us, lab.p99_us),
                (observe.p5_us, observe.p95_us, observe.p99_us),
                "n={n}"
            );
            assert!(v.contains(&table.p50), "n={n}: p50 is an observed value");
        }
    }

    #[test]
    fn cloud_median_is_bucketed() {
        // 0.1 ms samples land in the 0..1 ms bucket: the bucketed median is within it, above the true median
        let c = cloud_p50_us(&[100.0; 50]).unwrap();
        assert!(c > 100.0 && c <= 1000.0, "{c}");
    }

    /// The session's raw samples as the observer reads them (t: seconds since its start, at
    /// Unix time 1000 and CLOCK_MONOTONIC 5 s).
    fn observed(lines: &[(&str, &str, &str, f64, f64)]) -> ObsShared {
        let mut s = ObsShared {
            start_ts: Some(1000.0),
            start_mono: 5_000_000_000,
            ..Default::default()
        };
        for (view, local, remote, t, rtt) in lines {
            let smp = crate::session::RawSample {
                view: match *view {
                    "tcp" => crate::views::ViewKind::Tcp,
                    _ => crate::views::ViewKind::Sampler,
                },
                event: crate::session::RawEvent::Rtt,
                flow: crate::analysis::flow::Flow {
                    tunnel: Default::default(),
                    netns: 1,
                    local: local.parse().unwrap(),
                    remote: remote.parse().unwrap(),
                },
                proto: None,
                side: crate::analysis::flow::Side::Unknown,
                ts_ns: 5_000_000_000 + (t * 1e9).round() as u64,
                rtt_us: *rtt as u32,
                srtt_us: None,
                matching: None,
            };
            crate::cmd::lab::observer::observed_sample(&mut s, &smp);
        }
        s
    }

    /// A phase takes exactly its own connection (by 4-tuple, both ends) inside its window;
    /// everything else on the lab's port is counted, by reason.
    #[test]
    fn a_phase_takes_its_own_connection_inside_its_window() {
        let cli = "10.79.1.2:40000";
        let srv = "10.79.2.2:7878";
        let mut s = observed(&[
            ("tcp", cli, srv, 0.5, 40.0),       // handshake: before the window
            ("tcp", cli, srv, 1.0, 50.0),       // client, first transaction
            ("tcp", srv, cli, 1.2, 9000.0),     // server
            ("sampler", cli, srv, 1.2, 45.0),   // sampler client
            ("sampler", srv, cli, 1.3, 9000.0), // sampler server
            ("tcp", cli, srv, 2.0, 50.0),       // client, last transaction's end
            ("tcp", srv, cli, 2.04, 40000.0),   // the last response's delayed ACK: after
            ("tcp", "10.79.1.2:39999", srv, 1.1, 30.0), // a connection open before the lab
            ("tcp", srv, "10.79.1.2:39999", 1.1, 30.0),
            ("tcp", "10.79.1.2:41000", srv, 9.0, 30.0), // another phase's connection, later
            ("sampler", "10.79.1.2:0", "10.79.2.2:0", 1.1, 30.0), // a ping: not the lab's port
            // IPv4-mapped IPv6 addresses name the same sockets: the server's, in the window
            (
                "tcp",
                "[::ffff:10.79.2.2]:7878",
                "[::ffff:10.79.1.2]:40000",
                1.5,
                9000.0,
            ),
        ]);
        assert_eq!(s.other_port, 1);
        let mut d = PhaseData {
            start_unix: 1000.2,
            own: vec![OwnFlow {
                local: "10.79.1.2:40000".parse().unwrap(),
                start: 1000.9,
                end: 1002.0,
            }],
            ..Default::default()
        };
        d.take_observed(&s, 1002.3);
        use crate::views::ViewKind as V;
        let n = |k, s| d.passive(k, s).len();
        assert_eq!(
            (
                n(V::Tcp, Side::Client),
                n(V::Tcp, Side::Server),
                n(V::Sampler, Side::Client),
                n(V::Sampler, Side::Server)
            ),
            (2, 2, 1, 1)
        );
        assert_eq!(d.flows, 1);
        assert_eq!(
            d.left_out,
            LeftOut {
                own_outside_window: 2,
                other_connections: 2
            }
        );
        // The kernel's time since the observer's start, on the Unix clock of its start.
        assert_eq!(d.passive(V::Tcp, Side::Client)[0], (1001.0, 50.0));
        assert_eq!(d.passive(V::Tcp, Side::Server)[1], (1001.5, 9000.0));
        // A flow's end is not a sample, and not counted.
        let kept = s.samples.len();
        let fin = crate::session::RawSample {
            event: crate::session::RawEvent::FlowEnd,
            rtt_us: 0,
            ts_ns: 6_000_000_000,
            flow: crate::analysis::flow::Flow {
                tunnel: Default::default(),
                netns: 1,
                local: cli.parse().unwrap(),
                remote: srv.parse().unwrap(),
            },
            view: crate::views::ViewKind::Tcp,
            proto: None,
            side: crate::analysis::flow::Side::Client,
            srtt_us: None,
            matching: None,
        };
        crate::cmd::lab::observer::observed_sample(&mut s, &fin);
        assert_eq!((s.samples.len(), s.other_port), (kept, 1));
    }
}

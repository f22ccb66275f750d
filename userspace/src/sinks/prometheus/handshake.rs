//! The TCP view's handshakes in `/metrics` (issue 45): `rttscope_tcp_handshake_seconds{side}`,
//! a histogram of each connection's handshake RTT (client: SYN -> SYN-ACK; server: SYN-ACK ->
//! ACK) with the RTT's buckets, and `rttscope_tcp_handshake_failures_total{side,reason}`, the
//! failed or retransmitted handshakes by kind, every kind exposed from the first render.
use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use super::native::Native;
use super::RttHist;
use crate::analysis::flow::Side;
use crate::analysis::hist::Hist;

/// The TCP view's counters that are handshake failures (or retransmissions), with their side
/// and `reason` label.
pub const FAILURES: [(&str, &str, &str); 9] = [
    ("handshake_failed_refused", "client", "refused"),
    ("handshake_failed_timed_out", "client", "timed_out"),
    ("handshake_failed_unreachable", "client", "unreachable"),
    ("handshake_failed_reset", "client", "reset"),
    ("handshake_failed_abandoned", "client", "abandoned"),
    ("handshake_syn_retransmits", "client", "syn_retransmit"),
    (
        "handshake_synack_retransmits",
        "server",
        "synack_retransmit",
    ),
    ("handshake_listen_overflows", "server", "listen_overflow"),
    ("handshake_listen_drops", "server", "listen_drop"),
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SideLabel {
    side: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    side: String,
    reason: String,
}

/// The two families, and each side's histogram (for the native buckets OTLP sends).
pub(super) struct Handshakes {
    hist: Family<SideLabel, RttHist>,
    by_side: BTreeMap<String, RttHist>,
    failures: Family<FailureLabels, Counter>,
}

impl Handshakes {
    pub(super) fn register(r: &mut Registry) -> Handshakes {
        let h = Handshakes {
            hist: Family::default(),
            by_side: BTreeMap::new(),
            failures: Family::default(),
        };
        for (_, side, reason) in FAILURES {
            let l = FailureLabels {
                side: side.into(),
                reason: reason.into(),
            };
            drop(h.failures.get_or_create(&l));
        }
        r.register_with_unit(
            "rttscope_tcp_handshake",
            "Handshake RTT of each connection the TCP view saw established (client: SYN to SYN-ACK; server: SYN-ACK to the ACK); le=B counts samples < B us",
            Unit::Seconds,
            h.hist.clone(),
        );
        r.register(
            "rttscope_tcp_handshake_failures",
            "Handshakes that failed or were retransmitted, by side and reason: client refused (RST to the SYN), timed_out, unreachable (ICMP), reset (another error), abandoned (closed by the application), syn_retransmit; server synack_retransmit (of handshakes that completed), listen_overflow and listen_drop (the namespaces' ListenOverflows and ListenDrops)",
            h.failures.clone(),
        );
        h
    }

    /// Handshake RTTs of one side since the last read.
    pub(super) fn observe(&mut self, side: Side, h: &Hist) {
        let side = side.as_str().to_string();
        let fam = &self.hist;
        let s = self
            .by_side
            .entry(side.clone())
            .or_insert_with(|| fam.get_or_create(&SideLabel { side }).clone());
        s.add_delta(h, None);
    }

    /// A counter's growth `d`, when the counter is a handshake failure kind.
    pub(super) fn count(&self, name: &str, d: u64) {
        if let Some((_, side, reason)) = FAILURES.iter().find(|f| f.0 == name) {
            let l = FailureLabels {
                side: side.to_string(),
                reason: reason.to_string(),
            };
            self.failures.get_or_create(&l).inc_by(d);
        }
    }

    /// Each side's native buckets (OTLP's exponential histogram).
    pub(super) fn natives(&self) -> Vec<(String, Native)> {
        self.by_side
            .iter()
            .map(|(s, h)| (s.clone(), h.native()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{Exporter, LabelPolicy};
    use crate::analysis::flow::Side;
    use crate::analysis::hist::Hist;
    use crate::views::ViewKind;

    #[test]
    fn handshakes_are_a_histogram_per_side_and_failures_a_counter_per_reason() {
        let mut ex = Exporter::new(LabelPolicy::default()).unwrap();
        let t = ex.encode();
        // every reason from the first render, at 0
        assert!(
            t.contains(
                "rttscope_tcp_handshake_failures_total{side=\"server\",reason=\"listen_drop\"} 0"
            ),
            "{t}"
        );
        let mut h = Hist::default();
        h.record(20_300);
        h.record(20_500);
        ex.observe_handshakes(Side::Client, &h);
        ex.observe_handshakes(Side::Client, &h);
        let mut c = BTreeMap::new();
        c.insert("handshake_failed_refused", 2u64);
        ex.set_counters(ViewKind::Tcp, &c);
        c.insert("handshake_failed_refused", 5);
        ex.set_counters(ViewKind::Tcp, &c);
        let t = ex.encode();
        assert!(
            t.contains("# TYPE rttscope_tcp_handshake_seconds histogram"),
            "{t}"
        );
        assert!(
            t.contains("rttscope_tcp_handshake_seconds_count{side=\"client\"} 4"),
            "{t}"
        );
        // 20.3 ms and 20.5 ms: below the 20.48 ms bound (20 us x 2^10) one each time
        assert!(
            t.contains("rttscope_tcp_handshake_seconds_bucket{le=\"0.02048\",side=\"client\"} 2"),
            "{t}"
        );
        assert!(
            t.contains(
                "rttscope_tcp_handshake_failures_total{side=\"client\",reason=\"refused\"} 5"
            ),
            "{t}"
        );
        assert_eq!(ex.render().handshake_natives.len(), 1);
    }
}

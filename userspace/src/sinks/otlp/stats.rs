//! The OTLP pusher's delivery counters (`rttscope_otlp_*`), registered in the exporter's registry.
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Delivery counters, registered in the exporter's registry.
#[derive(Clone, Default)]
pub struct Stats {
    pub sent: Counter,
    pub dropped: Family<Vec<(String, String)>, Counter>,
    pub failures: Family<Vec<(String, String)>, Counter>,
}

/// The reasons of `rttscope_otlp_dropped_total`, every one exposed from the start (at 0), so that
/// a `rate()` or an alert on a reason has a series before the first drop.
const DROP_REASONS: [&str; 4] = ["queue_full", "superseded", "refused", "exit"];

impl Stats {
    pub fn register(r: &mut Registry) -> Stats {
        let s = Stats::default();
        for reason in DROP_REASONS {
            drop(
                s.dropped
                    .get_or_create(&vec![("reason".into(), reason.into())]),
            );
        }
        r.register(
            "rttscope_otlp_exports",
            "OTLP export requests delivered (answered 2xx)",
            s.sent.clone(),
        );
        r.register(
            "rttscope_otlp_dropped",
            "OTLP export requests never delivered, by reason: queue_full, superseded (a newer one was sent instead: its counts are cumulative), refused (an answer not worth a retry), exit (the last one, not delivered within the exit deadline)",
            s.dropped.clone(),
        );
        r.register(
            "rttscope_otlp_failures",
            "OTLP export attempts that failed, by cause (connect, tls, timeout, io, http_<status>)",
            s.failures.clone(),
        );
        s
    }

    pub(super) fn failed(&self, cause: &str) {
        self.failures
            .get_or_create(&vec![("cause".into(), cause.into())])
            .inc();
    }

    pub(super) fn dropped(&self, reason: &str) {
        self.dropped
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    /// Every request dropped, whatever the reason.
    pub fn dropped_total(&self) -> u64 {
        DROP_REASONS
            .iter()
            .map(|r| {
                self.dropped
                    .get_or_create(&vec![("reason".into(), r.to_string())])
                    .get()
            })
            .sum()
    }
}

//! The exporter's part of `--names` and `--label-backend` (issue 45): the `remote_name` and
//! `backend_prefix` labels of a flow's samples, and the names file's own metrics
//! (`rttscope_names_reloads_total{result}`, `rttscope_names_entries`).
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{LabelPolicy, RttLabels};
use crate::analysis::flow::Flow;
use crate::analysis::peers::PeerFile;

/// The reloads' results, in the order [`NamesState::last`] keeps them.
const RESULTS: [&str; 3] = ["success", "failure", "too_large"];

/// The names file and its metrics.
pub struct NamesState {
    file: Arc<PeerFile>,
    reloads: Family<Vec<(String, String)>, Counter>,
    entries: Gauge,
    /// The reload counts (in [`RESULTS`]' order) last exported.
    last: [u64; 3],
}

impl NamesState {
    /// Register its metrics (every result at 0 from the start).
    pub fn register(file: Arc<PeerFile>, r: &mut Registry) -> NamesState {
        let reloads = Family::<Vec<(String, String)>, Counter>::default();
        r.register(
            "rttscope_names_reloads",
            "Changes of the --names file applied (result=success) or refused, the previous names kept (failure: malformed or unreadable; too_large: over the size or entry cap)",
            reloads.clone(),
        );
        let entries = Gauge::default();
        r.register(
            "rttscope_names_entries",
            "Entries of the --names file in force",
            entries.clone(),
        );
        let mut s = NamesState {
            file,
            reloads,
            entries,
            last: [0; 3],
        };
        s.update();
        s
    }

    /// The file's reload counts and entries, as of now.
    pub fn update(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.file.counts;
        let now = [
            c.success.load(Relaxed),
            c.failure.load(Relaxed),
            c.too_large.load(Relaxed),
        ];
        for (i, r) in RESULTS.iter().enumerate() {
            let label = vec![("result".to_string(), r.to_string())];
            self.reloads
                .get_or_create(&label)
                .inc_by(now[i].saturating_sub(self.last[i]));
        }
        self.last = now;
        self.entries.set(self.file.current().len() as i64);
    }
}

/// `remote_name` (`--names`: the remote's name, else empty) and `backend_prefix`
/// (`--label-backend`: the wire's remote of a NATed connection cut as the remote, else empty)
/// when the policy asks for them; an empty value is no label.
pub fn name_labels(
    policy: &LabelPolicy,
    names: Option<&NamesState>,
    labels: &mut RttLabels,
    flow: &Flow,
    translated: Option<&Flow>,
) {
    if policy.names {
        let current = names.map(|n| n.file.current());
        let name = current.as_ref().and_then(|n| n.name(flow.remote));
        labels.remote_name = Some(name.unwrap_or_default().to_string());
    }
    if policy.backend {
        let b = translated.map(|t| policy.remote_prefix(t.remote.ip()));
        labels.backend_prefix = Some(b.unwrap_or_default());
    }
}

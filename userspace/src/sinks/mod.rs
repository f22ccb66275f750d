//! Where results go: the per-interval table, charts and the Prometheus exporter.
pub mod chart;
pub mod progress;
pub mod prometheus;
pub mod table;

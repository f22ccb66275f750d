//! Where results go: the per-interval table, charts the Prometheus exporter and OTLP export.
pub mod chart;
pub mod otlp;
pub mod progress;
pub mod prometheus;
pub mod table;

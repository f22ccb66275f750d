//! Where results go: the per-interval table and charts.
pub mod chart;
pub mod table;

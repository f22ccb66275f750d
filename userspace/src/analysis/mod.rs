//! Pure code, no privileges: histograms, statistics, cloud bucket layouts,
//! the result format and units.
pub mod cloud_monitoring;
pub mod dist;
pub mod hist;
pub mod input;
pub mod records;
pub mod results;
pub mod stats;
pub mod units;
pub mod workload;

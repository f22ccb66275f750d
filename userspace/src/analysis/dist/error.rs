//! What a layout, a percentile, a merge or an alignment period can get wrong.
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum DistError {
    #[error("bad bucket layout '{spec}': {why}")]
    BadLayout { spec: String, why: String },
    #[error("percentile {0} is outside 0..=100")]
    BadPercentile(f64),
    #[error("cannot merge distributions with different layouts ({ours} and {theirs})")]
    LayoutMismatch { ours: String, theirs: String },
    #[error("alignment period must be a positive number of seconds, not {0}")]
    BadPeriod(f64),
}

//! One driver per subcommand.
pub mod bucket;
pub mod chart;
pub mod compare;
pub mod features;
pub mod observe;
pub mod probe;
pub mod serve;

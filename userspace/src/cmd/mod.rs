//! One driver per subcommand.
pub mod bucket;
pub mod chart;
pub mod compare;
pub mod features;
#[cfg(feature = "lab")]
pub mod lab;
pub mod manual;
pub mod observe;
pub mod probe;
pub mod serve;

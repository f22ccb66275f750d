//! `rttscope lab`'s driver: the scenarios of [`crate::lab`] run on its
//! testbed with the real views.
//!
//! - [`env`]: the real views (responder, probes, observer) and the report.
//! - [`observer`]: the passive views, observe's session in this process.
pub mod env;
mod observer;

pub use env::run;

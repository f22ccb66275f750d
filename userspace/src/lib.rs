//! rttscope: round-trip time seen three ways, side by side.
//!
//! - TCP view (`views::tcp`): RTT as the TCP stack computes it (sock_ops RTT callback).
//! - Active view: request/response and ICMP probes.
//! - Sampler view (`views::sampler`): a cloud-style packet sampler at interface ingress/egress.
pub mod active;
pub mod analysis;
pub mod bpf;
pub mod cli;
pub mod cmd;
pub mod error;
/// Fuzz harnesses (the `fuzz/` crate and the unit suite; docs/fuzzing.md).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "lab")]
pub mod lab;
pub mod logging;
pub mod session;
pub mod sinks;
pub mod sys;
pub mod views;

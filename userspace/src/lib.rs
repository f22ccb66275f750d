//! rttscope: round-trip time seen three ways, side by side.
//!
//! - TCP view (`tcp_view`): RTT as the TCP stack computes it (sock_ops RTT callback).
//! - Active view: request/response and ICMP probes.
//! - Sampler view: a cloud-style packet sampler at interface ingress/egress.
pub mod bpf;
pub mod cli;
pub mod error;
pub mod lab;
pub mod logging;
pub mod observe;
pub mod units;

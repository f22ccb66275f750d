//! rttscope: round-trip time seen three ways, side by side.
//!
//! - TCP view (`tcp_view`): RTT as the TCP stack computes it (sock_ops RTT callback).
//! - Active view: request/response and ICMP probes.
//! - Sampler view: a cloud-style packet sampler at interface ingress/egress.
pub mod active;
pub mod bpf;
pub mod bpf_syscall;
pub mod bucket;
pub mod caps;
pub mod chart;
pub mod cli;
pub mod compare;
pub mod config;
pub mod dist;
pub mod error;
pub mod flow;
pub mod hist;
pub mod irtt;
pub mod lab;
pub mod loader;
pub mod logging;
pub mod metrics;
pub mod netns;
pub mod observe;
pub mod preflight;
pub mod report;
pub mod results;
pub mod sampler;
pub mod sampler_cmd;
pub mod stats;
pub mod tcp_view;
pub mod units;

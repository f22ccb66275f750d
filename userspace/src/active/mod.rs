//! The active view: what an application measures. `rttscope serve` answers
//! request/response probes; `rttscope probe tcp-rr|udp-rr|icmp HOST` times
//! transactions from just before the request's send() to just after the
//! response's last recv() (netperf TCP_RR/UDP_RR), or ICMP echoes (ping).
//!
//! Library use (no CLI): [`run_probe`] with a [`ProbeConfig`] returns a
//! [`ProbeResult`] that records every setting; [`serve`] (or [`serve::bind`]
//! then [`serve::Server::run`]) runs the responder in-process. Both stop when
//! their [`cancel::Cancel`] receiver sees `true`. The commands that drive them
//! are `cmd::probe` and `cmd::serve`.
pub mod cancel;
pub mod config;
pub(crate) mod engine;
pub mod framing;
pub mod icmp;
pub mod irtt;
pub mod output;
pub mod result;
pub mod rr;
pub mod serve;
pub(crate) mod transport;

pub use config::{IoMode, Kind, LineHook, ProbeConfig, ProbeLine, ReplyHook, Stop};
pub use result::{Counts, ProbeResult, Settings};
pub use rr::run_probe;
pub use serve::{serve, ServeConfig, DEFAULT_PORT};

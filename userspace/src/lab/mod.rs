//! `rttscope lab`: a testbed of network namespaces (client, router, server)
//! with link impairment on the router, and the scenarios run on it.
//!
//! - [`testbed`]: the namespaces, veths, addresses, routes; removed on drop
//!   and, for crashed runs, at the next start.
//! - [`emulator`]: per-direction delay/jitter (our NFQUEUE emulator), loss
//!   (nftables), bottleneck (tbf).
//! - [`nfqueue`]: the netlink client the emulator uses.
//! - [`env`]: the real views (responder, probes, observer) and the report.
//! - [`observer`]: the passive views, observe's session in this process.
//! - [`scenarios`]: the six scenarios as data, and the runner.
//! - [`signals`]: Ctrl-C / SIGTERM cancel the run so guards can clean up.
pub mod emulator;
pub mod env;
pub mod nfqueue;
mod observer;
pub mod scenarios;
pub mod signals;
pub mod testbed;

pub use emulator::{Direction, Impairment, LinkConfig};
pub use scenarios::{run, LabArgs, Scenario};
pub use testbed::{Role, Testbed};

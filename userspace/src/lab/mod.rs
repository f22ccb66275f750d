//! `rttscope lab`: a testbed of network namespaces (client, router, server)
//! with link impairment on the router, and the scenarios run on it.
//!
//! - [`testbed`]: the namespaces, veths, addresses, routes; removed on drop
//!   and, for crashed runs, at the next start.
//! - [`emulator`]: per-direction delay/jitter (our NFQUEUE emulator), loss
//!   (nftables), bottleneck (tbf).
//! - [`nfqueue`]: the netlink client the emulator uses.
//! - [`scenarios`]: the six scenarios as data, and the runner.
//! - [`signals`]: Ctrl-C / SIGTERM cancel the run so guards can clean up.
//!
//! The command's driver (the real views on this testbed, the report) is
//! `crate::cmd::lab`: the testbed and the scenarios use nothing above them.
pub mod emulator;
pub mod nfqueue;
pub mod scenarios;
pub mod signals;
pub mod testbed;

pub use emulator::{Direction, Impairment, LinkConfig};
pub use scenarios::{run, LabArgs, Scenario};
pub use testbed::{Role, Testbed};

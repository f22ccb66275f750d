//! The command line: one subcommand per module.
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "rttscope",
    version,
    about = "Round-trip time seen three ways, side by side: TCP's own RTT, a cloud-style packet sampler, and active probes",
    propagate_version = true
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Observe RTT passively (TCP view; sampler view with --view sampler), without generating traffic.
    Observe(crate::observe::ObserveArgs),
    /// Run a scenario on a testbed of network namespaces (client, router, server) with link impairment.
    Lab(crate::lab::LabArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}

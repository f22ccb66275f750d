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
    /// Observe RTT passively, generating no traffic: TCP view, sampler view (--iface), cloud buckets, Prometheus daemon (--listen).
    Observe(crate::cmd::observe::ObserveArgs),
    /// Bucket RTT samples like the cloud metric (Cloud Monitoring distribution) and show its percentiles next to exact ones.
    Bucket(crate::cmd::bucket::BucketArgs),
    /// Chart a saved result (PNG or SVG): RTT over time, CDF, or a sweep with percentile bands.
    Chart(crate::sinks::chart::ChartArgs),
    /// Answer TCP and UDP request/response probes (the responder for `probe tcp-rr|udp-rr`).
    Serve(crate::active::ServeArgs),
    /// Active probes: request/response (netperf TCP_RR/UDP_RR), ICMP echo (ping), irtt.
    Probe(crate::active::ProbeArgs),
    /// All views side by side for the same flows and window: TCP, sampler, cloud buckets, probes; --explain.
    Compare(crate::cmd::compare::CompareArgs),
    /// Rebuild the seeds' experiments on a testbed of namespaces (delay, loss, bottleneck) and record every view.
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

//! `rttscope observe`: the passive views (TCP; sampler) in one table.
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::units::duration_arg;

#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Only these network namespaces (names under /var/run/netns, or `host`); repeatable.
    #[arg(long = "netns", value_name = "NAME")]
    pub netns: Vec<String>,
    /// Also enable existing connections in every network namespace (default: the current one and --netns ones).
    #[arg(long)]
    pub all_netns: bool,
    /// cgroup v2 directory to attach the sock_ops program to (default: the cgroup v2 root).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only connections with this local or remote port; repeatable.
    #[arg(long = "port", value_name = "N")]
    pub ports: Vec<u16>,
    /// Only connections with a local or remote address in this CIDR; repeatable.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<ipnet::IpNet>,
    /// Report interval.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Also stream every raw sample (ring buffer) to the output.
    #[arg(long)]
    pub raw: bool,
    /// Capacity of the per-flow map (LRU: the least recently used flow is evicted when full).
    #[arg(long, default_value_t = 16384)]
    pub max_flows: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub fn run(_args: ObserveArgs) -> anyhow::Result<()> {
    anyhow::bail!("observe is being built")
}

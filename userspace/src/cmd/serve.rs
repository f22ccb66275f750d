//! `rttscope serve`: the responder for the request/response probes.
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::active::cancel::{cancel_pair, on_signals, runtime};
use crate::active::serve::{self, ServeConfig};
use crate::analysis::units::duration_arg;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on, TCP and UDP (repeatable). Default: every address, 0.0.0.0:7878 and [::]:7878.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Largest request or response size in bytes; a client asking for more is disconnected.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES")]
    pub max_size: u32,
    /// Largest number of concurrent TCP connections; more are closed on accept.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_conns: usize,
    /// Largest number of concurrent TCP connections from one source address (0: no limit).
    #[arg(long, default_value_t = serve::DEFAULT_MAX_CONNS_PER_PEER, value_name = "N")]
    pub max_conns_per_peer: usize,
    /// Close a TCP connection that sends nothing (or reads nothing) for this long; a hello,
    /// a whole request and a whole response each get this long from their first byte.
    #[arg(long, default_value = "30s", value_parser = duration_arg, value_name = "DURATION")]
    pub idle_timeout: Duration,
    /// UDP replies per second to one source address (0: no limit).
    #[arg(long, default_value_t = serve::DEFAULT_UDP_RATE, value_name = "PER_SECOND")]
    pub udp_rate: u32,
    /// UDP replies one source may get back to back above its rate.
    #[arg(long, default_value_t = serve::DEFAULT_UDP_BURST, value_name = "N")]
    pub udp_burst: u32,
}

/// `rttscope serve ...`
pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = ServeConfig {
        listen: if args.listen.is_empty() {
            serve::default_listen()
        } else {
            args.listen
        },
        max_size: args.max_size,
        max_conns: args.max_conns.max(1),
        max_conns_per_peer: args.max_conns_per_peer,
        idle_timeout: args.idle_timeout,
        udp_rate: args.udp_rate,
        udp_burst: args.udp_burst,
        ..ServeConfig::default()
    };
    let rt = runtime()?;
    rt.block_on(async {
        let (tx, rx) = cancel_pair();
        on_signals(tx);
        let server = serve::bind(cfg).await?;
        let addrs: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
        eprintln!(
            "rttscope serve: listening on {} (TCP and UDP)",
            addrs.join(", ")
        );
        let stats = server.stats.clone();
        let r = server.run(rx).await;
        eprintln!(
            "rttscope serve: stopped; {}",
            serde_json::to_string(&*stats).unwrap_or_default()
        );
        r
    })
}

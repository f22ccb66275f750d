//! The responder's settings and their defaults.
use std::net::SocketAddr;
use std::time::Duration;

/// The responder's default port (TCP and UDP).
pub const DEFAULT_PORT: u16 = 7878;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Addresses to listen on (TCP and UDP on each).
    pub listen: Vec<SocketAddr>,
    /// Largest request or response size in bytes.
    pub max_size: u32,
    /// Largest number of concurrent TCP connections.
    pub max_conns: usize,
    /// Largest number of concurrent TCP connections from one source address (0: no limit).
    pub max_conns_per_peer: usize,
    /// Close a connection idle (nothing received, or a response not read) this
    /// long; also the time a hello, a whole request and a whole response each
    /// have, from their first byte.
    pub idle_timeout: Duration,
    /// UDP replies per second to one source address (0: no limit).
    pub udp_rate: u32,
    /// Replies a source may get back to back above its rate (the bucket's depth).
    pub udp_burst: u32,
    /// Source addresses the UDP rate limiter remembers at most; beyond, the
    /// stalest are forgotten (counted in `udp_rate_evictions`).
    pub udp_rate_sources: usize,
    /// A UDP cookie is valid in the window it was made in and the next one.
    pub cookie_window: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: default_listen(),
            max_size: 1 << 20,
            max_conns: 256,
            max_conns_per_peer: DEFAULT_MAX_CONNS_PER_PEER,
            idle_timeout: Duration::from_secs(30),
            udp_rate: DEFAULT_UDP_RATE,
            udp_burst: DEFAULT_UDP_BURST,
            udp_rate_sources: 4096,
            cookie_window: Duration::from_secs(3600),
        }
    }
}

/// Default per-source TCP connection limit.
pub const DEFAULT_MAX_CONNS_PER_PEER: usize = 32;
/// Default UDP replies per second per source: above a back-to-back UDP_RR on
/// loopback (~20-50k transactions/s), so one probe is never throttled.
pub const DEFAULT_UDP_RATE: u32 = 100_000;
/// Default bucket depth: 10 ms at the default rate.
pub const DEFAULT_UDP_BURST: u32 = 1000;

/// 0.0.0.0:7878 and [::]:7878: every address, as netserver and `irtt server`
/// listen (the replies are bounded: cookies, rates, deadlines above).
pub fn default_listen() -> Vec<SocketAddr> {
    vec![
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)),
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, DEFAULT_PORT)),
    ]
}

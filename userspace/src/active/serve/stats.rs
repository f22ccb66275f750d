//! The responder's counters (every refusal has one) and its rate-limited logging.
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What the server did; every refusal has a counter.
#[derive(Debug, Default, Serialize)]
pub struct ServeStats {
    pub connections: AtomicU64,
    /// TCP connections closed at once: `max_conns` reached.
    pub over_conn_limit: AtomicU64,
    /// TCP connections closed at once: `max_conns_per_peer` reached for their source address.
    pub over_peer_limit: AtomicU64,
    pub bad_hello: AtomicU64,
    /// TCP connections the peer closed before sending a byte: handshake probes (`probe
    /// tcp-connect`, tcping), not bad hellos.
    pub handshake_only: AtomicU64,
    /// No hello within the idle timeout, or idle between transactions.
    pub idle_closed: AtomicU64,
    /// A request not complete within the idle timeout of its first byte (slowloris).
    pub slow_requests: AtomicU64,
    /// A response not read within the idle timeout of its first byte.
    pub slow_readers: AtomicU64,
    pub mid_request_disconnects: AtomicU64,
    pub tcp_transactions: AtomicU64,
    pub udp_requests: AtomicU64,
    pub udp_bad: AtomicU64,
    /// Cookie requests answered with a cookie.
    pub udp_cookie_requests: AtomicU64,
    /// Requests for a response larger than themselves without a valid cookie:
    /// answered with a (smaller) cookie datagram instead.
    pub udp_cookie_required: AtomicU64,
    /// Datagrams not answered: their source was over its rate.
    pub udp_rate_limited: AtomicU64,
    /// Sources the full rate table forgot while they still had a partly spent bucket.
    pub udp_rate_evictions: AtomicU64,
    pub udp_send_errors: AtomicU64,
    /// TCP connections closed at once: no thread could be started for them.
    pub thread_spawn_errors: AtomicU64,
}

pub(super) fn inc(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed) + 1
}

/// Log the first ten of a kind, then every thousandth, so a flood cannot flood the log.
pub(super) fn log_nth(count: u64) -> bool {
    count <= 10 || count.is_multiple_of(1000)
}

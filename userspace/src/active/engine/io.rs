//! What the engine and a transport exchange: when a request left ([`Stamp`]),
//! what a send did ([`Sent`]) and a receive brought ([`Event`], [`Reply`]), and
//! the [`Transport`] trait itself. The recorder reads replies and stamps too,
//! so they live here, below both.
use anyhow::Result;

/// When a request left: CLOCK_MONOTONIC, and CLOCK_REALTIME when the RTT is
/// to be taken from the kernel's receive stamp (ICMP, as ping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub mono_ns: u64,
    pub real_ns: Option<u64>,
}

/// A reply: the sequence number it names, and the kernel's receive time (realtime) if given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub seq: u64,
    pub rx_real_ns: Option<u64>,
    /// ICMP: the reply's TTL or hop limit, for ping's `ttl=`.
    pub ttl: Option<u8>,
}

/// What a send did.
#[derive(Debug)]
pub(crate) enum Sent {
    At(Stamp),
    /// Not sent (counted as an error and a lost request; the run goes on).
    Failed(std::io::Error),
    /// The run was stopped (cancel, or the end of `-l` with a transaction in flight).
    Stopped,
}

/// What a receive brought.
#[derive(Debug)]
pub(crate) enum Event {
    /// A reply, received at `t1` (CLOCK_MONOTONIC, read right after the receive).
    Reply(Reply, u64),
    /// The responder wants the request again (UDP: a new cookie instead of the response).
    Resend,
    /// Not a reply to us.
    Foreign,
    /// No reply within the timeout: the request is lost.
    TimedOut,
    /// The receive failed (e.g. ECONNREFUSED from an ICMP port unreachable): lost.
    Failed(std::io::Error),
    /// ICMP: an error about one of our echo requests (a router's "Time to live exceeded", a
    /// "Destination Host Unreachable"): that request is lost, counted in `errors`.
    IcmpError(crate::active::icmp::IcmpError),
    Stopped,
}

/// A request/response transport. `Err` from `send` or `recv` ends the run with
/// that error (TCP: a broken connection or a transaction over the timeout).
pub(crate) trait Transport {
    /// Send request `seq`.
    async fn send(&mut self, seq: u64) -> Result<Sent>;
    /// The next datagram or response for the request last sent, until its timeout.
    async fn recv(&mut self) -> Result<Event>;
    /// After a failed receive: pause before the next request (no spinning on a dead peer).
    async fn pause(&mut self) {}
    /// After the run: a reply still arriving before `until` (late or duplicate), if any.
    async fn straggler(&mut self, _until: tokio::time::Instant) -> Option<Reply> {
        None
    }
    /// Datagrams the transport skipped itself as not ours (ICMP), added to `foreign` at the end.
    fn foreign(&self) -> u64 {
        0
    }
}

//! The selection: which of the passive views' samples are this run's (the probes' own
//! connections and pings, inside their windows), sorted by view and side.
use std::collections::BTreeMap;

use anyhow::Result;

use super::window::{Collected, RrResults};
use crate::active::rr::Kind;
use crate::analysis::flow::{Flow, Side};
use crate::session::Session;
use crate::views::ViewKind;

/// Samples collected for one view: (seconds since start, rtt us).
pub(super) type Series = Vec<(f64, f64)>;

/// This run's samples by view and side, the retransmissions on its connections, and how many
/// samples of other traffic were left out.
pub(super) struct Sides {
    /// Each attached view's samples, in registry order, by side: the probe's connection's
    /// client and server ends, and (`Side::Pinger`) the passive reading of the ICMP probe's pings
    /// (to the target, from here).
    pub(super) by_view: Vec<(ViewKind, BTreeMap<Side, Series>)>,
    pub(super) retrans: u64,
    /// Samples of other connections and pings (or of the probes' connections outside their
    /// windows: handshake, hello, close) that no row holds.
    pub(super) others: u64,
}

impl Sides {
    /// The samples of `view` on `side` (empty: none).
    pub(super) fn of(&self, view: ViewKind, side: Side) -> &[(f64, f64)] {
        self.by_view
            .iter()
            .find(|(k, _)| *k == view)
            .and_then(|(_, m)| m.get(&side))
            .map_or(&[], |s| s.as_slice())
    }
}

/// What identifies this run's probes to the passive views: the TCP probe's 4-tuple in this
/// namespace, the ICMP probe's identifier, and each probe's window (first transaction to last)
/// on the monotonic clock. Everything else on the host (other connections to the same port,
/// connections opened before, other namespaces' traffic, other pings) is left out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Selection {
    netns: u32,
    /// The TCP probe's (local, remote) and window; no local address: no TCP probe ran.
    tcp_local: Option<std::net::SocketAddr>,
    tcp_remote: std::net::SocketAddr,
    tcp: crate::active::rr::ProbeIdent,
    /// The ICMP probe's target, identifier and window.
    icmp: Option<(std::net::IpAddr, u16, crate::active::rr::ProbeIdent)>,
    /// Time 0 of the rows: the TCP probe's first transaction (CLOCK_MONOTONIC ns).
    pub(super) origin_mono: u64,
}

impl Selection {
    pub(super) fn new(netns: u32, rr: &RrResults, fallback_origin: u64) -> Selection {
        let ok = |k: Kind| {
            rr.iter()
                .filter_map(|r| r.as_ref().ok())
                .find(|r| r.settings.kind == k)
        };
        let tcp = ok(Kind::TcpRr);
        let tcp_ident = tcp.map(|r| r.ident).unwrap_or_default();
        let icmp =
            ok(Kind::Icmp).and_then(|r| Some((r.settings.address, r.ident.icmp_id?, r.ident)));
        Selection {
            netns,
            tcp_local: tcp_ident.local,
            tcp_remote: tcp.map_or(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), |r| {
                std::net::SocketAddr::new(r.settings.address, r.settings.port)
            }),
            tcp: tcp_ident,
            icmp,
            origin_mono: if tcp_ident.start_mono_ns > 0 {
                tcp_ident.start_mono_ns
            } else {
                fallback_origin
            },
        }
    }

    /// Seconds from time 0 of the rows.
    fn secs(&self, ts_ns: u64) -> f64 {
        (ts_ns as i64 - self.origin_mono as i64) as f64 / 1e9
    }

    /// The TCP probe's connection seen from its own end (this namespace).
    fn is_client(&self, f: &Flow) -> bool {
        f.netns == self.netns && Some(f.local) == self.tcp_local && f.remote == self.tcp_remote
    }

    /// The same connection seen from the responder's end (when it is in view).
    fn is_server(&self, f: &Flow) -> bool {
        Some(f.remote) == self.tcp_local && f.local == self.tcp_remote
    }

    /// The ICMP probe's echoes, seen by the sampler as the pinger.
    fn is_icmp(&self, f: &Flow, ts_ns: u64) -> bool {
        self.icmp.is_some_and(|(ip, id, w)| {
            f.netns == self.netns
                && f.remote.ip() == ip
                && f.local.port() == id
                && w.in_window(ts_ns)
        })
    }
}

/// Sort samples into views: only the probes' own connections and pings, inside their windows.
pub(super) fn split_sides(session: &Session, raw: &Collected, sel: &Selection) -> Result<Sides> {
    // Retransmissions of this run's connection (the views that see the socket's count).
    let mut retrans = 0u64;
    for v in session.views() {
        retrans += v.retransmissions(&|f| sel.is_client(f) || sel.is_server(f))?;
    }
    let mut others = 0u64;
    let mut by_view = Vec::new();
    for v in session.views() {
        let mut sides: BTreeMap<Side, Series> = BTreeMap::new();
        for s in raw.samples.iter().filter(|s| s.view == v.kind()) {
            let (f, ts, rtt) = (&s.flow, s.ts_ns, s.rtt_us as f64);
            // a ping (the only non-TCP samples collected) from here, or the probe's connection
            let side = if s.proto.is_some() {
                sel.is_icmp(f, ts).then_some(Side::Pinger)
            } else if !sel.tcp.in_window(ts) {
                None
            } else if sel.is_client(f) {
                Some(Side::Client)
            } else if sel.is_server(f) {
                Some(Side::Server)
            } else {
                None
            };
            match side {
                Some(side) => sides.entry(side).or_default().push((sel.secs(ts), rtt)),
                None => others += 1,
            }
        }
        by_view.push((v.kind(), sides));
    }
    Ok(Sides {
        by_view,
        retrans,
        others,
    })
}

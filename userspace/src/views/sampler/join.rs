//! The join of the sampler's rows with the rows of the views read before it (the TCP view),
//! and which of a row's sampler flows its samples come from (issue 41).
//!
//! **Join.** A sampler flow's ends are looked up among every socket the earlier views know, in
//! any namespace ([`crate::views::view::Ask::Ends`]): a socket in the flow's own namespace with
//! the same ends first (a plain flow on the socket's own host: the join as it always was); else
//! the one socket elsewhere with those ends (a pod's flow seen on its host-side veth, `lxc…`, in
//! the node's namespace; or inside VXLAN/Geneve on the node's underlay, keyed by its inner
//! ends); else, with no socket having its ends at all, the one socket whose ends are its own
//! swapped (the other end's socket: the sides are each other's). Each row stays oriented by its
//! socket. Plain flows are looked up this way only when TCP (an ICMP echo's identifier is no
//! port), tunnelled ones of any kind. Never a guess: when sockets in two or more namespaces
//! (none the flow's own) have the ends asked for, nothing a socket knows tells them apart (the
//! same addresses in two namespaces; a socket's key has no VNI), so the flow is not joined
//! ([`How::Ambiguous`], counted by the view as `join_ambiguous`) and keeps a row of its own.
//!
//! **One interface per row.** A socket's flow is often seen on two interfaces (the pod's `lxc`
//! veth and the node's underlay; a tunnel device and its underlay): each timed every packet
//! exchange, so merging them would count each exchange twice. A row's samples are those of one
//! of its sampler flows, chosen by [`pick`]: those timing the socket's own data (same ends)
//! before those timing its peer's (swapped), then the highest median so far, then the highest
//! mean (exact, where a median is a histogram bucket's: two medians of the same exchanges often
//! share a bucket), then the most samples, then the lowest flow. The highest RTTs are those of
//! the interface nearest the socket: a farther interface on the same path times a part of the
//! same round trip, so each of its samples is the smaller. The others'
//! samples are counted (`samples_other_iface`) and listed per interface in the end record
//! (`iface_samples`).
use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::SocketAddr;

use crate::analysis::flow::{Flow, Side};
use crate::views::view::ReadCtx;

/// How a sampler flow found its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// An earlier view knows the flow itself, or a socket in its own namespace has its ends.
    Own,
    /// The one socket with its ends (or, with none, its ends swapped) in another namespace.
    Across,
    /// Sockets in several other namespaces have its ends: not joined (a row of its own).
    Ambiguous,
    /// No socket has its ends: a row of its own (or its socket's through NAT).
    Alone,
}

/// Where a sampler flow's samples go: the row of flow `row`; `swapped` when that socket's ends
/// are the sampler flow's swapped (the other end's socket: the sides are each other's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub row: Flow,
    pub swapped: bool,
    pub how: How,
}

impl Join {
    /// The flow's own row.
    pub fn alone(flow: Flow, how: How) -> Join {
        Join {
            row: flow,
            swapped: false,
            how,
        }
    }
}

/// The flows with one pair of ends: every namespace's (few: usually one).
type ByEnds = HashMap<(SocketAddr, SocketAddr), Vec<Flow>>;

/// The flows the earlier views know, by their ends: built at most once per read, and only when
/// a flow no earlier view knows asks.
#[derive(Default)]
pub struct Joiner {
    ends: Option<ByEnds>,
}

impl Joiner {
    /// A sampler flow's row: see the module's documentation. `tcp`: the flow is TCP.
    pub fn join(&mut self, ctx: &ReadCtx<'_, '_>, flow: &Flow, tcp: bool) -> Join {
        let tunnelled = !flow.tunnel.is_none();
        if !tunnelled && (!tcp || ctx.side_of(flow) != Side::Unknown) {
            return Join::alone(*flow, if tcp { How::Own } else { How::Alone });
        }
        let ends = self.ends.get_or_insert_with(|| {
            let mut m = ByEnds::new();
            for (k, f) in ctx.flows_by_ends() {
                let v = m.entry(k).or_default();
                if !v.contains(&f) {
                    v.push(f);
                }
            }
            m
        });
        lookup(ends, flow)
    }
}

/// [`Joiner::join`] against the flows by their ends.
fn lookup(ends: &ByEnds, flow: &Flow) -> Join {
    for (key, swapped) in [
        ((flow.local, flow.remote), false),
        ((flow.remote, flow.local), true),
    ] {
        let Some(v) = ends.get(&key).filter(|v| !v.is_empty()) else {
            continue;
        };
        if let Some(own) = v.iter().find(|f| f.netns == flow.netns) {
            let how = if swapped { How::Across } else { How::Own };
            return Join {
                row: *own,
                swapped,
                how,
            };
        }
        if v.len() > 1 {
            return Join::alone(*flow, How::Ambiguous);
        }
        return Join {
            row: v[0],
            swapped,
            how: How::Across,
        };
    }
    Join::alone(*flow, How::Alone)
}

/// What [`pick`] orders a row's sampler flows by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rank {
    /// Its ends are the socket's swapped (it times the peer's data).
    pub swapped: bool,
    /// Its median so far (us; NaN: no sample yet).
    pub median_us: f64,
    /// Its mean so far (us; exact, where the median is a bucket's; NaN: no sample yet).
    pub mean_us: f64,
    /// Its samples so far.
    pub samples: u64,
}

impl Rank {
    /// The rank of a sampler flow whose samples so far are `h`.
    pub fn of(h: &crate::analysis::hist::Hist, swapped: bool) -> Rank {
        Rank {
            swapped,
            median_us: h.percentile(50.0),
            mean_us: h.sum_us as f64 / h.count() as f64,
            samples: h.count(),
        }
    }
}

/// Of a row's sampler flows (never empty), the index of the one whose samples the row takes:
/// see the module's documentation.
pub fn pick<'a>(cands: impl IntoIterator<Item = (&'a Flow, Rank)>) -> usize {
    let mut best: Option<(usize, &Flow, Rank)> = None;
    for (i, (f, r)) in cands.into_iter().enumerate() {
        let better = match &best {
            None => true,
            Some((_, bf, b)) => {
                let us = |x: f64| if x.is_nan() { -1.0 } else { x };
                let key = |r: &Rank| (!r.swapped, us(r.median_us), us(r.mean_us), r.samples);
                let (mine, theirs) = ((key(&r), Reverse(f)), (key(b), Reverse(*bf)));
                mine.partial_cmp(&theirs) == Some(std::cmp::Ordering::Greater)
            }
        };
        if better {
            best = Some((i, f, r));
        }
    }
    best.map_or(0, |b| b.0)
}

/// The side of the other end of a connection.
pub fn flip(s: Side) -> Side {
    match s {
        Side::Client => Side::Server,
        Side::Server => Side::Client,
        s => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::flow::{Encap, Tunnel};
    use crate::analysis::hist::Hist;

    fn flow(ns: u32, l: &str, r: &str) -> Flow {
        Flow::new(ns, l.parse().unwrap(), r.parse().unwrap())
    }

    fn by_ends(flows: &[Flow]) -> ByEnds {
        let mut m = ByEnds::new();
        for f in flows {
            m.entry((f.local, f.remote)).or_default().push(*f);
        }
        m
    }

    #[test]
    fn tunnelled_flows_join_their_socket_by_inner_ends() {
        let pod = flow(7, "10.244.1.5:40000", "10.244.2.9:80");
        let server = flow(9, "10.244.2.9:80", "10.244.1.5:40000");
        let mut seen = flow(1, "10.244.1.5:40000", "10.244.2.9:80");
        seen.tunnel = Tunnel {
            vlan: None,
            vni: Some(42),
            encap: Some(Encap::Vxlan),
        };
        let j = lookup(&by_ends(&[pod, server]), &seen);
        assert_eq!(
            (j.row, j.swapped, j.how),
            (pod, false, How::Across),
            "the same ends first"
        );
        let j = lookup(&by_ends(&[server]), &seen);
        assert_eq!(
            (j.row, j.swapped),
            (server, true),
            "else the other end's socket"
        );
        let j = lookup(&by_ends(&[]), &seen);
        assert_eq!((j.row, j.how), (seen, How::Alone), "else its own row");
        assert_eq!(flip(Side::Client), Side::Server);
        assert_eq!(flip(Side::Pinger), Side::Pinger);
    }

    /// A pod's flow on its `lxc` (plain, the node's namespace) joins the pod's socket; a socket
    /// in its own namespace wins over one elsewhere; the same ends in two other namespaces join
    /// neither, not even the swapped ends' socket.
    #[test]
    fn plain_flows_join_across_namespaces_unless_ambiguous() {
        let node = 1;
        let seen = flow(node, "10.45.2.11:7161", "10.45.1.11:40000");
        let server_pod = flow(9, "10.45.2.11:7161", "10.45.1.11:40000");
        let client_pod = flow(7, "10.45.1.11:40000", "10.45.2.11:7161");
        let j = lookup(&by_ends(&[server_pod, client_pod]), &seen);
        assert_eq!((j.row, j.swapped, j.how), (server_pod, false, How::Across));
        let own = flow(node, "10.45.2.11:7161", "10.45.1.11:40000");
        let j = lookup(&by_ends(&[server_pod, own]), &seen);
        assert_eq!((j.row, j.how), (own, How::Own), "its own namespace first");
        let twin = flow(11, "10.45.2.11:7161", "10.45.1.11:40000");
        let j = lookup(&by_ends(&[server_pod, twin, client_pod]), &seen);
        assert_eq!((j.row, j.swapped, j.how), (seen, false, How::Ambiguous));
        let twin_client = flow(12, "10.45.1.11:40000", "10.45.2.11:7161");
        let j = lookup(&by_ends(&[client_pod, twin_client]), &seen);
        assert_eq!(
            (j.row, j.how),
            (seen, How::Ambiguous),
            "swapped: the same rule"
        );
    }

    /// Through the views' interface: a fake TCP view read before knows the sockets (by flow and
    /// by ends); the plain flow it knows itself stays put, ICMP is not looked up, a plain TCP flow
    /// of the node joins the pod's socket, and with a twin socket in a third namespace, none.
    #[test]
    fn joiner_asks_the_views_read_before() {
        use crate::views::fake::FakeView;
        use crate::views::view::{Counters, NsNames, View};
        use crate::views::ViewKind;
        let pod = flow(7, "10.45.1.11:40000", "10.45.2.11:80");
        let mut tcp = FakeView::new(ViewKind::Tcp, Vec::new());
        tcp.knows.insert(pod, Side::Client);
        let join = |earlier: &[Box<dyn View>], f: &Flow, is_tcp: bool| {
            let (mut names, mut workloads, mut rows) = (NsNames::new(), None, Default::default());
            let ctx = ReadCtx {
                names: &mut names,
                workloads: &mut workloads,
                keep_rows: true,
                rows: &mut rows,
                sink: None,
                earlier,
                watched: Counters::new(),
                raw_bad: None,
                window_start: false,
            };
            Joiner::default().join(&ctx, f, is_tcp)
        };
        let earlier: Vec<Box<dyn View>> = vec![Box::new(tcp)];
        assert_eq!(join(&earlier, &pod, true), Join::alone(pod, How::Own));
        let seen = flow(1, "10.45.1.11:40000", "10.45.2.11:80");
        assert_eq!(join(&earlier, &seen, false), Join::alone(seen, How::Alone));
        let j = join(&earlier, &seen, true);
        assert_eq!((j.row, j.swapped, j.how), (pod, false, How::Across));
        let mut tcp = FakeView::new(ViewKind::Tcp, Vec::new());
        tcp.knows.insert(pod, Side::Client);
        tcp.knows
            .insert(flow(9, "10.45.1.11:40000", "10.45.2.11:80"), Side::Client);
        let earlier: Vec<Box<dyn View>> = vec![Box::new(tcp)];
        assert_eq!(
            join(&earlier, &seen, true),
            Join::alone(seen, How::Ambiguous)
        );
    }

    fn hist(samples: &[u32]) -> Hist {
        let mut h = Hist::default();
        for s in samples {
            h.record(*s);
        }
        h
    }

    /// The row's samples come from one flow: its own data first, then the highest median, the
    /// most samples, the lowest flow; a flow with no sample yet ranks last.
    #[test]
    fn one_flow_per_row_by_the_documented_order() {
        let (a, b) = (
            flow(1, "10.0.0.1:1", "10.0.0.2:2"),
            flow(2, "10.0.0.1:1", "10.0.0.2:2"),
        );
        let near = hist(&[300, 310, 320]);
        let far = hist(&[20, 25, 30, 35]);
        let r = |h: &Hist, s| Rank::of(h, s);
        assert_eq!(pick([(&a, r(&far, false)), (&b, r(&near, false))]), 1);
        assert_eq!(
            pick([(&a, r(&near, true)), (&b, r(&far, false))]),
            1,
            "own data first"
        );
        let (lo, hi) = (hist(&[10_000, 10_001]), hist(&[10_000, 10_040]));
        assert_eq!(lo.percentile(50.0), hi.percentile(50.0), "one bucket");
        assert_eq!(
            pick([(&a, r(&hi, false)), (&b, r(&lo, false))]),
            0,
            "then the mean"
        );
        let (three, four) = (hist(&[310; 3]), hist(&[310; 4]));
        assert_eq!(
            pick([(&a, r(&three, false)), (&b, r(&four, false))]),
            1,
            "then the most samples"
        );
        assert_eq!(
            pick([(&b, r(&near, false)), (&a, r(&near, false))]),
            1,
            "lowest flow"
        );
        assert_eq!(
            pick([(&a, r(&Hist::default(), false)), (&b, r(&far, false))]),
            1
        );
        assert_eq!(pick([(&a, r(&near, false))]), 0);
    }
}

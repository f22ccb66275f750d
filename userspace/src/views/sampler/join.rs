//! The join of the sampler's rows with the rows of the views read before it (the TCP view)
//! for flows seen with a tunnel identity (issue 41): a pod's flow carried in VXLAN or Geneve
//! and observed on the node's underlay interface is keyed by its inner tuple and VNI in the
//! node's namespace, while its socket lives in the pod's namespace. Such a flow joins the row
//! of the socket with the same inner ends, in whatever namespace, and else the socket whose
//! ends are its own swapped (the other end's socket); each row stays oriented by its socket.
//! A plain flow (no VLAN, no tunnel) joins exactly as before: its own 4-tuple and namespace.
//!
//! When two sockets in different namespaces have the same ends (overlapping addresses behind
//! different tunnels), the join takes the lowest flow (namespace inode, then ends): a guess the
//! VNI cannot settle, since a socket's key carries none.
use std::collections::HashMap;
use std::net::SocketAddr;

use crate::analysis::flow::{Flow, Side};
use crate::views::view::ReadCtx;

/// Where a sampler flow's samples go: the row of flow `row`; `swapped` when that socket's ends
/// are the sampler flow's swapped (the other end's socket: the sides are each other's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub row: Flow,
    pub swapped: bool,
}

/// The flows the earlier views know, by their ends: built at most once per read, and only
/// when a tunnelled flow asks.
#[derive(Default)]
pub struct Joiner {
    ends: Option<HashMap<(SocketAddr, SocketAddr), Flow>>,
}

impl Joiner {
    /// A sampler flow's row: see the module's documentation.
    pub fn join(&mut self, ctx: &ReadCtx<'_, '_>, flow: &Flow) -> Join {
        if flow.tunnel.is_none() {
            return Join {
                row: *flow,
                swapped: false,
            };
        }
        let ends = self.ends.get_or_insert_with(|| {
            let mut m: HashMap<(SocketAddr, SocketAddr), Flow> = HashMap::new();
            for (k, f) in ctx.flows_by_ends() {
                let e = m.entry(k).or_insert(f);
                *e = (*e).min(f);
            }
            m
        });
        Self::lookup(ends, flow)
    }

    fn lookup(ends: &HashMap<(SocketAddr, SocketAddr), Flow>, flow: &Flow) -> Join {
        if let Some(f) = ends.get(&(flow.local, flow.remote)) {
            return Join {
                row: *f,
                swapped: false,
            };
        }
        if let Some(f) = ends.get(&(flow.remote, flow.local)) {
            return Join {
                row: *f,
                swapped: true,
            };
        }
        Join {
            row: *flow,
            swapped: false,
        }
    }
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

    fn flow(ns: u32, l: &str, r: &str) -> Flow {
        Flow::new(ns, l.parse().unwrap(), r.parse().unwrap())
    }

    #[test]
    fn tunnelled_flows_join_their_socket_by_inner_ends() {
        let pod = flow(7, "10.244.1.5:40000", "10.244.2.9:80");
        let server = flow(9, "10.244.2.9:80", "10.244.1.5:40000");
        let mut ends = HashMap::new();
        ends.insert((pod.local, pod.remote), pod);
        ends.insert((server.local, server.remote), server);
        let mut seen = flow(1, "10.244.1.5:40000", "10.244.2.9:80");
        seen.tunnel = Tunnel {
            vlan: None,
            vni: Some(42),
            encap: Some(Encap::Vxlan),
        };
        let j = Joiner::lookup(&ends, &seen);
        assert_eq!((j.row, j.swapped), (pod, false), "the same ends first");
        ends.remove(&(pod.local, pod.remote));
        let j = Joiner::lookup(&ends, &seen);
        assert_eq!(
            (j.row, j.swapped),
            (server, true),
            "else the other end's socket"
        );
        ends.clear();
        assert_eq!(Joiner::lookup(&ends, &seen).row, seen, "else its own row");
        assert_eq!(flip(Side::Client), Side::Server);
        assert_eq!(flip(Side::Pinger), Side::Pinger);
    }
}

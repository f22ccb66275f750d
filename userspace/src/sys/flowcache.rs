//! What a kernel table said of each of the sampler's flows, asked through one netlink socket per
//! network namespace: the owner's cgroup (sock_diag, `sys::sockdiag`) and the NAT translation
//! (ctnetlink, `sys::conntrack`). An answer is kept while the sampler still has the flow (found:
//! asked again after [`RECHECK_FOUND`]; not: after [`RECHECK_NONE`]), at most
//! [`MAX_LOOKUPS_PER_READ`] questions per read and [`MAX_KNOWN`] flows. Asked once per read per
//! flow, never per packet.
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::analysis::flow::Flow;
use crate::sys::netns::{self, NetNs};

/// A found answer is asked again after this long (the 4-tuple may be reused by another socket).
pub const RECHECK_FOUND: Duration = Duration::from_secs(60);
/// An answer of nothing found is asked again after this long at the earliest.
pub const RECHECK_NONE: Duration = Duration::from_secs(10);
/// Questions per read at most (the rest wait for the next read).
pub const MAX_LOOKUPS_PER_READ: u32 = 4_096;
/// Flows remembered at most (beyond the sampler's own table: never reached); past it, a new flow
/// is not asked.
pub const MAX_KNOWN: usize = 65_536;

/// What the cache has for a flow.
pub enum Cached<'a, S, V> {
    /// Known and fresh, or stale with no question left in this read: this answer.
    Known(V),
    /// Not known, and no room to ask (the cache is full, or no question is left in this read).
    NoRoom,
    /// The flow's namespace has no socket (it could not be entered, or refused the socket).
    NoSocket,
    /// To be asked through this socket (one question of the read taken); then [`FlowCache::insert`].
    Ask(&'a mut S),
}

/// The answers (`V`) of the sockets (`S`, one per namespace inode) for the flows of a read.
pub struct FlowCache<S, V> {
    /// Opened at the start, while the process may still enter namespaces.
    sockets: HashMap<u32, S>,
    known: HashMap<Flow, (V, Instant)>,
    seen: HashSet<Flow>,
    budget: u32,
}

impl<S: Send + 'static, V: Copy> FlowCache<S, V> {
    /// A socket in each of `namespaces` (`open` run in it); one that cannot be entered or
    /// opened is logged at debug level (`what` names the socket) and has none.
    pub fn open(namespaces: &[NetNs], what: &str, open: fn() -> Result<S>) -> Self {
        let mut sockets = HashMap::new();
        for ns in namespaces {
            match netns::run_in(ns, open) {
                Ok(s) => {
                    sockets.insert(ns.inode, s);
                }
                Err(e) => tracing::debug!("{what} in {}: {e:#}", ns.name),
            }
        }
        FlowCache {
            sockets,
            known: HashMap::new(),
            seen: HashSet::new(),
            budget: MAX_LOOKUPS_PER_READ,
        }
    }

    /// A new read.
    pub fn begin(&mut self) {
        self.seen.clear();
        self.budget = MAX_LOOKUPS_PER_READ;
    }

    /// A flow still in the sampler's table without new samples: keep what is known of it.
    pub fn keep(&mut self, f: &Flow) {
        if self.known.contains_key(f) {
            self.seen.insert(*f);
        }
    }

    /// Forget the flows not seen since [`FlowCache::begin`].
    pub fn end(&mut self) {
        let seen = &self.seen;
        self.known.retain(|f, _| seen.contains(f));
    }

    /// What is known of `f`, seen in this read; `found` tells a found answer (kept
    /// [`RECHECK_FOUND`]) from one of nothing found (kept [`RECHECK_NONE`]).
    pub fn get(&mut self, f: &Flow, found: impl Fn(&V) -> bool) -> Cached<'_, S, V> {
        self.seen.insert(*f);
        if let Some(&(v, at)) = self.known.get(f) {
            let fresh = if found(&v) {
                RECHECK_FOUND
            } else {
                RECHECK_NONE
            };
            if at.elapsed() < fresh || self.budget == 0 {
                return Cached::Known(v);
            }
        } else if self.budget == 0 || self.known.len() >= MAX_KNOWN {
            return Cached::NoRoom;
        }
        match self.sockets.get_mut(&f.netns) {
            Some(s) => {
                self.budget -= 1;
                Cached::Ask(s)
            }
            None => Cached::NoSocket,
        }
    }

    /// The answer just asked for `f`; the one it replaces, if any.
    pub fn insert(&mut self, f: Flow, v: V) -> Option<V> {
        self.known
            .insert(f, (v, Instant::now()))
            .map(|(was, _)| was)
    }

    /// A socket for namespace `inode` (tests: a namespace without one otherwise).
    #[cfg(test)]
    pub fn with_socket(mut self, inode: u32, s: S) -> Self {
        self.sockets.insert(inode, s);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(port: u16) -> Flow {
        Flow::new(
            7,
            format!("10.0.0.1:{port}").parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        )
    }

    /// Asked once, then known; the budget of a read bounds the questions; a flow not seen in a
    /// read is forgotten at its end; a namespace without a socket is said.
    #[test]
    fn asks_once_per_flow_within_the_read_budget_and_forgets_the_unseen() {
        let mut c: FlowCache<u32, bool> = FlowCache::open(&[], "test", || Ok(0)).with_socket(7, 0);
        c.begin();
        let Cached::Ask(s) = c.get(&flow(1), |v| *v) else {
            panic!("a new flow is asked");
        };
        *s += 1;
        assert_eq!(c.insert(flow(1), true), None);
        assert!(matches!(c.get(&flow(1), |v| *v), Cached::Known(true)));
        for p in 2..=MAX_LOOKUPS_PER_READ as u16 {
            assert!(matches!(c.get(&flow(p), |v| *v), Cached::Ask(_)), "{p}");
        }
        let last = MAX_LOOKUPS_PER_READ as u16 + 1;
        assert!(matches!(c.get(&flow(last), |v| *v), Cached::NoRoom));
        c.end();
        c.begin();
        c.keep(&flow(1));
        c.end();
        assert!(matches!(c.get(&flow(1), |v| *v), Cached::Known(true)));
        assert_eq!(c.known.len(), 1, "the flows not seen are forgotten");
        let other = Flow::new(
            8,
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        assert!(matches!(c.get(&other, |v| *v), Cached::NoSocket));
    }
}

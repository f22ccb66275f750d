//! What runs on an interface's tc hooks besides the sampler, in the order the kernel runs it
//! (issue 41): the XDP program (ingress, before tc), the tcx programs (BPF_PROG_QUERY, in
//! order), then the clsact filters (by priority). A program ahead of ours that ends the chain
//! (returns `TC_ACT_OK`/`TCX_PASS`, drops, redirects) hides its packets from the sampler: the
//! observer says so at start and again when the order changes while it runs (a CNI that
//! restarts re-attaches, possibly first), and `rttscope features --iface` lists it.
use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::Serialize;

use super::tc::{is_ours as is_our_filter, tcx_attach_type};
use crate::sys::netns;
use crate::sys::rtnl::{Rtnl, TcFilter};

/// A BPF program by id, with its name where it can be read (CAP_SYS_ADMIN).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgRef {
    pub id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl std::fmt::Display for ProgRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(n) if !n.is_empty() => write!(f, "{n} (id {})", self.id),
            _ => write!(f, "id {}", self.id),
        }
    }
}

/// One hook of one interface (ingress or egress), in the order its programs run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Chain {
    pub direction: &'static str,
    /// Ingress only: the XDP program, and how it is attached (driver, generic, offloaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp: Option<(ProgRef, &'static str)>,
    /// tcx programs, first to run first.
    pub tcx: Vec<ProgRef>,
    /// clsact filters, by priority.
    pub clsact: Vec<TcFilter>,
}

/// How our program on a hook is attached: tcx (by its id) or a clsact filter (its priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ours {
    Tcx(u32),
    Clsact(u16),
    /// Not attached (`features`: where the sampler would go).
    Planned {
        tcx: bool,
    },
}

/// Program names by id, read once each (a name never changes; reading one needs CAP_SYS_ADMIN,
/// which the daemon gives up after its start).
fn name_of(id: u32) -> Option<String> {
    static NAMES: Mutex<Option<HashMap<u32, Option<String>>>> = Mutex::new(None);
    let mut g = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let names = g.get_or_insert_with(HashMap::new);
    names
        .entry(id)
        .or_insert_with(|| crate::sys::bpf::prog_name_by_id(id).ok())
        .clone()
}

fn prog(id: u32) -> ProgRef {
    ProgRef {
        id,
        name: name_of(id),
    }
}

/// Read one hook's chain. Runs inside the interface's namespace (`rtnl` a socket of it: the
/// tcx query resolves the ifindex in the calling thread's namespace).
pub fn read(rtnl: &mut Rtnl, ifindex: u32, egress: bool) -> Result<Chain> {
    let tcx = match crate::sys::bpf::prog_query(ifindex, tcx_attach_type(egress)) {
        Ok(ids) => ids.into_iter().map(prog).collect(),
        // no tcx on this kernel (< 6.6): nothing there
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Vec::new(),
        Err(e) => return Err(e).context("querying the tcx programs (BPF_PROG_QUERY)"),
    };
    let xdp = if egress {
        None
    } else {
        rtnl.link(ifindex)?
            .and_then(|l| l.xdp)
            .map(|(id, how)| (prog(id), how))
    };
    Ok(Chain {
        direction: if egress { "egress" } else { "ingress" },
        xdp,
        tcx,
        clsact: rtnl.filters(ifindex, egress)?,
    })
}

fn filter_text(f: &TcFilter) -> String {
    let what = match (&f.name, f.prog_id) {
        // tc's name is often the object file's; the program's own says more (`cil_from_container`)
        (Some(n), Some(id)) => {
            match name_of(id).filter(|p| !p.is_empty() && !n.starts_with(p.as_str())) {
                Some(p) => format!("bpf {n} (program {p}, id {id}"),
                None => format!("bpf {n} (id {id}"),
            }
        }
        _ => format!("{} (handle {:#x}", f.kind, f.handle),
    };
    let da = if f.direct_action {
        ", direct-action"
    } else {
        ""
    };
    format!("clsact filter {what}, priority {}{da})", f.priority)
}

impl Chain {
    /// What runs before our program and may end the chain, one phrase each (our own programs,
    /// rttscope's other observers' and programs after ours left out).
    pub fn ahead(&self, ours: Ours) -> Vec<String> {
        let mut out = Vec::new();
        if let Some((p, how)) = &self.xdp {
            out.push(format!("XDP program {p} ({how}), before tc"));
        }
        let our_tcx = match ours {
            Ours::Tcx(id) => Some(id),
            Ours::Planned { tcx: true } => Some(0), // first: nothing ahead
            _ => None,
        };
        let foreign_tcx = |p: &&ProgRef| {
            !p.name
                .as_deref()
                .is_some_and(|n| n.starts_with("rtt_sampler_"))
        };
        match our_tcx {
            Some(id) => {
                let before = self.tcx.iter().take_while(|p| p.id != id);
                if id != 0 {
                    out.extend(
                        before
                            .filter(foreign_tcx)
                            .map(|p| format!("tcx program {p}")),
                    );
                }
            }
            None => {
                // tcx programs all run before clsact filters
                let tcx = self.tcx.iter().filter(foreign_tcx);
                out.extend(tcx.map(|p| format!("tcx program {p}")));
                let prio = match ours {
                    Ours::Clsact(p) => p,
                    _ => u16::MAX, // planned: the priority a claim would pick is reported apart
                };
                let clsact = self.clsact.iter().filter(|f| !is_our_filter(f));
                out.extend(clsact.filter(|f| f.priority < prio).map(filter_text));
            }
        }
        out
    }

    /// Whether a clsact filter other than ours holds priority 1, where nothing can precede it
    /// (only matters to our clsact filters).
    pub fn pinned_first(&self, ours: Ours) -> bool {
        matches!(ours, Ours::Clsact(_) | Ours::Planned { tcx: false })
            && self
                .clsact
                .iter()
                .any(|f| !is_our_filter(f) && f.priority == 1)
    }

    /// Every program on the hook, in the order they run, ours marked (`features --iface`).
    pub fn listing(&self, ours_ids: &[u32]) -> Vec<String> {
        let mark = |id: u32| {
            if ours_ids.contains(&id) {
                " [this observer]"
            } else {
                ""
            }
        };
        let mut out = Vec::new();
        if let Some((p, how)) = &self.xdp {
            out.push(format!("xdp: {p} ({how})"));
        }
        for (i, p) in self.tcx.iter().enumerate() {
            out.push(format!("tcx #{}: {p}{}", i + 1, mark(p.id)));
        }
        for f in &self.clsact {
            out.push(filter_text(f));
        }
        out
    }
}

/// One sentence on what runs ahead of our hook on `iface`, or None when nothing does;
/// `pinned`: a foreign clsact filter holds priority 1 ([`Chain::pinned_first`]).
pub fn ahead_sentence(
    iface: &str,
    direction: &str,
    ahead: &[String],
    pinned: bool,
) -> Option<String> {
    if ahead.is_empty() {
        return None;
    }
    let why = if pinned {
        " (a clsact filter at priority 1 cannot be preceded: tc reads priority 0 as \"choose one\"; a kernel with tcx, 6.6 or later, puts the sampler first)"
    } else {
        ""
    };
    Some(format!(
        "the sampler's {direction} hook on {iface} runs after {}{why}: if that ends the chain (returns TC_ACT_OK or TCX_PASS, drops or redirects), the sampler does not see those packets, and the blind check says so",
        ahead.join(", ")
    ))
}

/// `rttscope features --iface`: one hook of an interface as it is now, and where the sampler
/// would go on it.
#[derive(Debug, Clone, Serialize)]
pub struct HookReport {
    #[serde(flatten)]
    pub chain: Chain,
    /// How the sampler would attach here (`tcx` where the kernel has it, else `clsact`) and,
    /// for clsact, the priority it would take.
    pub sampler_attach: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clsact_priority: Option<u16>,
    /// What would run ahead of it.
    pub ahead: Vec<String>,
    /// Whether it sees the hook's packets: `yes`, or `only those passed on` by what runs ahead.
    pub sees: &'static str,
}

/// Both hooks of `iface` (`[NETNS:]DEV`), read inside its namespace; `tcx`: whether the sampler
/// would attach tcx links (the kernel has them).
pub fn report(iface: &super::IfaceSpec, tcx: bool) -> Result<Vec<HookReport>> {
    let ns = netns::resolve(iface.netns.as_deref().unwrap_or("self"))?;
    let name = iface.name.clone();
    let chains = netns::run_in(&ns, move || {
        let cname = std::ffi::CString::new(name.clone())?;
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            anyhow::bail!("no interface '{name}' in that network namespace");
        }
        let mut r = Rtnl::open()?;
        Ok([read(&mut r, ifindex, false)?, read(&mut r, ifindex, true)?])
    })
    .with_context(|| format!("interface {iface}"))?;
    let all: Vec<TcFilter> = chains.iter().flat_map(|c| c.clsact.clone()).collect();
    let prio = (!tcx).then(|| super::tc::clsact_priority(&all, 0));
    Ok(chains
        .into_iter()
        .map(|chain| {
            let ours = match prio {
                Some(p) => Ours::Clsact(p),
                None => Ours::Planned { tcx: true },
            };
            let ahead = chain.ahead(ours);
            HookReport {
                sampler_attach: if tcx { "tcx" } else { "clsact" },
                clsact_priority: prio,
                sees: if ahead.is_empty() {
                    "yes"
                } else {
                    "only the packets that the programs ahead pass on"
                },
                ahead,
                chain,
            }
        })
        .collect())
}

/// The interfaces of a pattern's namespace (`lxc*`, `NETNS:veth*`) that match it now, in the
/// kernel's order: what `observe --iface PATTERN` would attach at start.
pub fn matching(pattern: &super::IfaceSpec) -> Result<Vec<super::IfaceSpec>> {
    let ns = netns::resolve(pattern.netns.as_deref().unwrap_or("self"))?;
    let links = netns::run_in(&ns, || Rtnl::open()?.links())
        .with_context(|| format!("interfaces matching {pattern}"))?;
    Ok(links
        .into_iter()
        .filter(|l| pattern.matches(&l.name))
        .map(|l| super::IfaceSpec {
            netns: pattern.netns.clone(),
            name: l.name,
        })
        .collect())
}

/// The report's lines for one interface.
pub fn report_lines(iface: &str, hooks: &[HookReport]) -> Vec<String> {
    let mut out = Vec::new();
    for h in hooks {
        let at = match h.clsact_priority {
            Some(p) => format!("a clsact filter at priority {p}"),
            None => "a tcx link, first".to_string(),
        };
        out.push(format!(
            "{iface} {}: the sampler would attach {at}; it sees {}",
            h.chain.direction,
            if h.ahead.is_empty() {
                "every packet".to_string()
            } else {
                format!("only what {} passes on", h.ahead.join(", "))
            }
        ));
        let listing = h.chain.listing(&[]);
        if listing.is_empty() {
            out.push("  (no other program on this hook)".into());
        }
        out.extend(listing.into_iter().map(|l| format!("  {l}")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(prio: u16, name: &str, id: u32) -> TcFilter {
        TcFilter {
            priority: prio,
            handle: 1,
            kind: "bpf".into(),
            name: Some(name.into()),
            prog_id: Some(id),
            direct_action: true,
            chain: 0,
        }
    }

    #[test]
    fn what_runs_ahead_of_ours() {
        let cni = ProgRef {
            id: 7,
            name: Some("cil_from_cont".into()),
        };
        let ours = ProgRef {
            id: 9,
            name: Some("rtt_sampler_ing".into()),
        };
        let mut c = Chain {
            direction: "ingress",
            tcx: vec![ours.clone(), cni.clone()],
            clsact: vec![filter(1, "cni.o:[tc]", 11)],
            ..Chain::default()
        };
        // tcx first: nothing ahead (clsact runs after every tcx program)
        assert!(c.ahead(Ours::Tcx(9)).is_empty());
        // the CNI re-attached first
        c.tcx = vec![cni.clone(), ours];
        let a = c.ahead(Ours::Tcx(9));
        assert_eq!(a, vec!["tcx program cil_from_cont (id 7)".to_string()]);
        // clsact at 0x7273: the tcx programs and the filter at priority 1 are ahead
        c.tcx = vec![cni];
        let a = c.ahead(Ours::Clsact(0x7273));
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(a[1].contains("priority 1"), "{a:?}");
        assert!(c.pinned_first(Ours::Clsact(0x7273)) && !c.pinned_first(Ours::Tcx(9)));
        let s = ahead_sentence("ns:veth0", "ingress", &a, true).unwrap();
        assert!(s.contains("cannot be preceded") && !s.contains('\n'), "{s}");
        // our other observers' filters never count
        c.tcx.clear();
        c.clsact = vec![filter(5, "rtt_sampler_ing:[3]", 3), filter(7, "x", 4)];
        assert!(c.ahead(Ours::Clsact(6)).is_empty());
        assert!(ahead_sentence("a", "egress", &[], false).is_none());
    }
}

//! The status of a view's kernel hooks in the interval and end records (issue 41: never blind
//! without a word).
use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `records::Name` (a record below it names it: no use back up).
type Name = Cow<'static, str>;

/// One kernel hook of a view on one interface (issue 41): the packets its program saw against
/// the packets the interface moved in that direction (the kernel's own counters), and what
/// runs ahead of it. `blind`: in the last interval the interface moved more than the view's
/// threshold (the sampler: 10 packets) while the hook saw none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct HookStatus {
    pub view: Name,
    /// The interface's namespace as given (`self`: the observer's own) and its name.
    pub netns: String,
    pub iface: String,
    /// `ingress` or `egress`.
    pub direction: Name,
    /// How the hook is attached (`tcx`, `clsact`).
    pub how: String,
    /// Since attach: packets the hook's program saw, and packets the interface received
    /// (ingress) or sent (egress).
    pub hook_packets: u64,
    pub iface_packets: u64,
    /// The same over the last interval.
    pub interval_hook_packets: u64,
    pub interval_iface_packets: u64,
    pub blind: bool,
    /// What runs before the hook and may end the chain (XDP, tcx programs, clsact filters).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ahead: Vec<String>,
}

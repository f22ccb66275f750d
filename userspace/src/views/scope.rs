//! What observe gives every view besides its own options: its shared
//! options ([`Scope`]) and the views' keys of its config file ([`FileKeys`]).
//! Apart from the registry (`views/mod.rs`), which builds each view from
//! them, so that a view's `options.rs` can take them without a cycle.

/// What observe's own options say to every view (each takes what it uses):
/// the namespaces (`--netns`, resolved), `--all-netns`, `--cgroup`, the
/// `--port` and `--addr` filters, `--raw` and `--max-flows`.
pub struct Scope<'a> {
    pub netns: &'a [crate::sys::netns::NetNs],
    pub all_netns: bool,
    pub cgroup: Option<&'a std::path::Path>,
    pub ports: &'a [u16],
    pub addrs: &'a [ipnet::IpNet],
    pub raw: bool,
    pub max_flows: u32,
}

/// The views' keys of observe's config file, as written (flat in the file, each key optional):
/// `views`, each view's own, and the flow-table capacity they share (`max_flows`).
#[derive(Default)]
pub struct FileKeys<'a> {
    pub views: Option<&'a [String]>,
    pub max_flows: Option<u32>,
    /// The sampler's: `ifaces`, `sample_every`, `proto`.
    pub ifaces: Option<&'a [String]>,
    pub sample_every: Option<u32>,
    pub proto: Option<&'a [crate::views::sampler::Proto]>,
}

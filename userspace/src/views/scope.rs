//! What observe gives every view besides its own options: its shared
//! options ([`Scope`]), and how a view is run on the lab's testbed ([`OnTestbed`]).
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

/// How a view observes a testbed of two network namespaces, a client's and a server's, that
/// reach each other through an interface of the same name in each, watched from outside both
/// with `--netns` for each (`rttscope lab`'s testbed; the lab runs the views with
/// [`crate::views::ViewKind::flow_rtts`]): observe's options that attach it there, and that set
/// how it samples ([`crate::views::on_testbed`]).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OnTestbed {
    /// After `--view`: where it attaches, besides the namespaces every view takes.
    pub attach: Vec<String>,
    /// After the shared options (`--port`): its sampling rate, for a view that samples packets
    /// (1 in `sample_every` per direction).
    pub rate: Vec<String>,
}

/// The most flows `--max-flows` may ask of a view's table.
pub const MAX_FLOWS: u32 = 1 << 24;

/// The bound on `--max-flows` every view applies: at least 1, at most [`MAX_FLOWS`] (the
/// sampler's table takes 5.25 KiB per flow; the TCP view's maps grow with it too, and a size the
/// kernel cannot allocate failed as ENOMEM at load time).
pub fn check_max_flows(n: u32) -> anyhow::Result<()> {
    if n == 0 || n > MAX_FLOWS {
        anyhow::bail!("--max-flows must be between 1 and {MAX_FLOWS}, not {n} (the flow tables take up to 5.3 KiB per flow)");
    }
    Ok(())
}

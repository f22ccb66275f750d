//! The sampler view's own options of `rttscope observe` (flattened into
//! observe's through the registry's [`crate::views::ViewArgs`]): its
//! interfaces and how it samples, checked against the views asked for, and
//! how they become its config; and its options of `rttscope compare`
//! ([`CompareSamplerArgs`], through [`crate::views::CompareViewArgs`]).
use std::any::Any;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use super::{AttachMode, IfaceSpec, Matching, Proto, SamplerConfig};
use crate::analysis::units::duration_arg;
use crate::views::def::{own, AttachOpts, ViewConfig, ViewDef};
use crate::views::scope::{OnTestbed, Scope};
use crate::views::view::View;
use crate::views::ViewKind;

/// The sampler view in the registry (`views::VIEWS`).
pub const DEF: ViewDef = ViewDef {
    kind: ViewKind::Sampler,
    observe: |opts, scope| {
        let args = own::<SamplerArgs>(opts).expect("the registry holds the sampler's options");
        Ok(Box::new(SamplerSetup {
            ifaces: args.ifaces.clone(),
            config: args.config(scope),
        }))
    },
    by_default: |opts| own::<SamplerArgs>(opts).is_some_and(|a| a.given()),
    compare: |opts, _| {
        let Some(args) = own::<CompareSamplerArgs>(opts) else {
            return Ok(None);
        };
        Ok(args.config().map(|config| {
            Box::new(SamplerSetup {
                ifaces: args.ifaces.clone(),
                config,
            }) as Box<dyn ViewConfig>
        }))
    },
    plan: super::plan::plan,
    on_testbed,
    testbed_words,
    start_schema: Some(super::track::start_schema),
    not_requested: Some(
        "unavailable: sampler view: not requested (--view tcp,sampler --iface NAME)",
    ),
};

/// The sampler asked for: its interfaces and its settings.
#[derive(Debug, Clone)]
pub struct SamplerSetup {
    pub ifaces: Vec<IfaceSpec>,
    pub config: SamplerConfig,
}

impl ViewConfig for SamplerSetup {
    fn def(&self) -> &'static ViewDef {
        &DEF
    }

    fn set_raw(&mut self) {
        self.config.raw = true;
    }

    /// One copy of the programs per interface, attached at ingress and egress (the build
    /// without BPF atomics where the kernel refuses them).
    fn attach(&self, how: &AttachOpts) -> Result<Box<dyn View>> {
        let loader = how.built_loader()?;
        crate::sys::preflight::require_bpf_caps()?;
        self.config.validate()?;
        let v = super::attach::Sampler::attach(loader, &self.ifaces, self.config.clone())?;
        Ok(Box::new(super::track::SamplerView::new(
            Box::new(v),
            how.workloads,
        )))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Debug, Clone, PartialEq, Args)]
pub struct SamplerArgs {
    /// Sampler view: interface to sample at ingress and egress, NAME (current namespace) or NETNS:NAME; repeatable. NAME may be a pattern (veth*, lxc*, cali*): every matching interface, those created later too (within a second), those deleted released.
    #[arg(long = "iface", value_name = "[NETNS:]NAME")]
    pub ifaces: Vec<IfaceSpec>,
    /// Sampler view: attach at most N interfaces at once; those a pattern matches beyond it are refused and counted (ifaces_refused). Each costs 128 bytes of kernel memory per CPU for its hook counters.
    #[arg(long, default_value_t = super::config::DEFAULT_MAX_IFACES, value_name = "N")]
    pub max_ifaces: u32,
    /// Sampler view: sample each packet, in each direction, with probability 1/N (the cloud sampler samples).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sample_every: u32,
    /// Sampler view: pair segments and ACKs by sequence number (cloud sampler) or TCP timestamps (pping).
    #[arg(long = "match", value_enum, default_value = "seq")]
    pub matching: Matching,
    /// Sampler view: protocols to time, comma separated: tcp (data segments and their ACKs), icmp (ICMP and ICMPv6 echo, like ePPing).
    #[arg(long = "proto", value_delimiter = ',', value_enum, default_values = ["tcp", "icmp"], value_name = "PROTO")]
    pub protos: Vec<Proto>,
    /// Sampler view: tcx links (kernel >= 6.6), clsact filters, or tcx falling back to clsact.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Sampler view: drop a recorded segment not acknowledged within this time (counted as expired); a duration with a unit.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_arg)]
    pub pending_timeout: Duration,
    /// Sampler view: UDP destination ports parsed as VXLAN (the inner flow timed, keyed with its VNI), comma separated, at most 4: IANA's 4789 (Calico) and Linux's 8472 (Flannel, Cilium).
    #[arg(long = "vxlan-port", value_delimiter = ',', default_values_t = super::config::DEFAULT_VXLAN_PORTS, value_name = "PORT")]
    pub vxlan_ports: Vec<u16>,
    /// Sampler view: UDP destination ports parsed as Geneve, comma separated, at most 4 (IANA's 6081: Cilium's tunnel mode).
    #[arg(long = "geneve-port", value_delimiter = ',', default_values_t = super::config::DEFAULT_GENEVE_PORTS, value_name = "PORT")]
    pub geneve_ports: Vec<u16>,
}

impl SamplerArgs {
    /// Options that ask for the view when `--view` does not say (an interface).
    pub fn given(&self) -> bool {
        !self.ifaces.is_empty()
    }

    /// Refuse interfaces without the view, and the view without interfaces.
    pub fn check(&self, wanted: bool) -> Result<()> {
        if wanted && self.ifaces.is_empty() {
            bail!("the sampler view needs at least one --iface NAME (or NETNS:NAME) to attach to");
        }
        if !wanted && !self.ifaces.is_empty() {
            bail!(
                "--iface is for the sampler view: add sampler to --view (e.g. --view tcp,sampler)"
            );
        }
        Ok(())
    }

    /// The view's config with the scope's raw samples and flow-table capacity.
    pub fn config(&self, scope: &Scope<'_>) -> SamplerConfig {
        SamplerConfig {
            sample_every: self.sample_every,
            matching: self.matching,
            raw: scope.raw,
            max_flows: scope.max_flows,
            pending_timeout: self.pending_timeout,
            attach: self.attach,
            protos: self.protos.clone(),
            max_ifaces: self.max_ifaces,
            vxlan_ports: self.vxlan_ports.clone(),
            geneve_ports: self.geneve_ports.clone(),
        }
    }

    /// The clap ids of the options its config-file keys set ([`Self::merge_file`]), in order
    /// (through the registry's [`crate::views::ViewArgs::FILE_IDS`]).
    pub const FILE_IDS: &'static [&'static str] = &[
        "ifaces",
        "sample_every",
        "protos",
        "max_ifaces",
        "vxlan_ports",
        "geneve_ports",
    ];

    /// Of [`Self::FILE_IDS`], the options whose value differs from `defaults`'.
    pub fn differing(&self, defaults: &Self) -> Vec<&'static str> {
        let differs = [
            self.ifaces != defaults.ifaces,
            self.sample_every != defaults.sample_every,
            self.protos != defaults.protos,
            self.max_ifaces != defaults.max_ifaces,
            self.vxlan_ports != defaults.vxlan_ports,
            self.geneve_ports != defaults.geneve_ports,
        ];
        let ids = Self::FILE_IDS.iter().zip(differs);
        ids.filter(|(_, d)| *d).map(|(id, _)| *id).collect()
    }

    /// `merge` of observe's config file: each of the view's keys the file sets, unless the
    /// option was given (`from_file(id)` false). The keys are validated ([`check_file`]).
    pub fn merge_file(&mut self, keys: &SamplerFileKeys, from_file: &dyn Fn(&str) -> bool) {
        if let (true, Some(v)) = (from_file("ifaces"), &keys.ifaces) {
            // validated: check_file, parse_file_ifaces
            self.ifaces = v.iter().filter_map(|i| i.parse().ok()).collect();
        }
        if let (true, Some(n)) = (from_file("sample_every"), keys.sample_every) {
            self.sample_every = n;
        }
        if let (true, Some(p)) = (from_file("protos"), &keys.proto) {
            self.protos = p.clone();
        }
        if let (true, Some(n)) = (from_file("max_ifaces"), keys.max_ifaces) {
            self.max_ifaces = n;
        }
        if let (true, Some(p)) = (from_file("vxlan_ports"), &keys.vxlan_ports) {
            self.vxlan_ports = p.clone();
        }
        if let (true, Some(p)) = (from_file("geneve_ports"), &keys.geneve_ports) {
            self.geneve_ports = p.clone();
        }
    }
}

/// The view's keys of observe's config file, as written (flat in the file beside observe's own
/// keys, each optional). Not `deny_unknown_fields`: the registry reads each view's keys from the
/// whole file ([`crate::views::FileKeys`]), and observe refuses a key no part knows.
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
pub struct SamplerFileKeys {
    /// Sampler view: interfaces, "[NETNS:]NAME", NAME a name or a pattern ("veth*").
    pub ifaces: Option<Vec<String>>,
    /// Sampler view: take every N-th packet.
    pub sample_every: Option<u32>,
    /// Sampler view: protocols to time, ["tcp", "icmp"] (see observe --proto).
    pub proto: Option<Vec<Proto>>,
    /// Sampler view: at most this many interfaces attached at once (see observe --max-ifaces).
    pub max_ifaces: Option<u32>,
    /// Sampler view: UDP ports parsed as VXLAN (see observe --vxlan-port).
    pub vxlan_ports: Option<Vec<u16>>,
    /// Sampler view: UDP ports parsed as Geneve (see observe --geneve-port).
    pub geneve_ports: Option<Vec<u16>>,
}

/// The view's own options of `rttscope compare` (flattened into compare's through the
/// registry's [`crate::views::CompareViewArgs`]): its interfaces and how it samples.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct CompareSamplerArgs {
    /// Sampler view on this interface (NAME or NETNS:NAME); repeatable. Without it no sampler rows.
    #[arg(long = "iface", value_name = "[NETNS:]NAME")]
    pub ifaces: Vec<IfaceSpec>,
    /// Sampler: sample each packet with probability 1/N.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sample_every: u32,
    /// Sampler matching rule.
    #[arg(long = "match", value_enum, default_value = "seq")]
    pub matching: Matching,
}

impl CompareSamplerArgs {
    /// The view's config in compare, with raw samples for the time series; None without an
    /// interface (no sampler rows).
    pub fn config(&self) -> Option<SamplerConfig> {
        (!self.ifaces.is_empty()).then(|| SamplerConfig {
            sample_every: self.sample_every,
            matching: self.matching,
            raw: true,
            ..Default::default()
        })
    }
}

/// The config file's keys of the view: one sentence naming the key per problem.
pub fn check_file(keys: &SamplerFileKeys) -> Result<()> {
    super::config::check_tunnel_ports(
        keys.vxlan_ports.as_deref().unwrap_or_default(),
        keys.geneve_ports.as_deref().unwrap_or_default(),
        ["vxlan_ports", "geneve_ports"],
    )?;
    for i in keys.ifaces.iter().flatten() {
        let name = i.rsplit(':').next().unwrap_or("");
        if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains(' ') {
            bail!(
                "ifaces: '{}' is not an interface name ([NETNS:]NAME, at most 15 characters)",
                crate::analysis::input::quote_input(i)
            );
        }
    }
    if keys.proto.as_ref().is_some_and(|p| p.is_empty()) {
        bail!("proto must name at least one protocol: \"tcp\", \"icmp\" or both");
    }
    if let Some(n) = keys.max_ifaces {
        if n == 0 || n > super::config::MAX_IFACES {
            bail!(
                "max_ifaces must be between 1 and {}, not {n}",
                super::config::MAX_IFACES
            );
        }
    }
    if keys.sample_every == Some(0) {
        bail!("sample_every must be at least 1 (1 = every packet)");
    }
    Ok(())
}

/// The config file's interfaces, parsed (after the checks every view's keys share).
pub fn parse_file_ifaces(keys: &SamplerFileKeys) -> Result<()> {
    for i in keys.ifaces.iter().flatten() {
        i.parse::<IfaceSpec>()
            .map_err(|e| anyhow::anyhow!("ifaces: {e}"))?;
    }
    Ok(())
}

/// Its options on the lab's testbed ([`crate::views::on_testbed`]): the testbed's interface in
/// each namespace, and how it samples.
pub fn on_testbed(netns: [&str; 2], iface: &str, sample_every: u32) -> OnTestbed {
    OnTestbed {
        attach: netns
            .iter()
            .flat_map(|n| ["--iface".to_string(), format!("{n}:{iface}")])
            .collect(),
        rate: vec!["--sample-every".into(), sample_every.to_string()],
    }
}

/// Its hooks on the testbed and what its columns hold, in words
/// ([`crate::views::testbed_words`]).
pub fn testbed_words(iface: &str, sample_every: u32) -> (String, String) {
    (
        format!("tc ingress+egress on {iface} of the client and of the server namespace"),
        format!(
            "the packet sampler at each end's interface{}",
            match sample_every {
                0 | 1 => String::new(),
                n => format!(" (1 in {n} packets per direction)"),
            }
        ),
    )
}

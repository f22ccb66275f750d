//! The passive views, one folder each (C side: `bpf/<view>.bpf.c`), behind
//! one interface ([`passive`]), each loadable by two loaders:
//!
//! - libbpf (feature `libbpf`, the default): libbpf-rs over C libbpf, the
//!   reference CO-RE loader;
//! - aya (feature `aya`): aya 0.14, a pure-Rust loader with no C libbpf.
//!
//! Both load the same compiled objects (`$OUT_DIR/<name>.bpf.o` from `bpf/`)
//! through one loader layer ([`loader`]: one `Object` trait, a libbpf and an
//! aya implementation), against which each view's attach and read logic is
//! written once (`<view>/attach.rs`); both decode with the same generated
//! types (`crate::bpf`). See docs/loaders.md for when to choose which. This
//! module is the registry: a view is registered by its `pub mod` line, its
//! `attach_*` function, and its options (a field of [`ViewArgs`], built into
//! its config by [`ViewArgs::configs`]; its keys of observe's config file, a field of
//! [`FileKeys`]; compare's: [`CompareViewArgs`]).
use anyhow::Result;

pub use passive::{LoaderKind, PassiveView, RawEvent, RawSample, RawSamples, RingSource, ViewKind};
pub use scope::{OnTestbed, Scope};

#[cfg(feature = "example-view")]
pub mod count;
pub mod fine;

pub(crate) mod loader;
pub mod names;
pub mod passive;
pub mod probe;
pub mod sampler;
pub mod scope;
pub mod tcp;
pub mod view;

#[cfg(not(any(feature = "libbpf", feature = "aya")))]
compile_error!("build at least one BPF loader: feature `libbpf` (default) or `aya`");

/// A view asked for, with its settings: the registry (one variant per view,
/// in the order the session attaches and reads them).
pub enum ViewConfig {
    Tcp(tcp::TcpViewConfig),
    Sampler(Vec<sampler::IfaceSpec>, sampler::SamplerConfig),
    /// The example view (feature `example-view`).
    #[cfg(feature = "example-view")]
    Count(count::CountConfig),
}

impl ViewConfig {
    /// Which view this is.
    pub fn kind(&self) -> ViewKind {
        match self {
            ViewConfig::Tcp(_) => ViewKind::Tcp,
            ViewConfig::Sampler(..) => ViewKind::Sampler,
            #[cfg(feature = "example-view")]
            ViewConfig::Count(_) => ViewKind::Count,
        }
    }

    /// Load it with its raw-sample ring buffer on.
    pub fn set_raw(&mut self) {
        match self {
            ViewConfig::Tcp(c) => c.raw = true,
            ViewConfig::Sampler(_, c) => c.raw = true,
            // none to turn on: its raw_samples() says so
            #[cfg(feature = "example-view")]
            ViewConfig::Count(_) => {}
        }
    }

    /// Load and attach it with the chosen loader, to be read by the session
    /// (`keep_rows`: build rows; `keep_summary`: keep closed flows for the
    /// end summary; `workloads`: `--label-workload`).
    pub fn attach(
        &self,
        loader: LoaderKind,
        keep_rows: bool,
        keep_summary: bool,
        workloads: bool,
    ) -> Result<Box<dyn view::View>> {
        Ok(match self {
            ViewConfig::Tcp(c) => Box::new(tcp::track::TcpSession::new(
                attach_tcp(loader, c)?,
                c,
                keep_rows,
                keep_summary,
            )),
            ViewConfig::Sampler(ifaces, c) => {
                crate::sys::preflight::require_bpf_caps()?;
                c.validate()?;
                let v = attach_sampler(loader, ifaces, c.clone())?;
                Box::new(sampler::track::SamplerSession::new(v, workloads))
            }
            #[cfg(feature = "example-view")]
            ViewConfig::Count(c) => attach_count(loader, c)?,
        })
    }
}

/// Each view's own options of `rttscope observe` (declared in its folder,
/// `<view>/options.rs`) and `--view`, flattened into observe's options in
/// this order: the registry of options.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct ViewArgs {
    #[command(flatten)]
    pub tcp: tcp::options::TcpArgs,
    /// Views to show, comma separated: tcp, sampler [default: tcp, plus sampler when --iface is given].
    #[arg(long, value_delimiter = ',', value_enum)]
    pub view: Option<Vec<ViewKind>>,
    #[command(flatten)]
    pub sampler: sampler::options::SamplerArgs,
}

impl ViewArgs {
    /// Each view's options as observe's settings record them, added to them (each view's
    /// `options.rs`: the TCP view's `ack_hook`).
    pub fn record(&self, settings: &mut serde_json::Map<String, serde_json::Value>) {
        self.tcp.record(settings);
    }

    /// The views asked for: `--view` (repeats next to each other dropped), or
    /// by default the TCP view, plus each view whose own options ask for it.
    pub fn kinds(&self) -> Vec<ViewKind> {
        match &self.view {
            Some(v) => {
                let mut v = v.clone();
                v.dedup();
                v
            }
            None if !self.sampler.given() => vec![ViewKind::Tcp],
            None => vec![ViewKind::Tcp, ViewKind::Sampler],
        }
    }

    /// Each view's options that make no sense with the views asked for.
    pub fn check(&self, kinds: &[ViewKind]) -> Result<()> {
        self.sampler.check(kinds.contains(&ViewKind::Sampler))
    }

    /// The configs of the views asked for, in registry order, from their own
    /// options and observe's shared ones.
    pub fn configs(&self, kinds: &[ViewKind], scope: &Scope<'_>) -> Result<Vec<ViewConfig>> {
        let mut configs = Vec::new();
        for kind in ViewKind::ALL.iter().filter(|k| kinds.contains(k)) {
            configs.push(match kind {
                ViewKind::Tcp => ViewConfig::Tcp(self.tcp.config(scope)?),
                ViewKind::Sampler => {
                    ViewConfig::Sampler(self.sampler.ifaces.clone(), self.sampler.config(scope))
                }
                // the example view (tests: docs/views.md) takes observe's --cgroup
                #[cfg(feature = "example-view")]
                ViewKind::Count => ViewConfig::Count(count::CountConfig {
                    cgroup: scope.cgroup.map(|c| c.to_path_buf()),
                }),
            });
        }
        Ok(configs)
    }

    /// The clap ids of the options observe's config file sets here ([`Self::merge_file`]):
    /// `--view`, then each view's (its options' `FILE_IDS`), in this order.
    pub const FILE_IDS: &'static [&'static str] =
        &crate::analysis::fields::concat::<{ 1 + sampler::options::SamplerArgs::FILE_IDS.len() }>(
            &[&["view"], sampler::options::SamplerArgs::FILE_IDS],
        );

    /// Of [`Self::FILE_IDS`], the options whose value differs from `defaults`' (in that order).
    pub fn differing(&self, defaults: &Self) -> Vec<&'static str> {
        let mut ids = Vec::new();
        if self.view != defaults.view {
            ids.push("view");
        }
        ids.extend(self.sampler.differing(&defaults.sampler));
        ids
    }

    /// `merge` of observe's config file: `views` and each view's own keys the file sets,
    /// unless the option was given (`from_file(id)` false). The keys are validated
    /// ([`check_file_keys`]).
    pub fn merge_file(
        &mut self,
        views: Option<&[String]>,
        keys: &FileKeys,
        from_file: &dyn Fn(&str) -> bool,
    ) {
        if let (true, Some(v)) = (from_file("view"), views) {
            let kind = |n: &String| ViewKind::from_name(n).unwrap_or(ViewKind::Tcp);
            self.view = Some(v.iter().map(kind).collect());
        }
        self.sampler.merge_file(&keys.sampler, from_file);
    }
}

/// The views' own keys of observe's config file, as written (flat in the file beside observe's
/// keys, each optional): one field per view that has keys, its struct declared in its folder
/// (`<view>/options.rs`, a derived `Deserialize` that is not `deny_unknown_fields`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FileKeys {
    pub sampler: sampler::options::SamplerFileKeys,
}

impl FileKeys {
    /// Each view's keys read from the whole file's text (toml's spans and messages kept; the
    /// keys of observe and of the other views are ignored here). On errors: the one at the
    /// earliest top-level key ([`crate::analysis::fields::first`]; the same: registry order).
    pub fn from_text(text: &str) -> Result<Self, crate::analysis::fields::PartError> {
        let mut errors = Vec::new();
        let keys = FileKeys {
            sampler: from_text(text, &mut errors),
        };
        crate::analysis::fields::first(errors).map_or(Ok(keys), Err)
    }

    /// Every view's keys, in registry order (each view's in its struct's order).
    pub fn names() -> Vec<&'static str> {
        use crate::analysis::fields::serde_fields;
        [serde_fields::<sampler::options::SamplerFileKeys>()].concat()
    }
}

/// [`FileKeys::from_text`]: one view's keys (its default on an error, added to `errors`).
fn from_text<T>(text: &str, errors: &mut Vec<crate::analysis::fields::PartError>) -> T
where
    T: serde::de::DeserializeOwned + Default,
{
    crate::analysis::fields::from_toml(text).unwrap_or_else(|e| {
        errors.push(e);
        T::default()
    })
}

/// Each view's own options of `rttscope compare` (declared in its folder, `<view>/options.rs`),
/// flattened into compare's options in this order: the registry of compare's options.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CompareViewArgs {
    #[command(flatten)]
    pub sampler: sampler::options::CompareSamplerArgs,
}

impl CompareViewArgs {
    /// The views compare attaches, in registry order, each configured by its folder around the
    /// responder's `port` (a view whose options ask for none is left out).
    pub fn configs(&self, port: u16) -> Result<Vec<ViewConfig>> {
        let mut configs = Vec::new();
        for kind in ViewKind::ALL {
            configs.extend(match kind {
                ViewKind::Tcp => Some(ViewConfig::Tcp(tcp::options::compare_config(port)?)),
                ViewKind::Sampler => (self.sampler.config())
                    .map(|c| ViewConfig::Sampler(self.sampler.ifaces.clone(), c)),
                // the example view: not in compare
                #[cfg(feature = "example-view")]
                ViewKind::Count => None,
            });
        }
        Ok(configs)
    }
}

/// What each view will do on a kernel with these features (`rttscope features`), in registry
/// order.
pub fn plans(f: &probe::Features) -> Vec<probe::ViewPlan> {
    ViewKind::ALL
        .iter()
        .map(|kind| match kind {
            ViewKind::Tcp => tcp::plan::plan(f),
            ViewKind::Sampler => sampler::plan::plan(f),
            // the example view: no kernel path to choose (cgroup_skb since 4.10)
            #[cfg(feature = "example-view")]
            ViewKind::Count => probe::ViewPlan::default(),
        })
        .collect()
}

/// `rttscope features --iface IF`: what runs on each of the interface's tc hooks, in order, and
/// whether a view hooked there (the packet sampler) would see the packets: the report's lines
/// and its JSON.
pub fn iface_hooks(iface: &str, f: &probe::Features) -> Result<(Vec<String>, serde_json::Value)> {
    let spec: sampler::IfaceSpec = iface.parse().map_err(anyhow::Error::msg)?;
    let hooks = sampler::chain::report(&spec, f.tcx.ok)?;
    let lines = sampler::chain::report_lines(iface, &hooks);
    Ok((lines, serde_json::json!({ "iface": iface, "hooks": hooks })))
}

/// Daemon mode's log line for a view not asked for, saying how to ask for it (None: say
/// nothing).
pub fn not_requested(kind: ViewKind) -> Option<&'static str> {
    match kind {
        ViewKind::Tcp => Some("unavailable: tcp view: not requested (--view)"),
        ViewKind::Sampler => {
            Some("unavailable: sampler view: not requested (--view tcp,sampler --iface NAME)")
        }
        #[cfg(feature = "example-view")]
        ViewKind::Count => None,
    }
}

/// A view's options of observe on a testbed ([`OnTestbed`]): `netns` the client's and the
/// server's namespace, `iface` the interface of each, `sample_every` the sampling rate of a
/// view that samples packets. Each view's folder says its own (`options.rs`).
pub fn on_testbed(kind: ViewKind, netns: [&str; 2], iface: &str, sample_every: u32) -> OnTestbed {
    match kind {
        ViewKind::Tcp => tcp::options::on_testbed(),
        ViewKind::Sampler => sampler::options::on_testbed(netns, iface, sample_every),
        #[cfg(feature = "example-view")]
        ViewKind::Count => OnTestbed::default(),
    }
}

/// A view on the testbed of [`on_testbed`] in words: its hooks there (the lab's result.json) and
/// what its columns hold (the legend of the lab's SUMMARY.md).
pub fn testbed_words(kind: ViewKind, iface: &str, sample_every: u32) -> (String, String) {
    match kind {
        ViewKind::Tcp => tcp::options::testbed_words(),
        ViewKind::Sampler => sampler::options::testbed_words(iface, sample_every),
        #[cfg(feature = "example-view")]
        ViewKind::Count => (
            "cgroup_skb ingress+egress".into(),
            "packets and bytes in and out of a cgroup".into(),
        ),
    }
}

/// The type of a view's value in observe's start record (docs/observe-record.schema.json), for a
/// view whose value has one; None: any JSON.
pub fn start_schema(
    kind: ViewKind,
    gen: &mut schemars::SchemaGenerator,
) -> Option<schemars::Schema> {
    match kind {
        ViewKind::Tcp => None,
        ViewKind::Sampler => Some(sampler::track::start_schema(gen)),
        #[cfg(feature = "example-view")]
        ViewKind::Count => None,
    }
}

/// The views observe's config file may name (`views = [...]`).
pub const FILE_VIEWS: &[&str] = &["tcp", "sampler"];

/// Check the views' keys of observe's config file (`views`, the flow-table capacity they share,
/// `max_flows`, and each view's own): one sentence naming the key per problem (the first found).
pub fn check_file_keys(
    views: Option<&[String]>,
    max_flows: Option<u32>,
    keys: &FileKeys,
) -> Result<()> {
    use crate::analysis::input::quote_input as q;
    for v in views.into_iter().flatten() {
        if !FILE_VIEWS.contains(&v.as_str()) {
            anyhow::bail!(
                "views: '{}' is not a view (choose from: {})",
                q(v),
                FILE_VIEWS.join(", ")
            );
        }
    }
    if views.is_some_and(|v| v.is_empty()) {
        anyhow::bail!("views must name at least one view (tcp, sampler)");
    }
    sampler::options::check_file(&keys.sampler)?;
    if let Some(m) = max_flows {
        if !(16..=1 << 24).contains(&m) {
            anyhow::bail!("max_flows must be between 16 and 16777216, not {m}");
        }
    }
    sampler::options::parse_file_ifaces(&keys.sampler)
}

/// Load and attach the TCP view with the chosen loader. Fails with one
/// clear sentence (also when that loader is not built into this binary).
pub fn attach_tcp(kind: LoaderKind, cfg: &tcp::TcpViewConfig) -> Result<Box<dyn tcp::TcpView>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(tcp::attach::Tcp::attach(kind, cfg)?))
}

/// Load one copy of the sampler's programs per interface with the chosen
/// loader and attach them at ingress and egress (the build without BPF
/// atomics where the kernel refuses them). Fails with one clear sentence
/// (also when that loader is not built into this binary).
pub fn attach_sampler(
    kind: LoaderKind,
    ifaces: &[sampler::IfaceSpec],
    cfg: sampler::SamplerConfig,
) -> Result<Box<dyn sampler::SamplerView>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(sampler::attach::Sampler::attach(
        kind, ifaces, cfg,
    )?))
}

/// Load and attach the example view (feature `example-view`) with the chosen
/// loader. Fails with one clear sentence (also when that loader is not built
/// into this binary).
#[cfg(feature = "example-view")]
pub fn attach_count(kind: LoaderKind, cfg: &count::CountConfig) -> Result<Box<dyn view::View>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(count::Count::attach(kind, cfg)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// compare's views from its flags: the TCP view on the responder's port in the observer's own
    /// namespace (4096 flows, raw samples), then the sampler on each `--iface` with its rate and
    /// matching (raw samples, the rest its defaults); no sampler without `--iface`.
    #[test]
    fn compare_configs_from_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: CompareViewArgs,
        }
        let configs = |flags: &[&str]| {
            let args = T::try_parse_from(std::iter::once("compare").chain(flags.iter().copied()));
            args.unwrap().a.configs(7879).unwrap()
        };
        let own = crate::sys::netns::current_inode().unwrap();
        let got = configs(&[
            "--iface",
            "lo",
            "--iface",
            "n1:eth0",
            "--sample-every",
            "4",
            "--match",
            "tsval",
        ]);
        assert_eq!(
            got.iter().map(|c| c.kind()).collect::<Vec<_>>(),
            [ViewKind::Tcp, ViewKind::Sampler]
        );
        let ViewConfig::Tcp(t) = &got[0] else {
            panic!("not the TCP view first")
        };
        assert_eq!(
            (t.ports.as_slice(), t.raw, t.max_flows, t.all_netns),
            (&[7879][..], true, 4096, false)
        );
        assert_eq!(
            t.iter_netns.iter().map(|n| n.inode).collect::<Vec<_>>(),
            [own]
        );
        assert!(t.cgroup.is_none() && t.netns_filter.is_empty() && t.cidrs.is_empty());
        let ViewConfig::Sampler(ifaces, c) = &got[1] else {
            panic!("not the sampler second")
        };
        let names: Vec<_> = ifaces
            .iter()
            .map(|i| (i.netns.as_deref(), i.name.as_str()))
            .collect();
        assert_eq!(names, [(None, "lo"), (Some("n1"), "eth0")]);
        assert_eq!(
            (c.sample_every, c.matching, c.raw),
            (4, sampler::Matching::Tsval, true)
        );
        let d = sampler::SamplerConfig::default();
        assert_eq!(
            (c.max_flows, c.pending_timeout, c.attach, &c.protos),
            (d.max_flows, d.pending_timeout, d.attach, &d.protos)
        );
        let got = configs(&["--sample-every", "4"]);
        assert_eq!(
            got.iter().map(|c| c.kind()).collect::<Vec<_>>(),
            [ViewKind::Tcp]
        );
    }

    #[test]
    fn missing_loader_is_one_sentence() {
        for k in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if k.built_in() {
                continue;
            }
            let e = attach_tcp(k, &tcp::TcpViewConfig::default()).err().unwrap();
            let s = e.to_string();
            assert!(s.contains("built without the"), "{s}");
            assert!(!s.contains('\n'), "{s}");
        }
    }

    #[test]
    fn missing_sampler_loader_is_one_sentence() {
        for k in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if k.built_in() {
                continue;
            }
            let e = attach_sampler(k, &[], sampler::SamplerConfig::default())
                .err()
                .unwrap();
            let s = e.to_string();
            assert!(s.contains("built without the"), "{s}");
        }
    }
}

#[cfg(all(test, not(feature = "example-view")))]
mod record_schema_tests {
    use crate::analysis::records::schema_json;

    /// docs/observe-record.schema.json is what the Rust types generate, each view's key of the
    /// start record typed by its own code ([`super::start_schema`]) (regenerate with
    /// RTTSCOPE_WRITE_SCHEMA=1), and every line of observe's output fixture is valid against it.
    /// The checked-in schema is the shipped build's: with the example view built in, each flow
    /// has one more column (`count`), so the comparison is made only without it.
    #[test]
    fn checked_in_record_schema_matches_the_types_and_the_output() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let want = schema_json(&super::start_schema);
        crate::analysis::assert_checked_in_schema(
            "docs/observe-record.schema.json",
            &want,
            "checked_in_record_schema",
        );
        let schema: serde_json::Value = serde_json::from_str(&want).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let text = std::fs::read_to_string(dir.join("tests/fixtures/observe/raw.jsonl")).unwrap();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{errors:?}\n{line}");
        }
        let bad = serde_json::json!({"type": "sample", "view": "tcp", "t": 1.0});
        assert!(
            !validator.is_valid(&bad),
            "a sample without rtt_us is refused"
        );
    }
}

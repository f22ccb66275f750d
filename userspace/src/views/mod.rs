//! The passive views, one folder each (C side: `bpf/<view>.bpf.c`), behind
//! one interface ([`view::View`]), each loadable by two loaders:
//!
//! - libbpf (feature `libbpf`, the default): libbpf-rs over C libbpf, the
//!   reference CO-RE loader;
//! - aya (feature `aya`): aya 0.14, a pure-Rust loader with no C libbpf.
//!
//! Both load the same compiled objects (`$OUT_DIR/<name>.bpf.o` from `bpf/`)
//! through one loader layer ([`loader`]: one `Object` trait, a libbpf and an
//! aya implementation), against which each view's attach and read logic is
//! written once (`<view>/attach.rs`). See docs/loaders.md for when to choose which. This
//! module is the registry: a view is registered by its `pub mod` line and its descriptor's
//! line in [`VIEWS`] (a [`ViewDef`], exported by its folder); a view with options of its own
//! adds their clap `flatten` ([`ViewArgs`], [`CompareViewArgs`]; its keys of observe's config
//! file, a field of [`FileKeys`]).
use anyhow::Result;

pub use def::{AttachOpts, ViewConfig, ViewDef};
pub use passive::{
    HoldsAttached, LoaderKind, PassiveView, RawEvent, RawSample, RawSamples, RingSource, ViewKind,
};
pub use scope::{OnTestbed, Scope};

#[cfg(feature = "example-view")]
pub mod count;
pub mod def;
#[cfg(test)]
pub mod fake;
pub mod features;
pub mod fine;

pub(crate) mod loader;
pub mod names;
pub mod passive;
pub mod sampler;
pub mod scope;
pub mod tcp;
pub mod view;

#[cfg(not(any(feature = "libbpf", feature = "aya")))]
compile_error!("build at least one BPF loader: feature `libbpf` (default) or `aya`");

/// Every view, in the order the session attaches and reads them (and records list their
/// columns: [`ViewKind::ALL`], the same views in the same order): the registry.
pub const VIEWS: &[&ViewDef] = &[
    &tcp::DEF,
    &sampler::DEF,
    #[cfg(feature = "example-view")]
    &count::DEF,
];

/// A view's entry in the registry.
pub fn def(kind: ViewKind) -> &'static ViewDef {
    VIEWS
        .iter()
        .find(|d| d.kind == kind)
        .expect("every ViewKind is in VIEWS")
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

    /// Every view's own options (each view's [`ViewDef`] finds its own: [`def::own`]).
    fn own(&self) -> [&dyn std::any::Any; 2] {
        [&self.tcp, &self.sampler]
    }

    /// The views asked for: `--view` (repeats next to each other dropped), or
    /// by default each view that runs by default or whose own options ask for it.
    pub fn kinds(&self) -> Vec<ViewKind> {
        match &self.view {
            Some(v) => {
                let mut v = v.clone();
                v.dedup();
                v
            }
            None => VIEWS
                .iter()
                .filter(|d| (d.by_default)(&self.own()))
                .map(|d| d.kind)
                .collect(),
        }
    }

    /// Each view's options that make no sense with the views asked for.
    pub fn check(&self, kinds: &[ViewKind]) -> Result<()> {
        self.sampler.check(kinds.contains(&ViewKind::Sampler))
    }

    /// The configs of the views asked for, in registry order, from their own
    /// options and observe's shared ones.
    pub fn configs(
        &self,
        kinds: &[ViewKind],
        scope: &Scope<'_>,
    ) -> Result<Vec<Box<dyn ViewConfig>>> {
        VIEWS
            .iter()
            .filter(|d| kinds.contains(&d.kind))
            .map(|d| (d.observe)(&self.own(), scope))
            .collect()
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
    pub fn configs(&self, port: u16) -> Result<Vec<Box<dyn ViewConfig>>> {
        let own: [&dyn std::any::Any; 1] = [&self.sampler];
        VIEWS
            .iter()
            .filter_map(|d| (d.compare)(&own, port).transpose())
            .collect()
    }
}

/// What each view will do on a kernel with these features (`rttscope features`), in registry
/// order.
pub fn plans(f: &features::Features) -> Vec<features::ViewPlan> {
    VIEWS.iter().map(|d| (d.plan)(f)).collect()
}

/// `rttscope features --iface IF`: what runs on each of the interface's tc hooks, in order, and
/// whether a view hooked there (the packet sampler) would see the packets: the report's lines
/// and its JSON.
pub fn iface_hooks(
    iface: &str,
    f: &features::Features,
) -> Result<(Vec<String>, Vec<serde_json::Value>)> {
    let spec: sampler::IfaceSpec = iface.parse().map_err(anyhow::Error::msg)?;
    if !spec.is_pattern() {
        let hooks = sampler::chain::report(&spec, f.tcx.ok)?;
        let lines = sampler::chain::report_lines(iface, &hooks);
        return Ok((
            lines,
            vec![serde_json::json!({ "iface": iface, "hooks": hooks })],
        ));
    }
    // a pattern: each interface it matches now (observe follows those that come later too)
    let matched = sampler::chain::matching(&spec)?;
    if matched.is_empty() {
        let line = format!(
            "{iface}: no interface matches now (observe --iface '{iface}' attaches those that appear)"
        );
        return Ok((vec![line], Vec::new()));
    }
    let (mut lines, mut docs) = (Vec::new(), Vec::new());
    for one in matched {
        let name = one.to_string();
        let hooks = sampler::chain::report(&one, f.tcx.ok)?;
        lines.extend(sampler::chain::report_lines(&name, &hooks));
        docs.push(serde_json::json!({ "iface": name, "pattern": iface, "hooks": hooks }));
    }
    Ok((lines, docs))
}

/// Daemon mode's log line for a view not asked for, saying how to ask for it (None: say
/// nothing).
pub fn not_requested(kind: ViewKind) -> Option<&'static str> {
    def(kind).not_requested
}

/// A view's options of observe on a testbed ([`OnTestbed`]): `netns` the client's and the
/// server's namespace, `iface` the interface of each, `sample_every` the sampling rate of a
/// view that samples packets. Each view's folder says its own.
pub fn on_testbed(kind: ViewKind, netns: [&str; 2], iface: &str, sample_every: u32) -> OnTestbed {
    (def(kind).on_testbed)(netns, iface, sample_every)
}

/// A view on the testbed of [`on_testbed`] in words: its hooks there (the lab's result.json) and
/// what its columns hold (the legend of the lab's SUMMARY.md).
pub fn testbed_words(kind: ViewKind, iface: &str, sample_every: u32) -> (String, String) {
    (def(kind).testbed_words)(iface, sample_every)
}

/// The type of a view's value in observe's start record (docs/observe-record.schema.json), for a
/// view whose value has one; None: any JSON.
pub fn start_schema(
    kind: ViewKind,
    gen: &mut schemars::SchemaGenerator,
) -> Option<schemars::Schema> {
    def(kind).start_schema.map(|s| s(gen))
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
            got.iter().map(|c| c.def().kind).collect::<Vec<_>>(),
            [ViewKind::Tcp, ViewKind::Sampler]
        );
        let t: &tcp::TcpViewConfig = got[0].as_any().downcast_ref().unwrap();
        assert_eq!(
            (t.ports.as_slice(), t.raw, t.max_flows, t.all_netns),
            (&[7879][..], true, 4096, false)
        );
        assert_eq!(
            t.iter_netns.iter().map(|n| n.inode).collect::<Vec<_>>(),
            [own]
        );
        assert!(t.cgroup.is_none() && t.netns_filter.is_empty() && t.cidrs.is_empty());
        let s: &sampler::SamplerSetup = got[1].as_any().downcast_ref().unwrap();
        let c = &s.config;
        let names: Vec<_> = s
            .ifaces
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
            got.iter().map(|c| c.def().kind).collect::<Vec<_>>(),
            [ViewKind::Tcp]
        );
    }

    /// The registry lists every view once, in the order records list their columns.
    #[test]
    fn registry_is_every_view_in_order() {
        let kinds: Vec<ViewKind> = VIEWS.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, ViewKind::ALL);
    }

    /// Each view's attach, with a loader this binary was built without, fails with one sentence.
    #[test]
    fn missing_loader_is_one_sentence() {
        let configs: Vec<Box<dyn ViewConfig>> = vec![
            Box::new(tcp::TcpViewConfig::default()),
            Box::new(sampler::SamplerSetup {
                ifaces: vec![],
                config: sampler::SamplerConfig::default(),
            }),
        ];
        for loader in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if loader.built_in() {
                continue;
            }
            let how = AttachOpts {
                loader,
                keep_rows: false,
                keep_summary: false,
                workloads: false,
            };
            for c in &configs {
                let s = c.attach(&how).err().unwrap().to_string();
                assert!(s.contains("built without the"), "{s}");
                assert!(!s.contains('\n'), "{s}");
            }
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

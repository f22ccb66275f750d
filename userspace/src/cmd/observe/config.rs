//! The TOML config file of `rttscope observe` (`--config FILE`), an
//! alternative to flags for daemon mode. Unknown keys are errors; every
//! impossible value is one clear sentence naming the key. Each view declares its
//! own keys in its folder; the views' registry reads them ([`crate::views::FileKeys`]).
//! Options given explicitly win over the file: on the command line, or through their
//! environment variable (e.g. `RTTSCOPE_LOADER` for `--loader`); which ones
//! were given is clap's knowledge ([`Explicit::from_matches`]), handed down by
//! `main`, never re-read from the process's argv. `--check-config` validates
//! and exits.
//!
//! ```toml
//! netns = ["web1", "web2"]     # or omit: all namespaces
//! interval = "10s"
//! listen = "127.0.0.1:9464"
//! web_config_file = "/etc/rttscope/web.yml"  # TLS and basic auth for /metrics (optional)
//! otlp = "http://127.0.0.1:4318"  # OTLP/HTTP push (optional; true: OTEL_EXPORTER_OTLP_ENDPOINT)
//! otlp_interval = "30s"           # default: interval
//! otlp_headers = { Authorization = "Bearer ..." }  # secrets: keep the file mode 0640
//! otlp_ca_file = "/etc/rttscope/ca.pem"            # https://: else the system's roots
//! otlp_timeout = "5s"             # default: OTEL_EXPORTER_OTLP_TIMEOUT, else 10s
//! otlp_compression = "gzip"       # default: OTEL_EXPORTER_OTLP_COMPRESSION, else none
//! views = ["tcp"]
//! [labels]
//! v4_prefix = 24
//! v6_prefix = 48
//! ports = [443, 8080]
//! max_series = 1000
//! ```
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::args::ObserveArgs;
use crate::analysis::units::parse_duration;
use crate::sinks::prometheus::http::parse_listen;
use crate::sinks::prometheus::LabelPolicy;

/// The file as written (every key optional): observe's own keys, and the views' (read by the
/// views' registry, [`parse`]). A key that is neither is refused by [`parse`], not here.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
pub struct ConfigFile {
    /// Network namespaces to observe (names under /var/run/netns, `host`).
    pub netns: Option<Vec<String>>,
    pub all_netns: Option<bool>,
    /// cgroup v2 directory for the sock_ops program.
    pub cgroup: Option<PathBuf>,
    /// Only connections with these ports.
    pub ports: Option<Vec<u16>>,
    /// Only connections with addresses in these CIDRs.
    pub addrs: Option<Vec<String>>,
    /// Read interval, e.g. "1s".
    pub interval: Option<String>,
    /// Stop after this long (default: run until stopped).
    pub duration: Option<String>,
    /// Views to run, by name (the registry's `views::FILE_VIEWS`).
    pub views: Option<Vec<String>>,
    /// Each view's own keys (in the file after `views` in the list of keys; each view's
    /// folder declares them).
    #[serde(skip)]
    pub view_keys: crate::views::FileKeys,
    /// Address for /metrics, e.g. "127.0.0.1:9464".
    pub listen: Option<String>,
    /// The web config file of /metrics (TLS, basic auth), exporter-toolkit's format.
    pub web_config_file: Option<PathBuf>,
    /// OTLP/HTTP endpoint to push the metrics to, e.g. "http://127.0.0.1:4318"; `true`: the
    /// endpoint of the environment (bare `--otlp`).
    pub otlp: Option<OtlpKey>,
    /// How often to push OTLP, e.g. "30s" (default: interval).
    pub otlp_interval: Option<String>,
    /// Headers of every OTLP request, e.g. `{ Authorization = "Bearer ..." }` (secrets).
    pub otlp_headers: Option<crate::sinks::otlp::settings::HeaderTable>,
    /// https:// OTLP: CA certificates (PEM), client certificate chain and key (mTLS).
    pub otlp_ca_file: Option<PathBuf>,
    pub otlp_client_cert: Option<PathBuf>,
    pub otlp_client_key: Option<PathBuf>,
    /// An OTLP request not answered within this time fails, e.g. "5s".
    pub otlp_timeout: Option<String>,
    pub otlp_compression: Option<crate::sinks::otlp::settings::Compression>,
    /// Flow-table capacity (see observe --max-flows).
    pub max_flows: Option<u32>,
    pub raw: Option<bool>,
    /// No per-interval output (daemon mode).
    pub quiet: Option<bool>,
    /// Turn on kernel BPF run-time statistics while running.
    pub bpf_stats: Option<bool>,
    /// The names file of remote addresses (`--names`).
    pub names: Option<PathBuf>,
    pub labels: Option<LabelsSection>,
}

/// `otlp = "URL"`, or `otlp = true` (the environment's endpoint) / `false` (off).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum OtlpKey {
    Url(String),
    On(bool),
}

/// `[labels]`: the label policy of the exporter.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LabelsSection {
    pub v4_prefix: Option<u8>,
    pub v6_prefix: Option<u8>,
    pub ports: Option<Vec<u16>>,
    /// Workload labels (unit, container, pod): off by default.
    pub workload: Option<bool>,
    /// The backend of a NATed connection as a label: off by default.
    pub backend: Option<bool>,
    pub max_series: Option<usize>,
    /// A label set without samples for this long is removed, e.g. "10min".
    pub series_idle: Option<String>,
}

/// A validated config: typed values.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ObserveConfig {
    pub file: ConfigFile,
    pub addrs: Vec<ipnet::IpNet>,
    pub interval: Option<Duration>,
    pub duration: Option<Duration>,
    pub listen: Option<SocketAddr>,
    pub series_idle: Option<Duration>,
    pub otlp_interval: Option<Duration>,
    pub otlp_timeout: Option<Duration>,
}

/// Read and validate a config file.
pub fn load(path: &Path) -> Result<ObserveConfig> {
    let text = crate::sys::files::read_to_string(path)
        .with_context(|| format!("config file {}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", shown(path)))
}

/// A path for a message or `--check-config`: control and bidirectional characters escaped.
fn shown(path: &Path) -> String {
    crate::analysis::input::escape_for_terminal(&path.display().to_string())
}

/// A value from the file in a message: at most 80 characters, then how many bytes more; control
/// and bidirectional characters escaped (a 50 MB line is not echoed whole).
fn q(v: &str) -> String {
    crate::analysis::input::quote_input(v)
}

/// Longest message `parse` returns (a message from toml or another parser may quote a value).
/// (The unknown-key message lists every key: 460 characters with the otlp_* keys.)
const MAX_MESSAGE_CHARS: usize = 600;

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parse and validate config text. Errors are one sentence (no newline), at most
/// `MAX_MESSAGE_CHARS` characters: a value is quoted in at most 80.
pub fn parse(text: &str) -> Result<ObserveConfig> {
    // room for the "... (N more bytes)" that says how much was cut
    const CUT: usize = MAX_MESSAGE_CHARS - 30;
    parse_text(text).map_err(|e| {
        anyhow::anyhow!(
            "{}",
            crate::analysis::input::quote_input_max(&e.to_string(), CUT)
        )
    })
}

/// toml's message with every `name` and "value" it quotes (an unknown key, a value of the
/// wrong type: the file's text) cut to 80 characters. Fuzzing found a 130-character key echoed
/// whole.
fn cut_backquoted(msg: &str) -> String {
    cut_quoted(&cut_quoted(msg, '`'), '"')
}

/// Every part of `msg` between two `delim`s cut to 80 characters.
fn cut_quoted(msg: &str, delim: char) -> String {
    let mut out = String::with_capacity(msg.len().min(1024));
    for (i, part) in msg.split(delim).enumerate() {
        if i > 0 {
            out.push(delim);
        }
        match i % 2 {
            1 => out.push_str(&q(part)),
            _ => out.push_str(part),
        }
    }
    out
}

/// In three parts, as serde cannot refuse the unknown keys of a struct that flattens others'
/// (and flattening would lose toml's spans, the `line N:`): observe's own keys
/// ([`ConfigFile`]), the views' ([`crate::views::FileKeys`]), then every top-level key
/// against both ([`KnownKeys`]). Of their errors the one at the earliest top-level key is
/// reported (the same key: in that order), the one a single struct would have met first.
fn parse_text(text: &str) -> Result<ObserveConfig> {
    use crate::analysis::fields::{first, from_toml};
    let file = from_toml::<ConfigFile>(text);
    let view_keys = crate::views::FileKeys::from_text(text);
    let known = from_toml::<KnownKeys>(text);
    match (file, view_keys, known) {
        (Ok(mut file), Ok(view_keys), Ok(KnownKeys)) => {
            file.view_keys = view_keys;
            validate(file)
        }
        (file, view_keys, known) => {
            let e = first(
                [file.err(), view_keys.err(), known.err()]
                    .into_iter()
                    .flatten(),
            );
            Err(toml_error(text, &e.expect("a part failed").error))
        }
    }
}

/// toml's error as one sentence: `line N: ` and its message, names cut ([`cut_backquoted`]).
fn toml_error(text: &str, e: &toml::de::Error) -> anyhow::Error {
    let msg = cut_backquoted(&e.message().trim().replace('\n', " "));
    match e.span() {
        Some(s) => anyhow::anyhow!("line {}: {msg}", line_of(text, s.start)),
        None => anyhow::anyhow!("{msg}"),
    }
}

/// Every key the file may have at its top level, in the order toml's "unknown field" message
/// lists them: [`ConfigFile`]'s, with the views' ([`crate::views::FileKeys::names`]) after
/// `views`.
fn file_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let own = crate::analysis::fields::serde_fields::<ConfigFile>();
        let at = own
            .iter()
            .position(|k| *k == "views")
            .map_or(own.len(), |i| i + 1);
        [&own[..at], &crate::views::FileKeys::names(), &own[at..]].concat()
    })
}

/// The file's top-level keys, each one of [`file_keys`]: else toml's error at the first other
/// one, "unknown field `K`, expected one of ..." (serde's words, as a derived
/// `deny_unknown_fields` says them). Values are not looked at.
struct KnownKeys;

impl<'de> Deserialize<'de> for KnownKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Table;
        impl<'de> serde::de::Visitor<'de> for Table {
            type Value = KnownKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<KnownKeys, A::Error> {
                while m.next_key::<KnownKey>()?.is_some() {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
                Ok(KnownKeys)
            }
        }
        d.deserialize_map(Table)
    }
}

/// One key of [`KnownKeys`], refused in toml's key deserializer (so the error is at the key).
struct KnownKey;

impl<'de> Deserialize<'de> for KnownKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl serde::de::Visitor<'_> for Key {
            type Value = KnownKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, k: &str) -> Result<KnownKey, E> {
                match file_keys().contains(&k) {
                    true => Ok(KnownKey),
                    false => Err(E::unknown_field(k, file_keys())),
                }
            }
        }
        d.deserialize_identifier(Key)
    }
}

fn dur(key: &str, v: &Option<String>) -> Result<Option<Duration>> {
    match v {
        None => Ok(None),
        Some(s) => parse_duration(s)
            .map(Some)
            .map_err(|e| match s.chars().count() > 80 {
                // the parser quotes the value whole: say it here, cut
                true => anyhow::anyhow!("{key}: '{}' is not a duration", q(s)),
                false => anyhow::anyhow!("{key}: {e}"),
            }),
    }
}

/// Check every value; one sentence per problem (the first found, in the order below).
pub fn validate(file: ConfigFile) -> Result<ObserveConfig> {
    let (interval, duration, series_idle) = check_durations(&file)?;
    let addrs = check_places(&file)?;
    crate::views::check_file_keys(file.views.as_deref(), file.max_flows, &file.view_keys)?;
    let listen = check_listen(&file)?;
    let (otlp_interval, otlp_timeout) = check_otlp(&file)?;
    check_labels(&file)?;
    Ok(ObserveConfig {
        file,
        addrs,
        interval,
        duration,
        listen,
        series_idle,
        otlp_interval,
        otlp_timeout,
    })
}

/// interval, duration, labels.series_idle.
fn check_durations(
    file: &ConfigFile,
) -> Result<(Option<Duration>, Option<Duration>, Option<Duration>)> {
    let interval = dur("interval", &file.interval)?;
    if let Some(i) = interval {
        if i < Duration::from_millis(10) {
            bail!(
                "interval must be at least 10ms, not '{}'",
                q(file.interval.as_deref().unwrap_or(""))
            );
        }
        if i > Duration::from_secs(3600) {
            bail!("interval must be at most 1h");
        }
    }
    let duration = dur("duration", &file.duration)?;
    if duration == Some(Duration::ZERO) {
        bail!("duration must be longer than 0 (omit it to run until stopped)");
    }
    let series_idle = dur(
        "labels.series_idle",
        &file.labels.as_ref().and_then(|l| l.series_idle.clone()),
    )?;
    if series_idle == Some(Duration::ZERO) {
        bail!("labels.series_idle must be longer than 0");
    }
    Ok((interval, duration, series_idle))
}

/// netns, cgroup, ports, addrs (returned parsed).
fn check_places(file: &ConfigFile) -> Result<Vec<ipnet::IpNet>> {
    for n in file.netns.iter().flatten() {
        if n.is_empty() || (n.contains('/') && !n.starts_with('/')) {
            bail!("netns: '{}' is not a network namespace name", q(n));
        }
    }
    if file.netns.as_ref().is_some_and(|v| v.len() > 64) {
        bail!("netns: at most 64 namespaces may be listed");
    }
    if let Some(c) = &file.cgroup {
        if !c.is_absolute() {
            bail!(
                "cgroup must be an absolute path, not '{}'",
                q(&c.display().to_string())
            );
        }
    }
    for p in file.ports.iter().flatten() {
        if *p == 0 {
            bail!("ports: 0 is not a port");
        }
    }
    if file.ports.as_ref().is_some_and(|v| v.len() > 64) {
        bail!("ports: at most 64 ports may be listed");
    }
    let mut addrs = Vec::new();
    for a in file.addrs.iter().flatten() {
        addrs.push(a.parse::<ipnet::IpNet>().map_err(|_| {
            anyhow::anyhow!(
                "addrs: '{}' is not a CIDR such as 10.0.0.0/8 or fd00::/8",
                q(a)
            )
        })?);
    }
    if addrs.len() > 64 {
        bail!("addrs: at most 64 CIDRs may be listed");
    }
    Ok(addrs)
}

/// listen.
fn check_listen(file: &ConfigFile) -> Result<Option<SocketAddr>> {
    match &file.listen {
        Some(l) => Ok(Some(parse_listen(l).map_err(|e| {
            match l.chars().count() > 80 {
                // the parser quotes the value whole: say it here, cut
                true => anyhow::anyhow!("listen: '{}' is not a listen address", q(l)),
                false => anyhow::anyhow!("listen: {e}"),
            }
        })?)),
        None => Ok(None),
    }
}

/// otlp, otlp_interval, otlp_headers, otlp_timeout (the files are read at start).
fn check_otlp(file: &ConfigFile) -> Result<(Option<Duration>, Option<Duration>)> {
    if let Some(OtlpKey::Url(u)) = &file.otlp {
        if !u.is_empty() {
            crate::sinks::otlp::Endpoint::parse(u).map_err(|e| anyhow::anyhow!("otlp: {e}"))?;
        }
    }
    let otlp_interval = dur("otlp_interval", &file.otlp_interval)?;
    if otlp_interval.is_some_and(|d| d < Duration::from_millis(100)) {
        bail!("otlp_interval must be at least 100ms");
    }
    for (k, v) in file.otlp_headers.iter().flat_map(|h| h.0.iter()) {
        crate::sinks::otlp::settings::Header::new(k, v, "otlp_headers")?;
    }
    let otlp_timeout = dur("otlp_timeout", &file.otlp_timeout)?;
    if otlp_timeout == Some(Duration::ZERO) {
        bail!("otlp_timeout must be longer than 0");
    }
    Ok((otlp_interval, otlp_timeout))
}

/// The [labels] table.
fn check_labels(file: &ConfigFile) -> Result<()> {
    if let Some(l) = &file.labels {
        for p in l.ports.iter().flatten() {
            if *p == 0 {
                bail!("labels.ports: 0 is not a port");
            }
        }
        let mut pol = LabelPolicy::default();
        if let Some(v) = l.v4_prefix {
            pol.v4_prefix = v;
        }
        if let Some(v) = l.v6_prefix {
            pol.v6_prefix = v;
        }
        if let Some(v) = l.max_series {
            pol.max_series = v;
        }
        pol.validate().map_err(|e| anyhow::anyhow!("labels: {e}"))?;
    }
    Ok(())
}

/// The ids of the options given explicitly, which win over the config file.
/// An id is clap's arg id: the `ObserveArgs` field name (`ports`, not `port`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explicit(HashSet<String>);

/// The options a config file can set, by clap id (= `ObserveArgs` field
/// name): observe's own, in two runs around the views' (`--view` and each view's own, the
/// registry's [`crate::views::ViewArgs::FILE_IDS`], compared by
/// [`crate::views::ViewArgs::differing`]); [`merge`] consults exactly these, and
/// [`Explicit::non_default`] compares exactly these against the flag defaults.
macro_rules! merged_options {
    ([$($before:ident),* $(,)?], [$($after:ident),* $(,)?]) => {
        const BEFORE_VIEWS: &[&str] = &[$(stringify!($before)),*];
        const AFTER_VIEWS: &[&str] = &[$(stringify!($after)),*];
        const VIEWS: &[&str] = crate::views::ViewArgs::FILE_IDS;
        pub const MERGED_IDS: &[&str] = &crate::analysis::fields::concat::<
            { BEFORE_VIEWS.len() + VIEWS.len() + AFTER_VIEWS.len() },
        >(&[BEFORE_VIEWS, VIEWS, AFTER_VIEWS]);

        fn differing(args: &ObserveArgs, defaults: &ObserveArgs) -> HashSet<String> {
            let mut ids = HashSet::new();
            $(
                if args.$before != defaults.$before {
                    ids.insert(stringify!($before).to_string());
                }
            )*
            let views = args.view_opts.differing(&defaults.view_opts);
            ids.extend(views.into_iter().map(String::from));
            $(
                if args.$after != defaults.$after {
                    ids.insert(stringify!($after).to_string());
                }
            )*
            ids
        }
    };
}

merged_options!(
    [netns, all_netns, cgroup, ports, addrs, interval, duration, raw],
    [
        max_flows,
        listen,
        web_config_file,
        otlp,
        otlp_interval,
        otlp_headers,
        otlp_ca_file,
        otlp_client_cert,
        otlp_client_key,
        otlp_timeout,
        otlp_compression,
        quiet,
        bpf_stats,
        names,
        v4_prefix,
        v6_prefix,
        label_ports,
        label_workload,
        label_backend,
        max_series,
        series_idle,
    ]
);

impl Explicit {
    /// Nothing given: the file wins wherever it sets a key.
    pub fn none() -> Self {
        Explicit::default()
    }

    /// These ids (clap arg ids) count as given.
    pub fn from_ids<I, S>(ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Explicit(ids.into_iter().map(Into::into).collect())
    }

    /// From the `observe` subcommand's matches: an option counts as given
    /// when clap took its value from the command line or from its
    /// environment variable (`env = ...`, e.g. `RTTSCOPE_LOADER`), so an
    /// environment setting wins over the file just as a flag does. A value
    /// equal to the default still counts when it was given.
    pub fn from_matches(m: &clap::ArgMatches) -> Self {
        use clap::parser::ValueSource;
        Explicit(
            m.ids()
                .filter(|id| {
                    matches!(
                        m.value_source(id.as_str()),
                        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                    )
                })
                .map(|id| id.to_string())
                .collect(),
        )
    }

    /// For library callers that build `ObserveArgs` without a command line:
    /// an option counts as given when its value differs from the flag's
    /// default. A value equal to the default cannot be told apart from "not
    /// given", so the file wins over it.
    pub fn non_default(args: &ObserveArgs) -> Self {
        Explicit(differing(args, &flag_defaults()))
    }

    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }

    /// The options a file could set that count as given, in
    /// [`MERGED_IDS`] order. (Besides options, clap also reports the ids of
    /// the derives' arg groups, `ObserveArgs` and the flattened `ViewArgs`,
    /// `TcpArgs`, `SamplerArgs`; they name no option.)
    pub fn merged_ids(&self) -> Vec<&'static str> {
        MERGED_IDS
            .iter()
            .copied()
            .filter(|id| self.contains(id))
            .collect()
    }
}

/// `ObserveArgs` as clap builds it from no flags: the declared defaults, with
/// environment variables ignored (so `RTTSCOPE_LOADER` cannot change or
/// break it).
fn flag_defaults() -> ObserveArgs {
    use clap::{Args, FromArgMatches};
    let mut cmd = ObserveArgs::augment_args(clap::Command::new("observe"));
    let with_env: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| a.get_env().is_some())
        .map(|a| a.get_id().clone())
        .collect();
    for id in with_env {
        cmd = cmd.mut_arg(id, |a| a.env(None::<&'static str>));
    }
    let m = cmd
        .try_get_matches_from(["observe"])
        .expect("observe parses with no flags");
    ObserveArgs::from_arg_matches(&m).expect("observe's defaults are valid")
}

/// Merge a config into the parsed flags: the file sets each option it names
/// unless `explicit` holds that option's id.
pub fn merge(cfg: &ObserveConfig, args: &mut ObserveArgs, explicit: &Explicit) {
    let f = &cfg.file;
    let from_file = |id: &str| {
        debug_assert!(MERGED_IDS.contains(&id), "{id} missing from MERGED_IDS");
        !explicit.contains(id)
    };
    if let (true, Some(v)) = (from_file("netns"), &f.netns) {
        args.netns = v.clone();
    }
    if let (true, Some(v)) = (from_file("all_netns"), f.all_netns) {
        args.all_netns = v;
    }
    if let (true, Some(v)) = (from_file("cgroup"), &f.cgroup) {
        args.cgroup = Some(v.clone());
    }
    if let (true, Some(v)) = (from_file("ports"), &f.ports) {
        args.ports = v.clone();
    }
    if let (true, Some(_)) = (from_file("addrs"), &f.addrs) {
        args.addrs = cfg.addrs.clone();
    }
    if let (true, Some(i)) = (from_file("interval"), cfg.interval) {
        args.interval = i;
    }
    if let (true, Some(d)) = (from_file("duration"), cfg.duration) {
        args.duration = Some(d);
    }
    if let (true, Some(v)) = (from_file("raw"), f.raw) {
        args.raw = v;
    }
    args.view_opts
        .merge_file(f.views.as_deref(), &f.view_keys, &from_file);
    if let (true, Some(m)) = (from_file("max_flows"), f.max_flows) {
        args.max_flows = m;
    }
    if let (true, Some(l)) = (from_file("listen"), cfg.listen) {
        args.listen = Some(l);
    }
    if let (true, Some(p)) = (from_file("web_config_file"), &f.web_config_file) {
        args.web_config_file = Some(p.clone());
    }
    merge_otlp(cfg, args, &from_file);
    if let (true, Some(v)) = (from_file("quiet"), f.quiet) {
        args.quiet = v;
    }
    if let (true, Some(v)) = (from_file("bpf_stats"), f.bpf_stats) {
        args.bpf_stats = v;
    }
    if let (true, Some(v)) = (from_file("names"), &f.names) {
        args.names = Some(v.clone());
    }
    merge_labels(cfg, args, &from_file);
}

/// [`merge`]: the otlp keys.
fn merge_otlp(cfg: &ObserveConfig, args: &mut ObserveArgs, from_file: &dyn Fn(&str) -> bool) {
    let f = &cfg.file;
    match (from_file("otlp"), &f.otlp) {
        (true, Some(OtlpKey::Url(u))) => args.otlp = Some(u.clone()),
        (true, Some(OtlpKey::On(on))) => args.otlp = on.then(String::new),
        _ => {}
    }
    if let (true, Some(d)) = (from_file("otlp_interval"), cfg.otlp_interval) {
        args.otlp_interval = Some(d);
    }
    if let (true, Some(h)) = (from_file("otlp_headers"), &f.otlp_headers) {
        args.otlp_headers = h.args();
    }
    if let (true, Some(p)) = (from_file("otlp_ca_file"), &f.otlp_ca_file) {
        args.otlp_ca_file = Some(p.clone());
    }
    if let (true, Some(p)) = (from_file("otlp_client_cert"), &f.otlp_client_cert) {
        args.otlp_client_cert = Some(p.clone());
    }
    if let (true, Some(p)) = (from_file("otlp_client_key"), &f.otlp_client_key) {
        args.otlp_client_key = Some(p.clone());
    }
    if let (true, Some(d)) = (from_file("otlp_timeout"), cfg.otlp_timeout) {
        args.otlp_timeout = Some(d);
    }
    if let (true, Some(c)) = (from_file("otlp_compression"), f.otlp_compression) {
        args.otlp_compression = Some(c);
    }
}

/// [`merge`]: the [labels] table.
fn merge_labels(cfg: &ObserveConfig, args: &mut ObserveArgs, from_file: &dyn Fn(&str) -> bool) {
    let f = &cfg.file;
    if let Some(l) = &f.labels {
        if let (true, Some(v)) = (from_file("v4_prefix"), l.v4_prefix) {
            args.v4_prefix = Some(v);
        }
        if let (true, Some(v)) = (from_file("v6_prefix"), l.v6_prefix) {
            args.v6_prefix = Some(v);
        }
        if let (true, Some(v)) = (from_file("label_ports"), &l.ports) {
            args.label_ports = v.clone();
        }
        if let (true, Some(v)) = (from_file("label_workload"), l.workload) {
            args.label_workload = v;
        }
        if let (true, Some(v)) = (from_file("label_backend"), l.backend) {
            args.label_backend = v;
        }
        if let (true, Some(v)) = (from_file("max_series"), l.max_series) {
            args.max_series = Some(v);
        }
        if let (true, Some(v)) = (from_file("series_idle"), cfg.series_idle) {
            args.series_idle = Some(v);
        }
    }
}

/// The label policy the flags (after merging) ask for.
pub fn label_policy(args: &ObserveArgs) -> Result<LabelPolicy> {
    let d = LabelPolicy::default();
    let p = LabelPolicy {
        v4_prefix: args.v4_prefix.unwrap_or(d.v4_prefix),
        v6_prefix: args.v6_prefix.unwrap_or(d.v6_prefix),
        ports: args.label_ports.clone(),
        workload: args.label_workload,
        backend: args.label_backend,
        names: args.names.is_some(),
        max_series: args.max_series.unwrap_or(d.max_series),
        series_idle: args.series_idle.unwrap_or(d.series_idle),
    };
    p.validate()?;
    Ok(p)
}

/// Apply `--config` (and `--check-config`) to the flags: `None` means
/// "checked, nothing to run". `explicit`: the options given explicitly,
/// which win over the file (see [`Explicit`]).
pub fn resolve(mut args: ObserveArgs, explicit: &Explicit) -> Result<Option<ObserveArgs>> {
    let Some(path) = args.config.clone() else {
        if args.check_config {
            bail!("--check-config needs --config FILE");
        }
        return Ok(Some(args));
    };
    let cfg = load(&path)?;
    merge(&cfg, &mut args, explicit);
    let policy = label_policy(&args)?;
    if args.check_config {
        if let Some(p) = &args.web_config_file {
            crate::sinks::prometheus::web::Web::load(p)?;
        }
        println!("{}", check_line(&path, &args, &policy));
        return Ok(None);
    }
    Ok(Some(args))
}

/// `--check-config`'s line; what came from the file or the command line (path, namespace names)
/// with control and bidirectional characters escaped.
fn check_line(path: &Path, args: &ObserveArgs, policy: &LabelPolicy) -> String {
    format!(
        "{}: OK (interval {}, listen {}, netns {}, labels /{} /{} ports {:?}, max_series {})",
        shown(path),
        crate::analysis::units::fmt_duration_short(args.interval),
        args.listen
            .map(|a| a.to_string())
            .unwrap_or_else(|| "off".into()),
        if args.netns.is_empty() {
            "all".into()
        } else {
            crate::analysis::input::escape_for_terminal(&args.netns.join(","))
        },
        policy.v4_prefix,
        policy.v6_prefix,
        policy.ports,
        policy.max_series
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        let e = parse(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e:?}");
        e
    }

    #[test]
    fn full_example_parses() {
        let c = parse(
            r#"
netns = ["web1", "web2"]
cgroup = "/sys/fs/cgroup/unified/system.slice"
ports = [443]
addrs = ["10.0.0.0/8", "fd00::/8"]
interval = "10s"
duration = "1h"
views = ["tcp", "sampler"]
ifaces = ["web1:eth0"]
sample_every = 4
listen = "0.0.0.0:9464"
max_flows = 65536
quiet = true
bpf_stats = true
[labels]
v4_prefix = 16
v6_prefix = 64
ports = [443, 8080]
max_series = 500
series_idle = "5min"
"#,
        )
        .unwrap();
        assert_eq!(c.interval, Some(Duration::from_secs(10)));
        assert_eq!(c.addrs.len(), 2);
        assert_eq!(c.listen, Some("0.0.0.0:9464".parse().unwrap()));
        assert_eq!(c.series_idle, Some(Duration::from_secs(300)));
        assert_eq!(c.file.labels.unwrap().ports, Some(vec![443, 8080]));
        assert_eq!(parse("").unwrap(), ObserveConfig::default());
    }

    #[test]
    fn shipped_example_configs_are_valid() {
        let c = parse(include_str!("../../../../examples/deploy/rttscope.toml")).unwrap();
        assert_eq!(
            c.listen,
            Some("127.0.0.1:9464".parse().unwrap()),
            "loopback by default"
        );
        // The Kubernetes ConfigMap's embedded file.
        let yaml = include_str!("../../../../examples/deploy/rttscope-daemonset.yaml");
        let start = yaml.find("rttscope.toml: |").unwrap();
        let body: String = yaml[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    ") || l.is_empty())
            .map(|l| format!("{}\n", l.trim_start()))
            .collect();
        let c = parse(&body).unwrap();
        assert_eq!(c.listen, Some("0.0.0.0:9464".parse().unwrap()));
    }

    #[test]
    fn bad_toml_is_one_sentence_with_line() {
        let e = err("interval = \"1s\"\nnetns = [\"a\"\n");
        assert!(e.starts_with("line 2") || e.starts_with("line 3"), "{e}");
        let e = err("interval = 1s\n");
        assert!(e.starts_with("line 1"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err("intervall = \"1s\"\n");
        assert!(e.contains("intervall") && e.contains("line 1"), "{e}");
        let e = err("[labels]\nv4prefix = 24\n");
        assert!(e.contains("v4prefix") && e.contains("line 2"), "{e}");
        let e = err("[metrics]\nx = 1\n");
        assert!(e.contains("metrics"), "{e}");
    }

    #[test]
    fn impossible_values_one_sentence_each() {
        for (text, want) in [
            ("interval = \"0\"", "interval must be at least 10ms"),
            ("interval = \"fast\"", "interval: 'fast' is not a duration"),
            (
                "[labels]\nseries_idle = \"10m\"",
                "labels.series_idle: '10m' is ambiguous: write 10ms for milliseconds or 10min for minutes",
            ),
            ("interval = \"5\"", "interval: '5' has no unit: write 5s for seconds"),
            ("duration = \"0\"", "duration must be longer than 0"),
            (
                "listen = \"localhost\"",
                "listen: 'localhost' is not a listen address",
            ),
            ("listen = \"1.2.3.4:99999\"", "not a listen address"),
            (
                "[labels]\nv4_prefix = 33",
                "labels: the IPv4 label prefix must be 0..32 bits, not 33",
            ),
            (
                "[labels]\nv6_prefix = 200",
                "labels: the IPv6 label prefix must be 0..128 bits, not 200",
            ),
            ("[labels]\nmax_series = 0", "at least 1"),
            ("[labels]\nv4_prefix = 300", "line 2"),
            ("[labels]\nports = [0]", "labels.ports: 0 is not a port"),
            ("ports = [70000]", "line 1"),
            ("ports = [0]", "ports: 0 is not a port"),
            (
                "addrs = [\"10.0.0.0/33\"]",
                "addrs: '10.0.0.0/33' is not a CIDR",
            ),
            ("views = [\"udp\"]", "views: 'udp' is not a view"),
            ("views = []", "at least one view"),
            ("sample_every = 0", "sample_every must be at least 1"),
            ("vxlan_ports = [0]", "vxlan_ports: 0 is not a port"),
            ("geneve_ports = [1, 2, 3, 4, 5]", "geneve_ports takes at most 4 ports"),
            (
                "vxlan_ports = [6081]\ngeneve_ports = [6081]",
                "UDP port 6081 is given as both a VXLAN (vxlan_ports) and a Geneve port (geneve_ports)",
            ),
            ("proto = []", "proto must name at least one protocol"),
            ("proto = [\"udp\"]", "line 1"),
            ("max_flows = 1", "max_flows must be between 16"),
            ("max_flows = -5", "line 1"),
            ("netns = [\"a/b\"]", "'a/b' is not a network namespace name"),
            (
                "cgroup = \"relative/cg\"",
                "cgroup must be an absolute path",
            ),
            ("ifaces = [\"ns:\"]", "is not an interface name"),
            ("interval = 5", "line 1"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    /// `rttscope observe ARGV...` through the observe subcommand's own clap
    /// command (the one `Cli` nests; this module does not import the CLI):
    /// the flags and the options clap saw given. No process argv.
    fn observe(argv: &[&str]) -> (ObserveArgs, Explicit) {
        use clap::{Args, FromArgMatches};
        let m = ObserveArgs::augment_args(clap::Command::new("observe"))
            .try_get_matches_from(std::iter::once("observe").chain(argv.iter().copied()))
            .unwrap();
        (
            ObserveArgs::from_arg_matches(&m).unwrap(),
            Explicit::from_matches(&m),
        )
    }

    #[test]
    fn flags_win_over_the_file() {
        let cfg = parse(
            "netns = [\"cfgns\"]\ninterval = \"5s\"\nmax_flows = 1000\nlisten = \"127.0.0.1:9999\"\n[labels]\nv4_prefix = 16\nmax_series = 7\n",
        )
        .unwrap();
        let (mut a, explicit) =
            observe(&["--netns", "clins", "--v4-prefix", "20", "--interval", "2s"]);
        assert_eq!(explicit.merged_ids(), ["netns", "interval", "v4_prefix"]);
        merge(&cfg, &mut a, &explicit);
        assert_eq!(a.netns, vec!["clins"]);
        assert_eq!(a.interval, Duration::from_secs(2));
        assert_eq!(a.max_flows, 1000, "file value replaces the flag default");
        assert_eq!(a.listen, Some("127.0.0.1:9999".parse().unwrap()));
        let p = label_policy(&a).unwrap();
        assert_eq!(p.v4_prefix, 20);
        assert_eq!(p.max_series, 7);
        assert_eq!(p.v6_prefix, 48);
    }

    #[test]
    fn sampler_options_merge() {
        let cfg =
            parse("views = [\"tcp\", \"sampler\"]\nifaces = [\"ns1:eth0\"]\nsample_every = 8\nproto = [\"icmp\"]\n")
                .unwrap();
        let (mut a, explicit) = observe(&[]);
        assert!(explicit.merged_ids().is_empty());
        merge(&cfg, &mut a, &explicit);
        assert_eq!(a.view_opts.sampler.sample_every, 8);
        assert_eq!(
            a.view_opts.sampler.protos,
            vec![crate::views::sampler::Proto::Icmp]
        );
        assert_eq!(a.view_opts.sampler.ifaces.len(), 1);
        assert_eq!(
            a.view_opts.view,
            Some(vec![
                crate::views::ViewKind::Tcp,
                crate::views::ViewKind::Sampler
            ])
        );
    }

    /// Fuzzing found an unknown key of 130 characters quoted whole by toml's message (80 is the
    /// rule), and a message cut at 300 characters that became longer with its "(N more bytes)".
    #[test]
    fn an_unknown_key_is_quoted_cut_and_messages_stay_within_300_characters() {
        let key = format!("view{}s", "-".repeat(125));
        let e = err(&format!("# a comment\n{key} = 1\n"));
        assert!(
            e.starts_with(&format!(
                "line 2: unknown field `{}... (50 more bytes)`, expected one of `netns`",
                &key[..80]
            )),
            "{e}"
        );
        assert!(
            e.chars().count() <= MAX_MESSAGE_CHARS,
            "{} characters: {e}",
            e.chars().count()
        );
        let e = err(&format!("{} = 1", "k".repeat(1 << 16)));
        assert!(
            e.chars().count() <= MAX_MESSAGE_CHARS,
            "{} characters: {e}",
            e.chars().count()
        );
    }

    /// A 50 MB value is not echoed whole: each message quotes at most 80 characters of it and
    /// says how many bytes more there were, whichever key it is under (validated here, or
    /// refused by the TOML parser or another parser), and stays one line.
    #[test]
    fn a_huge_value_is_quoted_cut() {
        let big = "x".repeat(1 << 20);
        for (key, text) in [
            ("interval", format!("interval = \"{big}\"")),
            ("netns", format!("netns = [\"a/{big}\"]")),
            ("cgroup", format!("cgroup = \"{big}\"")),
            ("addrs", format!("addrs = [\"{big}\"]")),
            ("views", format!("views = [\"{big}\"]")),
            ("ifaces", format!("ifaces = [\"{big}\"]")),
            ("listen", format!("listen = \"{big}\"")),
            ("otlp", format!("otlp = \"{big}\"")),
            ("ports", format!("ports = [\"{big}\"]")),
            ("unknown key", format!("{big} = 1")),
        ] {
            let e = err(&text);
            assert!(
                e.len() <= MAX_MESSAGE_CHARS + 30,
                "{key}: {} bytes: {}",
                e.len(),
                &e[..400]
            );
            assert!(e.contains("more bytes)"), "{key}: {e}");
            assert!(!e.contains(&"x".repeat(301)), "{key}: {e}");
        }
        assert_eq!(
            err(&format!("interval = \"{big}\"")),
            format!(
                "interval: '{}... ({} more bytes)' is not a duration",
                "x".repeat(80),
                (1 << 20) - 80
            )
        );
        // Control characters in a value are escaped in the message.
        assert_eq!(
            err("netns = [\"a/\\u001b[31m\"]"),
            "netns: 'a/\\u{1b}[31m' is not a network namespace name"
        );
    }

    /// `--check-config` shows a namespace name (or path) with a right-to-left override or an
    /// escape character escaped, not raw.
    #[test]
    fn check_config_escapes_what_it_echoes() {
        let cfg = parse("netns = [\"web\\u202egnp.exe\", \"b\\u001b[2J\"]\n").unwrap();
        let (mut args, explicit) = observe(&[]);
        merge(&cfg, &mut args, &explicit);
        let line = check_line(
            Path::new("/etc/r\u{1b}t.toml"),
            &args,
            &label_policy(&args).unwrap(),
        );
        assert!(
            line.starts_with("/etc/r\\u{1b}t.toml: OK (interval 1s, listen off, netns web\\u{202e}gnp.exe,b\\u{1b}[2J, labels"),
            "{line}"
        );
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{line:?}"
        );
    }

    #[test]
    fn check_config_needs_a_file() {
        use clap::Args;
        let cmd = || ObserveArgs::augment_args(clap::Command::new("observe"));
        assert!(cmd()
            .try_get_matches_from(["observe", "--check-config"])
            .is_err());
        let (a, explicit) = observe(&["--listen"]);
        assert!(explicit.contains("listen"));
        assert_eq!(
            a.listen,
            Some("127.0.0.1:9464".parse().unwrap()),
            "default bind is loopback"
        );
    }

    #[test]
    fn config_merged_ids_are_clap_arg_ids() {
        use clap::Args;
        let cmd = ObserveArgs::augment_args(clap::Command::new("observe"));
        for id in MERGED_IDS {
            assert!(
                cmd.get_arguments().any(|a| a.get_id() == *id),
                "{id} is not an observe arg id"
            );
        }
        // The list/option/bool flags whose long name differs from the id.
        for (id, long) in [
            ("ports", "port"),
            ("addrs", "addr"),
            ("ifaces", "iface"),
            ("label_ports", "label-port"),
            ("protos", "proto"),
        ] {
            let a = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(a.get_long(), Some(long));
        }
        // Every key of the file, set at once, is merged under its id.
        let cfg = parse(
            "netns = [\"n\"]\nall_netns = true\ncgroup = \"/cg\"\nports = [1]\naddrs = [\"10.0.0.0/8\"]\ninterval = \"5s\"\nduration = \"1min\"\nviews = [\"sampler\"]\nifaces = [\"e0\"]\nsample_every = 3\nproto = [\"tcp\"]\nmax_ifaces = 7\nvxlan_ports = [4790]\ngeneve_ports = [6082]\nlisten = \"127.0.0.1:1\"\nweb_config_file = \"/w.yml\"\notlp = \"https://127.0.0.1:4318\"\notlp_interval = \"30s\"\notlp_headers = { a = \"b\" }\notlp_ca_file = \"/ca\"\notlp_client_cert = \"/c\"\notlp_client_key = \"/k\"\notlp_timeout = \"2s\"\notlp_compression = \"gzip\"\nmax_flows = 99\nraw = true\nquiet = true\nbpf_stats = true\nnames = \"/n\"\n[labels]\nv4_prefix = 8\nv6_prefix = 9\nports = [2]\nworkload = true\nbackend = true\nmax_series = 3\nseries_idle = \"1min\"\n",
        )
        .unwrap();
        let (mut a, _) = observe(&[]);
        merge(&cfg, &mut a, &Explicit::none());
        let mut changed: Vec<String> = Explicit::non_default(&a).0.into_iter().collect();
        changed.sort();
        let mut all: Vec<String> = MERGED_IDS.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(changed, all, "each file key moves its own option");
        // With every id explicit, the file changes nothing.
        let (mut b, _) = observe(&[]);
        merge(
            &cfg,
            &mut b,
            &Explicit::from_ids(MERGED_IDS.iter().copied()),
        );
        assert_eq!(Explicit::non_default(&b), Explicit::none());
    }

    #[test]
    fn config_library_callers_rule_is_non_default() {
        // observe::run(args) without a command line: a value that differs
        // from its flag's default counts as given; one equal to the default
        // is indistinguishable from "not given" and the file wins over it.
        let cfg = parse("interval = \"5s\"\nmax_flows = 1000\nsample_every = 4\n").unwrap();
        let (mut a, _) = observe(&[]);
        a.interval = Duration::from_secs(2);
        a.view_opts.sampler.sample_every = 1; // the default
        let explicit = Explicit::non_default(&a);
        assert_eq!(explicit, Explicit::from_ids(["interval"]));
        merge(&cfg, &mut a, &explicit);
        assert_eq!(
            a.interval,
            Duration::from_secs(2),
            "differs from default: kept"
        );
        assert_eq!(a.max_flows, 1000);
        assert_eq!(
            a.view_opts.sampler.sample_every, 4,
            "equal to the default: the file wins"
        );
    }

    /// The keys the unknown-key message lists: observe's own (serde's list of [`ConfigFile`]),
    /// the views' right after `views`, as when one struct declared them all; no key both
    /// observe's and a view's.
    #[test]
    fn unknown_key_list_is_observes_keys_then_the_views_after_views() {
        let own = crate::analysis::fields::serde_fields::<ConfigFile>();
        let views = crate::views::FileKeys::names();
        let at = own.iter().position(|k| *k == "views").unwrap() + 1;
        let want: Vec<&str> = [&own[..at], &views, &own[at..]].concat();
        assert_eq!(file_keys(), want);
        assert_eq!(
            file_keys(),
            [
                "netns",
                "all_netns",
                "cgroup",
                "ports",
                "addrs",
                "interval",
                "duration",
                "views",
                "ifaces",
                "sample_every",
                "proto",
                "max_ifaces",
                "vxlan_ports",
                "geneve_ports",
                "listen",
                "web_config_file",
                "otlp",
                "otlp_interval",
                "otlp_headers",
                "otlp_ca_file",
                "otlp_client_cert",
                "otlp_client_key",
                "otlp_timeout",
                "otlp_compression",
                "max_flows",
                "raw",
                "quiet",
                "bpf_stats",
                "names",
                "labels"
            ]
        );
        assert!(
            views.iter().all(|k| !own.contains(k)),
            "{views:?} in {own:?}"
        );
        assert!(!own.contains(&"view_keys"), "a skipped field is no key");
        assert_eq!(
            err("interval = \"1s\"\nfoo = 1\n"),
            "line 2: unknown field `foo`, expected one of `netns`, `all_netns`, `cgroup`, \
             `ports`, `addrs`, `interval`, `duration`, `views`, `ifaces`, `sample_every`, \
             `proto`, `max_ifaces`, `vxlan_ports`, `geneve_ports`, `listen`, `web_config_file`, `otlp`, `otlp_interval`, `otlp_headers`, `otlp_ca_file`, \
             `otlp_client_cert`, `otlp_client_key`, `otlp_timeout`, `otlp_compression`, \
             `max_flows`, `raw`, `quiet`, `bpf_stats`, `names`, `labels`"
        );
    }

    /// The file is read in three parts (observe's keys, the views', the list of keys): the
    /// problem reported is the first toml meets, whichever part finds it, as with one struct:
    /// the first in the file, or in toml's order of the top-level keys where that differs (a
    /// table made by `[labels.q]` goes after `[ifaces]`).
    #[test]
    fn the_first_problem_in_the_file_is_reported_whichever_part_finds_it() {
        let unknown = "line 3: unknown field `foo`";
        for (text, want) in [
            (
                "views = [\"sampler\"]\n\nfoo = 1\nsample_every = \"x\"\n",
                unknown,
            ),
            ("\n\nfoo = 1\nproto = [\"udp\"]\n", unknown),
            ("\n\nfoo = 1\ninterval = 5\n", unknown),
            ("\n\nfoo = 1\n[labels]\nv4_prefix = \"x\"\n", unknown),
            (
                "\nsample_every = \"x\"\nfoo = 1\n",
                "line 2: invalid type: string \"x\", expected u32",
            ),
            (
                "\n\n\nproto = [\"udp\"]\n\n\n\n\nfoo = 1\n",
                "line 4: unknown variant `udp`, expected `tcp` or `icmp`",
            ),
            (
                "ifaces = 5\ninterval = 5\n",
                "line 1: invalid type: integer `5`, expected a sequence",
            ),
            (
                "interval = 5\nifaces = 5\n",
                "line 1: invalid type: integer `5`, expected a string",
            ),
            ("ifaces = 5\nbar = 1\n", "line 1: invalid type: integer `5`"),
            (
                "[labels.q]\n[ifaces]\n[labels]\nv4_prefix = 1\n",
                "line 2: invalid type: map, expected a sequence",
            ),
            (
                "[labels.q]\n[foo]\n[labels]\n",
                "line 2: unknown field `foo`",
            ),
        ] {
            let e = err(text);
            assert!(e.starts_with(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Any text as a config file: no panic, and an error is one line (the daemon logs it).
        #[test]
        fn any_config_text_parses_or_fails_in_one_line(
            text in "((interval|duration|max_flows|netns|ports|views|ifaces|listen|sample_every|\\[labels\\]|v4_prefix|max_series) ?= ?(\"[^\"\n]{0,20}\"|-?[0-9]{1,12}|\\[[0-9, \"a-z]{0,20}\\]|\\PC{0,10})\n){0,6}"
        ) {
            if let Err(e) = parse(&text) {
                let e = e.to_string();
                proptest::prop_assert!(!e.contains('\n'), "{:?}", e);
            }
        }
    }
}

//! The TOML config file of `rttscope observe` (`--config FILE`), an
//! alternative to flags for daemon mode. Unknown keys are errors; every
//! impossible value is one clear sentence naming the key. Flags given on the
//! command line win over the file. `--check-config` validates and exits.
//!
//! ```toml
//! netns = ["web1", "web2"]     # or omit: all namespaces
//! interval = "10s"
//! listen = "127.0.0.1:9464"
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

use crate::metrics::{parse_listen, LabelPolicy};
use crate::observe::ObserveArgs;
use crate::units::parse_duration;

/// The file as written (every key optional).
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
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
    /// Views: "tcp", "sampler".
    pub views: Option<Vec<String>>,
    /// Sampler view: interfaces, "[NETNS:]NAME".
    pub ifaces: Option<Vec<String>>,
    /// Sampler view: take every N-th packet.
    pub sample_every: Option<u32>,
    /// Address for /metrics, e.g. "127.0.0.1:9464".
    pub listen: Option<String>,
    /// Flow-table capacity (see observe --max-flows).
    pub max_flows: Option<u32>,
    pub raw: Option<bool>,
    /// No per-interval output (daemon mode).
    pub quiet: Option<bool>,
    /// Turn on kernel BPF run-time statistics while running.
    pub bpf_stats: Option<bool>,
    pub labels: Option<LabelsSection>,
}

/// `[labels]`: the label policy of the exporter.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LabelsSection {
    pub v4_prefix: Option<u8>,
    pub v6_prefix: Option<u8>,
    pub ports: Option<Vec<u16>>,
    pub max_series: Option<usize>,
    /// A label set without samples for this long is removed, e.g. "10m".
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
}

pub const VIEWS: &[&str] = &["tcp", "sampler"];

/// Read and validate a config file.
pub fn load(path: &Path) -> Result<ObserveConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parse and validate config text. Errors are one sentence (no newline).
pub fn parse(text: &str) -> Result<ObserveConfig> {
    let file: ConfigFile = toml::from_str(text).map_err(|e| {
        let msg = e.message().trim().replace('\n', " ");
        match e.span() {
            Some(s) => anyhow::anyhow!("line {}: {msg}", line_of(text, s.start)),
            None => anyhow::anyhow!("{msg}"),
        }
    })?;
    validate(file)
}

fn dur(key: &str, v: &Option<String>) -> Result<Option<Duration>> {
    match v {
        None => Ok(None),
        Some(s) => parse_duration(s)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{key}: {e}")),
    }
}

/// Check every value; one sentence per problem (the first found).
pub fn validate(file: ConfigFile) -> Result<ObserveConfig> {
    let interval = dur("interval", &file.interval)?;
    if let Some(i) = interval {
        if i < Duration::from_millis(10) {
            bail!(
                "interval must be at least 10ms, not '{}'",
                file.interval.as_deref().unwrap_or("")
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
    for n in file.netns.iter().flatten() {
        if n.is_empty() || (n.contains('/') && !n.starts_with('/')) {
            bail!("netns: '{n}' is not a network namespace name");
        }
    }
    if file.netns.as_ref().is_some_and(|v| v.len() > 64) {
        bail!("netns: at most 64 namespaces may be listed");
    }
    if let Some(c) = &file.cgroup {
        if !c.is_absolute() {
            bail!("cgroup must be an absolute path, not '{}'", c.display());
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
            anyhow::anyhow!("addrs: '{a}' is not a CIDR such as 10.0.0.0/8 or fd00::/8")
        })?);
    }
    if addrs.len() > 64 {
        bail!("addrs: at most 64 CIDRs may be listed");
    }
    for v in file.views.iter().flatten() {
        if !VIEWS.contains(&v.as_str()) {
            bail!(
                "views: '{v}' is not a view (choose from: {})",
                VIEWS.join(", ")
            );
        }
    }
    if file.views.as_ref().is_some_and(|v| v.is_empty()) {
        bail!("views must name at least one view (tcp, sampler)");
    }
    for i in file.ifaces.iter().flatten() {
        let name = i.rsplit(':').next().unwrap_or("");
        if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains(' ') {
            bail!("ifaces: '{i}' is not an interface name ([NETNS:]NAME, at most 15 characters)");
        }
    }
    if file.sample_every == Some(0) {
        bail!("sample_every must be at least 1 (1 = every packet)");
    }
    if let Some(m) = file.max_flows {
        if !(16..=1 << 24).contains(&m) {
            bail!("max_flows must be between 16 and 16777216, not {m}");
        }
    }
    for i in file.ifaces.iter().flatten() {
        i.parse::<crate::sampler::IfaceSpec>()
            .map_err(|e| anyhow::anyhow!("ifaces: {e}"))?;
    }
    let listen = match &file.listen {
        Some(l) => Some(parse_listen(l).map_err(|e| anyhow::anyhow!("listen: {e}"))?),
        None => None,
    };
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
    Ok(ObserveConfig {
        file,
        addrs,
        interval,
        duration,
        listen,
        series_idle,
    })
}

/// Merge a config into the parsed flags. `explicit` holds the ids of the
/// flags given on the command line (they win); for list and optional flags
/// a non-empty command-line value also wins.
pub fn merge(cfg: &ObserveConfig, args: &mut ObserveArgs, explicit: &HashSet<String>) {
    let f = &cfg.file;
    let given = |id: &str| explicit.contains(id);
    if args.netns.is_empty() {
        if let Some(v) = &f.netns {
            args.netns = v.clone();
        }
    }
    if !args.all_netns {
        args.all_netns = f.all_netns.unwrap_or(false);
    }
    if args.cgroup.is_none() {
        args.cgroup = f.cgroup.clone();
    }
    if args.ports.is_empty() {
        args.ports = f.ports.clone().unwrap_or_default();
    }
    if args.addrs.is_empty() {
        args.addrs = cfg.addrs.clone();
    }
    if let (false, Some(i)) = (given("interval"), cfg.interval) {
        args.interval = i;
    }
    if args.duration.is_none() {
        args.duration = cfg.duration;
    }
    if !args.raw {
        args.raw = f.raw.unwrap_or(false);
    }
    if args.view.is_none() {
        if let Some(v) = &f.views {
            use crate::observe::View;
            args.view = Some(
                v.iter()
                    .map(|n| {
                        if n == "sampler" {
                            View::Sampler
                        } else {
                            View::Tcp
                        }
                    })
                    .collect(),
            );
        }
    }
    if args.ifaces.is_empty() {
        // Validated in `validate`.
        args.ifaces = f
            .ifaces
            .iter()
            .flatten()
            .filter_map(|i| i.parse().ok())
            .collect();
    }
    if let (false, Some(n)) = (given("sample_every"), f.sample_every) {
        args.sample_every = n;
    }
    if let (false, Some(m)) = (given("max_flows"), f.max_flows) {
        args.max_flows = m;
    }
    if args.listen.is_none() {
        args.listen = cfg.listen;
    }
    if !args.quiet {
        args.quiet = f.quiet.unwrap_or(false);
    }
    if !args.bpf_stats {
        args.bpf_stats = f.bpf_stats.unwrap_or(false);
    }
    if let Some(l) = &f.labels {
        if args.v4_prefix.is_none() {
            args.v4_prefix = l.v4_prefix;
        }
        if args.v6_prefix.is_none() {
            args.v6_prefix = l.v6_prefix;
        }
        if args.label_ports.is_empty() {
            args.label_ports = l.ports.clone().unwrap_or_default();
        }
        if args.max_series.is_none() {
            args.max_series = l.max_series;
        }
        if args.series_idle.is_none() {
            args.series_idle = cfg.series_idle;
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
        max_series: args.max_series.unwrap_or(d.max_series),
        series_idle: args.series_idle.unwrap_or(d.series_idle),
    };
    p.validate()?;
    Ok(p)
}

/// Ids of the `observe` flags given on this process's command line.
pub fn explicit_flags() -> HashSet<String> {
    use clap::CommandFactory;
    let m = match crate::cli::Cli::command().try_get_matches_from(std::env::args_os()) {
        Ok(m) => m,
        Err(_) => return HashSet::new(),
    };
    let Some(("observe", sub)) = m.subcommand() else {
        return HashSet::new();
    };
    sub.ids()
        .filter(|id| sub.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.to_string())
        .collect()
}

/// Apply `--config` (and `--check-config`) to the flags: `None` means
/// "checked, nothing to run".
pub fn resolve(mut args: ObserveArgs) -> Result<Option<ObserveArgs>> {
    let Some(path) = args.config.clone() else {
        if args.check_config {
            bail!("--check-config needs --config FILE");
        }
        return Ok(Some(args));
    };
    let cfg = load(&path)?;
    merge(&cfg, &mut args, &explicit_flags());
    let policy = label_policy(&args)?;
    if args.check_config {
        println!(
            "{}: OK (interval {}, listen {}, netns {}, labels /{} /{} ports {:?}, max_series {})",
            path.display(),
            crate::units::fmt_duration_short(args.interval),
            args.listen
                .map(|a| a.to_string())
                .unwrap_or_else(|| "off".into()),
            if args.netns.is_empty() {
                "all".into()
            } else {
                args.netns.join(",")
            },
            policy.v4_prefix,
            policy.v6_prefix,
            policy.ports,
            policy.max_series
        );
        return Ok(None);
    }
    Ok(Some(args))
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
series_idle = "5m"
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
        let c = parse(include_str!("../../examples/deploy/rttscope.toml")).unwrap();
        assert_eq!(
            c.listen,
            Some("127.0.0.1:9464".parse().unwrap()),
            "loopback by default"
        );
        // The Kubernetes ConfigMap's embedded file.
        let yaml = include_str!("../../examples/deploy/rttscope-daemonset.yaml");
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

    #[test]
    fn flags_win_over_the_file() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let cfg = parse(
            "netns = [\"cfgns\"]\ninterval = \"5s\"\nmax_flows = 1000\nlisten = \"127.0.0.1:9999\"\n[labels]\nv4_prefix = 16\nmax_series = 7\n",
        )
        .unwrap();
        let c = Cli::try_parse_from([
            "rttscope",
            "observe",
            "--netns",
            "clins",
            "--v4-prefix",
            "20",
            "--interval",
            "2s",
        ])
        .unwrap();
        let Command::Observe(mut a) = c.command else {
            panic!()
        };
        let explicit: HashSet<String> = ["netns", "v4_prefix", "interval"]
            .into_iter()
            .map(String::from)
            .collect();
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
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let cfg =
            parse("views = [\"tcp\", \"sampler\"]\nifaces = [\"ns1:eth0\"]\nsample_every = 8\n")
                .unwrap();
        let Command::Observe(mut a) = Cli::try_parse_from(["rttscope", "observe"])
            .unwrap()
            .command
        else {
            panic!()
        };
        merge(&cfg, &mut a, &HashSet::new());
        assert_eq!(a.sample_every, 8);
        assert_eq!(a.ifaces.len(), 1);
        assert_eq!(
            a.view,
            Some(vec![
                crate::observe::View::Tcp,
                crate::observe::View::Sampler
            ])
        );
    }

    #[test]
    fn check_config_needs_a_file() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        assert!(Cli::try_parse_from(["rttscope", "observe", "--check-config"]).is_err());
        let c = Cli::try_parse_from(["rttscope", "observe", "--listen"]).unwrap();
        let Command::Observe(a) = c.command else {
            panic!()
        };
        assert_eq!(
            a.listen,
            Some("127.0.0.1:9464".parse().unwrap()),
            "default bind is loopback"
        );
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

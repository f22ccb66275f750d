//! The command line: one subcommand per module.
use clap::{Parser, Subcommand};

/// `rttscope --version`: the version, the commit it was built from, the BPF loaders and cargo
/// features built in, and whether the binary is static (build.rs; results carry the same as
/// their `tool`, `crate::analysis::results::Tool::current`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RTTSCOPE_GIT_COMMIT"),
    "; loaders: ",
    env!("RTTSCOPE_LOADERS"),
    "; features: ",
    env!("RTTSCOPE_FEATURES"),
    "; linkage: ",
    env!("RTTSCOPE_LINKAGE"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "rttscope",
    version = VERSION,
    about = "Round-trip time seen three ways, side by side: TCP's own RTT, a cloud-style packet sampler, and active probes",
    propagate_version = true
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: observe's options (the largest variant, ~500 bytes) are not worth
// a Box and the matches on it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Observe RTT passively, generating no traffic: TCP view, sampler view (--iface), cloud buckets, Prometheus daemon (--listen).
    // boxed: observe's options are several times the size of every other command's
    Observe(Box<crate::cmd::observe::ObserveArgs>),
    /// Bucket RTT samples like the cloud metric (Cloud Monitoring distribution) and show its percentiles next to exact ones.
    Bucket(crate::cmd::bucket::BucketArgs),
    /// Chart a saved result (PNG or SVG): RTT over time, CDF, or a sweep with percentile bands.
    Chart(crate::cmd::chart::ChartArgs),
    /// Answer TCP and UDP request/response probes (the responder for `probe tcp-rr|udp-rr`).
    Serve(crate::cmd::serve::ServeArgs),
    /// Active probes: request/response (netperf TCP_RR/UDP_RR), ICMP echo (ping), irtt.
    Probe(crate::cmd::probe::ProbeArgs),
    /// All views side by side for the same flows and window: TCP, sampler, cloud buckets, probes; --explain.
    Compare(crate::cmd::compare::CompareArgs),
    /// What this kernel allows (feature probes) and which path each view takes here; non-zero exit if observe cannot run.
    Features(crate::cmd::features::FeaturesArgs),
    /// Run a scenario (delayed ACKs, loss, RTT steps, bufferbloat, probe intervals) on a testbed of network namespaces with emulated links, and record every view.
    #[cfg(feature = "lab")]
    Lab(crate::lab::LabArgs),
    /// Write the man pages into a directory (for packagers).
    #[command(hide = true)]
    Man(crate::cmd::manual::ManArgs),
    /// Print a shell completion script (for packagers).
    #[command(hide = true)]
    Completions(crate::cmd::manual::CompletionsArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `--version` names the commit, the loaders and features built in and the linkage.
    #[test]
    fn version_names_commit_and_loaders() {
        let v = Cli::command().render_version();
        assert!(
            v.starts_with(&format!("rttscope {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{v}"
        );
        let commit = env!("RTTSCOPE_GIT_COMMIT");
        assert!(
            commit == "unknown"
                || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{commit}"
        );
        for l in crate::views::LoaderKind::available() {
            assert!(v.contains(l.as_str()), "{v} lacks {l}");
        }
        if !cfg!(feature = "aya") {
            assert!(!v.contains("aya"), "{v}");
        }
        // the features built in, and the linkage the target says
        let features = v.split("; features: ").nth(1).unwrap_or_default();
        assert_eq!(
            features.contains("lab"),
            cfg!(feature = "lab"),
            "{v}: lab feature"
        );
        let linkage = if cfg!(target_feature = "crt-static") {
            "; linkage: static)"
        } else {
            "; linkage: dynamic)"
        };
        assert!(v.trim_end().ends_with(linkage), "{v}");
    }

    /// `--loader` (and RTTSCOPE_LOADER) only where there is a choice: in a
    /// build with aya.
    #[test]
    fn loader_option_only_with_aya() {
        for sub in ["observe", "compare"] {
            let cli = Cli::command();
            let has = cli
                .find_subcommand(sub)
                .unwrap()
                .get_arguments()
                .any(|a| a.get_id() == "loader");
            assert_eq!(has, cfg!(feature = "aya"), "{sub}");
        }
    }

    /// What a bare number means for a duration option.
    #[derive(Clone, Copy, Debug)]
    enum Bare {
        /// netperf's -l, ping's -i -W -w
        Seconds,
        /// netperf's -w (whose own `m` is milliseconds and `u` microseconds)
        NetperfMs,
        /// no tool habit: a unit is required
        NeedsUnit,
    }

    /// Every duration option of every command: (argv before the flag, the
    /// flag, clap's id, what a bare number means).
    const DURATION_FLAGS: &[(&[&str], &str, &str, Bare)] = &[
        (&["probe", "tcp-rr", "h"], "-l", "length", Bare::Seconds),
        (&["probe", "tcp-rr", "h"], "-w", "interval", Bare::NetperfMs),
        (&["probe", "tcp-rr", "h"], "-W", "timeout", Bare::Seconds),
        (&["probe", "udp-rr", "h"], "-l", "length", Bare::Seconds),
        (&["probe", "udp-rr", "h"], "-w", "interval", Bare::NetperfMs),
        (&["probe", "udp-rr", "h"], "-W", "timeout", Bare::Seconds),
        (&["probe", "icmp", "h"], "-i", "interval", Bare::Seconds),
        (&["probe", "icmp", "h"], "-W", "timeout", Bare::Seconds),
        (&["probe", "icmp", "h"], "-w", "deadline", Bare::Seconds),
        (
            &["probe", "tcp-connect", "h:1"],
            "-i",
            "interval",
            Bare::Seconds,
        ),
        (
            &["probe", "tcp-connect", "h:1"],
            "-W",
            "timeout",
            Bare::Seconds,
        ),
        (
            &["probe", "tcp-connect", "h:1"],
            "-w",
            "deadline",
            Bare::Seconds,
        ),
        (&["probe", "irtt", "h"], "-i", "interval", Bare::NeedsUnit),
        (&["probe", "irtt", "h"], "-d", "duration", Bare::NeedsUnit),
        (&["compare", "h"], "-l", "length", Bare::Seconds),
        (&["compare", "h"], "-w", "interval", Bare::NetperfMs),
        (&["observe"], "--interval", "interval", Bare::NeedsUnit),
        (&["observe"], "--duration", "duration", Bare::NeedsUnit),
        (
            &["observe"],
            "--pending-timeout",
            "pending_timeout",
            Bare::NeedsUnit,
        ),
        (
            &["observe"],
            "--cloud-period",
            "cloud_period",
            Bare::NeedsUnit,
        ),
        (
            &["observe"],
            "--series-idle",
            "series_idle",
            Bare::NeedsUnit,
        ),
        (
            &["observe"],
            "--otlp-interval",
            "otlp_interval",
            Bare::NeedsUnit,
        ),
        (
            &["observe"],
            "--otlp-timeout",
            "otlp_timeout",
            Bare::NeedsUnit,
        ),
        (
            &["serve"],
            "--idle-timeout",
            "idle_timeout",
            Bare::NeedsUnit,
        ),
        (&["bucket", "f"], "--period", "period", Bare::NeedsUnit),
        #[cfg(feature = "lab")]
        (
            &["lab", "delayed-ack", "--hold"],
            "--hold-for",
            "hold_for",
            Bare::NeedsUnit,
        ),
    ];

    /// Parse `rttscope PREFIX FLAG VALUE`: the duration clap stored, or the
    /// refusal's text.
    fn duration_of(prefix: &[&str], flag: &str, id: &str, value: &str) -> Result<Duration, String> {
        let argv: Vec<&str> = ["rttscope"]
            .iter()
            .chain(prefix)
            .chain([flag, value].iter())
            .copied()
            .collect();
        let m = Cli::command()
            .try_get_matches_from(&argv)
            .map_err(|e| e.to_string())?;
        let mut sub = &m;
        while let Some((_, s)) = sub.subcommand() {
            sub = s;
        }
        Ok(*sub.get_one::<Duration>(id).expect("a duration"))
    }

    /// The grammar table of docs/usage.md, flag by flag: units everywhere,
    /// a bare number as the tool each option stands in for reads it, a lone
    /// `m` refused with a sentence (but in netperf's -w), garbage refused.
    #[test]
    fn duration_grammar_table() {
        let ms = Duration::from_millis;
        for &(prefix, flag, id, bare) in DURATION_FLAGS {
            let d = |v: &str| duration_of(prefix, flag, id, v);
            let what = format!("{} {flag}", prefix.join(" "));
            for (v, want) in [
                ("250ms", ms(250)),
                ("100us", Duration::from_micros(100)),
                ("1.5s", ms(1500)),
                ("2min", Duration::from_secs(120)),
                ("1h", Duration::from_secs(3600)),
                ("5000ns", Duration::from_micros(5)),
            ] {
                assert_eq!(d(v), Ok(want), "{what} {v}");
            }
            match bare {
                Bare::Seconds => {
                    assert_eq!(d("3"), Ok(Duration::from_secs(3)), "{what} 3");
                    assert_eq!(d("0.2"), Ok(ms(200)), "{what} 0.2");
                }
                Bare::NetperfMs => {
                    assert_eq!(d("3"), Ok(ms(3)), "{what} 3");
                    assert_eq!(d("3m"), Ok(ms(3)), "{what} 3m (netperf's ms)");
                    assert_eq!(d("50u"), Ok(Duration::from_micros(50)), "{what} 50u");
                    assert_eq!(d("-1"), Ok(Duration::ZERO), "{what} -1");
                }
                Bare::NeedsUnit => {
                    let e = d("3").unwrap_err();
                    assert!(e.contains("'3' has no unit: write 3s"), "{what} 3: {e}");
                }
            }
            if !matches!(bare, Bare::NetperfMs) {
                let e = d("3m").unwrap_err();
                assert!(
                    e.contains("'3m' is ambiguous: write 3ms for milliseconds or 3min for minutes"),
                    "{what} 3m: {e}"
                );
            }
            for bad in ["fast", "-5s", "1..2s", "3x"] {
                assert!(d(bad).is_err(), "{what} {bad} must be refused");
            }
        }
    }

    /// `compare` takes netperf's -l -w -b -r exactly as `probe tcp-rr` does:
    /// same long names, value names, defaults and help.
    #[test]
    fn compare_and_probe_share_netperf_options() {
        let cli = Cli::command();
        let probe = cli
            .find_subcommand("probe")
            .and_then(|p| p.find_subcommand("tcp-rr"))
            .unwrap();
        let compare = cli.find_subcommand("compare").unwrap();
        for short in ['l', 'w', 'b', 'r'] {
            let arg = |c: &clap::Command| {
                let a = c
                    .get_arguments()
                    .find(|a| a.get_short() == Some(short))
                    .unwrap_or_else(|| panic!("-{short}"))
                    .clone();
                (
                    a.get_long().map(str::to_string),
                    a.get_value_names().map(|v| v.to_vec()),
                    a.get_default_values().to_vec(),
                    a.get_help().map(|h| h.to_string()),
                )
            };
            assert_eq!(arg(probe), arg(compare), "-{short}");
        }
    }

    /// Every duration option's help says what a bare number means there.
    #[test]
    fn duration_help_says_what_a_bare_number_means() {
        for &(prefix, flag, id, bare) in DURATION_FLAGS {
            let mut cmd = Cli::command();
            for w in prefix.iter().filter(|w| {
                [
                    "probe",
                    "tcp-rr",
                    "udp-rr",
                    "icmp",
                    "tcp-connect",
                    "irtt",
                    "compare",
                    "observe",
                    "serve",
                    "bucket",
                    "lab",
                ]
                .contains(w)
            }) {
                cmd = cmd.find_subcommand(w).unwrap().clone();
            }
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let want = match bare {
                Bare::Seconds => "bare number is seconds",
                Bare::NetperfMs => "bare number is milliseconds",
                Bare::NeedsUnit => "with a unit",
            };
            assert!(
                help.contains(want),
                "{} {flag}: '{help}' lacks '{want}'",
                prefix.join(" ")
            );
        }
    }

    /// Every duration option of the command line is in the table above
    /// (a new one must say what its bare number means).
    #[test]
    fn every_duration_option_is_in_the_grammar_table() {
        fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                if a.get_value_names()
                    .is_some_and(|v| v.iter().any(|n| n == "DURATION"))
                {
                    out.push(format!("{} {}", path.join(" "), a.get_id()));
                }
            }
            for s in cmd.get_subcommands() {
                path.push(s.get_name().to_string());
                walk(s, path, out);
                path.pop();
            }
        }
        let mut found = Vec::new();
        walk(&Cli::command(), &mut Vec::new(), &mut found);
        let table: Vec<String> = DURATION_FLAGS
            .iter()
            .map(|(p, _, id, _)| {
                let words: Vec<&str> = p
                    .iter()
                    .copied()
                    .filter(|w| {
                        !w.starts_with('-') && !["h", "h:1", "f", "delayed-ack"].contains(w)
                    })
                    .collect();
                format!("{} {id}", words.join(" "))
            })
            .collect();
        for f in &found {
            assert!(
                table.contains(f),
                "{f} takes a DURATION but is not in DURATION_FLAGS"
            );
        }
        assert_eq!(found.len(), table.len(), "{found:?}");
    }

    use crate::cmd::observe::config::{self, Explicit};
    use crate::cmd::observe::ObserveArgs;
    use clap::FromArgMatches;
    use std::time::Duration;

    /// What `main` does, from a given argv (never the process's): parse once,
    /// then the observe flags and the options clap saw given.
    fn observe_from(cmd: clap::Command, argv: &[&str]) -> (ObserveArgs, Explicit) {
        let m = cmd
            .try_get_matches_from(["rttscope", "observe"].iter().chain(argv))
            .unwrap();
        let Command::Observe(args) = Cli::from_arg_matches(&m).unwrap().command else {
            panic!("not observe")
        };
        (
            *args,
            Explicit::from_matches(m.subcommand_matches("observe").unwrap()),
        )
    }

    fn file() -> config::ObserveConfig {
        config::parse("interval = \"5s\"\nmax_flows = 1000\nsample_every = 8\n").unwrap()
    }

    #[test]
    fn config_flag_on_the_command_line_wins_over_the_file() {
        let (mut a, explicit) = observe_from(Cli::command(), &["--interval", "2s"]);
        assert_eq!(explicit.merged_ids(), ["interval"]);
        config::merge(&file(), &mut a, &explicit);
        assert_eq!(a.interval, Duration::from_secs(2));
        assert_eq!(a.max_flows, 1000);
    }

    #[test]
    fn config_flag_equal_to_its_default_still_wins_over_the_file() {
        // 1s, 16384 and 1 are the defaults: given, they still win.
        let argv = [
            "--interval",
            "1s",
            "--max-flows",
            "16384",
            "--sample-every",
            "1",
        ];
        let (mut a, explicit) = observe_from(Cli::command(), &argv);
        assert_eq!(
            explicit.merged_ids(),
            ["interval", "sample_every", "max_flows"]
        );
        config::merge(&file(), &mut a, &explicit);
        assert_eq!(a.interval, Duration::from_secs(1));
        assert_eq!(a.max_flows, 16384);
        assert_eq!(a.view_opts.sampler.sample_every, 1);
    }

    #[test]
    fn config_file_wins_over_a_default_not_given() {
        let (mut a, explicit) = observe_from(Cli::command(), &["--quiet"]);
        assert_eq!(explicit.merged_ids(), ["quiet"]);
        config::merge(&file(), &mut a, &explicit);
        assert_eq!(a.interval, Duration::from_secs(5));
        assert_eq!(a.max_flows, 1000);
        assert_eq!(a.view_opts.sampler.sample_every, 8);
    }

    #[cfg(feature = "aya")]
    #[test]
    fn config_environment_variable_counts_as_given() {
        // --loader reads RTTSCOPE_LOADER. So that no other test (which may
        // parse concurrently) sees a changed RTTSCOPE_LOADER, this test sets
        // the same arg's env under a name of its own.
        let cli = Cli::command();
        let loader = cli
            .find_subcommand("observe")
            .unwrap()
            .get_arguments()
            .find(|a| a.get_id() == "loader")
            .unwrap();
        assert_eq!(
            loader.get_env(),
            Some(std::ffi::OsStr::new("RTTSCOPE_LOADER"))
        );
        let with_env = |id: &'static str, var: &'static str| {
            Cli::command().mut_subcommand("observe", move |s| s.mut_arg(id, move |a| a.env(var)))
        };
        // Not set: the default does not count.
        let (_, explicit) = observe_from(with_env("loader", "RTTSCOPE_TEST_13_LOADER"), &[]);
        assert!(!explicit.contains("loader"));
        std::env::set_var(
            "RTTSCOPE_TEST_13_LOADER",
            crate::views::LoaderKind::DEFAULT.to_string(),
        );
        let (_, explicit) = observe_from(with_env("loader", "RTTSCOPE_TEST_13_LOADER"), &[]);
        assert!(
            explicit.contains("loader"),
            "env-set, even to the default: given"
        );
        // No option the file sets reads the environment today; were one to,
        // its env value wins over the file like a flag (here equal to the
        // default, which the file would otherwise replace).
        std::env::set_var("RTTSCOPE_TEST_13_INTERVAL", "1s");
        let (mut a, explicit) =
            observe_from(with_env("interval", "RTTSCOPE_TEST_13_INTERVAL"), &[]);
        assert!(explicit.contains("interval"));
        config::merge(&file(), &mut a, &explicit);
        assert_eq!(a.interval, Duration::from_secs(1), "env wins over the file");
        assert_eq!(a.max_flows, 1000, "the file still wins over defaults");
    }
}

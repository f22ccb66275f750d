//! The command line: one subcommand per module.
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "rttscope",
    version,
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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Observe RTT passively, generating no traffic: TCP view, sampler view (--iface), cloud buckets, Prometheus daemon (--listen).
    Observe(crate::cmd::observe::ObserveArgs),
    /// Bucket RTT samples like the cloud metric (Cloud Monitoring distribution) and show its percentiles next to exact ones.
    Bucket(crate::cmd::bucket::BucketArgs),
    /// Chart a saved result (PNG or SVG): RTT over time, CDF, or a sweep with percentile bands.
    Chart(crate::sinks::chart::ChartArgs),
    /// Answer TCP and UDP request/response probes (the responder for `probe tcp-rr|udp-rr`).
    Serve(crate::cmd::serve::ServeArgs),
    /// Active probes: request/response (netperf TCP_RR/UDP_RR), ICMP echo (ping), irtt.
    Probe(crate::cmd::probe::ProbeArgs),
    /// All views side by side for the same flows and window: TCP, sampler, cloud buckets, probes; --explain.
    Compare(crate::cmd::compare::CompareArgs),
    /// Rebuild the seeds' experiments on a testbed of namespaces (delay, loss, bottleneck) and record every view.
    #[cfg(feature = "lab")]
    Lab(crate::lab::LabArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
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
            args,
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
        assert_eq!(a.sample_every, 1);
    }

    #[test]
    fn config_file_wins_over_a_default_not_given() {
        let (mut a, explicit) = observe_from(Cli::command(), &["--quiet"]);
        assert_eq!(explicit.merged_ids(), ["quiet"]);
        config::merge(&file(), &mut a, &explicit);
        assert_eq!(a.interval, Duration::from_secs(5));
        assert_eq!(a.max_flows, 1000);
        assert_eq!(a.sample_every, 8);
    }

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

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use rttscope::cli::{Cli, Command};
use rttscope::cmd::observe::config::Explicit;

fn main() -> ExitCode {
    // Parse once; the matches also say which options were given (command
    // line or environment), which `observe --config` needs.
    let matches = Cli::command().get_matches();
    let cli =
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    rttscope::logging::init(cli.verbose);
    let result = match cli.command {
        Command::Observe(args) => {
            let explicit = matches
                .subcommand_matches("observe")
                .map(Explicit::from_matches)
                .unwrap_or_default();
            rttscope::cmd::observe::run_with(*args, &explicit)
        }
        Command::Bucket(args) => rttscope::cmd::bucket::run(args),
        Command::Chart(args) => rttscope::cmd::chart::run(args),
        Command::Serve(args) => rttscope::cmd::serve::run(args),
        Command::Probe(args) => rttscope::cmd::probe::run(args),
        Command::Compare(args) => rttscope::cmd::compare::run(args),
        Command::Features(args) => rttscope::cmd::features::run(args),
        #[cfg(feature = "lab")]
        Command::Lab(args) => rttscope::cmd::lab::env::run(args),
        Command::Man(args) => rttscope::cmd::manual::man(args, Cli::command()),
        Command::Completions(args) => rttscope::cmd::manual::completions(args, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rttscope: {}", rttscope::error::sentence(&e));
            ExitCode::FAILURE
        }
    }
}

use std::process::ExitCode;

use clap::Parser;
use rttscope::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    rttscope::logging::init(cli.verbose);
    let result = match cli.command {
        Command::Observe(args) => rttscope::cmd::observe::run(args),
        Command::Bucket(args) => rttscope::cmd::bucket::run(args),
        Command::Chart(args) => rttscope::sinks::chart::run(args),
        Command::Serve(args) => rttscope::active::serve_main(args),
        Command::Probe(args) => rttscope::active::probe_main(args),
        Command::Compare(args) => rttscope::cmd::compare::run(args),
        Command::Lab(args) => rttscope::lab::env::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rttscope: {}", rttscope::error::sentence(&e));
            ExitCode::FAILURE
        }
    }
}

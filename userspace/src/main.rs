use std::process::ExitCode;

use clap::Parser;
use rttscope::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    rttscope::logging::init(cli.verbose);
    let result = match cli.command {
        Command::Observe(args) => rttscope::observe::run(args),
        Command::Lab(args) => rttscope::lab::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rttscope: {}", rttscope::error::sentence(&e));
            ExitCode::FAILURE
        }
    }
}

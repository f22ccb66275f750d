//! `tracing` set-up; libbpf's own messages are routed into it.
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: never escape codes in a log file or
        // the journal (NO_COLOR also turns it off).
        .with_ansi(colour(std::io::stderr().is_terminal()))
        .try_init();
    #[cfg(feature = "libbpf")]
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, libbpf_print)));
}

/// Whether log lines carry ANSI colour: on a terminal, unless NO_COLOR is set.
fn colour(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(feature = "libbpf")]
fn libbpf_print(level: libbpf_rs::PrintLevel, msg: String) {
    let msg = msg.trim_end();
    match level {
        // libbpf's warnings (a verifier log on a failed load, for example) are
        // details behind the one-sentence error: shown with -v.
        libbpf_rs::PrintLevel::Warn => tracing::info!(target: "libbpf", "{msg}"),
        libbpf_rs::PrintLevel::Info => tracing::info!(target: "libbpf", "{msg}"),
        libbpf_rs::PrintLevel::Debug => tracing::debug!(target: "libbpf", "{msg}"),
    }
}

#[cfg(test)]
mod tests {
    /// Never colour into a pipe, a file or the journal.
    #[test]
    fn no_colour_off_a_terminal() {
        assert!(!super::colour(false));
    }
}

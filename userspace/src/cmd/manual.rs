//! `rttscope man DIR` and `rttscope completions SHELL` (both hidden): the man
//! pages and the shell completions the packages install (scripts/package.sh),
//! generated from the same clap definition the binary parses with (the caller passes it:
//! `Cli::command()`, so this command layer does not reach up into the CLI's).
use std::path::PathBuf;

use anyhow::{Context, Result};

/// Write the man pages: rttscope.1 and one per subcommand (rttscope-observe.1, ...).
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    pub dir: PathBuf,
}

/// Print a shell's completion script for rttscope on stdout.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    pub shell: clap_complete::Shell,
}

pub fn man(args: ManArgs, cli: clap::Command) -> Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    clap_mangen::generate_to(cli, &args.dir)
        .with_context(|| format!("writing man pages into {}", args.dir.display()))
}

pub fn completions(args: CompletionsArgs, mut cli: clap::Command) -> Result<()> {
    clap_complete::generate(args.shell, &mut cli, "rttscope", &mut std::io::stdout());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    /// Every visible subcommand has its page; the hidden ones have none.
    #[test]
    fn man_pages_for_each_visible_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        man(
            ManArgs {
                dir: dir.path().to_path_buf(),
            },
            Cli::command(),
        )
        .unwrap();
        let page = std::fs::read_to_string(dir.path().join("rttscope.1")).unwrap();
        assert!(page.contains(".TH rttscope 1"), "{page}");
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
        {
            let p = dir.path().join(format!("rttscope-{}.1", sub.get_name()));
            assert!(p.exists(), "{} missing", p.display());
        }
        assert!(!dir.path().join("rttscope-man.1").exists());
        assert!(!dir.path().join("rttscope-completions.1").exists());
    }
}

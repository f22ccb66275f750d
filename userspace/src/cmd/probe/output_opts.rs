//! The output options every measuring command shares (`--json`, `--format`):
//! probe's request/response and ICMP probes, irtt, and compare.
use anyhow::Result;
use clap::Args;

/// The output options every measuring command shares: the result document and CSV.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputOpts {
    /// Save the result document (settings, counts, summary, every sample; docs/results.md) to
    /// FILE; `-` prints it on standard output, and what would have been printed goes to stderr.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// What to print: the tool's own summary (text), or csv: one row per sample,
    /// `view,t_us,rtt_us` (microseconds since the start, RTT in microseconds).
    #[arg(long, value_enum, default_value = "text")]
    pub format: PrintFormat,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrintFormat {
    #[default]
    Text,
    Csv,
}

impl OutputOpts {
    /// Whether the document goes to standard output (the text then goes to stderr).
    pub fn json_to_stdout(&self) -> bool {
        self.json.as_deref() == Some(std::path::Path::new("-"))
    }

    /// Print `text` (or the document's samples as CSV with `--format csv`) and write the document
    /// with `--json`.
    pub fn emit(&self, doc: &crate::analysis::results::RunResult, text: &str) -> Result<()> {
        use std::io::Write;
        let printed = match self.format {
            PrintFormat::Text => text.to_string(),
            PrintFormat::Csv => doc.samples_csv(),
        };
        if self.json_to_stdout() {
            std::io::stderr().write_all(printed.as_bytes())?;
        } else {
            std::io::stdout().write_all(printed.as_bytes())?;
        }
        if let Some(path) = &self.json {
            doc.write_to(path)?;
        }
        Ok(())
    }
}

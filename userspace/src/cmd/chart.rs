//! `rttscope chart`: read a saved result (or any output `bucket` reads) and draw it to PNG or
//! SVG through [`crate::sinks::chart`].
use std::path::PathBuf;

use clap::Args;

use crate::analysis::input::load_result;
use crate::sinks::chart::{render_file, ChartKind, ChartOptions, CloudCdf};

#[derive(Debug, Clone, Args)]
pub struct ChartArgs {
    /// A saved rttscope result (JSON).
    #[arg(value_name = "RESULT.json")]
    pub result: PathBuf,
    /// Output file; the extension chooses the format: .png or .svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// What to draw.
    #[arg(long, value_enum, default_value = "auto")]
    pub kind: ChartKind,
    /// Only these views (repeatable) [default: all].
    #[arg(long = "view", value_name = "NAME")]
    pub views: Vec<String>,
    /// Chart title [default: the result's title or command].
    #[arg(long)]
    pub title: Option<String>,
    /// Image width in pixels.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(200..=8000))]
    pub width: u32,
    /// Image height in pixels.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u32).range(150..=8000))]
    pub height: u32,
    /// Also draw the cloud's distribution from a Cloud Monitoring file (projects.timeSeries.list
    /// response; docs/cloud.md) in the CDF: its bucket counts, joined linearly inside each bucket.
    #[arg(long, value_name = "FILE")]
    pub cloud: Option<PathBuf>,
}

pub fn run(args: ChartArgs) -> anyhow::Result<()> {
    let result = load_result(&args.result)?;
    let opts = ChartOptions {
        kind: args.kind,
        views: args.views,
        title: args.title,
        size: (args.width, args.height),
        cloud: args.cloud.as_deref().map(CloudCdf::from_file).transpose()?,
    };
    render_file(&result, &opts, &args.output)?;
    println!("wrote {}", args.output.display());
    Ok(())
}

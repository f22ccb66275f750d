//! A view as the registry lists it: one [`ViewDef`] per view, a value its folder exports
//! (`<view>::DEF`), and what a view asked for becomes before it is attached ([`ViewConfig`]).
//! The layers above ask the registry (`views::VIEWS`) and never name a view.
use std::any::Any;

use anyhow::Result;

use crate::views::features::{Features, ViewPlan};
use crate::views::scope::{OnTestbed, Scope};
use crate::views::view::View;
use crate::views::{LoaderKind, ViewKind};

/// Every view's own clap options, each found by its view ([`own`]).
pub type Opts<'a> = [&'a dyn Any];

/// A view asked for, to be attached.
pub type Asked = Box<dyn ViewConfig>;

/// One view: its name and roles ([`ViewKind`], whose entry the records' vocabulary keeps), how
/// it is configured by each command, and what it will do on a kernel.
pub struct ViewDef {
    /// Which view this is (its name, and how records, tables and the exporter show it).
    pub kind: ViewKind,
    /// Its config in `observe` from observe's shared options and the views' own options
    /// (`own`: every view's clap options, [`own`] finds its own).
    pub observe: fn(own: &Opts<'_>, scope: &Scope<'_>) -> Result<Asked>,
    /// Whether `observe` runs it when `--view` does not say (its own options ask for it).
    pub by_default: fn(own: &[&dyn Any]) -> bool,
    /// Its config in `compare` around the responder's `port` (None: not attached there).
    pub compare: fn(own: &Opts<'_>, port: u16) -> Result<Option<Asked>>,
    /// What it will do on a kernel with these features (`rttscope features`).
    pub plan: fn(&Features) -> ViewPlan,
    /// Its options of observe on the lab's testbed ([`OnTestbed`]): the client's and the
    /// server's namespace, the interface of each, the sampling rate of a view that samples.
    pub on_testbed: fn(netns: [&str; 2], iface: &str, sample_every: u32) -> OnTestbed,
    /// Its hooks on that testbed and what its columns hold, in words (the lab's result.json and
    /// the legend of its SUMMARY.md).
    pub testbed_words: fn(iface: &str, sample_every: u32) -> (String, String),
    /// The type of its value in observe's start record (docs/observe-record.schema.json);
    /// None: any JSON.
    pub start_schema: Option<fn(&mut schemars::SchemaGenerator) -> schemars::Schema>,
    /// Daemon mode's log line when it is not asked for, saying how to ask (None: nothing).
    pub not_requested: Option<&'static str>,
}

/// A view's own clap options among every view's (None: it has none there).
pub fn own<'a, T: 'static>(own: &[&'a dyn Any]) -> Option<&'a T> {
    own.iter().find_map(|a| a.downcast_ref::<T>())
}

/// How the session attaches every view.
#[derive(Debug, Clone, Copy)]
pub struct AttachOpts {
    pub loader: LoaderKind,
    /// Build rows.
    pub keep_rows: bool,
    /// Keep closed flows for the end summary.
    pub keep_summary: bool,
    /// `--label-workload`.
    pub workloads: bool,
}

impl AttachOpts {
    /// The loader asked for, or the one sentence for a loader this binary was built without.
    pub fn built_loader(&self) -> Result<LoaderKind> {
        if !self.loader.built_in() {
            return Err(crate::views::passive::not_built(self.loader));
        }
        Ok(self.loader)
    }
}

/// A view asked for, with its settings: what attaches it.
pub trait ViewConfig: Any {
    /// Which view this is.
    fn def(&self) -> &'static ViewDef;
    /// Load it with its raw-sample ring buffer on (a view without raw samples: nothing).
    fn set_raw(&mut self);
    /// Load and attach it with the chosen loader, to be read by the session. Fails with one
    /// clear sentence (also when that loader is not built into this binary).
    fn attach(&self, how: &AttachOpts) -> Result<Box<dyn View>>;
    /// The settings themselves (the view's own code and tests).
    fn as_any(&self) -> &dyn Any;
}

/// Never: the options of a view that is not in compare.
pub fn not_in_compare(_: &[&dyn Any], _: u16) -> Result<Option<Box<dyn ViewConfig>>> {
    Ok(None)
}

/// Never: a view `observe` runs only when `--view` names it.
pub fn not_by_default(_: &[&dyn Any]) -> bool {
    false
}

//! The passive views, one folder each (C side: `bpf/<view>.bpf.c`), behind
//! one interface ([`passive`]), each loadable by two loaders:
//!
//! - libbpf (feature `libbpf`, the default): libbpf-rs over C libbpf, the
//!   reference CO-RE loader;
//! - aya (feature `aya`): aya 0.14, a pure-Rust loader with no C libbpf.
//!
//! Both load the same compiled objects (`$OUT_DIR/<name>.bpf.o` from `bpf/`)
//! through one loader layer ([`loader`]: one `Object` trait, a libbpf and an
//! aya implementation), against which each view's attach and read logic is
//! written once (`<view>/attach.rs`); both decode with the same generated
//! types (`crate::bpf`). See docs/loaders.md for when to choose which. This
//! module is the registry: a view is registered by its `pub mod` line and
//! its `attach_*` function.
use anyhow::Result;

pub use passive::{LoaderKind, PassiveView, RawEvent, RawSample, RawSamples, RingSource, ViewKind};

#[cfg(feature = "example-view")]
pub mod count;
pub mod fine;

pub(crate) mod loader;
pub mod names;
pub mod passive;
pub mod probe;
pub mod sampler;
pub mod tcp;
pub mod view;

#[cfg(not(any(feature = "libbpf", feature = "aya")))]
compile_error!("build at least one BPF loader: feature `libbpf` (default) or `aya`");

/// A view asked for, with its settings: the registry (one variant per view,
/// in the order the session attaches and reads them).
pub enum ViewConfig {
    Tcp(tcp::TcpViewConfig),
    Sampler(Vec<sampler::IfaceSpec>, sampler::SamplerConfig),
    /// The example view (feature `example-view`).
    #[cfg(feature = "example-view")]
    Count(count::CountConfig),
}

impl ViewConfig {
    /// Which view this is.
    pub fn kind(&self) -> ViewKind {
        match self {
            ViewConfig::Tcp(_) => ViewKind::Tcp,
            ViewConfig::Sampler(..) => ViewKind::Sampler,
            #[cfg(feature = "example-view")]
            ViewConfig::Count(_) => ViewKind::Count,
        }
    }

    /// Load it with its raw-sample ring buffer on.
    pub fn set_raw(&mut self) {
        match self {
            ViewConfig::Tcp(c) => c.raw = true,
            ViewConfig::Sampler(_, c) => c.raw = true,
            // none to turn on: its raw_samples() says so
            #[cfg(feature = "example-view")]
            ViewConfig::Count(_) => {}
        }
    }

    /// Load and attach it with the chosen loader, to be read by the session
    /// (`keep_rows`: build rows; `keep_summary`: keep closed flows for the
    /// end summary; `workloads`: `--label-workload`).
    pub fn attach(
        &self,
        loader: LoaderKind,
        keep_rows: bool,
        keep_summary: bool,
        workloads: bool,
    ) -> Result<Box<dyn view::View>> {
        Ok(match self {
            ViewConfig::Tcp(c) => Box::new(tcp::track::TcpSession::new(
                attach_tcp(loader, c)?,
                c,
                keep_rows,
                keep_summary,
            )),
            ViewConfig::Sampler(ifaces, c) => {
                crate::sys::preflight::require_bpf_caps()?;
                c.validate()?;
                let v = attach_sampler(loader, ifaces, c.clone())?;
                Box::new(sampler::track::SamplerSession::new(v, workloads))
            }
            #[cfg(feature = "example-view")]
            ViewConfig::Count(c) => attach_count(loader, c)?,
        })
    }
}

/// Load and attach the TCP view with the chosen loader. Fails with one
/// clear sentence (also when that loader is not built into this binary).
pub fn attach_tcp(kind: LoaderKind, cfg: &tcp::TcpViewConfig) -> Result<Box<dyn tcp::TcpView>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(tcp::attach::Tcp::attach(kind, cfg)?))
}

/// Load one copy of the sampler's programs per interface with the chosen
/// loader and attach them at ingress and egress (the build without BPF
/// atomics where the kernel refuses them). Fails with one clear sentence
/// (also when that loader is not built into this binary).
pub fn attach_sampler(
    kind: LoaderKind,
    ifaces: &[sampler::IfaceSpec],
    cfg: sampler::SamplerConfig,
) -> Result<Box<dyn sampler::SamplerView>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(sampler::attach::Sampler::attach(
        kind, ifaces, cfg,
    )?))
}

/// Load and attach the example view (feature `example-view`) with the chosen
/// loader. Fails with one clear sentence (also when that loader is not built
/// into this binary).
#[cfg(feature = "example-view")]
pub fn attach_count(kind: LoaderKind, cfg: &count::CountConfig) -> Result<Box<dyn view::View>> {
    if !kind.built_in() {
        return Err(passive::not_built(kind));
    }
    Ok(Box::new(count::Count::attach(kind, cfg)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_loader_is_one_sentence() {
        for k in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if k.built_in() {
                continue;
            }
            let e = attach_tcp(k, &tcp::TcpViewConfig::default()).err().unwrap();
            let s = e.to_string();
            assert!(s.contains("built without the"), "{s}");
            assert!(!s.contains('\n'), "{s}");
        }
    }

    #[test]
    fn missing_sampler_loader_is_one_sentence() {
        for k in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if k.built_in() {
                continue;
            }
            let e = attach_sampler(k, &[], sampler::SamplerConfig::default())
                .err()
                .unwrap();
            let s = e.to_string();
            assert!(s.contains("built without the"), "{s}");
        }
    }
}

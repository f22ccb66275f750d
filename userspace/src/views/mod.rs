//! One loader interface, two implementations.
//!
//! Everything above this module (observe, reports, JSON) talks to a loaded
//! view through [`TcpLoader`] and [`RawSamples`]; below it sit
//!
//! - `libbpf` (feature `libbpf`, the default): libbpf-rs over C libbpf, the
//!   reference CO-RE loader ([`crate::views::tcp::TcpView`]);
//! - `aya` (feature `aya`): aya 0.14, a pure-Rust loader with no C libbpf.
//!
//! Both load the same compiled objects (`$OUT_DIR/<name>.bpf.o` from `bpf/`)
//! and decode with the same generated types (`crate::bpf::tcp::types`,
//! `crate::bpf::decode`, [`crate::views::tcp::decode_flow`]). See
//! docs/loaders.md for when to choose which.
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};

use anyhow::Result;
use serde::Serialize;

use crate::bpf::tcp::types::rttscope_tcp_counter as C;
use crate::bpf::Event;
use crate::views::tcp::{TcpFlowState, TcpHookInfo, TcpViewConfig, COUNTER_NAMES};

#[cfg(feature = "aya")]
pub(crate) mod aya;
pub mod flow;
pub mod sampler;
pub mod tcp;

#[cfg(not(any(feature = "libbpf", feature = "aya")))]
compile_error!("build at least one BPF loader: feature `libbpf` (default) or `aya`");

/// Which BPF loader to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LoaderKind {
    /// libbpf-rs over C libbpf (the reference CO-RE loader).
    Libbpf,
    /// aya: pure-Rust userspace, no C libbpf.
    Aya,
}

impl LoaderKind {
    /// The loader used when none is asked for: libbpf if it is built in.
    pub const DEFAULT: LoaderKind = if cfg!(feature = "libbpf") {
        LoaderKind::Libbpf
    } else {
        LoaderKind::Aya
    };

    pub fn as_str(self) -> &'static str {
        match self {
            LoaderKind::Libbpf => "libbpf",
            LoaderKind::Aya => "aya",
        }
    }

    /// Is this loader compiled into this binary?
    pub fn built_in(self) -> bool {
        match self {
            LoaderKind::Libbpf => cfg!(feature = "libbpf"),
            LoaderKind::Aya => cfg!(feature = "aya"),
        }
    }

    /// The loaders compiled into this binary.
    pub fn available() -> Vec<LoaderKind> {
        [LoaderKind::Libbpf, LoaderKind::Aya]
            .into_iter()
            .filter(|k| k.built_in())
            .collect()
    }
}

impl std::fmt::Display for LoaderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A loaded and attached TCP view (sock_ops on a cgroup, iterator run in
/// the configured namespaces), whichever loader did it.
pub trait TcpLoader {
    /// Which loader this is.
    fn kind(&self) -> LoaderKind;
    /// How the view is hooked in (for report headers and JSON).
    fn info(&self) -> &TcpHookInfo;
    /// Read and decode every flow entry (histograms included).
    /// Every flow entry, handed to `f` one at a time (no copy of the whole map).
    fn for_each_flow(&self, f: &mut dyn FnMut(TcpFlowState)) -> Result<()>;
    /// Sum over CPUs of one per-CPU counter (0 if it cannot be read).
    fn counter(&self, c: C) -> u64;
    /// The current report epoch (flows' win_* values belong to it when equal).
    fn epoch(&self) -> u32;
    /// Start a new report interval: flows' win_min/win_max restart.
    fn next_epoch(&mut self);
    /// Give a flow's slot back (after it was reported closed, or to evict
    /// it): `slot` and `gen` as read in its `TcpFlowState`.
    fn forget(&mut self, slot: u32, gen: u32) -> Result<()>;
    /// Kernel IDs of the loaded programs (bpftool prog show id N).
    fn prog_ids(&self) -> Vec<(&'static str, u32)>;
    /// The raw-sample stream (only with `raw: true` in the config; once).
    fn raw_samples(&mut self) -> Result<RawSamples>;

    /// Every flow entry, collected.
    fn read_flows(&self) -> Result<Vec<TcpFlowState>> {
        let mut out = Vec::new();
        self.for_each_flow(&mut |f| out.push(f))?;
        Ok(out)
    }

    /// Every counter by name, in the order of `enum rttscope_tcp_counter`,
    /// plus `rtt_callbacks` (samples + callbacks skipped: the kernel counts
    /// only the exceptions, to keep the per-sample path short; with the
    /// per-ACK hook attached the samples are the hook's, and the callbacks
    /// are only those someone else turned on, all skipped).
    fn counters(&self) -> BTreeMap<&'static str, u64> {
        let mut m: BTreeMap<&'static str, u64> = COUNTER_NAMES
            .iter()
            .map(|(c, n)| (*n, self.counter(*c)))
            .collect();
        let from_cb = if self.info().ack_hook_attached() {
            0
        } else {
            m["samples"]
        };
        m.insert("rtt_callbacks", from_cb + m["rtt_callbacks_skipped"]);
        m
    }
}

/// Load and attach the TCP view with the chosen loader. Fails with one
/// clear sentence (also when that loader is not built into this binary).
pub fn attach_tcp(kind: LoaderKind, cfg: &TcpViewConfig) -> Result<Box<dyn TcpLoader>> {
    match kind {
        #[cfg(feature = "libbpf")]
        LoaderKind::Libbpf => Ok(Box::new(tcp::libbpf::LibbpfTcp::attach(cfg)?)),
        #[cfg(feature = "aya")]
        LoaderKind::Aya => Ok(Box::new(tcp::aya::AyaTcp::attach(cfg)?)),
        #[allow(unreachable_patterns)]
        other => anyhow::bail!(
            "this rttscope was built without the {other} loader (built in: {}); rebuild with `--features {other}`",
            LoaderKind::available()
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A ring buffer as one loader exposes it: a pollable fd and a way to
/// hand over every record now available.
pub trait RingSource {
    /// The fd that becomes readable when records arrive (epoll or map fd).
    fn poll_fd(&self) -> RawFd;
    /// Pass every available record's bytes to `f`; returns how many.
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> Result<usize>;
}

struct SourceFd(Box<dyn RingSource>);

impl AsRawFd for SourceFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.poll_fd()
    }
}

/// Raw samples from a view's ring buffer, driven by tokio (`AsyncFd`) and
/// decoded here, once, for both loaders.
pub struct RawSamples {
    fd: tokio::io::unix::AsyncFd<SourceFd>,
    /// Records too short to be an event (counted, skipped).
    pub bad_records: u64,
}

impl RawSamples {
    /// Wrap a loader's ring buffer. Must be called inside a tokio runtime.
    pub fn new(src: Box<dyn RingSource>) -> Result<Self> {
        // SAFETY: the fd belongs to `src`, which the AsyncFd owns: it stays
        // open until the AsyncFd has deregistered it.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                SourceFd(src),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
        Ok(RawSamples { fd, bad_records: 0 })
    }

    /// Decode every record available now into `out`, without waiting.
    pub fn drain_now(&mut self, out: &mut Vec<Event>) -> Result<usize> {
        let mut bad = 0;
        let n =
            self.fd
                .get_mut()
                .0
                .drain(&mut |bytes| match crate::bpf::decode::<Event>(bytes) {
                    Ok(ev) => out.push(ev),
                    Err(_) => bad += 1,
                })?;
        self.bad_records += bad;
        Ok(n)
    }

    /// Wait until records arrive, then decode all available into `out`.
    pub async fn next_batch(&mut self, out: &mut Vec<Event>) -> Result<usize> {
        loop {
            let mut guard = self
                .fd
                .readable_mut()
                .await
                .map_err(|e| anyhow::anyhow!("waiting on the ring buffer: {e}"))?;
            guard.clear_ready();
            drop(guard);
            let n = self.drain_now(out)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_loader_is_built_in() {
        assert!(LoaderKind::DEFAULT.built_in());
        assert!(LoaderKind::available().contains(&LoaderKind::DEFAULT));
    }

    #[test]
    fn missing_loader_is_one_sentence() {
        for k in [LoaderKind::Libbpf, LoaderKind::Aya] {
            if k.built_in() {
                continue;
            }
            let e = attach_tcp(k, &TcpViewConfig::default()).err().unwrap();
            let s = e.to_string();
            assert!(s.contains("built without the"), "{s}");
            assert!(!s.contains('\n'), "{s}");
        }
    }

    /// A fake source for the decoding path only (the kernel side is tested
    /// by the privileged suite): one valid event and one short record.
    struct Fixture(Vec<Vec<u8>>, std::os::fd::OwnedFd);
    impl RingSource for Fixture {
        fn poll_fd(&self) -> RawFd {
            self.1.as_raw_fd()
        }
        fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
            let n = self.0.len();
            for r in self.0.drain(..) {
                f(&r);
            }
            Ok(n)
        }
    }

    #[tokio::test]
    async fn raw_samples_decode_and_count_bad_records() {
        let ev = Event {
            r#type: 1,
            rtt_us: 321,
            ..Default::default()
        };
        let (r, _w) = nix::unistd::pipe().unwrap();
        let src = Fixture(vec![crate::bpf::as_bytes(&ev).to_vec(), vec![1, 2, 3]], r);
        let mut rs = RawSamples::new(Box::new(src)).unwrap();
        let mut out = Vec::new();
        assert_eq!(rs.drain_now(&mut out).unwrap(), 2);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].rtt_us, 321);
        assert_eq!(rs.bad_records, 1);
    }
}

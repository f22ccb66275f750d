//! What every passive view provides, whichever loader loaded it: the view
//! and loader names, the [`PassiveView`] trait, and the raw-sample stream
//! ([`RawSamples`]) both views and both loaders hand out, each record decoded
//! by its view into one type ([`RawSample`]).
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};

use anyhow::Result;
use serde::Serialize;

use crate::analysis::flow::{Flow, Side};
pub use crate::analysis::view_kind::ViewKind;
use crate::bpf::Event;

/// Which BPF loader to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LoaderKind {
    /// libbpf-rs over C libbpf (the reference CO-RE loader).
    Libbpf,
    /// Pure-Rust userspace (aya), no C libbpf.
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

/// The one sentence for a loader this binary was built without.
pub fn not_built(kind: LoaderKind) -> anyhow::Error {
    anyhow::anyhow!(
        "this rttscope was built without the {kind} loader (built in: {}); rebuild with `--features {kind}`",
        LoaderKind::available()
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// What every loaded and attached passive view provides (each view's own type adds how its
/// flows are read).
pub trait PassiveView {
    /// Which view this is.
    fn kind(&self) -> ViewKind;
    /// Which loader loaded it.
    fn loader(&self) -> LoaderKind;
    /// Kernel IDs of the loaded programs (bpftool prog show id N), by name.
    fn prog_ids(&self) -> Vec<(String, u32)>;
    /// Every counter by name (kernel counters summed over CPUs, plus what
    /// userspace derives).
    fn counters(&self) -> Result<BTreeMap<&'static str, u64>>;
    /// The raw-sample stream (only when raw samples were asked for at
    /// load; once). Must be called inside a tokio runtime.
    fn raw_samples(&mut self) -> Result<RawSamples>;
    /// Whether the view has raw samples at all (a view without any is left
    /// out of `--raw`, not refused).
    fn has_raw_samples(&self) -> bool {
        true
    }
}

/// A view the session reads that holds the object it attached: its kind, loader, programs,
/// counters and raw samples are that object's ([`PassiveView`] written once for all of them).
pub trait HoldsAttached {
    /// The attached object (the loaded and attached programs and maps).
    fn attached_object(&self) -> &dyn PassiveView;
    /// The object, for its raw-sample stream.
    fn attached_object_mut(&mut self) -> &mut dyn PassiveView;
}

/// Its programs, counters and raw samples: the attached object's.
impl<T: HoldsAttached> PassiveView for T {
    fn kind(&self) -> ViewKind {
        self.attached_object().kind()
    }

    fn loader(&self) -> LoaderKind {
        self.attached_object().loader()
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        self.attached_object().prog_ids()
    }

    fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        self.attached_object().counters()
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        self.attached_object_mut().raw_samples()
    }

    fn has_raw_samples(&self) -> bool {
        self.attached_object().has_raw_samples()
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

/// What a raw record reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawEvent {
    /// One RTT sample.
    Rtt,
    /// A flow ended (TCP state went to CLOSE; `rtt_us` 0).
    FlowEnd,
}

/// One raw record of any view, decoded by the view that wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawSample {
    pub view: ViewKind,
    pub event: RawEvent,
    pub flow: Flow,
    /// The flow's protocol when it is not TCP (`icmp`, `icmpv6`).
    pub proto: Option<&'static str>,
    /// The view's own label (the session resolves what it can of an
    /// unknown one: `Session::drain_raw`).
    pub side: Side,
    /// CLOCK_MONOTONIC ns, the kernel's.
    pub ts_ns: u64,
    pub rtt_us: u32,
    /// TCP's smoothed RTT at the sample (the TCP view).
    pub srtt_us: Option<u32>,
    /// How the sample was matched (the sampler: `seq`, `tsval`, `echo`).
    pub matching: Option<&'static str>,
}

impl RawSample {
    /// The record's label in observe's raw output: the view, or `flow_end`.
    pub fn label(&self) -> &'static str {
        match self.event {
            RawEvent::Rtt => self.view.as_str(),
            RawEvent::FlowEnd => "flow_end",
        }
    }
}

/// A view's decoder of its own ring-buffer records (None: not a record it
/// knows, counted as bad).
pub type DecodeRaw = fn(&Event) -> Option<RawSample>;

/// Raw samples from a view's ring buffer, driven by tokio (`AsyncFd`) and
/// decoded here, once, for both loaders, by the view's decoder.
pub struct RawSamples {
    fd: tokio::io::unix::AsyncFd<SourceFd>,
    decode: DecodeRaw,
    view: ViewKind,
    /// Records too short to be an event, or events the view's decoder does
    /// not know (counted, skipped).
    pub bad_records: u64,
}

impl RawSamples {
    /// Wrap a loader's ring buffer of `view`'s records. Must be called inside a tokio runtime.
    pub fn new(src: Box<dyn RingSource>, view: ViewKind, decode: DecodeRaw) -> Result<Self> {
        // SAFETY: the fd belongs to `src`, which the AsyncFd owns: it stays
        // open until the AsyncFd has deregistered it.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                SourceFd(src),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
        Ok(RawSamples {
            fd,
            decode,
            view,
            bad_records: 0,
        })
    }

    /// Which view's records these are.
    pub fn view(&self) -> ViewKind {
        self.view
    }

    /// Decode every record available now into `out`, without waiting;
    /// returns how many records were read (bad ones included).
    pub fn drain_now(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        let mut bad = 0;
        let decode = self.decode;
        let n = self
            .fd
            .get_mut()
            .0
            .drain(&mut |bytes| match crate::bpf::decode::<Event>(bytes)
                .ok()
                .as_ref()
                .and_then(decode)
            {
                Some(s) => out.push(s),
                None => bad += 1,
            })?;
        self.bad_records += bad;
        Ok(n)
    }

    /// Whether records may have arrived (the fd became readable since the
    /// last call); registers the waker when not.
    pub fn poll_readable(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        match self.fd.poll_read_ready_mut(cx) {
            std::task::Poll::Ready(Ok(mut guard)) => {
                guard.clear_ready();
                std::task::Poll::Ready(Ok(()))
            }
            std::task::Poll::Ready(Err(e)) => {
                std::task::Poll::Ready(Err(anyhow::anyhow!("waiting on the ring buffer: {e}")))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
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

    /// A fake source for the decoding path only (the kernel side is tested
    /// by the privileged suite): one valid event, one short record and one event the decoder does not
    /// know.
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
            key: Flow {
                tunnel: Default::default(),
                netns: 1,
                local: "10.0.0.1:1000".parse().unwrap(),
                remote: "10.0.0.2:80".parse().unwrap(),
            }
            .to_key(),
            ..Default::default()
        };
        let (r, _w) = nix::unistd::pipe().unwrap();
        let unknown = Event {
            r#type: 1,
            ..Default::default()
        }; // no address family: no flow
        let src = Fixture(
            vec![
                crate::bpf::as_bytes(&ev).to_vec(),
                vec![1, 2, 3],
                crate::bpf::as_bytes(&unknown).to_vec(),
            ],
            r,
        );
        let decode: DecodeRaw = |e| {
            Some(RawSample {
                view: ViewKind::Tcp,
                event: RawEvent::Rtt,
                flow: Flow::from_key(&e.key)?,
                proto: None,
                side: Side::from_raw(e.side),
                ts_ns: e.ts_ns,
                rtt_us: e.rtt_us,
                srtt_us: Some(e.srtt_us),
                matching: None,
            })
        };
        let mut rs = RawSamples::new(Box::new(src), ViewKind::Tcp, decode).unwrap();
        let mut out = Vec::new();
        assert_eq!(rs.drain_now(&mut out).unwrap(), 3);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].rtt_us, 321);
        assert_eq!(rs.bad_records, 2);
    }
}

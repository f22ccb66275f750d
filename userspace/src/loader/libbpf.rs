//! The libbpf loader: libbpf-rs (C libbpf inside) through the generated
//! skeleton. The TCP view itself is [`crate::tcp_view::TcpView`]; this is
//! the adapter to the loader interface.
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;

use anyhow::{Context, Result};

use super::{LoaderKind, RawSamples, RingSource, TcpLoader};
use crate::bpf::tcp::types::rttscope_tcp_counter as C;
use crate::tcp_view::{TcpFlowState, TcpHookInfo, TcpView, TcpViewConfig};

pub struct LibbpfTcp {
    view: TcpView,
    raw: bool,
    raw_taken: bool,
}

impl LibbpfTcp {
    pub fn attach(cfg: &TcpViewConfig) -> Result<Self> {
        Ok(LibbpfTcp {
            view: TcpView::attach(cfg)?,
            raw: cfg.raw,
            raw_taken: false,
        })
    }

    /// The wrapped view (libbpf-only extras).
    pub fn view(&self) -> &TcpView {
        &self.view
    }
}

impl TcpLoader for LibbpfTcp {
    fn kind(&self) -> LoaderKind {
        LoaderKind::Libbpf
    }
    fn info(&self) -> &TcpHookInfo {
        &self.view.info
    }
    fn for_each_flow(&self, f: &mut dyn FnMut(TcpFlowState)) -> Result<()> {
        self.view.for_each_flow(f)
    }
    fn counter(&self, c: C) -> u64 {
        self.view.counter(c)
    }
    fn epoch(&self) -> u32 {
        self.view.epoch()
    }
    fn next_epoch(&mut self) {
        self.view.next_epoch()
    }
    fn forget(&mut self, slot: u32, gen: u32) -> Result<()> {
        self.view.forget(slot, gen)
    }
    fn prog_ids(&self) -> Vec<(&'static str, u32)> {
        self.view.prog_ids()
    }
    fn raw_samples(&mut self) -> Result<RawSamples> {
        if !self.raw {
            anyhow::bail!("raw samples were not enabled when the TCP view was loaded");
        }
        if self.raw_taken {
            anyhow::bail!("the raw-sample stream was already taken");
        }
        // libbpf calls back per record during consume(); the records are
        // copied into one buffer and handed out by drain().
        let pending: Rc<RefCell<Pending>> = Default::default();
        let sink = pending.clone();
        let mut b = libbpf_rs::RingBufferBuilder::new();
        b.add(self.view.events_map(), move |data: &[u8]| {
            let mut p = sink.borrow_mut();
            p.bytes.extend_from_slice(data);
            p.lens.push(data.len());
            0
        })
        .context("setting up the raw-sample ring buffer")?;
        let rb = b.build().context("setting up the raw-sample ring buffer")?;
        self.raw_taken = true;
        RawSamples::new(Box::new(LibbpfRing { rb, pending }))
    }
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lens: Vec<usize>,
}

struct LibbpfRing {
    rb: libbpf_rs::RingBuffer<'static>,
    pending: Rc<RefCell<Pending>>,
}

impl RingSource for LibbpfRing {
    fn poll_fd(&self) -> RawFd {
        self.rb.epoll_fd()
    }
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        self.rb
            .consume()
            .context("reading the raw-sample ring buffer")?;
        let mut p = self.pending.borrow_mut();
        let mut off = 0;
        for &len in &p.lens {
            f(&p.bytes[off..off + len]);
            off += len;
        }
        let n = p.lens.len();
        p.bytes.clear();
        p.lens.clear();
        Ok(n)
    }
}

//! What both views' libbpf loaders share: a ring buffer as a
//! [`RingSource`] for the raw-sample stream.
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;

use anyhow::{Context, Result};
use libbpf_rs::MapCore;

use super::RingSource;

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lens: Vec<usize>,
}

pub(crate) struct LibbpfRing {
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

impl LibbpfRing {
    /// A ring buffer over `map` (a BPF_MAP_TYPE_RINGBUF). libbpf calls back
    /// per record during consume(); the records are copied into one buffer
    /// and handed out by drain().
    pub(crate) fn new(map: &dyn MapCore) -> Result<LibbpfRing> {
        let pending: Rc<RefCell<Pending>> = Default::default();
        let sink = pending.clone();
        let mut b = libbpf_rs::RingBufferBuilder::new();
        b.add(map, move |data: &[u8]| {
            let mut p = sink.borrow_mut();
            p.bytes.extend_from_slice(data);
            p.lens.push(data.len());
            0
        })
        .context("setting up the raw-sample ring buffer")?;
        let rb = b.build().context("setting up the raw-sample ring buffer")?;
        Ok(LibbpfRing { rb, pending })
    }
}

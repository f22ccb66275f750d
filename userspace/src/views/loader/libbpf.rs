//! The loader layer over libbpf-rs (C libbpf inside): objects opened from
//! memory without a skeleton (`ObjectBuilder::open_memory`), maps and
//! programs found by name, `.rodata` written through its initial value,
//! `.bss` read and written through libbpf's mapping of it (as the skeleton
//! did: single-word accesses, no read-modify-write of the whole section).
use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use libbpf_rs::{AsRawLibbpf, MapCore};

use super::{load_error, walk_iter, LoadErrno, Object, ObjectDef, ProgKind, Settings};
use crate::sys::netns::NetNs;
use crate::views::{LoaderKind, RingSource};

/// One loaded copy of an object.
pub(crate) struct LibbpfObject {
    /// Before the object: links detach before the programs go.
    links: Vec<libbpf_rs::Link>,
    obj: libbpf_rs::Object,
    def: &'static ObjectDef,
    refused: Vec<(&'static str, anyhow::Error)>,
}

/// libbpf's name for map `wanted`: as in the C source, or for a section
/// map (`.bss`) the object's name followed by it (`tcp_bpf.bss`).
fn is_map(actual: &OsStr, wanted: &str) -> bool {
    actual == wanted
        || (wanted.starts_with('.') && actual.to_str().is_some_and(|a| a.ends_with(wanted)))
}

/// Load every copy; the copies after the first reuse the first one's `shared` maps.
pub(super) fn load(
    def: &'static ObjectDef,
    copies: Vec<Settings>,
    shared: &'static [&'static str],
) -> Result<Vec<Box<dyn Object>>> {
    let mut objs: Vec<LibbpfObject> = Vec::new();
    for s in &copies {
        let reuse = match objs.first() {
            Some(first) => shared
                .iter()
                .map(|m| Ok((*m, first.map_fd(m)?.as_raw_fd())))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        objs.push(s.labelled(load_copy(def, s, &reuse))?);
    }
    Ok(objs
        .into_iter()
        .map(|o| Box::new(o) as Box<dyn Object>)
        .collect())
}

/// Load one copy. One refused program fails a whole libbpf object: when the
/// object has optional programs and fails, it is loaded again without them.
fn load_copy(
    def: &'static ObjectDef,
    s: &Settings,
    reuse: &[(&str, RawFd)],
) -> Result<LibbpfObject> {
    let fail = |e: libbpf_rs::Error| {
        let errno = match e.kind() {
            libbpf_rs::ErrorKind::OutOfMemory => LoadErrno::NoMemory,
            libbpf_rs::ErrorKind::PermissionDenied => LoadErrno::NotPermitted,
            _ => LoadErrno::Other,
        };
        load_error(
            def.what,
            &s.memory,
            errno,
            anyhow::Error::new(e),
            "run with -vv for libbpf's log",
        )
    };
    let mut refused = Vec::new();
    let obj = match open_and_load(def, s, reuse, &[])? {
        Ok(obj) => obj,
        Err(e) if !s.optional.is_empty() => {
            let obj = open_and_load(def, s, reuse, &s.optional)?.map_err(fail)?;
            // the load's error for the first optional program, its cause for the others
            let e = anyhow::Error::new(e);
            let why = e.root_cause().to_string();
            let mut first = Some(e);
            for p in &s.optional {
                let e = first.take().unwrap_or_else(|| anyhow::anyhow!("{why}"));
                refused.push((*p, e));
            }
            obj
        }
        Err(e) => return Err(fail(e)),
    };
    Ok(LibbpfObject {
        links: Vec::new(),
        obj,
        def,
        refused,
    })
}

/// Open `def`, apply the settings (leaving out `s.skip` and `without`),
/// reuse the maps in `reuse`, load. The outer error is a setup problem, the
/// inner one the load itself.
fn open_and_load(
    def: &ObjectDef,
    s: &Settings,
    reuse: &[(&str, RawFd)],
    without: &[&str],
) -> Result<std::result::Result<libbpf_rs::Object, libbpf_rs::Error>> {
    let mut open = libbpf_rs::ObjectBuilder::default()
        .name(def.name)
        .and_then(|b| b.open_memory(def.bytes))
        .with_context(|| format!("opening {}'s BPF object", def.what))?;
    for (name, n) in &s.max_entries {
        open_map(&mut open, name, def)?
            .set_max_entries(*n)
            .with_context(|| format!("sizing map {name}"))?;
    }
    if !s.globals.is_empty() {
        let mut ro = open_map(&mut open, ".rodata", def)?;
        let data = ro
            .initial_value_mut()
            .with_context(|| format!("{} has no .rodata", def.what))?;
        for g in &s.globals {
            data.get_mut(g.offset..g.offset + g.bytes.len())
                .with_context(|| format!("{} outside .rodata", g.name))?
                .copy_from_slice(&g.bytes);
        }
    }
    for (name, fd) in reuse {
        // SAFETY: the fd belongs to the first copy, alive for this call.
        let fd = unsafe { BorrowedFd::borrow_raw(*fd) };
        open_map(&mut open, name, def)?
            .reuse_fd(fd)
            .with_context(|| format!("reusing map {name}"))?;
    }
    for mut p in open.progs_mut() {
        let name = p.name().to_string_lossy();
        if s.skip.iter().chain(without).any(|n| *n == name) {
            p.set_autoload(false);
        }
    }
    Ok(open.load())
}

fn open_map<'a>(
    open: &'a mut libbpf_rs::OpenObject,
    name: &str,
    def: &ObjectDef,
) -> Result<libbpf_rs::OpenMapMut<'a>> {
    open.maps_mut()
        .find(|m| is_map(m.name(), name))
        .with_context(|| format!("{} has no map `{name}`", def.what))
}

impl LibbpfObject {
    fn prog(&self, name: &str) -> Result<libbpf_rs::ProgramMut<'_>> {
        self.obj
            .progs_mut()
            .find(|p| p.name() == name)
            .with_context(|| format!("{} has no program `{name}`", self.def.what))
    }

    fn loaded_map(&self, name: &str) -> Result<libbpf_rs::Map<'_>> {
        self.obj
            .maps()
            .find(|m| is_map(m.name(), name))
            .with_context(|| format!("{} has no map `{name}`", self.def.what))
    }

    /// libbpf's mapping of a data section (`.bss`), as the skeleton used it.
    fn data(&self, section: &str) -> Result<(*mut u8, usize)> {
        let m = self.loaded_map(section)?;
        let mut size: libbpf_rs::libbpf_sys::size_t = 0;
        // SAFETY: a valid map of the loaded object; libbpf returns its mmap'ed
        // memory (or NULL), alive as long as the object.
        let ptr = unsafe {
            libbpf_rs::libbpf_sys::bpf_map__initial_value(m.as_libbpf_object().as_ptr(), &mut size)
        };
        if ptr.is_null() {
            bail!("{}'s {section} is not mapped", self.def.what);
        }
        Ok((ptr.cast(), size as usize))
    }
}

impl Object for LibbpfObject {
    fn loader(&self) -> LoaderKind {
        LoaderKind::Libbpf
    }

    fn refused(&mut self, prog: &str) -> Option<anyhow::Error> {
        let i = self.refused.iter().position(|(p, _)| *p == prog)?;
        Some(self.refused.remove(i).1)
    }

    fn prog_fd(&self, prog: &str) -> Result<BorrowedFd<'_>> {
        let fd = self.prog(prog)?.as_fd().as_raw_fd();
        if fd < 0 {
            bail!("{}'s program `{prog}` is not loaded", self.def.what);
        }
        // SAFETY: the fd belongs to the loaded object, alive as long as `self`.
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    fn map_fd(&self, map: &str) -> Result<BorrowedFd<'_>> {
        let fd = self.loaded_map(map)?.as_fd().as_raw_fd();
        // SAFETY: the fd belongs to the loaded object, alive as long as `self`.
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    fn attach_cgroup(&mut self, prog: &str, cgroup: BorrowedFd<'_>) -> Result<()> {
        let link = self.prog(prog)?.attach_cgroup(cgroup.as_raw_fd())?;
        self.links.push(link);
        Ok(())
    }

    fn attach_trace(&mut self, prog: &str) -> Result<()> {
        let link = self.prog(prog)?.attach()?;
        self.links.push(link);
        Ok(())
    }

    fn run_iter(&mut self, prog: &str, ns: &NetNs) -> Result<()> {
        let ProgKind::Iter(target) = self.def.prog(prog)?.kind else {
            bail!("`{prog}` is not an iterator");
        };
        let link = self
            .prog(prog)?
            .attach()
            .with_context(|| format!("attaching the iter/{target} program"))?;
        let fd = link.as_fd();
        walk_iter(ns, &target.to_uppercase(), move || {
            Ok(crate::sys::bpfprog::iter_create(&fd)?)
        })
    }

    fn ring(&mut self, map: &str) -> Result<Box<dyn RingSource>> {
        Ok(Box::new(LibbpfRing::new(&self.loaded_map(map)?)?))
    }

    fn read_data(&self, section: &str, offset: usize, out: &mut [u8]) -> Result<()> {
        let (ptr, size) = self.data(section)?;
        if offset + out.len() > size {
            bail!("reading past {section}");
        }
        // SAFETY: in bounds of the mapping (checked); volatile: the kernel
        // programs write it concurrently.
        unsafe { volatile_copy(ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write_data(&mut self, section: &str, offset: usize, bytes: &[u8]) -> Result<()> {
        let (ptr, size) = self.data(section)?;
        if offset + bytes.len() > size {
            bail!("writing past {section}");
        }
        // SAFETY: in bounds of the mapping (checked), writable (.bss).
        unsafe { volatile_copy(bytes.as_ptr(), ptr.add(offset), bytes.len()) };
        Ok(())
    }
}

/// Copy `len` bytes between our memory and a mapping the kernel also
/// writes: one access for an aligned 4- or 8-byte variable (never torn).
///
/// # Safety
/// Both ranges must be valid for `len` bytes.
unsafe fn volatile_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match len {
            8 if (src as usize).is_multiple_of(8) && (dst as usize).is_multiple_of(8) => dst
                .cast::<u64>()
                .write_volatile(src.cast::<u64>().read_volatile()),
            4 if (src as usize).is_multiple_of(4) && (dst as usize).is_multiple_of(4) => dst
                .cast::<u32>()
                .write_volatile(src.cast::<u32>().read_volatile()),
            _ => {
                for i in 0..len {
                    dst.add(i).write_volatile(src.add(i).read_volatile());
                }
            }
        }
    }
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lens: Vec<usize>,
}

/// A ring buffer read through libbpf's ring-buffer manager.
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
    /// A ring buffer over `map` (a BPF_MAP_TYPE_RINGBUF; libbpf maps it, so
    /// it outlives the object's own handle). libbpf calls back per record
    /// during consume(); the records are copied into one buffer and handed
    /// out by drain().
    fn new(map: &dyn MapCore) -> Result<LibbpfRing> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_maps_carry_the_object_name() {
        assert!(is_map(OsStr::new("tcp_bpf.bss"), ".bss"));
        assert!(is_map(OsStr::new("tcp_flows"), "tcp_flows"));
        assert!(!is_map(OsStr::new("tcp_flows"), "flows"));
        assert!(!is_map(OsStr::new("tcp_bpf.rodata"), ".bss"));
    }
}

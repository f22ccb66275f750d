//! Shared mappings of mmapable BPF array maps (`BPF_F_MMAPABLE`), made for
//! one read, 1 MiB at a time, and unmapped after: the fine-histogram pool's
//! finished half and both views' flow tables. A mapping kept for the run (or
//! for a whole read) would put the map's pages in the observer's resident
//! set (RssFile) though the kernel already counts that memory.
use std::os::fd::{AsRawFd, BorrowedFd};

/// A shared read-write mapping of part of an mmapable array map, unmapped
/// on drop.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// Offset in the map's data of the mapping's first byte (page aligned).
    start: usize,
}

/// The system page size (4 KiB where sysconf fails).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no side effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl Mapping {
    /// Map bytes [off, off + len) of the map's data (the pages that hold them).
    pub(crate) fn new(fd: BorrowedFd<'_>, off: usize, len: usize) -> std::io::Result<Mapping> {
        let page = page_size();
        let start = off / page * page;
        let map_len = (off + len - start).div_ceil(page) * page;
        // SAFETY: a new shared mapping of the map's fd; the kernel checks the
        // range against the map's size and the map's BPF_F_MMAPABLE flag.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len: map_len,
            start,
        })
    }

    /// Bytes [off, off + len) of the map's data (panics outside the mapping).
    pub(crate) fn slice_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let rel = off
            .checked_sub(self.start)
            .expect("element before the mapping");
        assert!(rel + len <= self.len, "element outside the mapping");
        // SAFETY: inside the mapping (checked), and `&mut self` keeps this the only reference
        // from userspace. The programs may write the same memory concurrently (the caller's
        // protocol decides what a read of it is worth: e.g. a pool's finished half is no longer
        // written, a table's entries carry generation counts).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(rel), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// What [`for_each_element`] maps at a time: a read of a 46 MB table (both
/// views at 100,000 flows) mapped whole put all of it in the resident set
/// for the read's duration; windows of 1 MiB keep that to about 1 MiB.
const WINDOW: usize = 1 << 20;

/// Elements `first..first + count` of an mmapable array map of `size`-byte
/// elements, each handed to `f` (index, its bytes) through mappings of at
/// most [`WINDOW`] bytes made for this call and unmapped after.
pub(crate) fn for_each_element(
    fd: BorrowedFd<'_>,
    first: usize,
    count: usize,
    size: usize,
    mut f: impl FnMut(usize, &mut [u8]),
) -> std::io::Result<()> {
    let per = (WINDOW / size.max(1)).max(1);
    let end = first + count;
    let mut i = first;
    while i < end {
        let j = (i + per).min(end);
        let mut mem = Mapping::new(fd, i * size, (j - i) * size)?;
        for k in i..j {
            f(k, mem.slice_mut(k * size, size));
        }
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A memory file holding `n` elements of `size` bytes, each filled with
    /// its index mod 255, + 1 (never 0), mapped the way a BPF array is.
    fn table(n: usize, size: usize) -> std::fs::File {
        // SAFETY: a name and flags for memfd_create; the fd returned is new.
        let fd = unsafe { libc::memfd_create(c"rttscope-mmap-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just created and is owned by nothing else.
        let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| vec![(i % 255) as u8 + 1; size])
            .collect();
        f.write_all(&bytes).unwrap();
        f
    }

    /// Every element once, in order, with its own bytes, whatever the
    /// element size against the page and the window (TCP slots 152 bytes,
    /// sampler ways 256, pool entries 5,152), from any first element; and
    /// what `f` writes reaches the map.
    #[test]
    fn elements_are_visited_once_through_windows() {
        for (n, size, first) in [
            (20_000, 144, 0),
            (9_000, 256, 3),
            (700, 5152, 300),
            (1, 8, 0),
        ] {
            let f = table(n, size);
            let mut seen = Vec::new();
            for_each_element(f.as_fd(), first, n - first, size, |i, b| {
                assert_eq!(b.len(), size);
                assert!(b.iter().all(|&x| x == (i % 255) as u8 + 1), "element {i}");
                seen.push(i);
                b.fill(0);
            })
            .unwrap();
            assert_eq!(seen, (first..n).collect::<Vec<_>>(), "size {size}");
            let mut left = 0;
            for_each_element(f.as_fd(), 0, n, size, |_, b| {
                left += b.iter().filter(|&&x| x != 0).count()
            })
            .unwrap();
            assert_eq!(
                left,
                first * size,
                "size {size}: the visited elements were zeroed"
            );
        }
        assert!(for_each_element(table(1, 8).as_fd(), 0, 0, 8, |_, _| panic!()).is_ok());
    }
}

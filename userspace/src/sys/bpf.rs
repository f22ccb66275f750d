//! The few bpf(2) map commands both loaders need in bulk, on a map fd,
//! without going through either loader's API: batched lookup (thousands of
//! entries in a few syscalls; aya 0.14 has no batch API) and an update with
//! an optional key (a stack or queue map has none).
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for the batch commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size
    // passed; the pointers inside it point to live buffers of the sizes the
    // kernel will use (the callers' contracts).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Write `value` (exactly the map's value size) under `key` (exactly the
/// key size; `None` for stack and queue maps, where this pushes).
pub fn update(fd: BorrowedFd<'_>, key: Option<&[u8]>, value: &[u8], flags: u64) -> io::Result<()> {
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: value.as_ptr() as u64,
        flags,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a)
}

/// Walk a map with BPF_MAP_LOOKUP_BATCH, handing each (key, value) to `f`,
/// at most `limit` entries. Hash maps return whole buckets per call (fewer
/// than asked is normal); the kernel says ENOENT with the last entries.
pub fn lookup_batch(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    limit: usize,
    mut f: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    const BATCH: usize = 256;
    let mut keys = vec![0u8; key_size * BATCH];
    let mut vals = vec![0u8; value_size * BATCH];
    // Opaque cursors: a bucket index for hash maps, the last key for arrays.
    let mut cursor_in = vec![0u8; key_size.max(8)];
    let mut cursor_out = vec![0u8; key_size.max(8)];
    let mut first = true;
    let mut done = 0usize;
    while done < limit {
        let mut a = BatchAttr {
            in_batch: if first {
                0
            } else {
                cursor_in.as_mut_ptr() as u64
            },
            out_batch: cursor_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: vals.as_mut_ptr() as u64,
            count: BATCH.min(limit - done) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        let err = match bpf(BPF_MAP_LOOKUP_BATCH, &mut a) {
            Ok(()) => None,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Some(e),
            Err(e) => return Err(e),
        };
        let n = (a.count as usize).min(BATCH);
        for i in 0..n {
            f(
                &keys[i * key_size..(i + 1) * key_size],
                &vals[i * value_size..(i + 1) * value_size],
            );
        }
        done += n;
        if err.is_some() || n == 0 {
            return Ok(()); // the walk is complete
        }
        std::mem::swap(&mut cursor_in, &mut cursor_out);
        first = false;
    }
    Ok(())
}

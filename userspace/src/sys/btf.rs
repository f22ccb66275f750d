//! The kernel's own BTF (/sys/kernel/btf/vmlinux), read just far enough to
//! find a function's type id: what a fexit or iterator program names as its
//! `attach_btf_id`. Loader-independent (the feature probes run the same
//! under libbpf and aya builds).
use std::io;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// Bytes that follow a type's 12-byte header, by kind (`include/uapi/linux/btf.h`).
fn trailing(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD, TYPEDEF.., FUNC, FLOAT, TYPE_TAG
        1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
        3 => 12,                      // ARRAY
        4 | 5 | 15 | 19 => vlen * 12, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => vlen * 8,           // ENUM, FUNC_PROTO
        _ => return None,             // a kind this reader does not know
    })
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// The type id of the function `name` in the BTF blob `btf` (little-endian).
pub fn func_id_in(btf: &[u8], name: &str) -> Option<u32> {
    if u16::from_le_bytes(btf.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
        return None;
    }
    let hdr_len = u32_at(btf, 4)? as usize;
    let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
    let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
    let types = btf.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strs = btf.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let want = name.as_bytes();
    let (mut off, mut id) = (0usize, 1u32);
    while off + 12 <= types.len() {
        let name_off = u32_at(types, off)? as usize;
        let info = u32_at(types, off + 4)?;
        let kind = (info >> 24) & 0x1f;
        if kind == KIND_FUNC {
            let s = strs.get(name_off..)?;
            let end = s.iter().position(|&c| c == 0)?;
            if &s[..end] == want {
                return Some(id);
            }
        }
        off += 12 + trailing(kind, (info & 0xffff) as usize)?;
        id += 1;
    }
    None
}

/// The type id of the kernel function `name` in /sys/kernel/btf/vmlinux.
pub fn vmlinux_func_id(name: &str) -> io::Result<u32> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux")?;
    func_id_in(&btf, name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no function {name} in the kernel's BTF"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kernel_functions_or_says_why() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            return;
        }
        let a = vmlinux_func_id("tcp_ack_update_rtt").unwrap();
        let b = vmlinux_func_id("bpf_iter_tcp").unwrap();
        assert!(a > 0 && b > 0 && a != b);
        assert!(vmlinux_func_id("no_such_function_rttscope").is_err());
    }

    #[test]
    fn bad_blob_is_none() {
        assert_eq!(func_id_in(&[0u8; 8], "x"), None);
        assert_eq!(func_id_in(&[], "x"), None);
    }
}

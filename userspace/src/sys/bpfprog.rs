//! Tiny BPF programs built and loaded by hand (bpf(2) BPF_PROG_LOAD,
//! BPF_LINK_CREATE, ...), for the feature probes: what a kernel allows is
//! found by loading and attaching a few instructions, as `bpftool feature
//! probe` and libbpf's own probes do, under either loader.
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;

/// Program types (`enum bpf_prog_type`).
pub const PROG_SOCKET_FILTER: u32 = 1;
pub const PROG_SCHED_CLS: u32 = 3;
pub const PROG_SOCK_OPS: u32 = 13;
pub const PROG_TRACING: u32 = 26;
/// Attach types (`enum bpf_attach_type`).
pub const ATTACH_CGROUP_SOCK_OPS: u32 = 3;
pub const ATTACH_TRACE_FEXIT: u32 = 25;
pub const ATTACH_TRACE_ITER: u32 = 28;
pub const ATTACH_TCX_INGRESS: u32 = 46;
pub const ATTACH_TCX_EGRESS: u32 = 47;

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// Instruction constructors (the kernel's `BPF_*` macros of filter.h).
pub mod asm {
    use super::Insn;
    fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (src << 4) | (dst & 0xf),
            off,
            imm,
        }
    }
    pub fn mov_imm(dst: u8, imm: i32) -> Insn {
        i(0xb7, dst, 0, 0, imm)
    }
    pub fn mov(dst: u8, src: u8) -> Insn {
        i(0xbf, dst, src, 0, 0)
    }
    pub fn add_imm(dst: u8, imm: i32) -> Insn {
        i(0x07, dst, 0, 0, imm)
    }
    pub fn or_imm(dst: u8, imm: i32) -> Insn {
        i(0x47, dst, 0, 0, imm)
    }
    /// dst = *(size *)(src + off); size 1, 2, 4 or 8 bytes.
    pub fn ldx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
        i(0x61 | size_bits(size), dst, src, off, 0)
    }
    /// *(size *)(dst + off) = src.
    pub fn stx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
        i(0x63 | size_bits(size), dst, src, off, 0)
    }
    /// *(size *)(dst + off) = imm.
    pub fn st_imm(size: u8, dst: u8, off: i16, imm: i32) -> Insn {
        i(0x62 | size_bits(size), dst, 0, off, imm)
    }
    /// 64-bit atomic with a result: `op` BPF_CMPXCHG (0xf1) or BPF_XCHG (0xe1).
    pub fn atomic64(op: i32, dst: u8, src: u8, off: i16) -> Insn {
        i(0xdb, dst, src, off, op)
    }
    /// if dst == imm goto +off
    pub fn jeq_imm(dst: u8, imm: i32, off: i16) -> Insn {
        i(0x15, dst, 0, off, imm)
    }
    /// if dst != imm goto +off
    pub fn jne_imm(dst: u8, imm: i32, off: i16) -> Insn {
        i(0x55, dst, 0, off, imm)
    }
    pub fn ja(off: i16) -> Insn {
        i(0x05, 0, 0, off, 0)
    }
    pub fn call(helper: i32) -> Insn {
        i(0x85, 0, 0, 0, helper)
    }
    pub fn exit() -> Insn {
        i(0x95, 0, 0, 0, 0)
    }
    /// dst = the map behind `fd` (two instructions, BPF_PSEUDO_MAP_FD).
    pub fn ld_map_fd(dst: u8, fd: i32) -> [Insn; 2] {
        [i(0x18, dst, 1, 0, fd), Insn::default()]
    }
    fn size_bits(size: u8) -> u8 {
        match size {
            1 => 0x10,
            2 => 0x08,
            8 => 0x18,
            _ => 0x00,
        }
    }
}

fn sys(cmd: libc::c_long, attr: &mut [u64]) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-filled bpf_attr prefix of the size passed;
    // the pointers in it point to live buffers (the callers' contracts).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr().cast::<libc::c_void>(),
            std::mem::size_of_val(attr),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd(r: i64) -> OwnedFd {
    // SAFETY: a file descriptor bpf(2) just returned to us.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// What a program is loaded as.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgSpec<'a> {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    pub attach_btf_id: u32,
    /// At most 15 bytes (`rtt_probe_*`: not one of the views' programs).
    pub name: &'a str,
}

/// Load `insns`; on failure the error carries the verifier's last line.
pub fn prog_load(spec: ProgSpec<'_>, insns: &[Insn]) -> io::Result<OwnedFd> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut a = [0u64; 15]; // up to attach_prog_fd (offset 112)
    a[0] = spec.prog_type as u64 | ((insns.len() as u64) << 32);
    a[1] = insns.as_ptr() as u64;
    a[2] = license.as_ptr() as u64;
    a[3] = 1 | ((log.len() as u64) << 32); // log_level 1, log_size
    a[4] = log.as_mut_ptr() as u64;
    let mut name = [0u8; 16];
    let n = spec.name.len().min(15);
    name[..n].copy_from_slice(&spec.name.as_bytes()[..n]);
    a[6] = u64::from_le_bytes(name[..8].try_into().unwrap_or_default());
    a[7] = u64::from_le_bytes(name[8..].try_into().unwrap_or_default());
    a[8] = (spec.expected_attach_type as u64) << 32; // prog_ifindex 0
    a[13] = (spec.attach_btf_id as u64) << 32; // line_info_cnt 0, attach_btf_id
    match sys(BPF_PROG_LOAD, &mut a) {
        Ok(r) => Ok(fd(r)),
        Err(e) => {
            let text =
                String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)])
                    .into_owned();
            tracing::debug!("verifier log: {text}");
            let last = text
                .lines()
                .rev()
                .find(|l| {
                    !l.trim().is_empty()
                        && !l.starts_with("processed ")
                        && !l.starts_with("verification time")
                })
                .unwrap_or("");
            if last.is_empty() {
                Err(e)
            } else {
                Err(io::Error::new(e.kind(), format!("{e}; verifier: {last}")))
            }
        }
    }
}

/// `BPF_F_BEFORE`: with no relative program or link, a tcx link goes in at the head of the
/// chain (it runs before every program already there).
pub const LINK_BEFORE: u32 = 1 << 3;

/// BPF_LINK_CREATE: `target` is an ifindex or a cgroup fd (0 for an iterator).
pub fn link_create(prog: &impl AsFd, target: u32, attach_type: u32) -> io::Result<OwnedFd> {
    link_create_flags(prog, target, attach_type, 0)
}

/// [`link_create`] with `flags` ([`LINK_BEFORE`]; the tcx relative fd/id and expected revision
/// are left 0: none).
pub fn link_create_flags(
    prog: &impl AsFd,
    target: u32,
    attach_type: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut a = [0u64; 6];
    a[0] = prog.as_fd().as_raw_fd() as u32 as u64 | ((target as u64) << 32);
    a[1] = attach_type as u64 | ((flags as u64) << 32);
    sys(BPF_LINK_CREATE, &mut a).map(fd)
}

/// BPF_RAW_TRACEPOINT_OPEN with no name: attaches a fentry/fexit program.
pub fn tracing_attach(prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut a = [0u64; 2];
    a[1] = prog.as_raw_fd() as u32 as u64;
    sys(BPF_RAW_TRACEPOINT_OPEN, &mut a).map(fd)
}

/// BPF_ITER_CREATE: an iterator file to read from an iterator link.
pub fn iter_create(link: &impl AsFd) -> io::Result<std::fs::File> {
    let mut a = [0u64; 1];
    a[0] = link.as_fd().as_raw_fd() as u32 as u64;
    sys(BPF_ITER_CREATE, &mut a).map(|r| std::fs::File::from(fd(r)))
}

/// A one-entry array map (key 0) of `value_size` bytes.
pub fn array_map(value_size: u32) -> io::Result<OwnedFd> {
    let mut a = [0u64; 8];
    a[0] = 2 | (4u64 << 32); // BPF_MAP_TYPE_ARRAY, key_size 4
    a[1] = value_size as u64 | (1u64 << 32); // value_size, max_entries 1
    sys(BPF_MAP_CREATE, &mut a).map(fd)
}

/// The value of key 0 of a one-entry array map.
pub fn array_get(map: &OwnedFd, out: &mut [u8]) -> io::Result<()> {
    let key = 0u32;
    let mut a = [0u64; 4];
    a[0] = map.as_raw_fd() as u32 as u64;
    a[1] = &key as *const u32 as u64;
    a[2] = out.as_mut_ptr() as u64;
    sys(BPF_MAP_LOOKUP_ELEM, &mut a).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insn_encoding() {
        let i = asm::ldx(2, 2, 8, 14);
        assert_eq!((i.code, i.regs, i.off), (0x69, 0x82, 14));
        assert_eq!(asm::stx(8, 10, 0, -16).code, 0x7b);
        assert_eq!(asm::st_imm(4, 10, -4, 0).code, 0x62);
        assert_eq!(asm::ldx(4, 0, 1, 0).code, 0x61);
        assert_eq!(asm::ldx(1, 0, 1, 0).code, 0x71);
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }
}

//! The system calls and host facts, each in one place: bpf(2) calls the
//! loaders lack, entering a network namespace, capabilities, preflight
//! checks and the monotonic clock.
pub mod bpf;
pub mod bpfprog;
pub mod btf;
pub mod caps;
pub mod cgroup;
pub mod clock;
pub mod conntrack;
pub mod files;
pub mod flowcache;
pub mod mmap;
pub mod netlink;
pub mod netns;
pub mod preflight;
pub mod rtnl;
pub mod sockdiag;
pub mod tcpinfo;

/// Give the allocator's free memory back to the kernel. glibc keeps what a
/// read freed inside its heap (only the top is returned), so the transient
/// lists of one read at 100,000 flows stayed in the resident set for the rest
/// of the run. Called once per report interval; a no-op on other C libraries.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's arenas to
    // the kernel; no live allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

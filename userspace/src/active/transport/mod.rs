//! The transports behind [`crate::active::engine::Transport`]: TCP in the
//! reactor ([`tcp`]), TCP on a blocking thread ([`tcp_blocking`]), and UDP or
//! ICMP echo datagrams ([`dgram`]). Each moves requests and replies and reads
//! the clock around its system calls; the engine does the counting.
pub(crate) mod connect;
pub(crate) mod dgram;
pub(crate) mod tcp;
pub(crate) mod tcp_blocking;

/// A raw syscall result as io::Result.
pub(crate) fn sys_io(rc: isize) -> std::io::Result<usize> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

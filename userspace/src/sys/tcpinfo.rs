//! `getsockopt(TCP_INFO)`: what the kernel's TCP says of one socket, read once where a probe
//! needs it (the SYN retransmissions of `probe tcp-connect`).
use std::os::fd::AsRawFd;

/// The kernel's `struct tcp_info` of a TCP socket.
pub fn tcp_info(fd: &impl AsRawFd) -> std::io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain old data (integers only): all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `info`, which is that large; an older
    // kernel writes fewer and leaves the rest zero.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

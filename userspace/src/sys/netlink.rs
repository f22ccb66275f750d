//! One netlink socket of the namespace it was opened in, asked one question
//! at a time: the request goes out with a sequence number and the answer's
//! datagrams are read until one carries it (an answer to an earlier question
//! that timed out is skipped). sock_diag (`sys::sockdiag`), ctnetlink
//! (`sys::conntrack`) and route netlink (`sys::rtnl`, whose interface
//! notifications subscribe to a group) ask through it. Reads time out after one second.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

/// `struct nlmsghdr`.
pub const NLMSG_HDR: usize = 16;

/// A netlink socket of one protocol in one network namespace.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    what: &'static str,
    /// The largest datagram read (a dump's are as large as the reader's buffer, up to 32 KiB).
    buf_len: usize,
}

impl Netlink {
    /// Open one of `protocol` in the calling thread's namespace (`netns::run_in` for another);
    /// `what` names it in errors (`sock_diag`, `ctnetlink`).
    pub fn open(protocol: libc::c_int, what: &'static str) -> Result<Netlink> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("opening a {what} socket"));
        }
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let nl = Netlink {
            fd,
            seq: 0,
            what,
            buf_len: 8192,
        };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        nl.set_option(libc::SO_RCVTIMEO, &tv)
            .with_context(|| format!("setting a {what} socket's read timeout"))?;
        Ok(nl)
    }

    /// setsockopt(SOL_SOCKET, `opt`, `value`): `T` must be the option's C type.
    pub fn set_option<T: Copy>(&self, opt: libc::c_int, value: &T) -> std::io::Result<()> {
        // SAFETY: value outlives the call, its size is given.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                value as *const T as *const libc::c_void,
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Read answers of up to `bytes` per datagram (8 KiB unless said: one message's answers).
    pub fn answers_up_to(mut self, bytes: usize) -> Netlink {
        self.buf_len = bytes;
        self
    }

    /// Join the multicast `groups` (a bit mask, e.g. `RTMGRP_LINK`): the kernel's notifications
    /// of them arrive on this socket from now on.
    pub fn subscribe(&self, groups: u32) -> std::io::Result<()> {
        // SAFETY: sockaddr_nl is plain old data; zeroed is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        // SAFETY: sa is a valid sockaddr_nl of the given size.
        let rc = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next sequence number, for the request about to be sent.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Send `req` (its header already carrying [`Netlink::next_seq`]'s number) and hand each
    /// datagram of the answer to `answer` until it returns Some (None: another question's
    /// answer, read on).
    pub fn ask<T>(
        &mut self,
        req: &[u8],
        mut answer: impl FnMut(&[u8]) -> Result<Option<T>>,
    ) -> Result<T> {
        let fd = self.fd.as_raw_fd();
        // SAFETY: req is a valid buffer of the given length.
        let n = unsafe { libc::send(fd, req.as_ptr() as *const libc::c_void, req.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("asking {}", self.what));
        }
        let mut buf = vec![0u8; self.buf_len];
        loop {
            // SAFETY: buf is a valid, writable buffer of the given length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("reading {}'s answer", self.what));
            }
            if let Some(v) = answer(&buf[..n as usize])? {
                return Ok(v);
            }
        }
    }
}

impl AsRawFd for Netlink {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// The messages of one datagram (a dump's carry several): (type, sequence, payload after the
/// header); a malformed one ends them with an error.
pub fn messages(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, u32, &[u8])>> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDR {
            return None;
        }
        let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDR || len > b.len() {
            b = &[];
            return Some(Err(anyhow::anyhow!(
                "a malformed netlink message ({len} bytes)"
            )));
        }
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        let seq = u32::from_ne_bytes(b[8..12].try_into().unwrap());
        let payload = &b[NLMSG_HDR..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some(Ok((kind, seq, payload)))
    })
}

/// A message header: (length, type, flags, seq).
pub fn header(b: &[u8]) -> Result<(usize, u16, u16, u32)> {
    if b.len() < NLMSG_HDR {
        bail!("short netlink answer ({} bytes)", b.len());
    }
    Ok((
        u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize,
        u16::from_ne_bytes([b[4], b[5]]),
        u16::from_ne_bytes([b[6], b[7]]),
        u32::from_ne_bytes(b[8..12].try_into().unwrap()),
    ))
}

/// The error number of an NLMSG_ERROR message (0: an acknowledgement), None for another type.
pub fn error_of(b: &[u8]) -> Option<i32> {
    let (_, kind, _, _) = header(b).ok()?;
    if kind != libc::NLMSG_ERROR as u16 || b.len() < NLMSG_HDR + 4 {
        return None;
    }
    Some(-i32::from_ne_bytes(b[16..20].try_into().unwrap()))
}

/// The attributes of a netlink message part: (type without the nested/byte-order flags,
/// payload); stops at the first malformed one.
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((kind, payload))
    })
}

/// Append one attribute (padded to 4 bytes) to a request.
pub fn put_attr(req: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    req.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    req.extend_from_slice(&kind.to_ne_bytes());
    req.extend_from_slice(payload);
    req.resize((req.len() + 3) & !3, 0);
}

/// Open a nested attribute in a request; [`end_nest`] with the returned offset closes it.
pub fn begin_nest(req: &mut Vec<u8>, kind: u16) -> usize {
    let at = req.len();
    put_attr(req, kind | 0x8000, &[]);
    at
}

/// Close a nested attribute [`begin_nest`] opened: its length covers what was put since.
pub fn end_nest(req: &mut [u8], at: usize) {
    let len = (req.len() - at) as u16;
    req[at..at + 2].copy_from_slice(&len.to_ne_bytes());
}

/// Fill a request's header (length, type, flags, seq) in its first 16 bytes.
pub fn set_header(req: &mut [u8], kind: u16, flags: u16, seq: u32) {
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&kind.to_ne_bytes());
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&seq.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip() {
        let mut r = vec![0u8; NLMSG_HDR];
        let n = begin_nest(&mut r, 1);
        put_attr(&mut r, 2, &[1, 2, 3]);
        put_attr(&mut r, 3, &7u16.to_be_bytes());
        end_nest(&mut r, n);
        set_header(&mut r, 0x101, 1, 9);
        assert_eq!(header(&r).unwrap(), (r.len(), 0x101, 1, 9));
        let outer: Vec<_> = attrs(&r[NLMSG_HDR..]).collect();
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, 1, "the nested flag is masked");
        let inner: Vec<_> = attrs(outer[0].1).collect();
        assert_eq!(inner, vec![(2, &[1u8, 2, 3][..]), (3, &[0u8, 7][..])]);
        // truncated: no attribute past the end
        assert_eq!(attrs(&r[NLMSG_HDR..r.len() - 2]).count(), 0);
    }
}

//! The request/response wire format between `rttscope probe` and `rttscope serve`.
//!
//! **TCP.** A connection starts with a 16-byte hello from the client:
//!
//! ```text
//! 0      4        8         12       16
//! | "RTS1" | req u32 | resp u32 | flags u32 |   (big endian)
//! ```
//!
//! `req` is the size of every request on this connection, `resp` the size of
//! every response; flag bit 0 asks the server to set TCP_NODELAY too. The
//! server answers with the 4 bytes `"RTOK"` (or closes the connection when the
//! hello is invalid or a size exceeds its limit). After that the data is raw,
//! as in netperf's TCP_RR: the client writes `req` bytes, the server reads
//! exactly `req` bytes and writes `resp` bytes, and so on. So `-r 1,1` puts
//! one byte on the wire each way, the same as netperf.
//!
//! **UDP.** Every request datagram carries a 16-byte header:
//!
//! ```text
//! 0      4         8              16
//! | "RTU1" | resp u32 | seq u64       | padding up to the request size
//! ```
//!
//! The server answers with a datagram of `resp` bytes that starts with the same
//! header (magic, resp, seq), so the client can match replies to requests and
//! count loss, late replies and duplicates. UDP requests and responses are
//! therefore at least 16 bytes; smaller `-r` sizes are raised to 16 and the
//! result records the sizes actually sent.
//!
//! **UDP cookies.** The server never answers a datagram with a larger one
//! unless the peer proved it receives at its source address (otherwise a
//! spoofed 16-byte request would make it reflect 64 KiB at a victim). A
//! client whose response is larger than its request first sends a 16-byte
//! cookie request and gets a 16-byte cookie datagram:
//!
//! ```text
//! 0      4            16              0      4            8            16
//! | "RTUC" | zero x12   |    ->        | "RTUK" | zero u32   | cookie u64 |
//! ```
//!
//! It then carries the cookie in bytes 16..24 of every request (so such
//! requests are at least 24 bytes):
//!
//! ```text
//! 0      4         8              16           24
//! | "RTU1" | resp u32 | seq u64       | cookie u64 | padding up to the request size
//! ```
//!
//! A request whose response is not larger than the datagram itself needs no
//! cookie (bytes 16.. are then ignored). A request asking for more without a
//! valid cookie is answered with a fresh cookie datagram (16 bytes, never more
//! than the request) instead of the response; the client takes the new cookie
//! and sends the request again. A response to a request that carried a valid
//! cookie holds the server's current cookie in its bytes 16..24, so a running
//! client keeps a fresh one without asking. The cookie is a keyed hash of the
//! peer's address and port and a time window (see `serve/limits.rs`).
use thiserror::Error;

pub const HELLO_MAGIC: [u8; 4] = *b"RTS1";
pub const HELLO_ACK: [u8; 4] = *b"RTOK";
pub const HELLO_LEN: usize = 16;
pub const UDP_MAGIC: [u8; 4] = *b"RTU1";
pub const UDP_HEADER_LEN: usize = 16;
/// The largest UDP payload over IPv4.
pub const UDP_MAX: u32 = 65507;
pub const FLAG_NODELAY: u32 = 1;
/// A UDP cookie request ("give me a cookie"), 16 bytes.
pub const UDP_COOKIE_REQ_MAGIC: [u8; 4] = *b"RTUC";
/// A UDP cookie datagram from the server, 16 bytes.
pub const UDP_COOKIE_MAGIC: [u8; 4] = *b"RTUK";
/// Length of a cookie request and of a cookie datagram.
pub const UDP_COOKIE_LEN: usize = 16;
/// A request that carries a cookie (bytes 16..24) is at least this long.
pub const UDP_COOKIE_REQ_MIN: usize = UDP_HEADER_LEN + 8;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame too short: {0} bytes")]
    Short(usize),
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("size {0} is zero")]
    ZeroSize(&'static str),
    #[error("{what} size {size} exceeds the limit {limit}")]
    TooLarge {
        what: &'static str,
        size: u32,
        limit: u32,
    },
    #[error("unknown flags {0:#x}")]
    BadFlags(u32),
}

/// A TCP connection's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub req: u32,
    pub resp: u32,
    pub flags: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4..8].copy_from_slice(&self.req.to_be_bytes());
        b[8..12].copy_from_slice(&self.resp.to_be_bytes());
        b[12..16].copy_from_slice(&self.flags.to_be_bytes());
        b
    }

    /// Decode and validate a hello against the server's size limit.
    pub fn decode(b: &[u8], max_size: u32) -> Result<Hello, FrameError> {
        if b.len() < HELLO_LEN {
            return Err(FrameError::Short(b.len()));
        }
        let magic: [u8; 4] = b[0..4].try_into().unwrap();
        if magic != HELLO_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let req = u32::from_be_bytes(b[4..8].try_into().unwrap());
        let resp = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let flags = u32::from_be_bytes(b[12..16].try_into().unwrap());
        check_size("request", req, max_size)?;
        check_size("response", resp, max_size)?;
        if flags & !FLAG_NODELAY != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        Ok(Hello { req, resp, flags })
    }
}

fn check_size(what: &'static str, size: u32, limit: u32) -> Result<(), FrameError> {
    if size == 0 {
        return Err(FrameError::ZeroSize(what));
    }
    if size > limit {
        return Err(FrameError::TooLarge { what, size, limit });
    }
    Ok(())
}

/// The header of a UDP request or response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    pub resp: u32,
    pub seq: u64,
}

impl UdpHeader {
    /// Write the header into the first 16 bytes of `buf` (which must be at least that long).
    pub fn write(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&UDP_MAGIC);
        buf[4..8].copy_from_slice(&self.resp.to_be_bytes());
        buf[8..16].copy_from_slice(&self.seq.to_be_bytes());
    }

    /// Decode a request (the server side), validating `resp` against the limit.
    pub fn decode_request(b: &[u8], max_size: u32) -> Result<UdpHeader, FrameError> {
        let h = Self::decode(b)?;
        check_size("response", h.resp, max_size.min(UDP_MAX))?;
        if (h.resp as usize) < UDP_HEADER_LEN {
            return Err(FrameError::TooLarge {
                what: "response (below the 16-byte header)",
                size: h.resp,
                limit: UDP_HEADER_LEN as u32,
            });
        }
        Ok(h)
    }

    /// Decode the header without validating sizes (the client side).
    pub fn decode(b: &[u8]) -> Result<UdpHeader, FrameError> {
        if b.len() < UDP_HEADER_LEN {
            return Err(FrameError::Short(b.len()));
        }
        let magic: [u8; 4] = b[0..4].try_into().unwrap();
        if magic != UDP_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        Ok(UdpHeader {
            resp: u32::from_be_bytes(b[4..8].try_into().unwrap()),
            seq: u64::from_be_bytes(b[8..16].try_into().unwrap()),
        })
    }
}

/// The 16-byte cookie request a client sends before a run whose responses are
/// larger than its requests.
pub fn cookie_request() -> [u8; UDP_COOKIE_LEN] {
    let mut b = [0u8; UDP_COOKIE_LEN];
    b[0..4].copy_from_slice(&UDP_COOKIE_REQ_MAGIC);
    b
}

/// Is this datagram a cookie request (magic "RTUC")? `Some(false)`: it has the
/// magic but is too short.
pub fn is_cookie_request(b: &[u8]) -> Option<bool> {
    if b.len() >= 4 && b[0..4] == UDP_COOKIE_REQ_MAGIC {
        Some(b.len() >= UDP_COOKIE_LEN)
    } else {
        None
    }
}

/// The server's 16-byte cookie datagram.
pub fn encode_cookie(cookie: u64) -> [u8; UDP_COOKIE_LEN] {
    let mut b = [0u8; UDP_COOKIE_LEN];
    b[0..4].copy_from_slice(&UDP_COOKIE_MAGIC);
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// The cookie in a server's cookie datagram (the client side).
pub fn decode_cookie(b: &[u8]) -> Option<u64> {
    if b.len() >= UDP_COOKIE_LEN && b[0..4] == UDP_COOKIE_MAGIC {
        Some(u64::from_be_bytes(b[8..16].try_into().unwrap()))
    } else {
        None
    }
}

/// Bytes 16..24 of a request or response (the cookie, when one is carried).
pub fn carried_cookie(b: &[u8]) -> Option<u64> {
    b.get(UDP_HEADER_LEN..UDP_COOKIE_REQ_MIN)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
}

/// Write `cookie` into bytes 16..24 of `buf` (at least 24 bytes long).
pub fn write_cookie(buf: &mut [u8], cookie: u64) {
    buf[UDP_HEADER_LEN..UDP_COOKIE_REQ_MIN].copy_from_slice(&cookie.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_roundtrip_and_limits() {
        let h = Hello {
            req: 1,
            resp: 2,
            flags: FLAG_NODELAY,
        };
        assert_eq!(Hello::decode(&h.encode(), 100).unwrap(), h);
        let big = Hello {
            req: 1,
            resp: u32::MAX,
            flags: 0,
        };
        assert!(matches!(
            Hello::decode(&big.encode(), 1 << 20),
            Err(FrameError::TooLarge { .. })
        ));
        let zero = Hello {
            req: 0,
            resp: 1,
            flags: 0,
        };
        assert_eq!(
            Hello::decode(&zero.encode(), 10),
            Err(FrameError::ZeroSize("request"))
        );
        assert_eq!(
            Hello::decode(b"GET / HTTP/1.1\r\n", 10).unwrap_err(),
            FrameError::BadMagic(*b"GET ")
        );
        assert_eq!(Hello::decode(b"RTS1", 10), Err(FrameError::Short(4)));
        let mut flags = h.encode();
        flags[15] = 6;
        assert!(matches!(
            Hello::decode(&flags, 100),
            Err(FrameError::BadFlags(_))
        ));
    }

    #[test]
    fn udp_roundtrip() {
        let mut b = vec![0u8; 64];
        let h = UdpHeader { resp: 32, seq: 77 };
        h.write(&mut b);
        assert_eq!(UdpHeader::decode_request(&b, 1000).unwrap(), h);
        assert!(UdpHeader::decode_request(&b, 20).is_err());
        let small = UdpHeader { resp: 3, seq: 1 };
        small.write(&mut b);
        assert!(UdpHeader::decode_request(&b, 1000).is_err());
        assert!(UdpHeader::decode(&b[..15]).is_err());
    }

    #[test]
    fn cookie_datagrams() {
        let r = cookie_request();
        assert_eq!(r.len(), UDP_COOKIE_LEN);
        assert_eq!(is_cookie_request(&r), Some(true));
        assert_eq!(is_cookie_request(&r[..8]), Some(false));
        assert_eq!(is_cookie_request(b"RTU1xxxxxxxxxxxx"), None);
        let k = encode_cookie(0x0102_0304_0506_0708);
        assert_eq!(k.len(), UDP_COOKIE_LEN);
        assert_eq!(decode_cookie(&k), Some(0x0102_0304_0506_0708));
        assert_eq!(decode_cookie(&k[..15]), None);
        assert_eq!(decode_cookie(&r), None);
        // A cookie datagram is not a reply: it does not decode as a UDP header.
        assert!(UdpHeader::decode(&k).is_err());
        let mut b = vec![0u8; 30];
        UdpHeader { resp: 100, seq: 9 }.write(&mut b);
        write_cookie(&mut b, 42);
        assert_eq!(carried_cookie(&b), Some(42));
        assert_eq!(carried_cookie(&b[..23]), None);
        assert_eq!(UdpHeader::decode_request(&b, 1000).unwrap().seq, 9);
    }

    proptest! {
        #[test]
        fn cookie_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = is_cookie_request(&bytes);
            if let Some(c) = decode_cookie(&bytes) {
                prop_assert_eq!(&bytes[8..16], &c.to_be_bytes()[..]);
            }
            let _ = carried_cookie(&bytes);
        }

        #[test]
        fn hello_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in any::<u32>()) {
            if let Ok(h) = Hello::decode(&bytes, max) {
                prop_assert!(h.req >= 1 && h.req <= max);
                prop_assert!(h.resp >= 1 && h.resp <= max);
                prop_assert_eq!(&h.encode()[..], &bytes[..HELLO_LEN]);
            }
        }

        #[test]
        fn udp_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in any::<u32>()) {
            if let Ok(h) = UdpHeader::decode_request(&bytes, max) {
                prop_assert!(h.resp as usize >= UDP_HEADER_LEN && h.resp <= max.min(UDP_MAX));
            }
        }

        #[test]
        fn hello_roundtrips(req in 1u32..=1_000_000, resp in 1u32..=1_000_000, nd in any::<bool>()) {
            let h = Hello { req, resp, flags: if nd { FLAG_NODELAY } else { 0 } };
            prop_assert_eq!(Hello::decode(&h.encode(), 1_000_000).unwrap(), h);
        }

        #[test]
        fn udp_roundtrips(resp in 16u32..=UDP_MAX, seq in any::<u64>()) {
            let mut b = [0u8; 16];
            let h = UdpHeader { resp, seq };
            h.write(&mut b);
            prop_assert_eq!(UdpHeader::decode_request(&b, UDP_MAX).unwrap(), h);
        }
    }
}

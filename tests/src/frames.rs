//! Crafted Ethernet + IPv4 + TCP frames: for the sampler's parser tests
//! (tests/tests/sampler.rs) and its BPF_PROG_TEST_RUN benchmark
//! (scripts/bench/sampler.rs).

/// The Internet checksum (RFC 1071) of `data`.
pub fn csum(data: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in data.chunks(2) {
        s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[derive(Clone, Copy)]
pub struct Tcp {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub payload: usize,
}

/// Ethernet + IPv4 + TCP. `ihl_extra` adds IP option words, `frag` sets MF.
pub fn frame(t: Tcp, ihl_extra: usize, frag: bool, doff: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 1]);
    f.extend([0x08, 0x00]);
    let ihl = 5 + ihl_extra;
    let tcp_len = 20 + t.payload;
    let tot = ihl * 4 + tcp_len;
    let mut ip = vec![0x40 | ihl as u8, 0];
    ip.extend((tot as u16).to_be_bytes());
    ip.extend([0, 1]);
    ip.extend(if frag { [0x20, 0] } else { [0x40, 0] });
    ip.extend([64, 6, 0, 0]);
    ip.extend(t.src);
    ip.extend(t.dst);
    ip.extend(std::iter::repeat_n(1u8, ihl_extra * 4)); // NOP options
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend(ip);
    f.extend(t.sport.to_be_bytes());
    f.extend(t.dport.to_be_bytes());
    f.extend(t.seq.to_be_bytes());
    f.extend(t.ack.to_be_bytes());
    f.extend([doff << 4, t.flags]);
    f.extend([0xff, 0xff, 0, 0, 0, 0]);
    f.extend(std::iter::repeat_n(b'x', t.payload));
    f
}

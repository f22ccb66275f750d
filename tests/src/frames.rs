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
    set_tcp_csum(&mut f, 14 + ihl * 4);
    f
}

/// Sets the TCP checksum of an Ethernet + IPv4 frame whose TCP header starts at `l4`: over
/// the pseudo-header and the rest of the frame (the stack drops a segment whose checksum is
/// wrong, and so does the sampler).
pub fn set_tcp_csum(f: &mut [u8], l4: usize) {
    f[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
    let mut pseudo = f[26..34].to_vec();
    pseudo.extend([0, 6]);
    pseudo.extend(((f.len() - l4) as u16).to_be_bytes());
    pseudo.extend(&f[l4..]);
    let c = csum(&pseudo);
    f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

/// An ICMP or ICMPv6 message: echo (request/reply) carries `id` and `seq`;
/// for other types they fill the second header word.
#[derive(Clone, Copy)]
pub struct Icmp {
    pub typ: u8,
    pub id: u16,
    pub seq: u16,
    /// Bytes after the 8-byte header.
    pub payload: usize,
}

/// ICMP echo types.
pub const ECHO_REQUEST: u8 = 8;
pub const ECHO_REPLY: u8 = 0;
pub const ECHO6_REQUEST: u8 = 128;
pub const ECHO6_REPLY: u8 = 129;

fn icmp_body(m: Icmp) -> Vec<u8> {
    let mut b = vec![m.typ, 0, 0, 0];
    b.extend(m.id.to_be_bytes());
    b.extend(m.seq.to_be_bytes());
    b.extend(std::iter::repeat_n(b'p', m.payload));
    b
}

/// Ethernet + IPv4 + ICMP (checksums set; ICMPv4's over the message).
pub fn icmp_frame(src: [u8; 4], dst: [u8; 4], m: Icmp) -> Vec<u8> {
    let mut body = icmp_body(m);
    let c = csum(&body);
    body[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let mut ip = vec![0x45, 0];
    ip.extend(((20 + body.len()) as u16).to_be_bytes());
    ip.extend([0, 1, 0x40, 0, 64, 1, 0, 0]);
    ip.extend(src);
    ip.extend(dst);
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend(ip);
    f.extend(body);
    f
}

/// Ethernet + IPv6 + ICMPv6, its checksum over the pseudo-header
/// (addresses, length, next header 58) and the message (RFC 4443).
pub fn icmp6_frame(src: [u8; 16], dst: [u8; 16], m: Icmp) -> Vec<u8> {
    let mut body = icmp_body(m);
    let mut pseudo = Vec::with_capacity(40 + body.len());
    pseudo.extend(src);
    pseudo.extend(dst);
    pseudo.extend((body.len() as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, 58]);
    pseudo.extend(&body);
    let c = csum(&pseudo);
    body[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 1, 0x86, 0xdd]);
    f.extend([0x60, 0, 0, 0]);
    f.extend((body.len() as u16).to_be_bytes());
    f.extend([58, 64]);
    f.extend(src);
    f.extend(dst);
    f.extend(body);
    f
}

/// Send raw Ethernet frames out of `ifname` in the calling thread's namespace.
pub fn send_frames(ifname: &str, frames: &[Vec<u8>]) {
    let cname = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: plain socket calls with valid buffers.
    unsafe {
        let idx = libc::if_nametoindex(cname.as_ptr());
        assert!(idx > 0, "no interface {ifname}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = idx as i32;
        sll.sll_halen = 6;
        for fr in frames {
            let r = libc::sendto(
                fd,
                fr.as_ptr().cast(),
                fr.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert!(r >= 0, "sendto: {}", std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
}

/// `f` (an Ethernet frame) with 802.1Q/802.1ad tags inserted after its MAC addresses, outermost
/// first: `(TPID, VLAN id)` each.
pub fn vlan_tagged(f: &[u8], tags: &[(u16, u16)]) -> Vec<u8> {
    let mut v = f[..12].to_vec();
    for (tpid, id) in tags {
        v.extend(tpid.to_be_bytes());
        v.extend(id.to_be_bytes());
    }
    v.extend(&f[12..]);
    v
}

/// The outer network of a tunnelled frame.
#[derive(Clone, Copy)]
pub enum Outer {
    V4([u8; 4], [u8; 4]),
    V6([u8; 16], [u8; 16]),
}

/// Ethernet + outer IPv4 or IPv6 (protocol `proto`) + `payload` (IPv4 header checksum set).
pub fn outer_ip(outer: Outer, proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 2]);
    match outer {
        Outer::V4(src, dst) => {
            f.extend([0x08, 0x00]);
            let mut ip = vec![0x45, 0];
            ip.extend(((20 + payload.len()) as u16).to_be_bytes());
            ip.extend([0, 1, 0x40, 0, 64, proto, 0, 0]);
            ip.extend(src);
            ip.extend(dst);
            let c = csum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend(ip);
        }
        Outer::V6(src, dst) => {
            f.extend([0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend((payload.len() as u16).to_be_bytes());
            f.extend([proto, 64]);
            f.extend(src);
            f.extend(dst);
        }
    }
    f.extend(payload);
    f
}

/// A UDP datagram (checksum 0: none, as Linux's VXLAN sends over IPv4 by default).
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend(dport.to_be_bytes());
    u.extend(((8 + payload.len()) as u16).to_be_bytes());
    u.extend([0, 0]);
    u.extend(payload);
    u
}

/// `inner` (an Ethernet frame) in VXLAN with `vni`, to UDP port `port`, over `outer`.
pub fn vxlan(outer: Outer, port: u16, vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut h = vec![0x08, 0, 0, 0];
    h.extend(&vni.to_be_bytes()[1..]);
    h.push(0);
    h.extend(inner);
    outer_ip(outer, 17, &udp(49999, port, &h))
}

/// `inner` in Geneve (version 0) with `vni` and `opt_words` 4-byte words of options, protocol
/// type `ptype` (0x6558: `inner` is an Ethernet frame; 0x0800/0x86dd: an IP packet), to UDP 6081.
pub fn geneve(outer: Outer, vni: u32, opt_words: u8, ptype: u16, inner: &[u8]) -> Vec<u8> {
    let mut h = vec![opt_words & 0x3f, 0];
    h.extend(ptype.to_be_bytes());
    h.extend(&vni.to_be_bytes()[1..]);
    h.push(0);
    for i in 0..opt_words {
        // option class 0x0103, type i, length 0 words: one 4-byte option header each
        h.extend([0x01, 0x03, i, 0]);
    }
    h.extend(inner);
    outer_ip(outer, 17, &udp(49999, 6081, &h))
}

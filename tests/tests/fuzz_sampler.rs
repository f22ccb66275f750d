//! The sampler's kernel packet parser fuzzed in the real kernel (issue 26): the tc programs that
//! `rttscope observe --view sampler` loads are run by BPF_PROG_TEST_RUN on generated frames
//! (truncated headers, bad IHL and data offset, IPv6 extension headers, VLAN tags, ICMP error and
//! other types, bad checksums, ...) and on random mutations of good ACKs and echo replies. For
//! every frame: the verdict is pass, the program counted the packet, a frame built malformed
//! produces no sample and is counted by exactly one skip counter, and a mutant that produces a
//! sample is one the parser's rules accept (a TCP ACK of the pending flow, or an ICMP echo reply
//! with good checksums). RTTSCOPE_FUZZ_FRAMES sets the number of mutants (scripts/fuzz.sh runs
//! many more; docs/fuzzing.md).
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rttscope::views::sampler::hook_tags;
use rttscope_e2e::frames::{
    csum, frame, geneve, icmp_frame, outer_ip, udp, vlan_tagged, vxlan, Icmp, Outer, Tcp,
    ECHO_REPLY, ECHO_REQUEST,
};
use rttscope_e2e::{require_root, rttscope_bin, ChildGuard, NetNs};
use serde_json::Value;

const PASS: u32 = u32::MAX; // TCX_NEXT / TC_ACT_UNSPEC: -1
const LOCAL: [u8; 4] = [10, 77, 0, 1];
const PEER: [u8; 4] = [10, 77, 0, 99];

fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: bpf(2) with an attr buffer of the size passed (zero-filled past the fields set).
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() * 8) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_by_id(cmd: libc::c_long, id: u32) -> OwnedFd {
    let mut attr = [0u64; 2];
    attr[0] = id as u64;
    let fd = bpf(cmd, &mut attr).unwrap_or_else(|e| panic!("fd of bpf object {id}: {e}"));
    // SAFETY: a fresh fd the kernel gave us.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// The ids of the maps a program uses (BPF_OBJ_GET_INFO_BY_FD: nr_map_ids at byte 52, map_ids
/// pointer at byte 56 of struct bpf_prog_info).
fn prog_map_ids(prog: &OwnedFd) -> Vec<u32> {
    let mut ids = vec![0u32; 64];
    let mut info = [0u8; 256];
    info[52..56].copy_from_slice(&64u32.to_ne_bytes());
    info[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    let mut attr = [0u64; 2];
    attr[0] = prog.as_raw_fd() as u64 | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(15, &mut attr).expect("BPF_OBJ_GET_INFO_BY_FD");
    let n = u32::from_ne_bytes(info[52..56].try_into().unwrap()) as usize;
    ids.truncate(n.min(64));
    ids
}

/// The name of a map (struct bpf_map_info: name at byte 24, 16 bytes).
fn map_name(map: &OwnedFd) -> String {
    let mut info = [0u8; 128];
    let mut attr = [0u64; 2];
    attr[0] = map.as_raw_fd() as u64 | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(15, &mut attr).expect("map info");
    let n = &info[24..40];
    String::from_utf8_lossy(&n[..n.iter().position(|&c| c == 0).unwrap_or(16)]).into_owned()
}

/// One run of a loaded program on a frame: its return value, or None when the kernel refuses
/// the frame itself (no more than an Ethernet header).
fn test_run(prog: &OwnedFd, data: &[u8]) -> Option<u32> {
    let mut attr = [0u64; 10];
    attr[0] = prog.as_raw_fd() as u64; // prog_fd, retval
    attr[1] = data.len() as u64; // data_size_in, data_size_out
    attr[2] = data.as_ptr() as u64;
    match bpf(10, &mut attr) {
        Ok(_) => Some((attr[0] >> 32) as u32),
        // the kernel itself refuses a frame without a whole IPv4 or IPv6 header (test_run)
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && data.len() < 14 + 40 => None,
        Err(e) => panic!("BPF_PROG_TEST_RUN on {} bytes: {e}", data.len()),
    }
}

/// The sampler's loaded programs and its counters maps.
struct Kernel {
    egr: OwnedFd,
    ing: OwnedFd,
    counters: OwnedFd,
    /// `sampler_hooks`: each hook's key and packets, per CPU, which
    /// `seen_ingress`/`seen_egress` are the sums of.
    hooks: OwnedFd,
    /// The hooks BPF_PROG_TEST_RUN's packets count under, [ingress, egress] (entry, key): the
    /// observed namespace's (the programs' `cfg_netns`) and the loopback device's index (1),
    /// which the kernel gives a test run's skb; entered by the test as userspace enters an
    /// attached interface's hooks.
    test_hooks: [(u32, u64); 2],
    names: BTreeMap<u32, &'static str>,
    cpus: usize,
}

impl Kernel {
    fn counters(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        let mut val = vec![0u8; 8 * self.cpus];
        for (&i, &name) in &self.names {
            let found =
                rttscope::sys::bpf::lookup(self.counters.as_fd(), &i.to_ne_bytes(), &mut val)
                    .expect("counter lookup");
            assert!(found, "counter {name} missing");
            let sum = val
                .chunks(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                .sum();
            out.insert(name, sum);
        }
        for ((entry, key), name) in self.test_hooks.iter().zip(["seen_ingress", "seen_egress"]) {
            let cpus = rttscope::sys::bpf::possible_cpus().unwrap();
            let mut v = vec![0u8; hook_tags::ENTRY_BYTES * cpus];
            let found =
                rttscope::sys::bpf::lookup(self.hooks.as_fd(), &entry.to_ne_bytes(), &mut v)
                    .expect("hook counter lookup");
            assert!(found, "hook counter {name} missing");
            out.insert(name, hook_tags::packets(&v, *key));
        }
        out
    }

    /// Run `prog` on `data`: the verdict must be pass; returns the counters that moved.
    fn run(&self, ingress: bool, data: &[u8]) -> Option<BTreeMap<&'static str, u64>> {
        let before = self.counters();
        let prog = if ingress { &self.ing } else { &self.egr };
        let ret = test_run(prog, data)?;
        assert_eq!(ret, PASS, "verdict {ret:#x} on {}", hex(data));
        let after = self.counters();
        let d: BTreeMap<_, _> = after
            .iter()
            .filter(|(k, v)| before[*k] != **v)
            .map(|(k, v)| (*k, v - before[k]))
            .collect();
        let seen = if ingress {
            "seen_ingress"
        } else {
            "seen_egress"
        };
        assert_eq!(d.get(seen), Some(&1), "{seen} on {}: {d:?}", hex(data));
        Some(d)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().take(80).map(|x| format!("{x:02x}")).collect()
}

/// The counters that say why a packet was skipped (one per skipped packet).
fn is_skip(name: &str) -> bool {
    name.starts_with("skip_")
        || matches!(
            name,
            "icmp_errors"
                | "icmp_other"
                | "icmp_truncated"
                | "icmp_not_for_host"
                | "icmp_bad_checksum"
                | "icmp_unverified"
                | "tcp_not_for_host"
                | "tcp_bad_checksum"
                | "not_ack"
        )
}

fn skips(d: &BTreeMap<&'static str, u64>) -> Vec<(&'static str, u64)> {
    d.iter()
        .filter(|(k, _)| is_skip(k))
        .map(|(k, v)| (*k, *v))
        .collect()
}

/// A namespace whose interface (a veth pair inside it, no address, IPv6 off) carries no traffic of its own: every
/// packet the programs see is a frame this test runs.
fn quiet_netns() -> NetNs {
    let ns = NetNs::new("rtsfz").unwrap();
    for args in [
        &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"][..],
        &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
        &[
            "ip", "link", "add", "fz0", "type", "veth", "peer", "name", "fz1",
        ],
        &["ip", "link", "set", "fz0", "up"],
        &["ip", "link", "set", "fz1", "up"],
    ] {
        let out = ns.exec(args).unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    ns
}

/// `rttscope observe --view sampler` on that interface, its programs and counters.
struct Observer {
    child: ChildGuard,
    kernel: Kernel,
}

fn start_observer(ns: &NetNs) -> Observer {
    let mut cmd = std::process::Command::new(rttscope_bin());
    cmd.args([
        "observe", "--view", "sampler", "--format", "json", "--iface",
    ])
    .arg(format!("{}:fz0", ns.name))
    .args(["--duration", "600s", "--interval", "600s"]);
    let mut child = ChildGuard::spawn(&mut cmd).expect("spawn rttscope observe");
    let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut lines = BufReader::new(stdout);
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    // read the rest until observe exits (a closed pipe would fail its last write)
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    let start: Value = serde_json::from_str(&first)
        .unwrap_or_else(|e| panic!("observe's start line {first:?}: {e}"));
    let mut progs = BTreeMap::new();
    for p in start["sampler"]["prog_ids"].as_array().expect("prog_ids") {
        let (n, id) = match p {
            Value::Array(a) => (&a[0], &a[1]),
            _ => (&p["name"], &p["id"]),
        };
        progs.insert(n.as_str().unwrap().to_string(), id.as_u64().unwrap() as u32);
    }
    let egr = fd_by_id(13, progs["rtt_sampler_egr"]);
    let ing = fd_by_id(13, progs["rtt_sampler_ing"]);
    let map = |prefix: &str| {
        prog_map_ids(&ing)
            .into_iter()
            .map(|id| fd_by_id(14, id))
            .find(|m| map_name(m).starts_with(prefix))
    };
    let counters = map("sampler_counte").expect("the sampler_counters map");
    let hooks = map("sampler_hooks").expect("the sampler_hooks map");
    let names = rttscope::views::sampler::COUNTERS
        .iter()
        .map(|(n, c)| (c.0, *n))
        .collect();
    let cpus = rttscope::sys::bpf::possible_cpus().unwrap();
    let per_cpu = rttscope::sys::bpf::map_info(counters.as_fd())
        .unwrap()
        .map_type
        == 6;
    let test_hooks = test_run_hooks(ns, &hooks, cpus);
    let kernel = Kernel {
        egr,
        ing,
        counters,
        hooks,
        test_hooks,
        names,
        cpus: if per_cpu { cpus } else { 1 },
    };
    Observer { child, kernel }
}

/// Enter the hooks of a test run's packets (the loopback device, index 1, in the observed
/// namespace) as userspace enters an attached interface's (views/sampler/hook_tags.rs): the
/// first unused or released entry from the key's home, written on every CPU with a count of 0.
fn test_run_hooks(ns: &NetNs, hooks: &OwnedFd, cpus: usize) -> [(u32, u64); 2] {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(format!("/run/netns/{}", ns.name))
        .expect("the namespace's file")
        .ino();
    let mask = rttscope::sys::bpf::map_info(hooks.as_fd())
        .unwrap()
        .max_entries
        - 1;
    [0usize, 1].map(|dir| {
        let key = hook_tags::key(ino as u32, 1, dir);
        let entry = hook_tags::free_entry(key, mask, |e| {
            let mut v = vec![0u8; hook_tags::ENTRY_BYTES * cpus];
            rttscope::sys::bpf::lookup(hooks.as_fd(), &e.to_ne_bytes(), &mut v).unwrap();
            u64::from_ne_bytes(v[..8].try_into().unwrap())
        })
        .expect("a free entry for the test runs' hook");
        let v = hook_tags::entry_bytes(key, cpus);
        rttscope::sys::bpf::update(hooks.as_fd(), Some(&entry.to_ne_bytes()), &v, 0)
            .expect("a hook entry for the test runs");
        (entry, key)
    })
}

impl Observer {
    fn stop(self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.pid() as i32, libc::SIGINT) };
        let out = self.child.wait_output(Duration::from_secs(30)).unwrap();
        assert!(
            out.status.success(),
            "observe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn data_seg(seq: u32) -> Vec<u8> {
    frame(
        Tcp {
            src: LOCAL,
            dst: PEER,
            sport: 41111,
            dport: 42222,
            seq,
            ack: 0,
            flags: 0x18,
            payload: 10,
        },
        0,
        false,
        5,
    )
}

fn ack_of(seq: u32) -> Tcp {
    Tcp {
        src: PEER,
        dst: LOCAL,
        sport: 42222,
        dport: 41111,
        seq: 5000,
        ack: seq + 10,
        flags: 0x10,
        payload: 0,
    }
}

/// Frames the parser must skip, each with the counter that must say so.
fn malformed(seq: u32) -> Vec<(&'static str, Vec<u8>)> {
    let ack = ack_of(seq);
    let good = frame(ack, 0, false, 5);
    let set = |at: usize, b: &[u8]| {
        let mut f = good.clone();
        f[at..at + b.len()].copy_from_slice(b);
        f
    };
    let mut v: Vec<(&str, Vec<u8>)> = vec![
        ("skip_ip_options", frame(ack, 1, false, 5)),
        ("skip_ip_options", frame(ack, 10, false, 5)),
        ("skip_fragment", frame(ack, 0, true, 5)),
        ("skip_fragment", set(20, &[0x00, 0x10])), // fragment offset, no MF
        ("skip_malformed", frame(ack, 0, false, 0)),
        ("skip_malformed", frame(ack, 0, false, 4)),
        ("skip_malformed", frame(ack, 0, false, 6)), // data offset past the IP length
        ("skip_malformed", frame(ack, 0, false, 15)),
        ("skip_malformed", set(14, &[0x44])),   // IHL 4
        ("skip_malformed", set(14, &[0x40])),   // IHL 0
        ("skip_malformed", set(14, &[0x55])),   // version 5
        ("skip_malformed", set(14, &[0x65])),   // version 6 in an IPv4 frame
        ("skip_malformed", set(16, &[0, 0])),   // total length 0, no GSO
        ("skip_malformed", set(16, &[0, 39])),  // shorter than IP + TCP
        ("tcp_bad_checksum", set(22, &[63])),   // TTL changed, IPv4 header checksum not
        ("tcp_bad_checksum", set(48, &[0x7f])), // window changed, TCP checksum not
        ("tcp_not_for_host", set(0, &[0x02, 0, 0, 0, 0, 0x42])), // another host's MAC
        ("skip_truncated", set(16, &[0, 41])),  // longer than the frame
        ("skip_truncated", set(16, &[0xff, 0xff])),
        ("skip_non_tcp", set(23, &[17])),
        ("skip_gre", set(23, &[47])),
        ("skip_non_tcp", set(23, &[132])),
        ("skip_non_ip", set(12, &[0x08, 0x06])),
        ("skip_non_ip", set(12, &[0x88, 0xcc])),
        // a third tag (one or two are parsed: tunnels_and_vlans_are_parsed)
        (
            "skip_vlan",
            vlan_tagged(&good, &[(0x88a8, 7), (0x8100, 8), (0x8100, 9)]),
        ),
        ("not_ack", set(47, &[0x02])), // SYN without ACK
    ];
    for cut in [15, 20, 33, 34, 40, 53] {
        v.push(("skip_truncated", good[..cut].to_vec()));
    }
    for nh in [0u8, 43, 44, 51, 60, 135, 139, 140] {
        v.push(("skip_ipv6_ext", v6_frame(nh, &good[34..54])));
    }
    v.push(("skip_esp", v6_frame(50, &good[34..54])));
    v.push(("skip_non_tcp", v6_frame(17, &good[34..54])));
    v.push(("skip_truncated", v6_frame(6, &good[34..54])[..60].to_vec()));
    let mut short6 = v6_frame(6, &good[34..54]);
    short6[18..20].copy_from_slice(&[0, 19]);
    v.push(("skip_malformed", short6));
    let mut long6 = v6_frame(6, &good[34..54]);
    long6[18..20].copy_from_slice(&[0, 200]);
    v.push(("skip_truncated", long6));
    let mut ver6 = v6_frame(6, &good[34..54]);
    ver6[14] = 0x40;
    v.push(("skip_malformed", ver6));
    v.extend(icmp_malformed(seq as u16));
    v
}

/// Ethernet + IPv6 (next header `nh`) + `l4`.
fn v6_frame(nh: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 1, 0x86, 0xdd]);
    f.extend([0x60, 0, 0, 0]);
    f.extend((l4.len() as u16).to_be_bytes());
    f.extend([nh, 64]);
    f.extend(
        [0xfd, 0x77]
            .iter()
            .chain([0u8; 13].iter())
            .chain([0x99].iter()),
    );
    f.extend(
        [0xfd, 0x77]
            .iter()
            .chain([0u8; 13].iter())
            .chain([0x01].iter()),
    );
    f.extend(l4);
    f
}

fn echo_reply(seq: u16) -> Vec<u8> {
    icmp_frame(
        PEER,
        LOCAL,
        Icmp {
            typ: ECHO_REPLY,
            id: 777,
            seq,
            payload: 16,
        },
    )
}

fn icmp_malformed(seq: u16) -> Vec<(&'static str, Vec<u8>)> {
    let good = echo_reply(seq);
    let typed = |t: u8| {
        let m = Icmp {
            typ: t,
            id: 777,
            seq,
            payload: 16,
        };
        icmp_frame(PEER, LOCAL, m)
    };
    let mut v = vec![];
    for t in [3u8, 4, 5, 11, 12] {
        v.push(("icmp_errors", typed(t)));
    }
    for t in [13u8, 14, 17, 9, 10, 42, 255] {
        v.push(("icmp_other", typed(t)));
    }
    let mut tot = good.clone();
    tot[16..18].copy_from_slice(&27u16.to_be_bytes()); // ICMP header cut by the IP length
    v.push(("icmp_truncated", tot));
    let mut long = good.clone();
    long[16..18].copy_from_slice(&400u16.to_be_bytes()); // IP length past the frame
    v.push(("icmp_truncated", long));
    v.push(("icmp_truncated", good[..14 + 20 + 6].to_vec()));
    let mut ipsum = good.clone();
    ipsum[22] ^= 1; // TTL changed, IP checksum not
    v.push(("icmp_bad_checksum", ipsum));
    let mut icsum = good.clone();
    icsum[14 + 20 + 8] ^= 1; // payload changed, ICMP checksum not
    v.push(("icmp_bad_checksum", icsum));
    for t in [1u8, 2, 3, 4, 133, 134, 135, 136, 137, 143] {
        let mut b = vec![t, 0, 0, 0, 0x03, 0x09, 0, seq as u8];
        b.extend([0u8; 16]);
        v.push((
            if t < 128 { "icmp_errors" } else { "icmp_other" },
            v6_frame(58, &b),
        ));
    }
    v.push(("icmp_truncated", v6_frame(58, &[129, 0, 0, 0, 3, 9])));
    v
}

/// What the parser's rules accept as a TCP ACK covering the pending `seq..seq+10` of our flow
/// (an IPv4 ACK), or as the echo reply to our pending request `seq` (good checksums).
fn may_sample(f: &[u8], seq: u32, tcp: bool) -> bool {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[14] != 0x45 {
        return false;
    }
    let tot = u16::from_be_bytes([f[16], f[17]]) as usize;
    let frag = u16::from_be_bytes([f[20], f[21]]) & 0x3fff;
    if frag != 0 || tot > f.len() - 14 || f[26..30] != PEER || f[30..34] != LOCAL {
        return false;
    }
    if !tcp {
        let ok = f[23] == 1 && tot >= 28 && csum(&f[14..34]) == 0 && csum(&f[34..14 + tot]) == 0;
        return ok
            && f[34] == 0
            && f[38..40] == 777u16.to_be_bytes()
            && f[40..42] == (seq as u16).to_be_bytes();
    }
    if f[23] != 6 || tot < 40 || f.len() < 54 {
        return false;
    }
    let doff = (f[46] >> 4) as usize * 4;
    let flags = f[47];
    let ack = u32::from_be_bytes(f[42..46].try_into().unwrap());
    let ahead = ack.wrapping_sub(seq + 10);
    // the stack drops a segment with a bad IPv4 header or TCP checksum (the frames come with
    // CHECKSUM_NONE: the program sums them)
    csum(&f[14..34]) == 0
        && !tcp_csum_bad(f)
        && f[34..36] == 42222u16.to_be_bytes()
        && f[36..38] == 41111u16.to_be_bytes()
        && doff >= 20
        && doff <= tot - 20
        && flags & 0x10 != 0
        && flags & 0x04 == 0
        && ahead < 1 << 30
}

/// An IPv4 TCP segment of our flow with RST set (the rules drop the flow's pending segments).
fn is_rst_of_flow(f: &[u8]) -> bool {
    f.len() >= 54
        && f[12..14] == [0x08, 0x00]
        && f[14] == 0x45
        && f[23] == 6
        && f[26..30] == PEER
        && f[30..34] == LOCAL
        && f[34..36] == 42222u16.to_be_bytes()
        && f[36..38] == 41111u16.to_be_bytes()
        && f[47] & 0x04 != 0
}

/// A random mutation of `f`: header bytes changed, the frame cut or grown.
fn mutate(f: &[u8], rng: &mut u64) -> Vec<u8> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let mut m = f.to_vec();
    for _ in 0..1 + next() % 3 {
        match next() % 6 {
            0 | 1 => {
                let at = 12 + (next() as usize) % (m.len().saturating_sub(12).clamp(1, 48));
                if at < m.len() {
                    m[at] = next() as u8;
                }
            }
            2 => {
                let at = 12 + (next() as usize) % (m.len().saturating_sub(12).clamp(1, 48));
                if at < m.len() {
                    m[at] ^= 1 << (next() % 8);
                }
            }
            3 => m.truncate(14 + (next() as usize) % m.len().max(1)),
            4 => m.extend(std::iter::repeat_n(next() as u8, (next() % 64) as usize)),
            _ => {
                let interesting = [
                    0u8, 1, 4, 5, 6, 0x40, 0x45, 0x4f, 0x50, 0x60, 0x80, 0xf0, 0xff,
                ];
                let at = 12 + (next() as usize) % (m.len().saturating_sub(12).clamp(1, 48));
                if at < m.len() {
                    m[at] = interesting[(next() as usize) % interesting.len()];
                }
            }
        }
    }
    m
}

/// Every generated malformed frame: pass, counted by the one skip counter named, no sample; a
/// good ACK afterwards still finds the segment pending (the garbage consumed nothing).
fn malformed_frames_are_counted(k: &Kernel) -> usize {
    let mut n = 0;
    for round in 0..2u32 {
        let seq = 1_000 + round * 100;
        let d = k.run(false, &data_seg(seq)).unwrap();
        assert_eq!(
            d.get("recorded"),
            Some(&1),
            "data segment not recorded: {d:?}"
        );
        let req = icmp_frame(
            LOCAL,
            PEER,
            Icmp {
                typ: ECHO_REQUEST,
                id: 777,
                seq: seq as u16,
                payload: 16,
            },
        );
        k.run(false, &req).unwrap();
        for (want, f) in malformed(seq) {
            let Some(d) = k.run(true, &f) else { continue };
            assert_eq!(
                d.get("samples"),
                None,
                "{want} frame sampled: {} {d:?}",
                hex(&f)
            );
            assert_eq!(skips(&d), vec![(want, 1)], "frame {}: {d:?}", hex(&f));
            n += 1;
        }
        let d = k.run(true, &frame(ack_of(seq), 0, false, 5)).unwrap();
        assert_eq!(
            d.get("samples"),
            Some(&1),
            "the good ACK after the garbage: {d:?}"
        );
        let d = k.run(true, &echo_reply(seq as u16)).unwrap();
        assert_eq!(
            d.get("samples"),
            Some(&1),
            "the good echo reply after the garbage: {d:?}"
        );
    }
    n
}

/// Random mutants of a good ACK and a good echo reply, each after its segment or request was
/// recorded: pass, counted, a sample only from what the rules accept; then the good one, so
/// each round gives exactly one sample in all.
fn mutants_sample_only_what_the_rules_accept(k: &Kernel, frames: usize) -> (usize, usize, usize) {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ std::process::id() as u64;
    eprintln!("fuzz_sampler: mutation seed {rng:#x}");
    let (mut sampled, mut ran, mut bad_csum) = (0, 0, 0);
    for i in 0..frames as u32 {
        let tcp = i % 2 == 0;
        let seq = 100_000 + i * 100;
        let (rec, good) = if tcp {
            (data_seg(seq), frame(ack_of(seq), 0, false, 5))
        } else {
            let m = Icmp {
                typ: ECHO_REQUEST,
                id: 777,
                seq: seq as u16,
                payload: 16,
            };
            (icmp_frame(LOCAL, PEER, m), echo_reply(seq as u16))
        };
        let r = k.run(false, &rec).unwrap();
        let m = mutate(&good, &mut rng);
        // a frame the kernel refuses to run (no whole IP header) leaves the good one to time
        let d = k.run(true, &m).unwrap_or_default();
        ran += usize::from(!d.is_empty());
        let s = d.get("samples").copied().unwrap_or(0);
        assert!(
            s == 0 || may_sample(&m, seq, tcp),
            "a sample from a frame the rules refuse: {} {d:?}",
            hex(&m)
        );
        sampled += s as usize;
        bad_csum += d.get("tcp_bad_checksum").copied().unwrap_or(0) as usize;
        let d2 = k.run(true, &good).unwrap();
        let s2 = d2.get("samples").copied().unwrap_or(0);
        // an RST of the flow drops what is pending (counted): nothing left to time
        let rst = d.contains_key("pending_deleted");
        assert!(
            !rst || (tcp && is_rst_of_flow(&m)),
            "pending dropped by {}: {d:?}",
            hex(&m)
        );
        assert_eq!(
            s + s2,
            if rst { 0 } else { 1 },
            "mutant {} then the good frame: {d:?} {d2:?} (recorded: {r:?})",
            hex(&m)
        );
    }
    (ran, sampled, bad_csum)
}

/// Whether the TCP checksum of an IPv4 TCP frame is wrong (the stack drops such a segment).
fn tcp_csum_bad(f: &[u8]) -> bool {
    let tot = u16::from_be_bytes([f[16], f[17]]) as usize;
    let Some(seg) = f.get(34..14 + tot) else {
        return true;
    };
    let mut pseudo = f[26..34].to_vec();
    pseudo.extend([0, 6]);
    pseudo.extend((seg.len() as u16).to_be_bytes());
    pseudo.extend(seg);
    csum(&pseudo) != 0
}

#[test]
fn sampler_parser_survives_malformed_and_mutated_frames() {
    if !require_root() {
        return;
    }
    let frames: usize = std::env::var("RTTSCOPE_FUZZ_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000);
    let ns = quiet_netns();
    let obs = start_observer(&ns);
    let t0 = Instant::now();
    let n = malformed_frames_are_counted(&obs.kernel);
    let (ran, sampled, bad_csum) = mutants_sample_only_what_the_rules_accept(&obs.kernel, frames);
    eprintln!(
        "fuzz_sampler: {n} malformed frames, {ran} mutants ({sampled} sampled, as the rules allow; \
         {bad_csum} TCP ACKs not timed for a bad IPv4 header or TCP checksum) in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(n > 80 && ran > frames / 2, "{n} {ran}");
    obs.stop();
}

const OUTER4: Outer = Outer::V4([192, 168, 7, 1], [192, 168, 7, 2]);

fn outer6() -> Outer {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0xfd, 0x99]);
    let mut b = a;
    a[15] = 1;
    b[15] = 2;
    Outer::V6(a, b)
}

type Wrap = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// Ways a frame of our flow travels: (name, wrapper, the counter that must see it).
fn wrappers() -> Vec<(&'static str, Wrap, &'static str)> {
    vec![
        (
            "vlan 7",
            Box::new(|f: &[u8]| vlan_tagged(f, &[(0x8100, 7)])),
            "vlan",
        ),
        (
            "802.1ad 100 + 802.1Q 7",
            Box::new(|f: &[u8]| vlan_tagged(f, &[(0x88a8, 100), (0x8100, 7)])),
            "vlan",
        ),
        (
            "vxlan 4789 vni 42",
            Box::new(|f: &[u8]| vxlan(OUTER4, 4789, 42, f)),
            "tunnel_vxlan",
        ),
        (
            "vxlan 8472 vni 0 over ipv6",
            Box::new(|f: &[u8]| vxlan(outer6(), 8472, 0, f)),
            "tunnel_vxlan",
        ),
        (
            "vxlan vni 42 on vlan 5 (the underlay's tag is not the flow's)",
            Box::new(|f: &[u8]| vlan_tagged(&vxlan(OUTER4, 4789, 42, f), &[(0x8100, 5)])),
            "tunnel_vxlan",
        ),
        (
            "geneve vni 42, 3 option words",
            Box::new(|f: &[u8]| geneve(OUTER4, 42, 3, 0x6558, f)),
            "tunnel_geneve",
        ),
        (
            "geneve vni 9 carrying IP over ipv6",
            Box::new(|f: &[u8]| geneve(outer6(), 9, 0, 0x0800, &f[14..])),
            "tunnel_geneve",
        ),
        (
            "ipip",
            Box::new(|f: &[u8]| outer_ip(OUTER4, 4, &f[14..])),
            "tunnel_ipip",
        ),
    ]
}

/// Frames of an encapsulation or tag the parser does not follow, each with its counter.
fn unparsed(seq: u32) -> Vec<(&'static str, Vec<u8>)> {
    let ack = frame(ack_of(seq), 0, false, 5);
    let mut no_i = vxlan(OUTER4, 4789, 42, &ack);
    no_i[14 + 20 + 8] = 0; // VXLAN without the I flag: no VNI
    let mut ver1 = geneve(OUTER4, 42, 0, 0x6558, &ack);
    ver1[14 + 20 + 8] = 0x40; // Geneve version 1
    let mut arp = ack.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let vx = vxlan(OUTER4, 4789, 42, &ack);
    vec![
        (
            "skip_wireguard",
            outer_ip(OUTER4, 17, &udp(40000, 51820, &[1; 48])),
        ),
        (
            "skip_wireguard",
            outer_ip(outer6(), 17, &udp(51820, 40000, &[1; 48])),
        ),
        ("skip_esp", outer_ip(OUTER4, 17, &udp(4500, 4500, &[1; 48]))),
        ("skip_esp", outer_ip(OUTER4, 50, &[1; 48])),
        ("skip_gre", outer_ip(outer6(), 47, &[0; 48])),
        (
            "skip_non_tcp",
            outer_ip(OUTER4, 17, &udp(40000, 53, &[1; 48])),
        ),
        ("skip_tunnel_nested", vxlan(OUTER4, 4789, 1, &vx)),
        ("skip_malformed", no_i),
        ("skip_malformed", ver1),
        ("skip_non_ip", geneve(OUTER4, 42, 0, 0x88cc, &ack)),
        ("skip_non_ip", vxlan(OUTER4, 4789, 42, &arp)),
        ("skip_truncated", vx[..14 + 20 + 8 + 8 + 14 + 10].to_vec()), // in the inner IP header
        ("skip_truncated", vx[..vx.len() - 4].to_vec()), // shorter than its inner IP length
        ("skip_truncated", vx[..14 + 20 + 8 + 5].to_vec()), // in the VXLAN header
        (
            "skip_vlan",
            vlan_tagged(&ack, &[(0x8100, 1), (0x8100, 2), (0x8100, 3)]),
        ),
    ]
}

/// One or two VLAN tags, VXLAN, Geneve and IP-in-IP: a data segment of our flow sent in it is
/// recorded under the inner tuple and tunnel identity (the kind counted), the ACK in the same
/// tunnel times it; the same ACK plain, or in another VNI or VLAN, finds nothing pending. Then
/// what is not parsed: one skip counter each, no sample.
fn tunnels_and_vlans_are_parsed(k: &Kernel) -> usize {
    let mut n = 0;
    for (i, (name, wrap, kind)) in wrappers().into_iter().enumerate() {
        let seq = 50_000 + i as u32 * 1_000;
        let d = k.run(false, &wrap(&data_seg(seq))).unwrap();
        assert_eq!(
            (d.get("recorded"), d.get(kind), d.get("tcp_egress")),
            (Some(&1), Some(&1), Some(&1)),
            "{name}: data segment {d:?}"
        );
        let ack = frame(ack_of(seq), 0, false, 5);
        let d = k.run(true, &ack).unwrap();
        assert_eq!(
            d.get("samples"),
            None,
            "{name}: the plain ACK timed it: {d:?}"
        );
        for other in [
            vxlan(OUTER4, 4789, 43, &ack),
            vlan_tagged(&ack, &[(0x8100, 8)]),
        ] {
            let d = k.run(true, &other).unwrap();
            assert_eq!(
                d.get("samples"),
                None,
                "{name}: another VNI or VLAN timed it: {d:?}"
            );
        }
        let d = k.run(true, &wrap(&ack)).unwrap();
        assert_eq!(
            (d.get("samples"), d.get(kind)),
            (Some(&1), Some(&1)),
            "{name}: ACK {} {d:?}",
            hex(&wrap(&ack))
        );
        // an echo in the same tunnel
        let m = |typ| Icmp {
            typ,
            id: 778,
            seq: seq as u16,
            payload: 16,
        };
        k.run(false, &wrap(&icmp_frame(LOCAL, PEER, m(ECHO_REQUEST))))
            .unwrap();
        let d = k
            .run(true, &wrap(&icmp_frame(PEER, LOCAL, m(ECHO_REPLY))))
            .unwrap();
        assert_eq!(d.get("samples"), Some(&1), "{name}: echo reply {d:?}");
        n += 1;
    }
    for (want, f) in unparsed(1) {
        let d = k.run(true, &f).unwrap();
        assert_eq!(d.get("samples"), None, "{want}: {d:?}");
        assert_eq!(skips(&d), vec![(want, 1)], "frame {}: {d:?}", hex(&f));
        n += 1;
    }
    n
}

#[test]
fn sampler_parser_follows_vlans_and_tunnels() {
    if !require_root() {
        return;
    }
    let ns = quiet_netns();
    let obs = start_observer(&ns);
    let n = tunnels_and_vlans_are_parsed(&obs.kernel);
    eprintln!("fuzz_sampler: {n} tunnel and VLAN cases as expected");
    obs.stop();
}

//! Fuzz harnesses: one function per parser of files, flags and packets, each taking arbitrary
//! bytes and checking what must hold for any input (issue 26: "every parser of files, flags and
//! packets fuzzed"). The same functions run under libFuzzer (`fuzz/`, `scripts/fuzz.sh`, nightly)
//! and in the unit suite (the checked-in corpus replayed and proptest inputs, stable): a
//! property that fails is a panic, with the input in the message.
//!
//! What holds for every reader of a file: it never panics; a refusal is one sentence (one line,
//! no control character, a bounded length however long the input); what it accepts is in range
//! (RTTs finite, from 0 to 1e12 us) and, for the result document, reads back the same after
//! being written. Packet decoders never panic and give back what the encoder put in.
//! See docs/fuzzing.md.
use std::net::SocketAddr;

use crate::analysis::cloud_monitoring as cm;
use crate::analysis::{dist, input, records, results, strict_json, units};

/// The targets: name and harness. `fuzz/fuzz_targets/<name>.rs` calls the harness; its
/// checked-in seeds are `fuzz/seeds/<name>/` and the inputs fuzzing found failing (fixed since)
/// `fuzz/regressions/<name>/`, both replayed by the unit suite. (`fuzz/corpus/`, what a fuzzing
/// run grows, is not checked in.)
pub type Harness = fn(&[u8]);

/// (target name, harness).
pub const TARGETS: &[(&str, Harness)] = &[
    ("result_document", result_document),
    ("observe_jsonl", observe_jsonl),
    ("sample_list", sample_list),
    ("cloud_monitoring", cloud_monitoring),
    ("observe_config", observe_config),
    ("web_config", web_config),
    ("names_file", names_file),
    ("bucket_layout", bucket_layout),
    ("flags", flags),
    ("cgroup_path", cgroup_path),
    ("proc_sys", proc_sys),
    ("icmp_reply", icmp_reply),
    ("rr_frames", rr_frames),
    ("irtt_packets", irtt_packets),
    ("nfqueue", nfqueue),
];

/// Longest refusal a file reader may print: a value is quoted in at most 80 characters, each
/// escaped in at most 10 (`\u{10ffff}`), the path and the reason around it stay below the rest.
pub const MAX_MESSAGE_CHARS: usize = 1200;

/// A refusal of file input: one line, no control or bidirectional-override character, not
/// empty, at most `MAX_MESSAGE_CHARS` characters.
pub fn assert_one_sentence(what: &str, msg: &str) {
    assert!(!msg.trim().is_empty(), "{what}: empty error message");
    let bad = msg.chars().find(|&c| {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    });
    assert!(
        bad.is_none(),
        "{what}: error message holds {bad:?}: {:?}",
        input::quote_input_max(msg, 300)
    );
    let n = msg.chars().count();
    assert!(
        n <= MAX_MESSAGE_CHARS,
        "{what}: error message of {n} characters: {:?}",
        input::quote_input_max(msg, 300)
    );
}

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

fn assert_rtt_ok(what: &str, us: f64) {
    assert!(
        us.is_finite() && (0.0..=1e12).contains(&us),
        "{what}: accepted RTT {us} us"
    );
}

/// A result document (`--json` of every measuring command): accepted ⇒ valid, in range, and
/// written back it reads the same; refused ⇒ one sentence naming the file.
pub fn result_document(data: &[u8]) {
    let t = text(data);
    match results::RunResult::from_json(&t, "r.json") {
        Ok(r) => {
            r.validate().expect("an accepted document validates");
            for v in &r.views {
                for s in &v.samples {
                    assert_rtt_ok("result sample", s.rtt_us);
                    assert!(s.t_s().is_finite(), "result sample time {}", s.t_s());
                }
            }
            let back = r.to_json().expect("an accepted document serializes");
            let again = results::RunResult::from_json(&back, "r.json")
                .unwrap_or_else(|e| panic!("a document written back is refused: {e}"));
            assert_eq!(again.to_json().unwrap(), back, "write/read/write differs");
        }
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.starts_with("r.json"),
                "message does not name the file: {m}"
            );
            assert_one_sentence("result document", &m);
        }
    }
    // the same text through the readers `bucket` and `chart` pick from
    if let Ok(sets) = input::load_sample_sets(&t, "r.json") {
        for s in sets.iter().flat_map(|s| &s.samples) {
            assert_rtt_ok("sample set", s.rtt_us);
        }
    }
}

/// `observe --format json` JSON Lines: every line through the record parser, the whole text
/// through the raw-sample reader and the result reader.
pub fn observe_jsonl(data: &[u8]) {
    let t = text(data);
    for line in t.lines().take(64) {
        if let Err(e) = records::Record::parse(line) {
            assert_one_sentence("observe record", &e.to_string());
        }
    }
    match input::parse_observe_output(&t, "o.jsonl") {
        Ok(sets) => {
            for s in sets.iter().flat_map(|s| &s.samples) {
                assert_rtt_ok("observe sample", s.rtt_us);
                assert!(s.t_s().is_finite());
            }
        }
        Err(e) => assert_one_sentence("observe output", &format!("{e:#}")),
    }
    if let Err(e) = input::result_from_text(&t, "o.jsonl") {
        assert_one_sentence("observe output as a result", &format!("{e:#}"));
    }
}

/// A plain sample list (`bucket FILE`): one RTT per line, bare numbers in ms.
pub fn sample_list(data: &[u8]) {
    let t = text(data);
    match input::parse_sample_list(&t, "f.txt") {
        Ok(set) => {
            for s in &set.samples {
                assert_rtt_ok("sample list", s.rtt_us);
            }
        }
        Err(e) => assert_one_sentence("sample list", &format!("{e:#}")),
    }
    for line in t.lines().take(64) {
        if let Some(us) = input::parse_rtt_us(line) {
            assert!(us.is_finite() && us >= 0.0, "parse_rtt_us({line:?}) = {us}");
        }
    }
}

/// A Cloud Monitoring file (`bucket --cloud`, `compare --cloud`): accepted ⇒ its distributions
/// merge and give percentiles without panicking.
pub fn cloud_monitoring(data: &[u8]) {
    let t = text(data);
    match cm::parse(&t, "f.json") {
        Ok(f) => {
            let m = cm::merge_file(&f);
            if let Some(d) = &m.distribution {
                for p in [0.0, 50.0, 99.0, 100.0] {
                    let _ = d.percentile(p);
                }
                let _ = cm::cdf_points_us(d);
            }
            for v in &m.aligned {
                assert!(!v.is_nan(), "aligned value NaN");
            }
        }
        Err(e) => {
            let m = format!("{e:#}");
            assert!(
                m.starts_with("f.json"),
                "message does not name the file: {m}"
            );
            assert_one_sentence("cloud file", &m);
        }
    }
}

/// observe's TOML config (`--config`): refused ⇒ one line of at most 600 characters (the
/// unknown-key message lists every key; a quoted value is cut to 80).
pub fn observe_config(data: &[u8]) {
    let t = text(data);
    if let Err(e) = crate::cmd::observe::config::parse(&t) {
        let m = e.to_string();
        assert_one_sentence("observe config", &m);
        assert!(m.chars().count() <= 600, "config message too long: {m}");
    }
}

/// The web config file of /metrics (exporter-toolkit's YAML): refused ⇒ one line of at most 300
/// characters; the headers, when the file parses, are checked too (that no hash is quoted in a
/// refusal: the unit tests of `sinks::prometheus::web`).
pub fn web_config(data: &[u8]) {
    use crate::sinks::prometheus::web::file;
    let t = text(data);
    match file::parse(&t) {
        Err(m) => {
            assert_one_sentence("web config", &m);
            assert!(m.chars().count() <= 300, "web config message too long: {m}");
        }
        Ok(f) => {
            if let Some(h) = f.http_server_config {
                if let Err(m) = file::headers(&h.headers) {
                    assert_one_sentence("web config headers", &m);
                }
            }
        }
    }
}

/// The `--names` file (`analysis::peers`): the simple form and kubectl's JSON. Accepted: at most
/// `MAX_ENTRIES` entries, every name found is 1 to `MAX_NAME` bytes without space or control
/// character, and a lookup of any address never panics; refused: one sentence, at most 600
/// characters.
pub fn names_file(data: &[u8]) {
    use crate::analysis::peers::{PeerNames, MAX_ENTRIES, MAX_NAME};
    let t = text(data);
    match PeerNames::parse(&t) {
        Err(m) => {
            assert_one_sentence("names file", &m);
            assert!(m.chars().count() <= 600, "names file message too long: {m}");
        }
        Ok(n) => {
            assert!(n.len() <= MAX_ENTRIES);
            let probes = [
                "10.100.0.10:80",
                "0.0.0.0:0",
                "255.255.255.255:65535",
                "[::]:0",
                "[fd00::1]:443",
                "[::ffff:10.0.0.1]:80",
            ];
            let from_input = t
                .split(|c: char| c.is_whitespace() || c == '"')
                .filter_map(|w| {
                    w.parse::<std::net::IpAddr>()
                        .ok()
                        .map(|ip| SocketAddr::new(ip, 80))
                });
            let probes = probes
                .iter()
                .map(|p| p.parse().unwrap())
                .chain(from_input.take(32));
            for a in probes {
                if let Some(name) = n.name(a) {
                    assert!(!name.is_empty() && name.len() <= MAX_NAME, "{name:?}");
                    assert!(
                        !name.chars().any(|c| c.is_control() || c.is_whitespace()),
                        "{name:?}"
                    );
                }
            }
        }
    }
}

/// Bucket layouts: the `--layout` grammar and `--layout-from` files (a bucketOptions object or a
/// whole Cloud Monitoring file). Accepted ⇒ valid, and its spec reads back the same layout.
pub fn bucket_layout(data: &[u8]) {
    let t = text(data);
    if let Ok(o) = dist::BucketOptions::parse(&t) {
        check_layout(&o);
        let back = dist::BucketOptions::parse(&o.spec()).unwrap_or_else(|e| {
            panic!("spec {:?} of an accepted layout is refused: {e}", o.spec())
        });
        assert_eq!(back.num_buckets(), o.num_buckets(), "spec {}", o.spec());
    }
    match dist::layout_from_json(&t, "l.json") {
        Ok(o) => check_layout(&o),
        Err(e) => assert_one_sentence("layout file", &e),
    }
}

fn check_layout(o: &dist::BucketOptions) {
    o.validate().expect("an accepted layout validates");
    let n = o.num_buckets();
    assert!(n >= 1, "layout without buckets");
    for v in [0.0, 1.0, 1e3, 1e9, f64::MAX] {
        assert!(o.index(v) < n, "index({v}) out of {n} buckets");
    }
}

/// Every flag parser: the first byte picks one, the rest is the value.
pub fn flags(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let s = text(rest);
    let s = s.as_ref();
    let dur_ok = |d: std::time::Duration| assert!(d.as_secs() < u64::MAX, "{s:?}");
    match pick % 16 {
        0 => {
            if let Ok(d) = units::parse_duration(s) {
                dur_ok(d)
            }
        }
        1 => drop(units::duration_arg(s).map(dur_ok)),
        2 => drop(units::seconds_arg(s).map(dur_ok)),
        3 => drop(units::netperf_interval_arg(s).map(dur_ok)),
        4 => drop(units::period_arg(s).map(|d| assert!(d.as_secs_f64() > 0.0, "{s:?}"))),
        5 => {
            if let Ok(p) = dist::percentile_arg(s) {
                assert!((0.0..=100.0).contains(&p), "percentile {p} from {s:?}");
            }
            if let Ok(ps) = dist::parse_percentiles(s) {
                assert!(ps.iter().all(|p| (0.0..=100.0).contains(p)), "{ps:?}");
            }
        }
        6 => drop(crate::cmd::probe::sizes_arg(s)),
        7 => drop(crate::active::output::parse_selectors(s)),
        8 => {
            if let Ok(a) = crate::sinks::prometheus::http::parse_listen(s) {
                let _: SocketAddr = a;
            }
        }
        9 => {
            if let Ok(i) = s.parse::<crate::views::sampler::IfaceSpec>() {
                assert!(!i.name.is_empty() && i.name.len() <= 15, "{i:?}");
            }
        }
        10 => drop(crate::active::irtt::client::Wait::parse(s)),
        11 => drop(crate::cmd::probe::irtt::parse_key(s)),
        12 => {
            let _ = crate::cmd::probe::irtt::parse_byte(s);
            let _ = crate::cmd::probe::irtt::parse_fill(s);
        }
        13 => {
            let _ = crate::sinks::otlp::Endpoint::parse(s);
            let _ = crate::sinks::otlp::settings::parse_pairs(s, "OTEL_EXPORTER_OTLP_HEADERS");
        }
        14 => drop(dist::layout_arg(s)),
        _ => drop(strict_json::from_str(s)),
    }
}

/// A cgroup path (`/proc/PID/cgroup`, the cgroup walk) read as a workload: never panics, and
/// what it names is a piece of the path.
pub fn cgroup_path(data: &[u8]) {
    let t = text(data);
    let w = crate::analysis::workload::parse(&t);
    if let Some(c) = w.container_short() {
        assert!(t.contains(c), "container {c:?} not in {t:?}");
    }
    let _ = (w.pod(), w.netns_name());
}

/// Readers of /proc and /sys: /proc/net/tcp lines, the possible-CPU list, /proc/self/status
/// capabilities, BTF blobs.
pub fn proc_sys(data: &[u8]) {
    let t = text(data);
    for line in t.lines().take(64) {
        let _ = crate::views::sampler::sides::parse_line(line);
    }
    if let Some(n) = crate::sys::bpf::parse_cpu_list(&t) {
        assert!(n >= 1, "cpu list {t:?} gives {n}");
    }
    let _ = crate::sys::caps::CapState::parse(&t);
    let _ = crate::sys::btf::func_id_in(data, "tcp_ack_update_rtt");
    let mut btf = vec![0x9f, 0xeb, 1, 0];
    btf.extend_from_slice(data);
    let _ = crate::sys::btf::func_id_in(&btf, "tcp_ack_update_rtt");
}

/// ICMP and ICMPv6 echo replies as `probe icmp` decodes them (raw IPv4 with its header, datagram
/// sockets without): never panics; a reply built by the encoder decodes to its sequence.
pub fn icmp_reply(data: &[u8]) {
    use crate::active::icmp;
    let (head, body) = data.split_at(data.len().min(10));
    let mut h = [0u8; 10];
    h[..head.len()].copy_from_slice(head);
    let id = u16::from_be_bytes([h[0], h[1]]);
    let seq = u64::from_be_bytes(h[2..10].try_into().unwrap());
    for v6 in [false, true] {
        for ip_header in [false, true] {
            for want in [None, Some(id)] {
                let _ = icmp::decode_echo_reply(body, v6, ip_header, want, seq);
            }
        }
        // the encoder's request turned into a reply decodes to its sequence
        let mut b = icmp::encode_echo(v6, id, seq, seq, body.len().min(1400));
        b[0] = if v6 { 129 } else { 0 };
        if !v6 {
            b[2..4].copy_from_slice(&[0, 0]);
            let c = icmp::checksum(&b);
            b[2..4].copy_from_slice(&c.to_be_bytes());
        }
        assert_eq!(
            icmp::decode_echo_reply(&b, v6, false, Some(id), seq),
            Some(seq),
            "v6 {v6} id {id} seq {seq}"
        );
    }
}

/// The request/response wire (`serve` and `probe tcp-rr|udp-rr`): the TCP hello, UDP request
/// and response headers, cookie datagrams. Never panics; refused sizes stay refused.
pub fn rr_frames(data: &[u8]) {
    use crate::active::framing::{self, Hello, UdpHeader};
    let max = data
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(0);
    if let Ok(h) = Hello::decode(data, max) {
        assert!(h.req <= max && h.resp <= max, "{h:?} over {max}");
        assert_eq!(Hello::decode(&h.encode(), max).ok(), Some(h));
    }
    let _ = Hello::decode(data, u32::MAX);
    let _ = UdpHeader::decode_request(data, max);
    let _ = UdpHeader::decode(data);
    let _ = framing::is_cookie_request(data);
    let _ = framing::decode_cookie(data);
    let _ = framing::carried_cookie(data);
}

/// irtt packets (`probe irtt`): open replies, echo replies for every negotiated layout, and the
/// parameters a server sends back. Never panics.
pub fn irtt_packets(data: &[u8]) {
    use crate::active::irtt::packet::{self, EchoLayout, Key};
    use crate::active::irtt::params::{Clock, Params, ReceivedStats, StampAt};
    let _ = Params::decode(data);
    let sel = data.first().copied().unwrap_or(0) as i64;
    let layout = EchoLayout {
        hmac: sel & 1 == 1,
        stats: ReceivedStats::from_bits((sel >> 1) & 3).unwrap_or(ReceivedStats::Both),
        stamp_at: StampAt::from_bits((sel >> 3) % 5).unwrap_or(StampAt::Both),
        clock: Clock::from_bits(1 + (sel >> 5) % 3).unwrap_or(Clock::Both),
    };
    for key in [Key::default(), Key::new(b"k")] {
        let _ = packet::decode_open_reply(data, &key);
        let _ = packet::decode_echo_reply(data, &layout, &key, 1, 0);
        let mut m = packet::MAGIC.to_vec();
        m.extend_from_slice(data);
        let _ = packet::decode_open_reply(&m, &key);
        let _ = packet::decode_echo_reply(&m, &layout, &key, 1, 0);
    }
}

/// Netlink datagrams from NFQUEUE (the lab's link emulator). Never panics.
pub fn nfqueue(data: &[u8]) {
    #[cfg(feature = "lab")]
    {
        let (mut out, mut errors) = (Vec::new(), Vec::new());
        let _ = crate::lab::nfqueue::parse_datagram(data, &mut out, &mut errors);
    }
    #[cfg(not(feature = "lab"))]
    let _ = data;
}

/// The checked-in corpus and regression inputs of one target, replayed through its harness
/// (the unit suite's share of fuzzing: fast, no nightly).
#[cfg(test)]
fn replay(name: &str, f: Harness) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in [
        root.join("seeds").join(name),
        root.join("regressions").join(name),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for p in files {
            let data = std::fs::read(&p).unwrap();
            let r = std::panic::catch_unwind(|| f(&data));
            assert!(r.is_ok(), "{name}: {} fails the harness", p.display());
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every target has a checked-in corpus, and every input in it (and in the regressions
    /// found by fuzzing) passes its harness.
    #[test]
    fn checked_in_corpus_passes_every_harness() {
        for (name, f) in TARGETS {
            let n = replay(name, *f);
            assert!(n > 0, "{name}: no seeds in fuzz/seeds/{name}");
        }
    }

    /// Every target has its libFuzzer entry point (fuzz/fuzz_targets/NAME.rs calling the harness).
    #[test]
    fn every_target_has_a_fuzz_target() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        for (name, _) in TARGETS {
            let src = std::fs::read_to_string(root.join(format!("fuzz_targets/{name}.rs")))
                .unwrap_or_else(|_| panic!("fuzz/fuzz_targets/{name}.rs missing"));
            assert!(src.contains(&format!("fuzzing::{name}(")), "{name}.rs");
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "{name} in Cargo.toml"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
        /// Random bytes through every harness (the corpus replay covers structured inputs).
        #[test]
        fn random_bytes_pass_every_harness(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            for (_, f) in TARGETS {
                f(&data);
            }
        }

        /// Text shaped like the file formats, to get past the first byte.
        #[test]
        fn json_like_text_passes_the_file_harnesses(
            s in "\\{\"(format|version|views|type|timeSeries|samples|rtt_us|t)\":[-0-9eE.\\[\\]{},\":a-z ]{0,80}\\}"
        ) {
            for f in [result_document, observe_jsonl, cloud_monitoring, bucket_layout] {
                f(s.as_bytes());
            }
        }
    }
}

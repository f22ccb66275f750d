//! `analysis::peers`: both forms, the caps, the reload.
use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn simple_form_most_specific_wins() {
    let n = PeerNames::parse(
        "# operators' names\n\
         10.100.0.0/16:80 payments\n\
         10.100.0.0/16 infra   # every port\n\
         10.100.7.0/24 edge\n\
         10.100.7.9:80 one-pod\n\
         [fd00::/64]:443 web\n\
         fd00::1 db\n\
         \n",
    )
    .unwrap();
    assert_eq!(n.len(), 6);
    assert_eq!(n.name(sa("10.100.0.10:80")), Some("payments"));
    assert_eq!(n.name(sa("10.100.0.10:81")), Some("infra"));
    assert_eq!(
        n.name(sa("10.100.7.1:80")),
        Some("edge"),
        "the longer prefix"
    );
    assert_eq!(n.name(sa("10.100.7.9:80")), Some("one-pod"));
    assert_eq!(n.name(sa("[fd00::2]:443")), Some("web"));
    assert_eq!(
        n.name(sa("[fd00::1]:443")),
        Some("db"),
        "a host over a prefix"
    );
    assert_eq!(n.name(sa("[::ffff:10.100.0.1]:80")), Some("payments"));
    assert_eq!(n.name(sa("10.101.0.1:80")), None);
}

#[test]
fn simple_form_refusals_are_one_sentence() {
    for (text, want) in [
        ("10.0.0.0/33 x", "line 1: "),
        ("10.0.0.1", "is not `ADDRESS"),
        ("\n10.0.0.1 a b", "line 2: "),
        ("10.0.0.1:99999 x", "not an address"),
        ("[fd00::1:80 x", "not an address"),
        ("10.0.0.1 \u{7}bell", "control character"),
    ] {
        let e = PeerNames::parse(text).unwrap_err();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    let long = format!("10.0.0.1 {}", "n".repeat(MAX_NAME + 1));
    assert!(PeerNames::parse(&long)
        .unwrap_err()
        .contains("1 to 253 bytes"));
}

/// A List as `kubectl get services,pods,endpointslices -A -o json` prints it, written from
/// the API's documented schema (core/v1 Service and Pod, discovery.k8s.io/v1 EndpointSlice).
pub const KUBECTL_LIST: &str = include_str!("../../../../tests/fixtures/names/kubectl-list.json");

#[test]
fn kubectl_list_names_services_slices_and_pods() {
    let n = PeerNames::parse(KUBECTL_LIST).unwrap();
    // Service: its ClusterIP on its TCP port, both families
    assert_eq!(n.name(sa("10.96.12.34:80")), Some("shop/payments"));
    assert_eq!(n.name(sa("[fd00:10:96::1234]:80")), Some("shop/payments"));
    assert_eq!(
        n.name(sa("10.96.12.34:53")),
        None,
        "a UDP port names nothing"
    );
    // EndpointSlice: the backends on the target port, named after the service
    assert_eq!(n.name(sa("10.244.1.17:8080")), Some("shop/payments"));
    // Pod: its address on any other port
    assert_eq!(
        n.name(sa("10.244.1.17:9090")),
        Some("shop/payments-7d4b9c-x2x9q")
    );
    // a headless service ("None") and a hostNetwork pod name nothing
    assert_eq!(n.name(sa("192.168.1.10:10250")), None);
    assert_eq!(n.name(sa("10.244.2.5:5432")), Some("shop/db"));
}

#[test]
fn kube_form_refusals_and_single_objects() {
    let e = PeerNames::parse("{\"kind\": \"List\", \"items\": 3}").unwrap_err();
    assert!(e.starts_with("not the JSON of `kubectl get"), "{e}");
    let one = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"n"},
        "spec":{"clusterIP":"10.0.0.1","ports":[{"port":443}]}}"#;
    let n = PeerNames::parse(one).unwrap();
    assert_eq!(n.name(sa("10.0.0.1:443")), Some("n/a"));
}

/// The file changed on disk: re-read; malformed: the old names stay, said once; too large:
/// refused and counted; a symlink swapped to another file (a ConfigMap's update) is seen.
#[test]
fn reload_keeps_old_names_on_a_bad_file() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = std::env::temp_dir().join(format!("rttscope-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b, link) = (dir.join("a"), dir.join("b"), dir.join("names"));
    std::fs::write(&a, "10.100.0.0/16:80 payments\n").unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let f = PeerFile::load(&link).unwrap();
    let svc = sa("10.100.0.10:80");
    assert_eq!(f.current().name(svc), Some("payments"));
    assert_eq!(f.poll_now(), None, "unchanged");
    std::fs::write(&a, "10.100.0.0/16:80 payments-v2\n10.0.0.0/8 corp\n").unwrap();
    assert_eq!(f.poll_now(), Some(Reload::Loaded(2)));
    assert_eq!(f.current().name(svc), Some("payments-v2"));
    std::fs::write(&a, "10.100.0.0/16:80\n").unwrap();
    assert!(matches!(f.poll_now(), Some(Reload::Failed(e)) if e.starts_with("line 1: ")));
    assert_eq!(
        f.current().name(svc),
        Some("payments-v2"),
        "the old names stay"
    );
    assert_eq!(f.poll_now(), None, "said once");
    // the ConfigMap way: the link now points at another file
    std::fs::write(&b, KUBECTL_LIST).unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&b, &link).unwrap();
    assert!(matches!(f.poll_now(), Some(Reload::Loaded(n)) if n > 3));
    assert_eq!(
        f.current().name(sa("10.96.12.34:80")),
        Some("shop/payments")
    );
    // over the cap: refused, counted, the names stay
    let big = std::fs::File::create(&a).unwrap();
    big.set_len(MAX_FILE_BYTES + 1).unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&a, &link).unwrap();
    assert!(matches!(f.poll_now(), Some(Reload::Failed(e)) if e.contains("64 MiB")));
    assert_eq!(
        f.current().name(sa("10.96.12.34:80")),
        Some("shop/payments")
    );
    let c = &f.counts;
    let got = (
        c.success.load(Relaxed),
        c.failure.load(Relaxed),
        c.too_large.load(Relaxed),
    );
    assert_eq!(got, (2, 1, 1));
    let absent = PeerFile::load(&dir.join("absent"))
        .err()
        .unwrap()
        .to_string();
    assert!(absent.starts_with("names file "), "{absent}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A directory of this test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("rttscope-names-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Load's refusal of the file `body` (written to a file of its own), checked to be one sentence
/// naming the file (`observe` exits 1 with it: cmd::observe loads it with `?`).
fn refused_at_start(d: &Scratch, name: &str, body: &[u8]) -> String {
    let p = d.0.join(name);
    std::fs::write(&p, body).unwrap();
    let e = PeerFile::load(&p).err().unwrap().to_string();
    crate::fuzzing::assert_one_sentence(name, &e);
    assert!(e.starts_with("names file ") && e.contains(name), "{e}");
    e
}

/// At the start: a 100 MiB file is refused by its size (its bytes unread), a device that never
/// ends after 64 MiB and one byte; malformed, not UTF-8 and over the entries cap: one sentence each.
#[test]
fn refusals_at_the_start_are_one_sentence_each() {
    let d = Scratch::new("start");
    let big = d.0.join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let e = PeerFile::load(&big).err().unwrap().to_string();
    assert!(e.contains("it is 104857600 bytes, more than 64 MiB"), "{e}");
    crate::fuzzing::assert_one_sentence("big", &e);
    if std::path::Path::new("/dev/zero").exists() {
        let e = PeerFile::load(std::path::Path::new("/dev/zero"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("it is larger than 64 MiB"), "{e}");
    }
    let e = refused_at_start(&d, "bad", b"10.0.0.1 a\n10.0.0.0/33 b\n");
    assert!(e.contains(": line 2: "), "{e}");
    let e = refused_at_start(&d, "binary", &[0x31, 0xff, 0xfe, 0x0a]);
    assert!(e.ends_with("it is not UTF-8 text"), "{e}");
    let mut many = String::new();
    for i in 0..=MAX_ENTRIES as u32 {
        let [_, a, b, c] = i.to_be_bytes();
        many.push_str(&format!("10.{a}.{b}.{c} n\n"));
    }
    let e = refused_at_start(&d, "many", many.as_bytes());
    assert!(e.contains("more than 262144 entries"), "{e}");
}

/// Poll at once, `mid` run after the read.
fn poll_now_with(f: &PeerFile, mid: impl FnOnce()) -> Option<Reload> {
    f.seen.lock().unwrap().polled = None;
    f.poll_with(mid)
}

/// Rewritten in place while read (a `>` redirection caught half-way, whose first half parses):
/// refused, counted, the names in force stay, and read whole at the next look though the file
/// did not change after. Replaced by a rename while read: the open file is the old one, whole;
/// the new one is read at the next look.
#[test]
fn a_file_changed_while_read_is_refused_then_read_again() {
    use std::sync::atomic::Ordering::Relaxed;
    let d = Scratch::new("mid");
    let p = d.0.join("names");
    std::fs::write(&p, "10.100.0.0/16:80 payments\n").unwrap();
    let f = PeerFile::load(&p).unwrap();
    let svc = sa("10.100.0.10:80");
    let (half, rest) = ("10.100.0.0/16:80 payments-v2\n", "10.0.0.0/8 corp\n");
    std::fs::write(&p, half).unwrap();
    let append = || {
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(rest.as_bytes()).unwrap();
    };
    let r = poll_now_with(&f, append);
    let want = format!(
        "it changed while it was read ({} bytes read, {} bytes now;",
        half.len(),
        half.len() + rest.len()
    );
    assert!(
        matches!(&r, Some(Reload::Failed(e)) if e.starts_with(&want)),
        "{r:?}"
    );
    assert_eq!(
        f.current().name(svc),
        Some("payments"),
        "the old names stay"
    );
    assert_eq!(f.counts.failure.load(Relaxed), 1);
    assert_eq!(f.poll_now(), Some(Reload::Loaded(2)), "read again, whole");
    assert_eq!(f.current().name(svc), Some("payments-v2"));
    // the same content under a new inode (so that it is read), replaced by a rename while read
    let (copy, new) = (d.0.join("copy"), d.0.join("new"));
    std::fs::write(&copy, format!("{half}{rest}")).unwrap();
    std::fs::rename(&copy, &p).unwrap();
    std::fs::write(&new, "10.100.0.0/16:80 payments-v3\n").unwrap();
    let r = poll_now_with(&f, || std::fs::rename(&new, &p).unwrap());
    assert_eq!(r, None, "the open file, read whole: the content in force");
    assert_eq!(f.poll_now(), Some(Reload::Loaded(1)), "the new file");
    assert_eq!(f.current().name(svc), Some("payments-v3"));
    assert_eq!(
        (
            f.counts.success.load(Relaxed),
            f.counts.failure.load(Relaxed)
        ),
        (2, 1)
    );
}

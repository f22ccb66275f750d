//! ePPing (pping/ of xdp-project/bpf-examples) as a reference variant of
//! the sampler benchmark: one `pping` per veth end (it takes one interface),
//! each in the end's namespace, its tc programs attached by tcx; their ids
//! are read back from the interfaces (BPF_PROG_QUERY) so that the run-time
//! statistics of exactly these programs are measured. Built by
//! scripts/build-epping.sh (BENCH_EPPING_SRC in scripts/bench-sampler.sh).
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rttscope_e2e::{ChildGuard, NetNs, Pair};

/// The pping option sets when BENCH_EPPING_ARGS is not set (`;` between
/// sets: each gets a chain of its own in every round): its default rate
/// limit (one timestamp per flow per 100 ms) with one perf-buffer event per
/// RTT (pping's default output), the same without the rate limit (`-r 0`:
/// every new TSval and every ICMP echo timed), and the rate-limited one
/// aggregating RTTs in kernel histograms (`-a 1`, reported each second), as
/// rttscope does.
pub const DEFAULT_ARGS: &str = "-r 100;-r 0;-r 100 -a 1";

/// Given to every set: no map cleanup (`-c 0`: its iter/bpf_map_elem
/// programs, which kernels refusing tracing programs refuse, are then not
/// loaded: scripts/build-epping.sh), TCP and ICMP, tc on ingress (the
/// default hook, said for the record).
pub const COMMON_ARGS: &str = "-c 0 -T -C -I tc";

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// Two running pping processes and their tc programs, named `epping_egr` /
/// `epping_ing` by hook (the names the benchmark groups run times by).
pub struct Epping {
    children: Vec<(ChildGuard, Arc<Mutex<Vec<u8>>>)>,
    pub progs: Vec<(String, u64)>,
}

/// Program ids attached by tcx at `attach_type` on `ifname` of `ns`.
fn tcx_prog_ids(ns: &NetNs, ifname: &str, attach_type: u32) -> Vec<u64> {
    let ifname = ifname.to_string();
    ns.run(move || {
        let c = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
        let mut ids = [0u32; 16];
        let mut a = [0u8; 64]; // bpf_attr.query
        a[0..4].copy_from_slice(&ifindex.to_ne_bytes());
        a[4..8].copy_from_slice(&attach_type.to_ne_bytes());
        a[16..24].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
        a[24..28].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
        // SAFETY: bpf(2) BPF_PROG_QUERY with an id buffer of the count we pass.
        // (as_mut_ptr: the kernel writes the count back into `a`)
        let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, a.as_mut_ptr(), a.len()) };
        let n = u32::from_ne_bytes(a[24..28].try_into().unwrap()) as usize;
        if r != 0 {
            return Vec::new();
        }
        ids[..n.min(ids.len())].iter().map(|&i| i as u64).collect()
    })
}

/// Keeps reading a child's pipe into a buffer (a full pipe would block it).
fn drain(r: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut r = r;
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut b = b.lock().unwrap();
            if b.len() < 65536 {
                b.extend_from_slice(&chunk[..n]);
            }
        }
    });
    buf
}

impl Epping {
    /// Starts `bin` (pping) with `args` on both ends of `pair` and waits
    /// (up to 15 s) until both ends have its egress and ingress programs:
    /// the tcx programs there that are not in `known` (the chain's others).
    pub fn start(bin: &Path, args: &[String], pair: &Pair, known: &[u64]) -> Epping {
        let dir: PathBuf = bin.parent().expect("pping's directory").to_path_buf();
        let ends = [(&pair.a, pair.a_if.as_str()), (&pair.b, pair.b_if.as_str())];
        let mut children = Vec::new();
        for (ns, ifname) in ends {
            // pping loads pping_kern.o from its working directory
            let mut cmd: Command = ns.command(bin.to_str().expect("pping path"));
            cmd.args(["-i", ifname])
                .args(args)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null()) // its RTT events: not read
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("spawn pping");
            let err = drain(child.stderr.take().unwrap());
            children.push((ChildGuard(Some(child)), err));
        }
        let mut e = Epping {
            children,
            progs: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let progs = attached(pair, known);
            if progs.len() == 4 {
                e.progs = progs;
                return e;
            }
            let exited = e
                .children
                .iter_mut()
                .any(|(c, _)| matches!(c.0.as_mut().unwrap().try_wait(), Ok(Some(_))));
            if exited || Instant::now() > deadline {
                let errs: Vec<String> = e
                    .children
                    .iter()
                    .map(|(_, b)| String::from_utf8_lossy(&b.lock().unwrap()).into_owned())
                    .collect();
                panic!("ePPing did not attach on both veth ends (found {progs:?}); its stderr: {errs:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// (name by hook, id) of every tcx program on both ends of the pair but
/// those in `known`.
fn attached(pair: &Pair, known: &[u64]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (ns, ifname) in [(&pair.a, &pair.a_if), (&pair.b, &pair.b_if)] {
        for (t, name) in [
            (BPF_TCX_EGRESS, "epping_egr"),
            (BPF_TCX_INGRESS, "epping_ing"),
        ] {
            for id in tcx_prog_ids(ns, ifname, t)
                .into_iter()
                .filter(|i| !known.contains(i))
            {
                out.push((name.to_string(), id));
            }
        }
    }
    out
}

impl Drop for Epping {
    /// SIGTERM (pping detaches and exits), then the guard's SIGKILL if it
    /// has not exited within 10 s.
    fn drop(&mut self) {
        for (c, _) in &self.children {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.pid() as i32, libc::SIGTERM) };
        }
        for (c, _) in self.children.drain(..) {
            let _ = c.wait_output(Duration::from_secs(10));
        }
    }
}

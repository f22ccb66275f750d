#!/usr/bin/env bash
# The passive views on other kernels, each booted in a VM (virtme-ng, QEMU TCG):
# Debian 12's 6.1 (/boot) and Debian 11's 5.10 and 13's 6.12 (scripts/setup.sh puts
# them in /lib/modules/<version>/vmlinuz), or the images given / RTTSCOPE_TEST_KERNELS,
# with real TCP traffic (IPv4 and IPv6) between two network namespaces created in
# the guest, under both loaders, checked against `ss -ti` read in the guest; then
# `compare`, the daemon with the shipped unit's capabilities, and kill -9; in the oldest
# kernel's guest also the static binary in a Debian 11 root (features, one traffic run).
# See docs/kernels.md. Usage: sudo scripts/test-kernels.sh [KERNEL_IMAGE...]
# (RTTSCOPE_VM_TIMEOUT: seconds per guest, boot included; default 1500; RTTSCOPE_VM_JOBS: guests at a time, default 2)
#
# The host part boots each kernel with `vng --disable-kvm --exec "$0 --guest"`
# (KVM does not boot these guests here; TCG does, ~10 s). The guest sees the
# host's files read-only, so it runs the already built target/debug/rttscope
# (both loaders: --features rttscope/aya). The guest part prints one
# "test-kernels: guest <kernel>: PASS" line when every check passed.
set -euo pipefail
source "$(dirname "$0")/common.sh"

if [ "${1:-}" = "--guest" ]; then
  # ---------------------------------------------------------------- guest --
  shift
  export RTTSCOPE_BIN="${RTTSCOPE_BIN:-$ROOT/target/debug/rttscope}"
  cd "$ROOT"
  exec /usr/bin/python3 - "$@" <<'PY'
import ctypes, json, os, re, signal, socket, statistics, subprocess, sys, threading, time

BIN = os.environ["RTTSCOPE_BIN"]
EXAMPLE_BIN = os.environ.get("RTTSCOPE_EXAMPLE_BIN", "")
# A Debian 11 root (glibc 2.31) holding the static binary as /usr/local/bin/rttscope: given
# for the oldest kernel booted (static_run)
STATIC_ROOT = os.environ.get("RTTSCOPE_STATIC_ROOT", "")
KERNEL = os.uname().release
PORT = 5001
C_ADDR, S_ADDR = "10.88.0.1", "10.88.0.2"
C6_ADDR, S6_ADDR = "fd88::1", "fd88::2"
THINK = 0.005          # client's pause between transactions (paced RR)
RR_SECONDS = 2.5       # paced traffic, then the connection is held still
failures = []
libc = ctypes.CDLL(None, use_errno=True)


def log(msg):
    print(f"  {msg}", flush=True)


def check(ok, what):
    log(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def sh(*args, check_rc=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"{args}: {r.stdout}{r.stderr}")
    return r


def enter(ns):
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns {ns}")
    os.close(fd)


def within(a, b, rel, floor_ms):
    return abs(a - b) <= max(rel * b, floor_ms)


# -- the testbed: namespaces kc (client) and ks (server), veth vc <-> vs ----
def testbed_up():
    for ns in ("kc", "ks"):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "vc", "netns", "kc", "type", "veth", "peer", "name", "vs", "netns", "ks")
    sh("ip", "-n", "kc", "addr", "add", f"{C_ADDR}/24", "dev", "vc")
    sh("ip", "-n", "ks", "addr", "add", f"{S_ADDR}/24", "dev", "vs")
    sh("ip", "-n", "kc", "addr", "add", f"{C6_ADDR}/64", "dev", "vc", "nodad")
    sh("ip", "-n", "ks", "addr", "add", f"{S6_ADDR}/64", "dev", "vs", "nodad")
    sh("ip", "-n", "kc", "link", "set", "vc", "up")
    sh("ip", "-n", "ks", "link", "set", "vs", "up")


def testbed_down():
    for ns in ("kc", "ks"):
        sh("ip", "netns", "del", ns, check_rc=False)


def tcp_info_rtt_ms(sock):
    """tcpi_rtt (ms): the field `ss -ti` prints as rtt (TCP's srtt)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int.from_bytes(info[68:72], "little") / 1000.0


class Server:
    """1-byte requests, 2-byte responses, one thread per connection, in ks."""

    def __init__(self, addr=S_ADDR):
        ready = threading.Event()
        self.rtt = []

        def run():
            enter("ks")
            self.sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((addr, PORT))
            self.sock.listen(16)
            ready.set()
            while True:
                try:
                    c, _ = self.sock.accept()
                except OSError:
                    return
                threading.Thread(target=self.serve, args=(c,), daemon=True).start()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)

    def serve(self, c):
        """After each request (which ACKs the previous response): the
        server's srtt from TCP_INFO."""
        with c:
            while c.recv(1):
                if len(self.rtt) < 100000:
                    self.rtt.append(tcp_info_rtt_ms(c))
                c.sendall(b"ok")


class Client:
    """Paced request/response from kc for RR_SECONDS, then held open, silent.
    After each response (which ACKs the request) the client's srtt from
    TCP_INFO (the value `ss -ti` shows; ss itself takes ~0.5 s per run
    under TCG): like the server's, one reading per ACK, as TCP's samples."""

    def __init__(self, addr=S_ADDR):
        self.transactions = 0
        self.rtt = []
        self.done = threading.Event()
        self.release = threading.Event()
        self.go = threading.Event()
        ready = threading.Event()

        def run():
            enter("kc")
            s = socket.create_connection((addr, PORT))
            self.port = s.getsockname()[1]
            s.sendall(b"q")  # one transaction before the start: the connection is live
            s.recv(2)
            ready.set()
            self.go.wait(300)
            end = time.monotonic() + RR_SECONDS
            while time.monotonic() < end:
                s.sendall(b"q")
                got = b""
                while len(got) < 2:
                    got += s.recv(2 - len(got))
                self.transactions += 1
                self.rtt.append(tcp_info_rtt_ms(s))
                time.sleep(THINK)
            self.done.set()
            self.release.wait(60)
            s.close()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)


def ss_rtt(ns, filt):
    """(rtt, minrtt) in ms of the one established socket matching the ss
    filter in ns, from `ss -ti`; None if there is none."""
    out = sh("ip", "netns", "exec", ns, "ss", "-tinH", "state", "established", filt).stdout
    rtt = re.findall(r"\brtt:([0-9.]+)/", out)
    minrtt = re.findall(r"\bminrtt:([0-9.]+)", out)
    return (float(rtt[0]), float(minrtt[0])) if rtt and minrtt else None


def observe(args, timeout=120, cmd=None):
    """Start `rttscope observe --format json ARGS` (cmd: how to run rttscope, default
    [BIN]); returns (proc, start line)."""
    p = subprocess.Popen([*(cmd or [BIN]), "observe", "--format", "json", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    line = p.stdout.readline()
    log(f"observe {' '.join(args)}: started in {time.monotonic() - t0:.1f} s")
    if not line:
        p.wait(timeout)
        return p, None
    return p, json.loads(line)


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    return lines, err


def endpoint(addr, port):
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def end_flow(lines, netns, local):
    for l in lines:
        if l.get("type") == "end":
            for f in l.get("flows", []):
                if f.get("netns_name") == netns and f.get("local") == local:
                    return f
    return None


def nothing_left(what, empty_qdisc_ok=False):
    """No rttscope program loaded, no filter on vc/vs, and no clsact qdisc
    (empty_qdisc_ok: after a crash an empty one may stay, docs/sampler.md)."""
    progs = sh("bpftool", "prog", "show").stdout
    ours = [l for l in progs.splitlines() if re.search(r"name rtt_(tcp|sampler)_", l)]
    check(not ours, f"{what}: no rttscope program left loaded {ours if ours else ''}")
    for ns, dev in (("kc", "vc"), ("ks", "vs")):
        if not os.path.exists(f"/run/netns/{ns}"):
            continue  # the testbed is down (its interfaces went with it)
        q = sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev).stdout
        f = sh("ip", "netns", "exec", ns, "tc", "filter", "show", "dev", dev, "ingress",
               check_rc=False).stdout
        if empty_qdisc_ok:
            e = sh("ip", "netns", "exec", ns, "tc", "filter", "show", "dev", dev, "egress", check_rc=False).stdout
            check(not f.strip() and not e.strip(), f"{what}: no filter left on {dev} (clsact qdisc: {'clsact' in q})")
        else:
            check("clsact" not in q and not f.strip(), f"{what}: no clsact qdisc or filter left on {dev}")
    check(pins() == PINS0, f"{what}: no pin left in /sys/fs/bpf ({sorted(set(pins()) - set(PINS0))})")


def traffic_run(label, args, before=False, v6=False, cmd=None):
    """observe ARGS on both namespaces while a paced RR flow runs; then the
    flow is held still and ss read on both ends. Returns what to compare.
    before: the connection is opened (one transaction) before observe starts.
    v6: the connection runs over IPv6 between the namespaces."""
    c_addr, s_addr = (C6_ADDR, S6_ADDR) if v6 else (C_ADDR, S_ADDR)
    testbed_up()
    srv = Server(s_addr)
    cli = Client(s_addr) if before else None
    obs, start = observe(["--netns", "kc", "--netns", "ks", "--interval", "1s",
                          "--duration", f"{RR_SECONDS + 1.5}s", *args], cmd=cmd)
    if start is None:
        _, err = finish(obs)
        check(False, f"{label}: observe started: {err.strip()}")
        testbed_down()
        return None
    cli = cli or Client(s_addr)
    cli.go.set()
    cli.done.wait(RR_SECONDS + 30)
    time.sleep(0.3)
    frozen_c = ss_rtt("kc", f"dport = :{PORT}")
    frozen_s = ss_rtt("ks", f"sport = :{PORT}")
    lines, err = finish(obs)
    cli.release.set()
    time.sleep(0.2)
    r = dict(before=before, start=start, lines=lines, err=err, rc=obs.returncode, tx=cli.transactions,
             ss_c=cli.rtt, ss_s=srv.rtt,
             frozen_c=frozen_c, frozen_s=frozen_s,
             c=end_flow(lines, "kc", endpoint(c_addr, cli.port)),
             s=end_flow(lines, "ks", endpoint(s_addr, PORT)))
    check(obs.returncode == 0, f"{label}: observe exited 0 ({err.strip()[-300:]})")
    log(f"{label}: {cli.transactions} transactions; srtt readings client {len(cli.rtt)}, "
        f"server {len(srv.rtt)}; ss -ti once still: client {r['frozen_c']} ms, server {r['frozen_s']} ms")
    nothing_left(label)
    srv.sock.close()
    testbed_down()
    return r


def tcp_checks(label, r, source, existing_timed=True):
    """The TCP view's samples against TCP's own srtt (TCP_INFO readings during
    the traffic, `ss -ti` once the flow is still), both ends. source: "hook"
    (per-ACK hook), "args" (RTT_CB arguments), "fallback" (srtt) or "table"
    (a connection open before the start, timed by the build without atomics'
    per-ACK hook from its table by socket address), as the feature probes
    predict. A connection opened before the start that no path can time
    (existing_timed False) must be absent and counted as not timed."""
    tcp = r["start"]["tcp"]
    if r["before"]:
        log(f"{label}: connection opened before the start; existing path: {tcp.get('existing_path')}, "
            f"not timed: {tcp.get('existing_not_timed')}")
        if not existing_timed:
            check(tcp.get("existing_not_timed", 0) >= 2 and tcp.get("existing_path", "").startswith("none"),
                  f"{label}: both ends of the connection open before the start said not timed")
            check(r["c"] is None or not (r["c"].get("tcp") or {}).get("summary", {}).get("n"),
                  f"{label}: no TCP samples for a connection no path times")
            return
        check(tcp.get("existing_not_timed", 1) == 0, f"{label}: every existing connection timed")
    for side, key, ssk, frozen in (("client", "c", "ss_c", "frozen_c"), ("server", "s", "ss_s", "frozen_s")):
        f = r[key]
        if not check(f is not None and f.get("tcp") and r[ssk] and r[frozen],
                     f"{label} {side}: flow in the end line, srtt readings, ss -ti"):
            continue
        t = f["tcp"]
        n = t["summary"]["n"]
        p50, mean = t["summary"]["p50_us"] / 1000.0, t["summary"]["mean_us"] / 1000.0
        srtt = t["srtt_us"] / 1000.0
        ss_med, ss_mean = statistics.median(r[ssk]), statistics.mean(r[ssk])
        ss_still, ss_min = r[frozen]
        log(f"{label} {side}: n {n} for {r['tx']} transactions, samples p50 {p50:.3f} mean {mean:.3f} ms, "
            f"end srtt {srtt:.3f} ms | TCP's srtt: {len(r[ssk])} readings p50 {ss_med:.3f} mean {ss_mean:.3f} ms, "
            f"ss -ti once still: rtt {ss_still:.3f} minrtt {ss_min:.3f} ms")
        check(n >= 0.5 * r["tx"], f"{label} {side}: samples >= half the transactions")
        if source in ("hook", "args", "table"):
            # Both record the sample and srtt after it: srtt equals ss's
            # once the flow is still.
            check(within(srtt, ss_still, 0.2, 0.05),
                  f"{label} {side}: end srtt within 20% (or 50 us) of ss -ti's once the flow is still")
            # The samples themselves (--raw, in order) are what TCP fed its
            # estimator: TCP's moving average (tcp_rtt_estimator: srtt8 +=
            # m - srtt8/8) replayed over them lands on ss -ti's srtt. The
            # first value is forgotten by (7/8)^n: started from the first sample.
            local = f["local"]
            raw = [l["rtt_us"] for l in r["lines"]
                   if l.get("type") == "sample" and l.get("view") == "tcp" and l.get("local") == local]
            srtt8 = None
            for m in raw:
                srtt8 = m << 3 if srtt8 is None else srtt8 + m - (srtt8 >> 3)
            replay = (srtt8 >> 3) / 1000.0 if srtt8 else float("nan")
            log(f"{label} {side}: {len(raw)} raw samples; TCP's srtt replayed over them {replay:.3f} ms "
                f"vs ss -ti {ss_still:.3f} ms")
            check(len(raw) == n and within(replay, ss_still, 0.05, 0.01),
                  f"{label} {side}: every sample on the raw stream, and srtt replayed over them "
                  f"within 5% (or 10 us) of ss -ti's")
        else:
            # Each fallback sample is TCP's srtt before that ACK's update: the
            # samples and the srtt readings are the same quantity.
            check(within(p50, ss_med, 0.2, 0.05),
                  f"{label} {side}: samples' median within 20% (or 50 us) of the srtt readings' median")
    c = [l for l in r["lines"] if l.get("type") == "end"]
    cnt = c[0]["counters"]["tcp"] if c else {}
    if source == "table":
        check(tcp.get("ack_hook") == "attached: connections open before attach only",
              f"{label}: ack_hook attached for connections open before attach ({tcp.get('ack_hook')})")
        check(tcp.get("existing_path", "").startswith("per-ACK hook, by socket address"),
              f"{label}: existing path is the hook's table ({tcp.get('existing_path')})")
        check(cnt.get("existing_hook_samples", 0) == cnt.get("samples", -1) > 0
              and cnt.get("srtt_fallback_samples", 1) == 0,
              f"{label}: every sample the hook's ({cnt.get('existing_hook_samples')} of {cnt.get('samples')}, "
              f"srtt fallback {cnt.get('srtt_fallback_samples')})")
        check(cnt.get("existing_table_full", 1) == 0 and cnt.get("existing_table_stale", 1) == 0,
              f"{label}: table neither full nor stale ({cnt.get('existing_table_full')}, {cnt.get('existing_table_stale')})")
    elif source == "hook":
        check(tcp.get("ack_hook") == "attached", f"{label}: ack_hook attached ({tcp.get('ack_hook')})")
        check("tcp_ack_update_rtt" in tcp.get("rtt_source", ""), f"{label}: rtt source is the hook")
        check(cnt.get("srtt_fallback_samples", 1) == 0, f"{label}: no srtt fallback sample")
    elif source == "args":
        check(tcp.get("rtt_source", "").startswith("RTT_CB args"), f"{label}: rtt source is RTT_CB args ({tcp.get('rtt_source')})")
        check(cnt.get("srtt_fallback_samples", 1) == 0, f"{label}: no srtt fallback sample")
    else:
        check(tcp.get("ack_hook") != "attached", f"{label}: ack_hook not attached ({tcp.get('ack_hook')})")
        check(tcp.get("rtt_source", "").startswith("srtt fallback"),
              f"{label}: rtt source says srtt fallback ({tcp.get('rtt_source')})")
        check(cnt.get("srtt_fallback_samples", 0) == cnt.get("samples", -1) > 0,
              f"{label}: every sample counted as srtt fallback ({cnt.get('srtt_fallback_samples')} of {cnt.get('samples')})")


def sampler_checks(label, r, how, obj):
    """The sampler's median between ss's minrtt - 20% and the median of TCP's
    srtt + 20% (10 us slack each way), as in tests/tests/sampler.rs: srtt is
    a moving average that a few long samples inflate, so it bounds from above.
    obj: the build `features` names (sampler, or sampler_noatomic where the
    kernel refuses BPF atomics with a result): the start record says so."""
    att = (r["start"].get("sampler") or {}).get("attached", [])
    check(len(att) == 2 and all(a.get("how") == how for a in att),
          f"{label}: sampler attached by {how} on both interfaces ({[a.get('how') for a in att]})")
    wa = (r["start"].get("sampler") or {}).get("without_atomics")
    log(f"{label}: sampler build {obj}; start record: without_atomics {wa!r}")
    check((wa is not None) == (obj == "sampler_noatomic"),
          f"{label}: the start record names the sampler's build without atomics exactly where features does ({obj})")
    for side, key, ssk, frozen in (("client", "c", "ss_c", "frozen_c"), ("server", "s", "ss_s", "frozen_s")):
        s = (r[key] or {}).get("sampler")
        if not check(s is not None and r[ssk] and r[frozen], f"{label} {side}: sampler flow in the end line"):
            continue
        n = s["summary"]["n"]
        p50 = s["summary"]["p50_us"] / 1000.0
        ss_med = statistics.median(r[ssk])
        lo, hi = 0.8 * r[frozen][1] - 0.01, 1.2 * ss_med + 0.01
        t = ((r[key] or {}).get("tcp") or {}).get("summary") or {}
        tcp50 = f"{t['p50_us'] / 1000.0:.3f} ms (n {t.get('n')})" if t.get("p50_us") is not None else "none"
        log(f"{label} sampler {side}: n {n}, p50 {p50:.3f} ms; TCP view p50 {tcp50}; bounds {lo:.3f} (ss minrtt) .. {hi:.3f} (srtt p50)")
        check(n >= 0.5 * r["tx"], f"{label} sampler {side}: samples >= half the transactions")
        check(lo <= p50 <= hi, f"{label} sampler {side}: median between ss's minrtt - 20% and srtt's median + 20%")


def in_ns(ns, fn):
    """fn() on a thread that entered ns (setns is per thread); its result or exception."""
    out = {}

    def run():
        try:
            enter(ns)
            out["v"] = fn()
        except Exception as e:  # handed to the caller
            out["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if "e" in out:
        raise out["e"]
    return out.get("v")


def n_of(text, row):
    """compare's table: the sample count of the row named `row` (its first
    number), None if there is no such row."""
    for l in text.splitlines():
        if l.startswith(row + " ") and l[len(row):].split() and l[len(row):].split()[0].isdigit():
            return int(l[len(row):].split()[0])
    return None


def compare_run(smp):
    """`rttscope compare` once: `serve` in ks, compare from kc with the sampler
    on vc; each passive row holds one sample per probe transaction (+-1), as
    in tests/tests/compare.rs."""
    testbed_up()
    srv = subprocess.Popen(["ip", "netns", "exec", "ks", BIN, "serve", "--listen", f"{S_ADDR}:7878"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        t0 = time.monotonic()
        p = subprocess.run(["ip", "netns", "exec", "kc", BIN, "compare", S_ADDR, "-l", "3s", "-w", "20ms",
                            *(["--iface", "vc"] if smp else [])], capture_output=True, text=True, timeout=300)
        log(f"compare: exit {p.returncode} in {time.monotonic() - t0:.1f} s")
        for l in p.stdout.splitlines():
            log(f"| {l}")
        n = {row: n_of(p.stdout, row) for row in ("TCP_RR", "tcp client", "tcp server", "sampler client")}
        rr = n["TCP_RR"] or 0
        # ~150 at 20 ms; TCG on a loaded host gave 79: the rows' match is the check
        check(p.returncode == 0 and rr >= 20, f"compare: exit 0 and TCP_RR has >= 20 of ~150 transactions "
              f"({rr}; {p.stderr.strip()[-300:]})")
        for row in ("tcp client", "tcp server", "sampler client")[:3 if smp else 2]:
            check(n[row] is not None and abs(n[row] - rr) <= 1, f"compare: row {row} has one sample per transaction "
                  f"({n.get(row)} for {rr})")
    finally:
        srv.terminate()
        srv.wait(30)
    nothing_left("compare")
    testbed_down()


def unit_caps():
    """The capability set of the shipped systemd unit (bounding = ambient)."""
    unit = open(os.path.join(os.getcwd(), "examples/deploy/rttscope.service")).read()

    def caps(key):
        return {c.removeprefix("CAP_").lower() for l in unit.splitlines() if l.startswith(key + "=")
                for c in l.split("=", 1)[1].split()}
    b, a = caps("CapabilityBoundingSet"), caps("AmbientCapabilities")
    check(b and b == a, f"daemon: the unit's bounding and ambient sets are one set ({b}, {a})")
    return b


def scrape():
    """GET /metrics from kc's loopback, where the daemon listens."""
    def get():
        with socket.create_connection(("127.0.0.1", 9464), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            body = b""
            while chunk := s.recv(65536):
                body += chunk
            return body.decode()
    return in_ns("kc", get)


def rtt_count(body, view):
    return sum(float(l.rsplit(" ", 1)[1]) for l in body.splitlines()
               if l.startswith("rttscope_rtt_seconds_count{") and f'view="{view}"' in l)


CAP_BITS = {"net_admin": 12, "perfmon": 38, "bpf": 39}


def daemon_run(how):
    """The daemon as the shipped unit runs it: uid 0 with exactly the unit's
    capabilities (setpriv), the shipped config, in kc (nsenter, which leaves
    /sys as it is), TCP view and sampler; scraped once after real traffic, as
    tests/tests/deploy.rs on the host. Then kill -9 (kill9_checks)."""
    caps = unit_caps()
    unit = open("examples/deploy/rttscope.service").read()
    memlock = re.search(r"^LimitMEMLOCK=(\S+)", unit, re.M)
    memlock = memlock.group(1).replace("infinity", "unlimited") if memlock else None
    testbed_up()
    srv = Server()
    # the unit's LimitMEMLOCK as systemd applies it (before the capabilities drop)
    cmd = ["prlimit", f"--memlock={memlock}:{memlock}", "--"] if memlock else []
    cmd += ["nsenter", "--net=/var/run/netns/kc", "setpriv",
           "--bounding-set=-all," + ",".join("+" + c for c in sorted(caps)),
           BIN, "observe", "--config", "examples/deploy/rttscope.toml", "--listen", "127.0.0.1:9464",
           "--interval", "300ms", "--duration", "300s",
           *(["--view", "tcp,sampler", "--iface", "vc"] if how != "none" else ["--view", "tcp"])]
    d = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    body = None
    while body is None and d.poll() is None and time.monotonic() - t0 < 180:
        try:
            body = scrape()
        except OSError:
            time.sleep(0.5)
    log(f"daemon ({','.join(sorted(caps))}, LimitMEMLOCK {memlock}): /metrics served after {time.monotonic() - t0:.1f} s")
    if body is None:
        d.kill()
        _, err = d.communicate(timeout=60)
        check(False, f"daemon: started with the unit's capabilities and serves /metrics ({err.strip()[-500:]})")
        srv.sock.close()
        testbed_down()
        return
    check(True, "daemon: started with the unit's capabilities and serves /metrics")
    st = open(f"/proc/{d.pid}/status").read()
    eff = int(re.search(r"^CapEff:\s*(\S+)", st, re.M).group(1), 16)
    allowed = sum(1 << CAP_BITS[c] for c in caps)
    check(eff & ~allowed == 0, f"daemon: effective capabilities {eff:#x} within the unit's {allowed:#x}")
    check(re.search(r"^NoNewPrivs:\s*1", st, re.M) is not None, "daemon: no_new_privs set after attach")
    cli = Client()
    cli.go.set()
    cli.done.wait(RR_SECONDS + 30)
    # The daemon publishes at its 300 ms reads; a starved guest (two at a time, on a loaded host)
    # ran them late: 1 s after the traffic, 78 TCP samples of 196 transactions were on /metrics
    # (5.10, 2026-12-07). Scraped until the counts are in, for at most 20 s.
    def counts():
        b = scrape()
        return rtt_count(b, "tcp"), rtt_count(b, "sampler")
    t1 = time.monotonic()
    time.sleep(1.0)
    tcp, smp = counts()
    while (tcp < cli.transactions or (how != "none" and smp < 0.5 * cli.transactions)) \
            and time.monotonic() - t1 < 20:
        time.sleep(0.5)
        tcp, smp = counts()
    log(f"daemon: {cli.transactions} transactions; scraped {time.monotonic() - t1:.1f} s after: tcp {tcp:.0f} samples, sampler {smp:.0f}")
    check(tcp >= cli.transactions and (how == "none" or smp >= 0.5 * cli.transactions),
          "daemon: the scrape holds the traffic in both views (tcp >= one per transaction, both ends; "
          "sampler >= half)")
    cli.release.set()
    kill9_checks(d, how, srv)
    testbed_down()


def daemonset_memlock():
    """The DaemonSet's capabilities (no CAP_SYS_RESOURCE) under a container's
    usual 64 KiB RLIMIT_MEMLOCK: where the kernel charges BPF maps to it
    (before 5.11) observe refuses in one sentence naming it; with
    CAP_SYS_RESOURCE rttscope raises the limit itself and runs everywhere."""
    base = ["prlimit", "--memlock=65536:65536", "--", "setpriv"]
    run = [BIN, "observe", "--view", "tcp", "--duration", "1s", "--quiet"]
    p = sh(*base, "--bounding-set=-all,+bpf,+net_admin,+perfmon", *run, check_rc=False)
    err = p.stderr.strip()
    log(f"DaemonSet capabilities, memlock 64 KiB: exit {p.returncode} {err}")
    check(p.returncode == 0 or (len(err.splitlines()) == 1 and "RLIMIT_MEMLOCK" in err),
          "memlock: runs, or refuses in one sentence naming RLIMIT_MEMLOCK")
    p = sh(*base, "--bounding-set=-all,+bpf,+net_admin,+perfmon,+sys_resource", *run, check_rc=False)
    check(p.returncode == 0, f"memlock: with CAP_SYS_RESOURCE rttscope raises the limit and runs ({p.stderr.strip()})")
    nothing_left("memlock")


def pins():
    return sorted(os.path.join(d, f) for d, ds, fs in os.walk("/sys/fs/bpf") for f in ds + fs)


def our_prog_ids(pattern=r"^rtt_(tcp|sampler)_"):
    """In the guest every rttscope program is this suite's."""
    progs = json.loads(sh("bpftool", "-j", "prog", "show").stdout or "[]")
    return [p["id"] for p in progs if re.match(pattern, p.get("name", ""))]


def kill9_checks(d, how, srv):
    """kill -9 of the daemon (as the OOM killer or systemd's final SIGKILL
    would): its links and the TCP view's programs must go with the process,
    and no pin stay. tcx links go too; legacy clsact filters (where the probe
    found no tcx) outlive any process by design (docs/sampler.md): then they
    must be there, the next start must remove them, and its exit leave no
    program or filter (an empty clsact qdisc may stay after a crash)."""
    ids, tcp_ids = our_prog_ids(), our_prog_ids(r"^rtt_tcp_")
    d.kill()
    _, err = d.communicate(timeout=60)
    srv.sock.close()
    t0 = time.monotonic()
    while True:
        alive = [i for i in ids if i in our_prog_ids()]
        links = json.loads(sh("bpftool", "-j", "link", "show").stdout or "[]")
        linked = [l.get("prog_id") for l in links if l.get("prog_id") in ids]
        tcp_alive = [i for i in alive if i in tcp_ids]
        if (not linked and not tcp_alive and (how == "clsact" or not alive)) or time.monotonic() - t0 > 10:
            break
        time.sleep(0.2)
    log(f"kill -9 (exit {d.returncode}): programs {ids}; after: loaded {alive}, linked {linked}")
    check(tcp_ids and d.returncode == -signal.SIGKILL, "kill -9: the daemon's TCP view was loaded, and it died of SIGKILL")
    check(not linked, "kill -9: no link left")
    check(not tcp_alive, "kill -9: the TCP view's programs gone")
    if how != "clsact":
        nothing_left("kill -9")
        return
    f = sh("ip", "netns", "exec", "kc", "tc", "filter", "show", "dev", "vc", "egress").stdout
    check("rtt_sampler_egr" in f, "kill -9: clsact's filters outlive the process (as documented)")
    r = sh(BIN, "observe", "--loader", "libbpf", "--view", "sampler", "--iface", "kc:vc",
           "--duration", "1s", "-v", check_rc=False)
    check(r.returncode == 0 and "removed a stale rttscope clsact filter" in r.stderr,
          f"kill -9: the next start removes the stale filters ({r.returncode}: {r.stderr.strip()[-300:]})")
    nothing_left("kill -9, then the next run", empty_qdisc_ok=True)


def refusals(blocker):
    """Where the probes say observe cannot load (no BTF, privileges or cgroup v2): both
    loaders, the daemon as the unit starts it and `compare` each refuse in one
    sentence naming the missing capability, and leave nothing behind."""
    log(f"observe cannot run here: {blocker}")
    testbed_up()
    srv = subprocess.Popen(["ip", "netns", "exec", "ks", BIN, "serve", "--listen", f"{S_ADDR}:7878"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    caps = ",".join("+" + c for c in sorted(unit_caps()))
    cases = [(f"{loader}: observe", [BIN, "observe", "--loader", loader, "--view", "tcp,sampler",
                                     "--iface", "kc:vc", "--duration", "1s"]) for loader in ("libbpf", "aya")]
    cases += [("daemon (the unit's capabilities)",
               ["nsenter", "--net=/var/run/netns/kc", "setpriv", f"--bounding-set=-all,{caps}", BIN, "observe",
                "--config", "examples/deploy/rttscope.toml", "--listen", "127.0.0.1:9464", "--duration", "5s"]),
              ("compare", ["ip", "netns", "exec", "kc", BIN, "compare", S_ADDR, "-l", "1s", "--iface", "vc"])]
    for what, cmd in cases:
        p = sh(*cmd, check_rc=False)
        err = p.stderr.strip()
        log(f"{what}: exit {p.returncode}: {err}")
        check(p.returncode != 0 and len(err.splitlines()) == 1 and "panicked" not in err
              and blocker.split(":")[0] in err,
              f"{what}: refused in one sentence naming the missing capability")
    srv.terminate()
    srv.wait(30)
    nothing_left("refused")
    testbed_down()


def count_run():
    """The example view (feature example-view, docs/views.md) under both loaders: the loader
    layer's cgroup_skb programs on this kernel. A child in a cgroup of the run's own sends itself
    N datagrams of 100 bytes over loopback: exactly N packets and N * 128 bytes each way (IP
    header on), none of the guest's other traffic; both programs gone after observe exits."""
    if not EXAMPLE_BIN or not os.path.exists(EXAMPLE_BIN):
        log("example view: no build with example-view given (RTTSCOPE_EXAMPLE_BIN): not checked")
        return
    n, size = 40, 100
    want = {"packets_in": n, "packets_out": n, "bytes_in": n * (size + 28), "bytes_out": n * (size + 28)}
    root = next(l.split()[1] for l in open("/proc/mounts") if l.split()[2] == "cgroup2")
    for loader in ("libbpf", "aya"):
        what = f"example view ({loader})"
        cg = os.path.join(root, f"rtscount{os.getpid()}{loader}")
        os.mkdir(cg)
        p = subprocess.Popen([EXAMPLE_BIN, "observe", "--format", "json", "--view", "count", "--cgroup", cg,
                              "--loader", loader, "--interval", "1s", "--duration", "6s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = p.stdout.readline()
            if not check(bool(first), f"{what}: observe attached ({p.stderr.read() if not first else 'start record'})"):
                continue
            child = os.fork()
            if child == 0:
                code = 1
                try:
                    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    r.bind(("127.0.0.1", 0))
                    w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    for _ in range(n):
                        w.sendto(b"x" * size, r.getsockname())
                    for _ in range(n):
                        r.recv(2 * size)
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(child, 0)
            check(status == 0, f"{what}: the sender in the cgroup ran")
            lines, err = finish(p)
            end = next((l for l in lines if l.get("type") == "end"), {})
            c = end.get("counters", {}).get("count", {})
            got = {k: c.get(k) for k in want}
            check(got == want, f"{what}: counts {got}, want {want}{' ' + err.strip() if got != want else ''}")
            check(not our_prog_ids(r"^rtt_count_"), f"{what}: no count program left loaded")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            os.rmdir(cg)


def rates(label, before, after):
    """A connection open before the start gets, per side, at least half as
    many samples per second as one opened after it (both runs RR_SECONDS of
    the same paced traffic)."""
    for side in ("c", "s"):
        n = [((r[side] or {}).get("tcp") or {}).get("summary", {}).get("n", 0) for r in (before, after)]
        log(f"{label} {side}: samples/s opened before {n[0] / RR_SECONDS:.1f}, after {n[1] / RR_SECONDS:.1f}")
        check(n[0] >= 0.5 * n[1] > 0, f"{label} {'client' if side == 'c' else 'server'}: opened before the start, "
              f">= half the samples per second of one opened after ({n[0]} vs {n[1]} in {RR_SECONDS} s)")


def runs(feat, caps):
    """The traffic runs (three, or two where --ack-hook off is auto's path
    for connections opened before and after), expectations from the probes'
    answers (`rttscope features --json`: the plan)."""
    auto = {"rtt_cb_args": "args", "ack_hook": "hook"}.get(feat["views"]["tcp_rtt_source"], "fallback")
    off = "args" if caps["rtt_cb_args"] else "fallback"
    existing = feat["views"]["tcp_existing_connections"]
    # connections open before the start: timed as the others, or by the hook's table
    before = "table" if existing == "ack_hook_table" else auto
    # where the probes find no atomics (5.10) both views run their builds
    # without them (features: tcp_object, sampler_object)
    smp = feat["views"].get("sampler_available", True)
    how = feat["views"]["sampler_attach"] if smp else "none"
    obj = feat["views"].get("sampler_object", "sampler")
    ifaces = ["--iface", "kc:vc", "--iface", "ks:vs"] if smp else []
    check(smp, "features: the sampler is available (a build without atomics where they are refused)")
    # libbpf, default --ack-hook (auto), both interfaces for the sampler; the
    # connection opened before the start
    r_before = r = traffic_run("libbpf auto+sampler (before)", ["--loader", "libbpf", "--raw", *ifaces], before=True)
    if r:
        tcp_checks("libbpf auto (before)", r, before, existing != "none")
        if smp:
            sampler_checks("libbpf", r, how, obj)
    # the other two over IPv6: the other path (where there is one) opened after
    # the start, and aya with its own sampler on a connection opened before. The
    # suite's time is mostly observe starting under TCG (11-25 s a start), so the
    # loaders are not crossed with the paths: the host's aya pass runs every path.
    r_after = None
    if off != auto or before == "table":
        r_after = r = traffic_run("libbpf off (after, v6)", ["--loader", "libbpf", "--raw", "--ack-hook", "off"], v6=True)
        if r:
            tcp_checks("libbpf off (after, v6)", r, off)
            if r_before and before == "table":
                rates("libbpf: table (before) vs off (after)", r_before, r)
    else:
        log(f"--ack-hook off takes the same path as auto here ({auto}): no separate run")
    r = traffic_run("aya auto+sampler (before, v6)", ["--loader", "aya", "--raw", *ifaces], before=True, v6=True)
    if r:
        tcp_checks("aya auto (before, v6)", r, before, existing != "none")
        if r_after and before == "table":
            rates("aya: table (before) vs libbpf off (after)", r, r_after)
        if smp:
            sampler_checks("aya (v6)", r, how, obj)
    compare_run(smp)
    daemon_run(how)
    daemonset_memlock()
    count_run()
    static_run()


# Mounts for a chroot that loads kernel programs and enters the testbed's namespaces, made in an
# unshared mount namespace (they vanish with it; the root itself is the host's, read-only here).
CHROOT = r"""set -e; r="$0"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/tmp"
mount -t tmpfs tmpfs "$r/run"
mkdir -p "$r/run/netns"
mount --rbind /run/netns "$r/run/netns"
exec chroot "$r" "$@"
"""


def static_run():
    """The static binary (scripts/package.sh --binary: glibc, libelf and zlib linked in) in a
    Debian 11 root (glibc 2.31, chroot) on this kernel: `features` (its expectations: the same
    answers as the debug build's), then one traffic run of both views with their checks."""
    if not STATIC_ROOT:
        log("static binary: no Debian 11 root given (RTTSCOPE_STATIC_ROOT, the oldest kernel's guest): not checked")
        return
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", CHROOT, STATIC_ROOT]
    libc_line = sh(*cmd, "sh", "-c", "ldd --version | head -1", check_rc=False).stdout.strip()
    check("2.31" in libc_line, f"static: the root is Debian 11's (glibc 2.31: {libc_line})")
    p = sh(*cmd, "rttscope", "features", "--json", check_rc=False)
    try:
        feat = json.loads(p.stdout)
    except ValueError:
        check(False, f"static: features --json in the root (exit {p.returncode}): {p.stdout[-300:]}{p.stderr[-300:]}")
        return
    ours = json.loads(sh(BIN, "features", "--json", check_rc=False).stdout)
    answers = lambda f: {c["name"]: c["ok"] for c in f["capabilities"]}
    check(p.returncode == 0 and answers(feat) == answers(ours),
          f"static: features exits 0 and answers as the debug build ({answers(feat)})")
    auto = {"rtt_cb_args": "args", "ack_hook": "hook"}.get(feat["views"]["tcp_rtt_source"], "fallback")
    obj = feat["views"].get("sampler_object", "sampler")
    r = traffic_run("static (Debian 11 root)", ["--raw", "--iface", "kc:vc", "--iface", "ks:vs"],
                    cmd=[*cmd, "rttscope"])
    if r:
        tcp_checks("static (Debian 11 root)", r, auto)
        n = ((r["c"] or {}).get("tcp") or {}).get("summary", {}).get("n", 0)
        check(abs(n - r["tx"]) <= r["tx"] // 10 + 3,
              f"static: client samples {n} for {r['tx']} transactions (10% + 3)")
        sampler_checks("static (Debian 11 root)", r, feat["views"]["sampler_attach"], obj)


t_all = time.monotonic()
print(f"test-kernels: guest {KERNEL}: {BIN}", flush=True)
check(os.path.exists("/sys/kernel/btf/vmlinux"), "kernel BTF at /sys/kernel/btf/vmlinux")
testbed_down()
PINS0 = pins()
try:
    # What this kernel allows, probed by rttscope itself: every expectation below
    # follows from these answers, never from the kernel's version.
    p = sh(BIN, "features", "--json", check_rc=False)
    feat = json.loads(p.stdout)
    caps = {c["name"]: c["ok"] for c in feat["capabilities"]}
    for c in feat["capabilities"]:
        log(f"feature {c['name']}: {'yes' if c['ok'] else 'no'} ({c['detail']})")
    for l in feat["views"]["lines"] + [f"missing: {m}" for m in feat["views"]["missing"]]:
        log(l)
    check(p.returncode == (0 if feat["observe_can_run"] else 1), "features: exit status says whether observe can run")
    if not feat["observe_can_run"]:
        # the probe says observe cannot load here (no BTF, privileges or cgroup v2): it must
        # say so in one sentence, under both loaders, and leave nothing behind
        refusals(feat["views"]["blocker"])
    else:
        runs(feat, caps)
except Exception as e:  # a broken testbed or a hung observer: a failure, not a crash
    check(False, f"guest run raised {type(e).__name__}: {e}")
    testbed_down()

print(f"test-kernels: guest {KERNEL}: {time.monotonic() - t_all:.0f} s of checks", flush=True)
if failures:
    print(f"test-kernels: guest {KERNEL}: FAIL ({len(failures)} checks): " + "; ".join(failures), flush=True)
    sys.exit(1)
print(f"test-kernels: guest {KERNEL}: PASS", flush=True)
PY
fi

# ------------------------------------------------------------------ host --
require_root
cd "$ROOT"
export PATH="$HOME/.local/bin:/root/.local/bin:/root/.pyenv/shims:$PATH"

if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  echo "test-kernels: SKIPPED - NO QEMU: qemu-system-x86_64 is not installed (scripts/setup.sh installs qemu-system-x86); nothing ran on other kernels" >&2
  exit 0
fi
if ! command -v vng >/dev/null 2>&1; then
  echo "test-kernels: vng (virtme-ng) is missing: pip install virtme-ng (scripts/setup.sh does)" >&2
  exit 1
fi

if (($#)); then
  kernels=("$@")
elif [ -n "${RTTSCOPE_TEST_KERNELS:-}" ]; then
  read -r -a kernels <<<"$RTTSCOPE_TEST_KERNELS"
else
  # bookworm's own (/boot), and Debian 11's 5.10 and Debian 13's 6.12, which
  # scripts/setup.sh puts in /lib/modules/<version>/vmlinuz beside their modules.
  kernels=()
  for k in /boot/vmlinuz-*; do [ -e "$k" ] && kernels+=("$k"); done
  for k in /lib/modules/*/vmlinuz; do
    v=$(basename "$(dirname "$k")")
    [ -e "$k" ] && [ ! -e "/boot/vmlinuz-$v" ] && kernels+=("$k")
  done
fi
if ((${#kernels[@]} == 0)); then
  echo "test-kernels: no kernel image to boot (/boot/vmlinuz-*: apt-get install linux-image-amd64, which scripts/setup.sh does)" >&2
  exit 1
fi

# The binary the guest runs needs both loaders (scripts/test.sh builds it so and
# sets RTTSCOPE_BIN; standalone, build it here).
if [ -z "${RTTSCOPE_BIN:-}" ]; then
  cargo build -q -p rttscope --features aya
  RTTSCOPE_BIN="$ROOT/target/debug/rttscope"
fi
export RTTSCOPE_BIN

# The kernel version of an image path (/boot/vmlinuz-V or /lib/modules/V/vmlinuz).
kernel_version() {
  local n; n=$(basename "$1")
  if [ "$n" = vmlinuz ]; then basename "$(dirname "$1")"; else echo "${n#vmlinuz-}"; fi
}
# The guests' logs, and the static binary's root below: removed at exit, with any guest still
# running (an interrupted run).
vm_dir=$(mktemp -d /tmp/rttscope-test-kernels.XXXXXX)
static_root=""
trap 'rc=$?; pids=$(jobs -p); [ -z "$pids" ] || kill $pids 2>/dev/null || true; wait || true; rm -rf "$vm_dir" ${static_root:+"$static_root"}; exit $rc' EXIT
# The static binary (scripts/package.sh --binary) in a Debian 11 root (glibc 2.31), in the
# oldest kernel's guest (5.10 in the default list; the guest's static_run): the root from
# scripts/rootfs.sh (cached: the package tests made it; its lock waits for a build in progress),
# extracted here with the binary as /usr/local/bin/rttscope, removed at exit. scripts/test.sh
# sets RTTSCOPE_STATIC_BIN, and then a missing binary is a failure.
STATIC_BIN="${RTTSCOPE_STATIC_BIN:-$ROOT/target/static/rttscope-static}"
oldest=$(for k in "${kernels[@]}"; do kernel_version "$k"; done | sort -V | head -1)
if [ -x "$STATIC_BIN" ]; then
  static_root=$(mktemp -d "$ROOT/target/vm-static.XXXXXX")
  tar -xf "$("$ROOT/scripts/rootfs.sh" bullseye)" -C "$static_root"
  install -m 0755 "$STATIC_BIN" "$static_root/usr/local/bin/rttscope"
  echo "test-kernels: the static binary in a Debian 11 root, in the $oldest guest"
elif [ -n "${RTTSCOPE_STATIC_BIN:-}" ]; then
  echo "test-kernels: RTTSCOPE_STATIC_BIN=$RTTSCOPE_STATIC_BIN is not an executable" >&2
  exit 1
else
  echo "test-kernels: no static binary at $STATIC_BIN (scripts/package.sh --binary builds it): not run in a guest"
fi

# Two guests at a time (RTTSCOPE_VM_JOBS): a guest's work is mostly the verifier of its own
# kernel, one program at a time, so one guest keeps about one host CPU busy of its two vCPUs;
# one after the other the three took 1013 s (283 + 568 + 161, 2026-12-07). The oldest kernel
# starts first: its guest (the build without atomics, the static binary) is the longest.
# Each guest's output goes to its own log, printed whole when it ends.
jobs_max=${RTTSCOPE_VM_JOBS:-2}
mapfile -t kernels < <(for k in "${kernels[@]}"; do echo "$(kernel_version "$k") $k"; done | sort -V | cut -d' ' -f2-)

# One guest: boots kernel $1, its output in $vm_dir/$2.log, its verdict in $2.rc.
guest() {
  local k=$1 name=$2 sroot="" rc t0 t1 log="$vm_dir/$2.log"
  [ "$(kernel_version "$k")" = "$oldest" ] && sroot=$static_root
  t0=$(date +%s)
  # KVM does not boot these guests on our machines (docs/kernels.md). -v: the guest's console
  # in the log too. virtme-ng's guest init runs the script on its virtio-serial ports, which udev
  # names; on a loaded host (the guest at ~20% of a CPU) udev did not settle within its 300 s,
  # the init found no ports and ran the script on the console instead: without -v its output was
  # lost, and vng, with no exit status from the guest, exited 255 (2026-12-07). The console's
  # lines end in CR: taken out below.
  set +e
  timeout "${RTTSCOPE_VM_TIMEOUT:-1500}" vng -v --disable-kvm --cpus 2 --memory 1G --run "$k" \
    --exec "RTTSCOPE_BIN=$RTTSCOPE_BIN RTTSCOPE_EXAMPLE_BIN=${RTTSCOPE_EXAMPLE_BIN:-} RTTSCOPE_STATIC_ROOT=$sroot $ROOT/scripts/test-kernels.sh --guest" >"$log" 2>&1 </dev/null
  rc=$?
  set -e
  sed -i 's/\r$//' "$log"
  t1=$(date +%s)
  echo "$rc $((t1 - t0))" >"$vm_dir/$name.rc"
}

status=0
t_all=$(date +%s)
names=()
for k in "${kernels[@]}"; do
  name=$(basename "$k")
  [ "$name" = vmlinuz ] && name=vmlinuz-$(basename "$(dirname "$k")")
  names+=("$name")
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n || true; done
  echo "test-kernels: booting $name (vng --disable-kvm: QEMU TCG)"
  guest "$k" "$name" &
done
wait
for name in "${names[@]}"; do
  log="$vm_dir/$name.log"
  read -r rc secs <"$vm_dir/$name.rc" || { rc=?; secs=?; }
  echo "== kernel $name (vng --disable-kvm: QEMU TCG)"
  if grep -q "^test-kernels: guest .*: PASS$" "$log"; then
    grep -E "^(test-kernels|  )" "$log"
    echo "test-kernels: $name: PASS in $secs s wall time (boot included, $jobs_max guests at a time)"
  else
    cat "$log"
    echo "test-kernels: $name: FAILED (vng exit $rc, $secs s; guest output above)" >&2
    status=1
  fi
done
echo "test-kernels: ${#kernels[@]} kernel(s) in $(($(date +%s) - t_all)) s"
exit $status

#!/usr/bin/env bash
# Benchmark of a node's interface churn (issue 46.4; needs root; docs/metrics.md, "Interfaces
# that come and go"): `rttscope observe --view tcp,sampler --all-netns --iface 'PREFIX*'` while
# BENCH_NS namespaces (default 500) with BENCH_PER_NS veths each (default 10: 5,000 veths) are
# created and deleted, at most BENCH_ALIVE namespaces (default 20) at once, the oldest deleted
# (with its veths) to make room. The host ends `<prefix>a<i>` match the pattern, a prefix of
# this run's own (`rqb<pid>`): no other interface on the host is touched. Every
# BENCH_PROBE_EVERY-th namespace (default 25), one veth is timed from `ip link add` to our
# program on both of its tcx hooks (BPF_PROG_QUERY).
#
# Prints: the churn's wall time, the observer's VmHWM and VmRSS, its CPU seconds (user +
# system), the attach latencies (min, median, max), and the end record's interface counters
# (attached, refused, unattachable, released, live).
#
#   scripts/bench-churn.sh                           # 500 namespaces x 10 veths
#   BENCH_MAX_IFACES=128 scripts/bench-churn.sh      # a smaller bound: more refused
#   RTTSCOPE_BIN=target/release/rttscope scripts/bench-churn.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${RTTSCOPE_BIN:-target/debug/rttscope}
NS_N=${BENCH_NS:-500}
PER=${BENCH_PER_NS:-10}
ALIVE=${BENCH_ALIVE:-20}
MAXIF=${BENCH_MAX_IFACES:-256}
PROBE=${BENCH_PROBE_EVERY:-25}
P=rqb$$
OUT=$(mktemp -d /tmp/rttscope-churn.XXXXXX)
[[ $(id -u) == 0 ]] || { echo "bench-churn.sh: needs root" >&2; exit 1; }
[[ -x $BIN ]] || { echo "bench-churn.sh: no $BIN (cargo build first, or RTTSCOPE_BIN)" >&2; exit 1; }

OBS=
cleanup() {
    [[ -n $OBS ]] && kill "$OBS" 2>/dev/null || true
    ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${P}a" \
        | sed 's/^/link del /' | ip -force -batch - 2>/dev/null || true
    for n in $(ip netns list | awk '{print $1}' | grep "^${P}n"); do ip netns del "$n"; done
}
trap cleanup EXIT

# time from `ip link add` to our program on both tcx hooks of the new interface (seconds)
probe() {
    python3 - "$1" "$2" "$3" <<'PY'
import ctypes, os, subprocess, sys, time
name, peer, ns = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
def query(ifindex, at):
    ids = (ctypes.c_uint32 * 64)()
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = ifindex      # target_ifindex
    ctypes.c_uint32.from_buffer(attr, 4).value = at           # attach_type
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(ids)  # prog_ids
    ctypes.c_uint32.from_buffer(attr, 24).value = 64          # prog_cnt
    if libc.syscall(321, 16, attr, 128) != 0:                 # bpf(BPF_PROG_QUERY)
        return 0
    return ctypes.c_uint32.from_buffer(attr, 24).value
t0 = time.monotonic()
subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer, "netns", ns], check=True)
idx = int(open(f"/sys/class/net/{name}/ifindex").read())
while time.monotonic() - t0 < 5:
    if query(idx, 46) and query(idx, 47):                     # BPF_TCX_INGRESS, BPF_TCX_EGRESS
        print(f"{time.monotonic() - t0:.4f}")
        sys.exit(0)
    time.sleep(0.001)
print("timeout")
PY
}

"$BIN" observe --view tcp,sampler --all-netns --iface "${P}a*" --max-ifaces "$MAXIF" \
    --interval 1s --format json >"$OUT/out.json" 2>"$OUT/err.txt" &
OBS=$!
for _ in $(seq 600); do [[ -s $OUT/out.json ]] && break; sleep 0.1; done
[[ -s $OUT/out.json ]] || { echo "observer did not start: $(cat "$OUT/err.txt")" >&2; exit 1; }
cpu0=$(awk '{print $14 + $15}' /proc/$OBS/stat)

t0=$(date +%s.%N)
alive=()
lat=()
for ((k = 0; k < NS_N; k++)); do
    if ((${#alive[@]} >= ALIVE)); then
        ip netns del "${alive[0]}"
        alive=("${alive[@]:1}")
    fi
    ns=${P}n$k
    ip netns add "$ns"
    alive+=("$ns")
    first=$((k * PER))
    if ((PROBE > 0 && k % PROBE == 0)); then
        lat+=("$(probe "${P}a$first" "${P}b$first" "$ns")")
        first=$((first + 1))
    fi
    for ((i = first; i < (k + 1) * PER; i++)); do
        echo "link add ${P}a$i type veth peer name ${P}b$i netns $ns"
    done | ip -force -batch -
done
for ns in "${alive[@]}"; do ip netns del "$ns"; done
t1=$(date +%s.%N)
sleep 3
read -r hwm rss < <(awk '/VmHWM/{h=$2} /VmRSS/{r=$2} END{print h, r}' /proc/$OBS/status)
cpu1=$(awk '{print $14 + $15}' /proc/$OBS/stat)
kill -TERM "$OBS"
wait "$OBS" || true
OBS=

echo "churn: $NS_N namespaces x $PER veths ($((NS_N * PER)) veths), at most $ALIVE namespaces at once, --max-ifaces $MAXIF"
echo "churn wall time: $(echo "$t1 - $t0" | bc) s"
echo "observer: VmHWM $hwm kB, VmRSS $rss kB at the end, CPU $(echo "scale=2; ($cpu1 - $cpu0) / $(getconf CLK_TCK)" | bc) s during the churn"
printf '%s\n' "${lat[@]}" | sort -n | awk '{a[NR]=$1} END{if (NR) printf "attach latency (%d probes): min %.1f ms, median %.1f ms, max %.1f ms\n", NR, a[1]*1000, a[int((NR+1)/2)]*1000, a[NR]*1000}'
jq -r 'select(.type == "end") | .counters.sampler | "ifaces: attached \(.ifaces_attached), refused \(.ifaces_refused), unattachable \(.ifaces_unattachable), released \(.ifaces_released), live \(.ifaces_live)"' "$OUT/out.json"
grep -c . "$OUT/err.txt" | xargs echo "stderr lines:"
rm -rf "$OUT"

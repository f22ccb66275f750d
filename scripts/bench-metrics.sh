#!/usr/bin/env bash
# Daemon-mode benchmarks (figures go to docs/perf-metrics.md):
#  1. cost: request/response traffic through a veth pair between two
#     namespaces at a fixed rate (default 50,000 transactions/s = 100,000
#     packets/s), with `rttscope observe --listen` attached: observer CPU
#     (user, sys), in-kernel program time (BPF run-time statistics), and the
#     workload's maximum throughput without and with the observer
#     (alternating runs, medians);
#  2. soak: many short connections for SOAK seconds; every 10 s the
#     observer's RSS, the flow-map occupancy (rttscope_flows_tracked) and
#     the label sets in use, read over /metrics.
# Everything runs in namespaces of its own; nothing is left behind.
# Usage: sudo scripts/bench-metrics.sh [SECONDS_PER_RUN [SOAK_SECONDS [RATE]]]
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
SECS=${1:-5}
SOAK=${2:-180}
RATE=${3:-50000}
CONNS=8
cargo build --release -q --examples --bins
BIN="$ROOT/target/release/rttscope"
LOAD="$ROOT/target/release/examples/load_gen"
A="rtsmba$$"; B="rtsmbb$$"
PORT=$((20000 + $$ % 20000))
OUT=$(mktemp -d)
cleanup() {
  [ -n "${OBS:-}" ] && kill "$OBS" 2>/dev/null && wait "$OBS" 2>/dev/null || true
  [ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add "va$$" netns "$A" type veth peer name "vb$$" netns "$B"
ip -n "$A" addr add 10.79.0.1/24 dev "va$$"; ip -n "$B" addr add 10.79.0.2/24 dev "vb$$"
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set "va$$" up; ip -n "$B" link set "vb$$" up
# Short connections: reuse TIME_WAIT ports (namespace-local settings).
ip netns exec "$A" sysctl -q -w net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65535"
ulimit -n "$(ulimit -Hn)"
ip netns exec "$B" "$LOAD" server 10.79.0.2:7001 & SRV=$!
sleep 0.3

clk=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
cpu_ns() { awk '{print $1}' "/proc/$1/schedstat"; }  # user+sys, ns resolution
rss_kb() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
scrape() { curl -s --max-time 5 "http://127.0.0.1:$PORT/metrics"; }
metric() { # name [label filter regex] -> sum of matching values
  scrape | awk -v n="$1" -v f="${2:-}" '($1 == n || index($1, n "{") == 1) && (f == "" || $1 ~ f) {s += $NF} END {printf "%.9f\n", s+0}'
}
start_obs() { # [--bpf-stats] [more observe options]
  "$BIN" observe --listen "127.0.0.1:$PORT" --netns "$A" --netns "$B" --quiet \
    --interval 1s --max-flows 16384 --view tcp,sampler --iface "$B:vb$$" "$@" >"$OUT/obs.out" 2>"$OUT/obs.err" & OBS=$!
  for _ in $(seq 100); do scrape >/dev/null 2>&1 && return; sleep 0.1; done
  echo "observer did not start:"; cat "$OUT/obs.err"; exit 1
}
stop_obs() { kill -TERM "$OBS"; wait "$OBS" || true; OBS=; }
tps() { ip netns exec "$A" "$LOAD" rr 10.79.0.2:7001 "$SECS" "$CONNS" "$1" | sed 's/.*"tps":\([0-9.]*\).*/\1/'; }
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

echo "== settings: veth between two namespaces, TCP RR 1-byte/1-byte, $CONNS connections, ${SECS}s per run;"
echo "   observer: observe --listen --netns A --netns B --quiet --interval 1s --view tcp,sampler --iface B:vb (both passive views); --bpf-stats for the paced runs only"
echo "   machine: $(nproc) cores, $(uname -r); load from other processes on the machine is not controlled"
echo "== 1. cost at a fixed rate of $RATE transactions/s ($((2 * RATE)) packets/s)"
ucpu=(); scpu=(); kcpu=(); tcpu=(); got=(); base=(); with=()
for i in 1 2 3; do
  base+=("$(tps 0)")
  start_obs --bpf-stats
  sleep 1
  read -r u0 s0 < <(cpu_ticks "$OBS"); n0=$(cpu_ns "$OBS"); k0=$(metric rttscope_bpf_prog_run_time_seconds_total); t0=$(date +%s.%N)
  got+=("$(tps "$RATE")")
  read -r u1 s1 < <(cpu_ticks "$OBS"); n1=$(cpu_ns "$OBS"); k1=$(metric rttscope_bpf_prog_run_time_seconds_total); t1=$(date +%s.%N)
  stop_obs
  # The maximum throughput with the observer as deployed: run-time
  # statistics off (they cost two clock reads per program run).
  start_obs
  sleep 1
  with+=("$(tps 0)")
  stop_obs
  el=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
  ucpu+=("$(awk -v d=$((u1-u0)) -v e="$el" -v hz="$clk" 'BEGIN{printf "%.2f", 100*d/hz/e}')")
  scpu+=("$(awk -v d=$((s1-s0)) -v e="$el" -v hz="$clk" 'BEGIN{printf "%.2f", 100*d/hz/e}')")
  tcpu+=("$(awk -v a="$n0" -v b="$n1" -v e="$el" 'BEGIN{printf "%.3f", 100*(b-a)/1e9/e}')")
  kcpu+=("$(awk -v a="$k0" -v b="$k1" -v e="$el" 'BEGIN{printf "%.2f", 100*(b-a)/e}')")
  echo "run $i: paced ${got[-1]} tps; observer ${tcpu[-1]}% of one core (user ${ucpu[-1]}%, sys ${scpu[-1]}% at 1/${clk} s resolution); kernel programs ${kcpu[-1]}% of one core; max tps without ${base[-1]}, with ${with[-1]}"
done
b=$(med "${base[@]}"); w=$(med "${with[@]}")
echo "median: paced $(med "${got[@]}") tps; observer $(med "${tcpu[@]}")% (user $(med "${ucpu[@]}")%, sys $(med "${scpu[@]}")%), kernel programs $(med "${kcpu[@]}")% of one core"
echo "median max throughput without observer $b tps, with $w tps: change $(awk -v b="$b" -v w="$w" 'BEGIN{printf "%+.2f%%", 100*(w-b)/b}')"

echo "== 2. soak: ${SOAK}s of short connections (connect, 1-byte RR, close), 4 threads"
start_obs
# Independent occupancy figure: the flow map's entries as bpftool dumps them.
for _ in $(seq 30); do scrape | grep -q 'prog="tcp_sockops"' && break; sleep 0.1; done  # after the first read
prog=$(scrape | grep -o 'prog="tcp_sockops",id="[0-9]*' | head -1 | grep -o '[0-9]*$' || true)
MAPID=$(bpftool -j prog show id "$prog" 2>/dev/null | python3 -c '
import json, subprocess, sys
for i in json.load(sys.stdin).get("map_ids", []):
    m = json.loads(subprocess.check_output(["bpftool", "-j", "map", "show", "id", str(i)]))
    if m.get("name") == "tcp_flows": print(i)' 2>/dev/null || true)
map_entries() { [ -n "$MAPID" ] && bpftool -j map dump id "$MAPID" 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin) or []))' || echo -1; }
ip netns exec "$A" "$LOAD" churn 10.79.0.2:7001 "$SOAK" 4 >"$OUT/churn.json" & CH=$!
printf "%6s %10s %11s %14s %8s %12s %10s\n" t_s rss_kib map_entries flows_tracked series samples drops
t=0
while kill -0 "$CH" 2>/dev/null; do
  printf "%6d %10d %11d %14.0f %8.0f %12.0f %10.0f\n" "$t" "$(rss_kb "$OBS")" "$(map_entries)" "$(metric rttscope_flows_tracked)" \
    "$(metric rttscope_series)" "$(metric rttscope_samples_total)" "$(metric rttscope_drops_total)" | tee -a "$OUT/soak.txt"
  sleep 10; t=$((t + 10))
done
wait "$CH" || true
echo "load: $(cat "$OUT/churn.json")"
sleep 2
echo "after the load: RSS $(rss_kb "$OBS") KiB, map entries $(map_entries), flows tracked $(metric rttscope_flows_tracked), drops by reason:"
scrape | grep '^rttscope_drops_total' | sed 's/^/  /'
awk 'NR > 1 {r[NR] = $2} END {n = NR; if (n < 3) exit; lo = r[2]; hi = r[2]; for (i = 2; i <= n; i++) {if (r[i] < lo) lo = r[i]; if (r[i] > hi) hi = r[i]}
  printf "RSS over the soak (after the first sample): min %d KiB, max %d KiB, last %d KiB\n", lo, hi, r[n]}' "$OUT/soak.txt"
stop_obs

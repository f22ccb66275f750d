#!/usr/bin/env bash
# Benchmarks of the TCP view (figures go to docs/PERFORMANCE.md):
#  - ns per invocation of each kernel program (kernel BPF run-time statistics);
#  - transactions/s of a full-speed loopback TCP request/response flow without
#    and with the observer attached (alternating runs, statistics off), both
#    unpinned and with client and server pinned to one CPU;
#  - the same per-invocation cost for building blocks (a do-nothing floor, a
#    cookie read, an LRU hash lookup, a socket-storage lookup, an array lookup);
#  - observer CPU (user+sys) and RSS while it runs, and RSS with 10,000 flows.
# Everything runs in a namespace of its own. Usage: sudo [BENCH_BIN=PATH] scripts/bench-tcp.sh [SECONDS]
# (or sudo scripts/bench.sh [tcp] [SECONDS])
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
"$ROOT/scripts/setup.sh" >/dev/null
SECS=${1:-5}
cargo build --release -q --examples --bins
# BENCH_BIN: measure another rttscope binary (e.g. an older build) the same way.
BIN="${BENCH_BIN:-$ROOT/target/release/rttscope}"
LOAD="$ROOT/target/release/examples/load_gen"
NS="rtsbench$$"
OUT=$(mktemp -d)
old_stats=$(sysctl -n kernel.bpf_stats_enabled)
FLOOR_CG="/sys/fs/cgroup/unified/rtsbench$$"
FLOOR_PIN="/sys/fs/bpf/rtsfloor$$"
cleanup() {
  [ -n "${OBS:-}" ] && kill "$OBS" 2>/dev/null || true
  [ -n "${FSRV:-}" ] && kill "$FSRV" 2>/dev/null || true
  if [ -e "$FLOOR_PIN" ]; then
    bpftool cgroup detach "$FLOOR_CG" sock_ops pinned "$FLOOR_PIN" 2>/dev/null || true
    rm -f "$FLOOR_PIN"
  fi
  if [ -d "$FLOOR_CG" ]; then
    echo 1 > "$FLOOR_CG/cgroup.kill" 2>/dev/null || true   # every process of the cgroup (kernel >= 5.14)
    # Exiting threads keep the cgroup populated for a moment after cgroup.procs
    # is empty: retry the rmdir itself.
    for _ in $(seq 100); do
      rmdir "$FLOOR_CG" 2>/dev/null && break
      procs=$(cat "$FLOOR_CG/cgroup.procs" 2>/dev/null)
      [ -n "$procs" ] && { kill -9 $procs 2>/dev/null || true; }
      sleep 0.1
    done
    [ -d "$FLOOR_CG" ] && echo "bench-tcp: could not remove $FLOOR_CG" >&2
  fi
  [ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  sysctl -q -w kernel.bpf_stats_enabled="$old_stats"
  rm -rf "$OUT"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ulimit -n "$(ulimit -Hn)"  # 10,000 connections need 10,000 fds per process
# The load runs in a cgroup of its own, and the observer attaches there
# (--cgroup): its programs then see exactly the benchmark's sockets, as the
# floor program does, whatever else runs on the machine.
mkdir "$FLOOR_CG"
in_cg() { sh -c 'echo $$ > "$0/cgroup.procs"; shift; exec "$@"' "$FLOOR_CG" x "$@"; }
in_cg ip netns exec "$NS" "$LOAD" server 127.0.0.1:7001 & SRV=$!
sleep 0.3
# Run-time statistics cost two clock reads per program run: they are on only
# for the runs that measure ns per invocation, off for the TPS comparisons
# (a user of rttscope does not run with them).
stats() { sysctl -q -w kernel.bpf_stats_enabled="$1"; }
stats 0

tps() { in_cg ip netns exec "$NS" "$LOAD" rr 127.0.0.1:7001 "$SECS" 1 0 | sed 's/.*"tps":\([0-9.]*\).*/\1/'; }
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_kb() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/VmHWM/{print $2}' "/proc/$1/status"; }
start_obs() {
  : >"$OUT/obs.jsonl"
  "$BIN" observe --cgroup "$FLOOR_CG" --netns "$NS" --format json --interval 1s --max-flows 32768 >"$OUT/obs.jsonl" 2>"$OUT/obs.err" & OBS=$!
  for _ in $(seq 50); do [ -s "$OUT/obs.jsonl" ] && break; sleep 0.1; done
  kill -0 "$OBS" 2>/dev/null || { echo "observer failed to start: $(cat "$OUT/obs.err")" >&2; exit 1; }
}
stop_obs() { kill -INT "$OBS"; wait "$OBS" || true; OBS=; }
ns_run() { awk -v c=$((c1-c0)) -v t=$((t1-t0)) 'BEGIN{ if (c>0) printf "%.1f", t/c; else print "nan" }'; } # between two prog_stat reads
prog_stat() { # id -> "run_cnt run_time_ns" (bpftool omits both while zero)
  local j c t
  j=$(bpftool -j prog show id "$1")
  c=$(grep -o '"run_cnt":[0-9]*' <<<"$j" | cut -d: -f2 || true); t=$(grep -o '"run_time_ns":[0-9]*' <<<"$j" | cut -d: -f2 || true)
  echo "${c:-0} ${t:-0}"
}

echo "== TCP view: loopback TCP_RR, ${SECS}s per run, 3 runs each, alternating"
base=(); with=(); ns_per=(); cpu=(); rss=()
for i in 1 2 3; do
  base+=("$(tps)")
  start_obs
  ids=$(head -1 "$OUT/obs.jsonl" | sed 's/.*"prog_ids":\[\([0-9,]*\)\].*/\1/')
  sockops_id=${ids%%,*}
  u0=$(cpu_ticks "$OBS")
  with+=("$(tps)")
  u1=$(cpu_ticks "$OBS")
  stats 1
  read -r c0 t0 < <(prog_stat "$sockops_id")
  tps >/dev/null
  read -r c1 t1 < <(prog_stat "$sockops_id")
  stats 0
  rss+=("$(rss_kb "$OBS")")
  stop_obs
  ns_per+=("$(ns_run)")
  cpu+=("$(awk -v d=$((u1-u0)) -v s="$SECS" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", 100*d/hz/s}')")
  echo "run $i: tps without ${base[-1]}, with ${with[-1]}; sock_ops $((c1-c0)) runs, ${ns_per[-1]} ns/run; observer CPU ${cpu[-1]}%, RSS ${rss[-1]} KiB"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
b=$(med "${base[@]}"); w=$(med "${with[@]}")
echo "median tps without observer: $b; with: $w; change: $(awk -v b="$b" -v w="$w" 'BEGIN{printf "%+.2f%%", 100*(w-b)/b}')"
echo "median sock_ops ns/invocation: $(med "${ns_per[@]}")  (target <= 150)"
echo "median observer CPU: $(med "${cpu[@]}")% of one core; RSS $(med "${rss[@]}") KiB"

echo "== building blocks (scripts/bench/sockops_blocks.bpf.c): floor and one operation per RTT callback"
stats 1
# Same measurement, same flow, same cgroup (each program attached there, not
# at the root, one at a time; removed by the trap on any exit).
in_cg ip netns exec "$NS" "$LOAD" server 127.0.0.1:7002 & FSRV=$!
sleep 0.3
declare -A block_ns
for round in 1 2; do
  for block in 0 1 2 3 4; do
    clang-19 -target bpf -O2 -g -DBLOCK=$block -I"/usr/include/$(gcc -dumpmachine)" -c "$ROOT/scripts/bench/sockops_blocks.bpf.c" -o "$OUT/block$block.o"
    bpftool prog load "$OUT/block$block.o" "$FLOOR_PIN" type sockops
    bpftool cgroup attach "$FLOOR_CG" sock_ops pinned "$FLOOR_PIN" multi
    bid=$(bpftool -j prog show pinned "$FLOOR_PIN" | grep -o '"id":[0-9]*' | head -1 | cut -d: -f2)
    read -r c0 t0 < <(prog_stat "$bid")
    in_cg ip netns exec "$NS" "$LOAD" rr 127.0.0.1:7002 "$SECS" 1 0 >/dev/null
    read -r c1 t1 < <(prog_stat "$bid")
    bpftool cgroup detach "$FLOOR_CG" sock_ops pinned "$FLOOR_PIN"; rm -f "$FLOOR_PIN"
    block_ns[$block]="${block_ns[$block]:-} $(ns_run)"
  done
done
kill "$FSRV" 2>/dev/null || true; FSRV=
names=("floor: nothing per callback (the cost of being called + the statistics themselves)"
       "bpf_get_socket_cookie + array lookup" "bpf_get_socket_cookie + LRU hash lookup (8-byte key)"
       "socket-local storage lookup" "array lookup (inlined)")
for block in 0 1 2 3 4; do
  echo "block $block, ${names[$block]}: ns/run ${block_ns[$block]} (2 rounds)"
done

echo "== the same with client and server pinned to one CPU (no idle wake-up between the two ends)"
# An idle VM lets each CPU sleep between the two ends of a ping-pong, and each
# program run then pays cold caches; pinned, the CPU stays busy. Both regimes
# are real (a busy host resembles the pinned one); both are reported.
stats 0
in_cg taskset -c 0 ip netns exec "$NS" "$LOAD" server 127.0.0.1:7003 & FSRV=$!
sleep 0.3
pinned_rr() { in_cg taskset -c 0 ip netns exec "$NS" "$LOAD" rr 127.0.0.1:7003 "$SECS" 1 0 | sed 's/.*"tps":\([0-9.]*\).*/\1/'; }
pb=(); pw=(); pns=()
for i in 1 2 3; do
  pb+=("$(pinned_rr)")
  start_obs
  ids=$(head -1 "$OUT/obs.jsonl" | sed 's/.*"prog_ids":\[\([0-9,]*\)\].*/\1/')
  pw+=("$(pinned_rr)")
  stats 1
  read -r c0 t0 < <(prog_stat "${ids%%,*}")
  pinned_rr >/dev/null
  read -r c1 t1 < <(prog_stat "${ids%%,*}")
  stats 0
  stop_obs
  pns+=("$(ns_run)")
  echo "pinned run $i: tps without ${pb[-1]}, with ${pw[-1]}; sock_ops $((c1-c0)) runs, ${pns[-1]} ns/run"
done
b=$(med "${pb[@]}"); w=$(med "${pw[@]}")
echo "pinned median tps without: $b; with: $w; change: $(awk -v b="$b" -v w="$w" 'BEGIN{printf "%+.2f%%", 100*(w-b)/b}'); median sock_ops ns/invocation: $(med "${pns[@]}")"
clang-19 -target bpf -O2 -g -DBLOCK=0 -I"/usr/include/$(gcc -dumpmachine)" -c "$ROOT/scripts/bench/sockops_blocks.bpf.c" -o "$OUT/block0.o"
bpftool prog load "$OUT/block0.o" "$FLOOR_PIN" type sockops
bpftool cgroup attach "$FLOOR_CG" sock_ops pinned "$FLOOR_PIN" multi
bid=$(bpftool -j prog show pinned "$FLOOR_PIN" | grep -o '"id":[0-9]*' | head -1 | cut -d: -f2)
# What merely having a sock_ops program with RTT_CB on costs, statistics off:
# the share of the TPS change above that no program can avoid.
pf=(); for i in 1 2 3; do pf+=("$(pinned_rr)"); done
stats 1
read -r c0 t0 < <(prog_stat "$bid")
pinned_rr >/dev/null
read -r c1 t1 < <(prog_stat "$bid")
stats 0
bpftool cgroup detach "$FLOOR_CG" sock_ops pinned "$FLOOR_PIN"; rm -f "$FLOOR_PIN"
kill "$FSRV" 2>/dev/null || true; FSRV=
f=$(med "${pf[@]}")
echo "pinned floor: $((c1-c0)) runs, $(ns_run) ns/run; tps with the floor program ${pf[*]} (median $f, $(awk -v b="$b" -v w="$f" 'BEGIN{printf "%+.2f%%", 100*(w-b)/b}') against no program)"

echo "== TCP view: 10,000 flows"
start_obs
in_cg ip netns exec "$NS" "$LOAD" hold 127.0.0.1:7001 10000 8 >/dev/null & CLI=$!
for _ in $(seq 60); do
  n=$(ip netns exec "$NS" ss -Htn state established | wc -l)
  [ "$n" -ge 20000 ] && break; sleep 0.5
done
sleep 2.5
echo "observer RSS with 20,000 tracked sockets (10,000 connections, both ends): $(rss_kb "$OBS") KiB (peak $(hwm_kb "$OBS") KiB; target < 32 MiB)"
tracked=$(tail -1 "$OUT/obs.jsonl" | sed 's/.*"flows_tracked":\([0-9]*\).*/\1/')
echo "flows tracked in the last interval: $tracked (established sockets: $n)"
stop_obs
wait "$CLI" || true

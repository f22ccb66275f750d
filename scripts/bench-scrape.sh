#!/usr/bin/env bash
# Scrape storm (issue 26.10; figures go to docs/PERFORMANCE.md): an observer
# with FLOWS connections held open between two namespaces of its own
# (load_gen hold: one request/response each, then idle), then SCRAPERS
# concurrent scrapers for SECONDS (bench_scrape, loopback only). Prints the
# scrapes answered/failed, latency p50/p99/max and the observer's RSS before
# and after, the observer's idle CPU over 10 s with the flows held, and the
# loss identity of both views (samples_total = sum of _count + counted
# losses; docs/metrics.md) after RR traffic on 500 more connections while
# the held flows stay tracked. Nothing is left behind.
# RTTSCOPE_BIN=PATH runs another build (e.g. the previous one) as the observer; BENCH_INTERVAL
# its --interval (1s; the shipped DaemonSet and unit use 10s); BENCH_IDLE_SECS the idle window (10).
# Usage: sudo [BENCH_PERF=FILE] [BENCH_IDLE_ONLY=1] [RTTSCOPE_BIN=PATH] scripts/bench-scrape.sh [FLOWS [SCRAPERS [SECONDS]]]
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
FLOWS=${1:-20000}
SCRAPERS=${2:-2000}
SECS=${3:-60}
cargo build --release -q --bins --example load_gen
cargo build --release -q -p rttscope-e2e --example bench_scrape
BIN="${RTTSCOPE_BIN:-$ROOT/target/release/rttscope}"
LOAD="$ROOT/target/release/examples/load_gen"
STORM="$ROOT/target/release/examples/bench_scrape"
A="rtssca$$"; B="rtsscb$$"
PORT=$((20000 + $$ % 20000))
OUT=$(mktemp -d)
MAPS0=$(sysctl -n vm.max_map_count)
PIDS0=$(sysctl -n kernel.pid_max)
cleanup() {
  sysctl -q -w vm.max_map_count="$MAPS0" || true
  sysctl -q -w kernel.pid_max="$PIDS0" || true
  for p in ${HOLDS[@]+"${HOLDS[@]}"}; do kill "$p" 2>/dev/null || true; done
  [ -n "${OBS:-}" ] && kill "$OBS" 2>/dev/null && wait "$OBS" 2>/dev/null || true
  for p in ${SRVS[@]+"${SRVS[@]}"}; do kill "$p" 2>/dev/null || true; done
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
# One descriptor per connection on each side, and a thread per connection in the server: the
# hard descriptor limit (20,000 on our machines, and root here cannot raise it) and
# kernel.pid_max (32,768, threads included) stopped earlier runs near 20,000 connections (the
# server's accept failing with EMFILE). So the connections are spread over GROUPS pairs of
# server and holder processes of at most 15,000 each, and pid_max is raised (restored after).
ulimit -n "$(ulimit -Hn)"
GROUPS_N=$(( (FLOWS + 14999) / 15000 ))
PER=$(( (FLOWS + GROUPS_N - 1) / GROUPS_N ))
if [ "$PIDS0" -lt $((FLOWS + SCRAPERS + 20000)) ]; then sysctl -q -w kernel.pid_max=$((FLOWS + SCRAPERS + 20000)); fi
# the server's thread per connection takes two mappings (stack, guard page):
# 65,530 by default would stop it near 32,000 connections
sysctl -q -w vm.max_map_count=$((FLOWS * 4 + 65530))
ip netns add "$A"; ip netns add "$B"
ip link add "va$$" netns "$A" type veth peer name "vb$$" netns "$B"
ip -n "$A" addr add 10.79.0.1/24 dev "va$$"; ip -n "$B" addr add 10.79.0.2/24 dev "vb$$"
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set "va$$" up; ip -n "$B" link set "vb$$" up
ip netns exec "$A" sysctl -q -w net.ipv4.ip_local_port_range="1024 65535"
SRVS=(); HOLDS=()
for g in $(seq "$GROUPS_N"); do ip netns exec "$B" "$LOAD" server "10.79.0.2:$((7000 + g))" & SRVS+=("$!"); done
sleep 0.3
"$BIN" observe --listen "127.0.0.1:$PORT" --netns "$A" --netns "$B" --quiet \
  --iface "$A:va$$" --interval "${BENCH_INTERVAL:-1s}" --max-flows 131072 >"$OUT/obs.out" 2>"$OUT/obs.err" & OBS=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/metrics" && break; sleep 0.1; done
for g in $(seq "$GROUPS_N"); do
  ip netns exec "$A" "$LOAD" hold "10.79.0.2:$((7000 + g))" "$PER" $((2 * SECS + 120)) >"$OUT/hold$g.out" 2>&1 &
  HOLDS+=("$!")
done
# Wait until every connection is open (one thread each on the server: minutes for 50,000), then
# until the observer tracks the flows (both ends: 2 per connection).
for g in $(seq "$GROUPS_N"); do
  for _ in $(seq 1800); do
    grep -q connections "$OUT/hold$g.out" 2>/dev/null && break
    kill -0 "${HOLDS[g-1]}" 2>/dev/null || { echo "load_gen hold $g stopped:"; cat "$OUT/hold$g.out"; exit 1; }
    sleep 1
  done
done
echo "connections open: $(cat "$OUT"/hold*.out | tr '\n' ' ') ($GROUPS_N x $PER) after ${SECONDS} s"
for _ in $(seq 120); do
  n=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^rttscope_flows_tracked\{view="tcp"\}/{print $2}')
  [ "${n:-0}" -ge $((FLOWS * 2 * 9 / 10)) ] && break
  sleep 1
done
echo "flows tracked: ${n:-0}"
t0=$(date +%s%N)
curl -s -o "$OUT/one" "http://127.0.0.1:$PORT/metrics"
IDLE=${BENCH_IDLE_SECS:-10}
read -r _ _ _ _ _ _ _ _ _ _ _ u0 s0 _ < <(cut -d')' -f2- "/proc/$OBS/stat")
sleep "$IDLE"
read -r _ _ _ _ _ _ _ _ _ _ _ u1 s1 _ < <(cut -d')' -f2- "/proc/$OBS/stat")
echo "idle CPU with the flows held: $(( (u1 + s1 - u0 - s0) * 1000 / $(getconf CLK_TCK) / IDLE ))/10 % of a core over $IDLE s (--interval ${BENCH_INTERVAL:-1s})"
grep -E '^(Vm(RSS|HWM)|Rss(Anon|File|Shmem))' "/proc/$OBS/status" | tr '\n' ' '; echo
# BENCH_PERF=FILE: a 10 s call-graph profile of the idle observer (perf record), for where the
# idle CPU goes; BENCH_IDLE_ONLY=1 stops after the idle figures (no storms, no identity run).
if [ -n "${BENCH_PERF:-}" ]; then
  perf record -q -g -o "$BENCH_PERF" -p "$OBS" -- sleep 10 >/dev/null 2>&1
  echo "profile of the idle observer: $BENCH_PERF (perf report -i $BENCH_PERF --no-children)"
fi
if [ -n "${BENCH_IDLE_ONLY:-}" ]; then exit 0; fi
t0=$(date +%s%N)
curl -s -o "$OUT/one" "http://127.0.0.1:$PORT/metrics"
echo "one scrape alone: $(( ($(date +%s%N) - t0) / 1000000 )) ms, $(wc -c <"$OUT/one") bytes"
# Back to back (a closed loop: saturation), then each scraper once a second (2,000 Prometheus
# servers at a 1 s scrape interval: the load the service time answers for).
echo "storm, back to back:"
"$STORM" "$PORT" "$SCRAPERS" "$SECS" "$OBS"
echo "storm, each scraper every 1 s:"
"$STORM" "$PORT" "$SCRAPERS" "$SECS" "$OBS" 1000
# The identity at this size, with traffic: 500 more connections, 20 s of RR.
ip netns exec "$A" "$LOAD" rr 10.79.0.2:7001 20 500 0 >"$OUT/rr.out" 2>&1
sleep 3
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/after"
grep -E '^rttscope_flows_tracked' "$OUT/after"
for v in tcp sampler; do
  awk -v v="$v" '
    $0 ~ "^rttscope_samples_total\\{view=\""v"\"\\}" {taken=$2}
    $0 ~ "^rttscope_rtt_seconds_count\\{.*view=\""v"\"" {counted+=$2}
    $0 ~ "^rttscope_drops_total\\{.*view=\""v"\".*reason=\"samples_(evicted|not_binned)\"" {lost+=$2}
    END {printf "%s: samples_total %d = sum of _count %d + counted losses %d: %s\n", v, taken, counted, lost, (taken==counted+lost) ? "holds" : "DOES NOT HOLD"}
  ' "$OUT/after"
done
grep -E '^(Vm(RSS|HWM)|Rss(Anon|File|Shmem))' "/proc/$OBS/status" | tr '\n' ' '; echo

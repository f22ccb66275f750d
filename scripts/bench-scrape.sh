#!/usr/bin/env bash
# Scrape storm (issue 26.10; figures go to docs/PERFORMANCE.md): an observer
# with FLOWS connections held open between two namespaces of its own
# (load_gen hold: one request/response each, then idle), then SCRAPERS
# concurrent scrapers for SECONDS (bench_scrape, loopback only). Prints the
# scrapes answered/failed, latency p50/p99/max and the observer's RSS before
# and after. Nothing is left behind.
# Usage: sudo scripts/bench-scrape.sh [FLOWS [SCRAPERS [SECONDS]]]
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
FLOWS=${1:-20000}
SCRAPERS=${2:-2000}
SECS=${3:-60}
cargo build --release -q --bins --example load_gen
cargo build --release -q -p rttscope-e2e --example bench_scrape
BIN="$ROOT/target/release/rttscope"
LOAD="$ROOT/target/release/examples/load_gen"
STORM="$ROOT/target/release/examples/bench_scrape"
A="rtssca$$"; B="rtsscb$$"
PORT=$((20000 + $$ % 20000))
OUT=$(mktemp -d)
cleanup() {
  [ -n "${HOLD:-}" ] && kill "$HOLD" 2>/dev/null || true
  [ -n "${OBS:-}" ] && kill "$OBS" 2>/dev/null && wait "$OBS" 2>/dev/null || true
  [ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"
ip netns add "$A"; ip netns add "$B"
ip link add "va$$" netns "$A" type veth peer name "vb$$" netns "$B"
ip -n "$A" addr add 10.79.0.1/24 dev "va$$"; ip -n "$B" addr add 10.79.0.2/24 dev "vb$$"
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set "va$$" up; ip -n "$B" link set "vb$$" up
ip netns exec "$A" sysctl -q -w net.ipv4.ip_local_port_range="1024 65535"
ip netns exec "$B" "$LOAD" server 10.79.0.2:7001 & SRV=$!
sleep 0.3
"$BIN" observe --listen "127.0.0.1:$PORT" --netns "$A" --netns "$B" --quiet \
  --interval 1s --max-flows 131072 >"$OUT/obs.out" 2>"$OUT/obs.err" & OBS=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/metrics" && break; sleep 0.1; done
ip netns exec "$A" "$LOAD" hold 10.79.0.2:7001 "$FLOWS" $((SECS + 60)) >"$OUT/hold.out" 2>&1 & HOLD=$!
# Wait until the observer tracks the flows (both ends: 2 per connection).
for _ in $(seq 120); do
  n=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^rttscope_flows_tracked\{view="tcp"\}/{print $2}')
  [ "${n:-0}" -ge $((FLOWS * 2 * 9 / 10)) ] && break
  sleep 1
done
echo "flows tracked: ${n:-0}"
t0=$(date +%s%N)
curl -s -o "$OUT/one" "http://127.0.0.1:$PORT/metrics"
echo "one scrape alone: $(( ($(date +%s%N) - t0) / 1000000 )) ms, $(wc -c <"$OUT/one") bytes"
"$STORM" "$PORT" "$SCRAPERS" "$SECS" "$OBS"

#!/usr/bin/env bash
# Reproduce docs/perf-lab.md: the lab's delay emulator measured with real
# traffic through a testbed of network namespaces.
#   1. delay accuracy: ping through the router with 50 ms and 1 ms configured
#      one way (client->server), 500 pings 10 ms apart; error of the added
#      delay at p50 and p99 against an unimpaired baseline;
#   2. packet-rate limit: a paced UDP flood (64-byte payloads) through 1 ms
#      of delay at increasing rates (BENCH_RATES, pps, comma-separated),
#      with ping measuring the delay meanwhile.
# The measurements are scripts/bench/lab.rs (example bench_lab of the
# rttscope-e2e crate); arguments (delay, rate) pick one of them.
# Needs root and iproute2, nftables, iptables, tc, ping. Builds in release
# mode (the emulator's speed is what is measured). Touches nothing outside
# the namespaces it creates; they are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "bench-lab.sh: needs root (it creates network namespaces)" >&2
    exit 1
fi
for tool in ip nft iptables-restore ip6tables-restore tc ping; do
    command -v "$tool" >/dev/null || { echo "bench-lab.sh: $tool is not installed" >&2; exit 1; }
done

echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# BENCH_RATES=${BENCH_RATES:-10000,25000,50000,100000,200000}"
cargo run --release -q -p rttscope-e2e --example bench_lab -- "$@" 2>&1 |
    sed -n 's/.*BENCH //p'

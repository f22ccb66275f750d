#!/usr/bin/env bash
# Benchmark of the sampler view (needs root): ns per packet of each tc program
# (BPF run-time statistics, enabled through BPF_ENABLE_STATS for the run only)
# and the transactions-per-second drop of a full-speed TCP request/response
# flow between two namespaces with the sampler on both veth ends at
# --sample-every 1. Rounds alternate sampler off/on; medians are compared.
#
#   scripts/bench-sampler.sh                 # 5 rounds x 3 s, --match seq
#   BENCH_MATCH=tsval BENCH_ROUNDS=7 BENCH_SECS=5 scripts/bench-sampler.sh
#   RELEASE=1 scripts/bench-sampler.sh       # release build (rttscope and the RR client)
#   BENCH_PIN=1 scripts/bench-sampler.sh     # everything on CPU 0 (the busy regime:
#                                            # no idle wake-ups between the two ends)
#
# The benchmark is scripts/bench/sampler.rs (example bench_sampler of the
# rttscope-e2e crate); it runs `rttscope observe --view sampler` from the
# same target directory (RTTSCOPE_BIN overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
if [[ "${RELEASE:-0}" == 1 ]]; then profile=(--release); fi
cargo build -q -p rttscope "${profile[@]}"
pin=()
if [[ "${BENCH_PIN:-0}" == 1 ]]; then pin=(taskset -c 0); fi
exec "${pin[@]}" cargo run -q -p rttscope-e2e "${profile[@]}" --example bench_sampler

#!/usr/bin/env bash
# Benchmark of the sampler view (needs root): ns per run of each tc program
# (BPF run-time statistics, enabled through BPF_ENABLE_STATS for the run only)
# on a full-speed TCP request/response flow and then an ICMP echo flood
# between two namespaces, with the sampler on both veth ends at
# --sample-every 1, and transactions per second. Each round runs every
# variant in turn (rotating the order): no program, a do-nothing program
# (the floor), the sampler of BENCH_BEFORE_BIN (an older rttscope, if given)
# and this one; medians over the rounds are compared.
#
#   scripts/bench-sampler.sh                 # 5 rounds x 3 s, --match seq
#   BENCH_BEFORE_BIN=/path/to/old/rttscope scripts/bench-sampler.sh   # before/after in one run
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

#!/usr/bin/env bash
# Benchmark of the sampler view (needs root): ns per run of each tc program
# (BPF run-time statistics, enabled through BPF_ENABLE_STATS for the run only)
# on a full-speed TCP request/response flow and then an ICMP echo flood
# between two namespaces, with the sampler on both veth ends at
# --sample-every 1, and transactions per second. Each round runs every
# variant in turn (rotating the order): no program, a do-nothing program
# (the floor), the sampler of BENCH_BEFORE_BIN (an older rttscope, if given),
# this one and ePPing (the reference, if its source is given: built by
# scripts/build-epping.sh into target/epping); medians over the rounds are
# compared, and this sampler's cost above the floor is printed as a
# fraction of ePPing's, per direction (docs/perf-sampler.md).
#
#   scripts/bench-sampler.sh                 # 5 rounds x 3 s, --match seq
#   BENCH_BEFORE_BIN=/path/to/old/rttscope scripts/bench-sampler.sh   # before/after in one run
#   BENCH_EPPING_SRC=/path/to/bpf-examples scripts/bench-sampler.sh   # + ePPing, same run
#   BENCH_EPPING_ARGS='-r 0 -T -C -I tc -a 1;-r 0 -T -C -I tc'   # pping's option sets,
#                                          # one variant each (these are the default)
#   BENCH_EPPING_BIN=/path/to/built/pping  # an ePPing already built (no rebuild)
#   BENCH_MATCH=tsval BENCH_ROUNDS=7 BENCH_SECS=5 scripts/bench-sampler.sh
#   RELEASE=1 scripts/bench-sampler.sh       # release build (rttscope and the RR client)
#   BENCH_PIN=1 scripts/bench-sampler.sh     # everything on CPU 0 (the busy regime:
#                                            # no idle wake-ups between the two ends)
#
# The benchmark is scripts/bench/sampler.rs (example bench_sampler of the
# rttscope-e2e crate); it runs `rttscope observe --view sampler` from the
# same target directory (RTTSCOPE_BIN overrides).
set -euo pipefail
# paths given relative to where the script is started from
if [[ -n "${BENCH_EPPING_SRC:-}" ]]; then BENCH_EPPING_SRC=$(realpath -m "$BENCH_EPPING_SRC"); fi
if [[ -n "${BENCH_EPPING_BIN:-}" ]]; then export BENCH_EPPING_BIN=$(realpath -m "$BENCH_EPPING_BIN"); fi
cd "$(dirname "$0")/.."
profile=()
if [[ "${RELEASE:-0}" == 1 ]]; then profile=(--release); fi
cargo build -q -p rttscope "${profile[@]}"
if [[ -n "${BENCH_EPPING_SRC:-}" && -z "${BENCH_EPPING_BIN:-}" ]]; then
  BENCH_EPPING_BIN=$(scripts/build-epping.sh "$BENCH_EPPING_SRC")
  export BENCH_EPPING_BIN
fi
pin=()
if [[ "${BENCH_PIN:-0}" == 1 ]]; then pin=(taskset -c 0); fi
exec "${pin[@]}" cargo run -q -p rttscope-e2e "${profile[@]}" --example bench_sampler

#!/usr/bin/env bash
# The benchmarks, one script each (figures: docs/PERFORMANCE.md and the
# docs/perf-*.md it links). This script picks which:
#   tcp      scripts/bench-tcp.sh [SECONDS]          the TCP view (the default)
#   sampler  scripts/bench-sampler.sh                the sampler view (env: BENCH_*, RELEASE)
#   active   scripts/bench-active.sh                 the active probes (env: SECS, RUNS)
#   lab      scripts/bench-lab.sh [ARGS]             the lab's link emulator
#   metrics  scripts/bench-metrics.sh [SECONDS [SOAK_SECONDS [RATE]]]  daemon mode
#   all      each of the above in turn, with its defaults
# Usage: sudo scripts/bench.sh [tcp|sampler|active|lab|metrics|all] [args...]
# A first argument that is a number is the TCP benchmark's SECONDS:
# `scripts/bench.sh 5` runs `scripts/bench-tcp.sh 5`.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)"
usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; }
what=tcp
if [[ $# -gt 0 && ! "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  what=$1
  shift
fi
case "$what" in
  tcp | sampler | active | lab | metrics)
    exec "$dir/bench-$what.sh" "$@"
    ;;
  all)
    if [[ $# -gt 0 ]]; then
      echo "bench.sh: 'all' takes no arguments (each benchmark runs with its defaults)" >&2
      exit 2
    fi
    failed=()
    for b in tcp sampler active lab metrics; do
      echo "=== scripts/bench-$b.sh"
      "$dir/bench-$b.sh" || failed+=("bench-$b.sh")
    done
    if [[ ${#failed[@]} -gt 0 ]]; then
      echo "bench.sh: failed: ${failed[*]}" >&2
      exit 1
    fi
    ;;
  -h | --help | help)
    usage
    ;;
  *)
    echo "bench.sh: unknown benchmark '$what'" >&2
    usage >&2
    exit 2
    ;;
esac

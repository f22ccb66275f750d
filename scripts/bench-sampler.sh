#!/usr/bin/env bash
# Benchmark of the sampler view against ePPing (needs root;
# docs/perf-sampler.md). ns per run of each tc program (BPF run-time
# statistics, enabled through BPF_ENABLE_STATS for the run only) on a
# full-speed TCP request/response flow and then an ICMP echo flood between
# two namespaces. In each round and for each ePPing option set, one tc chain
# on both veth ends holds, at once: a do-nothing program (the floor), the
# sampler of the previous rttscope (built from BENCH_BEFORE_REV), this one
# (`observe --view sampler --sample-every 1`) and ePPing; the order of the
# chain is reversed every other round (the first program to read a packet
# pays for its cold lines). Prints, per round and protocol, floor ns,
# rttscope and ePPing egress / ingress ns and the above-floor ratio
# (ours - floor) / (ePPing - floor), then the medians and their spread.
#
#   scripts/bench-sampler.sh                      # 9 rounds x (3 s TCP RR + 1.5 s ICMP flood)
#   BENCH_ROUNDS=3 scripts/bench-sampler.sh       # fewer rounds
#   BENCH_EPPING_SRC=/path/to/bpf-examples scripts/bench-sampler.sh   # build ePPing first
#   BENCH_EPPING_BIN=/path/to/built/pping scripts/bench-sampler.sh    # an ePPing already built
#   BENCH_EPPING_ARGS='-r 100;-r 0;-r 100 -a 1'   # option sets, one chain each (the default;
#                                                 # `-c 0 -T -C -I tc` is added to each)
#   BENCH_BEFORE_REV=76df465 scripts/bench-sampler.sh   # the previous binary: default the
#                                                 # merge-base with main; `none`: no previous binary
#   BENCH_BEFORE_BIN=/path/to/old/rttscope        # a previous binary already built
#   BENCH_BEFORE_CFLAGS=-DRTTSCOPE_BENCH_UNAVOIDABLE scripts/bench-sampler.sh
#                                                 # in the previous binary's place: this tree
#                                                 # built with those clang flags for its BPF
#                                                 # objects (target/bench-variant); the one above:
#                                                 # only the unavoidable work (the floor of what
#                                                 # is possible, docs/perf-sampler.md)
#   BENCH_MATCH=tsval BENCH_SECS=5 scripts/bench-sampler.sh
#   BENCH_QUIET_WAIT=300 scripts/bench-sampler.sh # wait up to 300 s for load average < 0.5
#   RELEASE=1 scripts/bench-sampler.sh            # release builds
#   BENCH_PIN=1 scripts/bench-sampler.sh          # everything on CPU 0 (the busy regime)
#   BENCH_FEATURES= scripts/bench-sampler.sh      # cargo features of this tree's build (default
#                                                 # rttscope/aya, as scripts/test.sh builds)
#
# ePPing: without BENCH_EPPING_BIN, target/epping/src/pping/pping if built,
# else built by scripts/build-epping.sh from BENCH_EPPING_SRC; without
# either it is left out (one line says so). The previous binary is built
# from `git archive` of its revision in target/bench-prev/<rev>/src, with
# its own target directory (target/bench-prev/target), once per revision.
# Everything printed is also written to target/bench-sampler/<UTC time>.txt,
# after the settings (kernel, CPU, commits, rounds, load average).
# The benchmark is scripts/bench/sampler.rs (example bench_sampler of the
# rttscope-e2e crate).
set -euo pipefail
if [[ -n "${BENCH_EPPING_SRC:-}" ]]; then BENCH_EPPING_SRC=$(realpath -m "$BENCH_EPPING_SRC"); fi
if [[ -n "${BENCH_EPPING_BIN:-}" ]]; then export BENCH_EPPING_BIN=$(realpath -m "$BENCH_EPPING_BIN"); fi
if [[ -n "${BENCH_BEFORE_BIN:-}" ]]; then export BENCH_BEFORE_BIN=$(realpath -m "$BENCH_BEFORE_BIN"); fi
cd "$(dirname "$0")/.."
. scripts/common.sh
require_root
release=() dir=debug
if [[ "${RELEASE:-0}" == 1 ]]; then release=(--release) dir=release; fi
profile=("${release[@]}")
# BENCH_FEATURES: cargo features of this tree's build; default rttscope/aya, the
# features scripts/test.sh builds with, so that the benchmark leaves target/debug/rttscope as
# the suite expects it (a binary without aya has no --loader); empty: the default features
BENCH_FEATURES=${BENCH_FEATURES-rttscope/aya}
if [[ -n "${BENCH_FEATURES:-}" ]]; then profile+=(--features "$BENCH_FEATURES"); fi

# The previous rttscope, built from a revision in a target directory of its
# own (its build never touches this tree's binary); prints its path.
build_before() {
  local rev=$1 root=$ROOT/target/bench-prev
  local short out
  short=$(git rev-parse --short=9 "$rev^{commit}") ||
    { echo "bench-sampler: BENCH_BEFORE_REV=$rev is not a commit" >&2; exit 2; }
  out=$root/bin-$dir-$short/rttscope
  if [[ ! -x $out ]]; then
    echo "bench-sampler: building the previous rttscope at $short (target/bench-prev; once)" >&2
    rm -rf "$root/$short" && mkdir -p "$root/$short/src" "$(dirname "$out")"
    git archive "$short" | tar -x -C "$root/$short/src"
    # GIT_CEILING_DIRECTORIES: its build.rs must not take this tree's HEAD for its version
    (cd "$root/$short/src" && GIT_CEILING_DIRECTORIES=$root CARGO_TARGET_DIR=$root/target \
      nice -n 10 cargo build -q -p rttscope "${release[@]}" >&2)
    cp "$root/target/$dir/rttscope" "$out"
  fi
  echo "$out"
}

# This tree built with more clang flags for its BPF objects (RTTSCOPE_BPF_CFLAGS,
# userspace/build.rs), in target/bench-variant: its registry crates are hard
# links to this tree's (cargo writes a rebuilt crate under a new name; only
# rttscope's own files are built there); prints the binary's path.
build_variant() {
  local cflags=$1 root=$ROOT/target/bench-variant
  if [[ ! -d $root/$dir/deps ]]; then
    mkdir -p "$root/$dir/deps" "$root/$dir/build" "$root/$dir/.fingerprint"
    find "target/$dir/deps" -maxdepth 1 -type f ! -name '*rttscope*' -exec ln -f -t "$root/$dir/deps" {} +
    for d in build .fingerprint; do
      find "target/$dir/$d" -mindepth 1 -maxdepth 1 ! -name 'rttscope*' -exec cp -al -t "$root/$dir/$d" {} +
    done
  fi
  echo "bench-sampler: building this tree with RTTSCOPE_BPF_CFLAGS='$cflags' (target/bench-variant)" >&2
  RTTSCOPE_BPF_CFLAGS=$cflags CARGO_TARGET_DIR=$root nice -n 10 cargo build -q -p rttscope "${profile[@]}" >&2
  echo "$root/$dir/rttscope"
}

# one cargo command for both: the features rttscope-e2e asks of rttscope
# (lab) unify, as in a workspace build
nice -n 10 cargo build -q -p rttscope -p rttscope-e2e --bin rttscope --example bench_sampler "${profile[@]}"
if [[ -n "${BENCH_BEFORE_CFLAGS:-}" ]]; then
  BENCH_BEFORE_BIN=$(build_variant "$BENCH_BEFORE_CFLAGS")
  export BENCH_BEFORE_BIN BENCH_BEFORE_REV="this tree with $BENCH_BEFORE_CFLAGS"
elif [[ -z "${BENCH_BEFORE_BIN:-}" ]]; then
  before_rev=${BENCH_BEFORE_REV:-$(git merge-base HEAD main 2>/dev/null || echo none)}
  if [[ $before_rev != none ]]; then
    BENCH_BEFORE_BIN=$(build_before "$before_rev")
    export BENCH_BEFORE_BIN BENCH_BEFORE_REV=$(git rev-parse --short=9 "$before_rev")
  fi
fi
if [[ -z "${BENCH_EPPING_BIN:-}" ]]; then
  if [[ -n "${BENCH_EPPING_SRC:-}" ]]; then
    BENCH_EPPING_BIN=$(scripts/build-epping.sh "$BENCH_EPPING_SRC")
  elif [[ -x target/epping/src/pping/pping ]]; then
    BENCH_EPPING_BIN=$PWD/target/epping/src/pping/pping
  fi
  if [[ -n "${BENCH_EPPING_BIN:-}" ]]; then export BENCH_EPPING_BIN; fi
fi

# the machine should be quiet: wait (BENCH_QUIET_WAIT seconds at most) for
# the 1-minute load average to fall under 0.5; the run goes on either way
load1() { cut -d' ' -f1 /proc/loadavg; }
quiet() { awk -v l="$(load1)" 'BEGIN { exit !(l < 0.5) }'; }
waited=0
while ! quiet && ((waited < ${BENCH_QUIET_WAIT:-0})); do sleep 10; waited=$((waited + 10)); done

mkdir -p target/bench-sampler
log=target/bench-sampler/$(date -u +%Y%m%dT%H%M%SZ).txt
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
epping_rev="revisions unknown"
if [[ -n "${BENCH_EPPING_BIN:-}" ]]; then
  revs=$(dirname "$(dirname "$(dirname "$BENCH_EPPING_BIN")")")/revs.txt # OUT/src/pping/pping
  if [[ -f $revs ]]; then epping_rev="$(cat "$revs"), by scripts/build-epping.sh"; fi
fi
{
  echo "# scripts/bench-sampler.sh, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "kernel: $(uname -r); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "rttscope: $(git rev-parse --short=9 HEAD)$dirty, $dir build; previous: ${BENCH_BEFORE_REV:-${BENCH_BEFORE_BIN:-none}}"
  echo "ePPing: ${BENCH_EPPING_BIN:-none} ($epping_rev)"
  if quiet; then
    echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg): quiet (1-minute < 0.5)"
  else
    echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg): NOT quiet (1-minute >= 0.5): figures are noisier than on a quiet machine"
  fi
} | tee "$log"
pin=()
if [[ "${BENCH_PIN:-0}" == 1 ]]; then pin=(taskset -c 0); fi
"${pin[@]}" "target/$dir/examples/bench_sampler" | tee -a "$log"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); written to $log" | tee -a "$log"

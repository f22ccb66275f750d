#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of files, flags and packets (docs/fuzzing.md):
# each cargo-fuzz (libFuzzer) target in fuzz/ for SECONDS, then, as root, the sampler's kernel
# packet parser through BPF_PROG_TEST_RUN (tests/tests/fuzz_sampler.rs with more frames).
#
#   scripts/fuzz.sh [-t SECONDS] [--merge-seeds] [--no-kernel] [TARGET...]
#
# -t SECONDS      time per target (default 60, or FUZZ_SECONDS)
# --merge-seeds   afterwards, add to fuzz/seeds/TARGET the inputs of this run that reach new
#                 coverage (at most 4 KiB each; commit them: the unit suite replays them)
# --no-kernel     skip the BPF_PROG_TEST_RUN part (needs root)
# TARGET...       some targets only (default: all; `cargo +nightly fuzz list`)
#
# Needs the nightly toolchain and cargo-fuzz (`rustup toolchain install nightly`,
# `cargo install cargo-fuzz`). The working corpus grows in fuzz/corpus (not checked in); a
# failing input is saved in fuzz/artifacts/TARGET/ and the script exits non-zero. Figures
# (executions, coverage, corpus) are printed per target and written to target/fuzz-report.txt.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

secs=${FUZZ_SECONDS:-60}
merge=0
kernel=1
targets=()
while (($#)); do
  case "$1" in
    -t) secs="$2"; shift 2 ;;
    --merge-seeds) merge=1; shift ;;
    --no-kernel) kernel=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$secs" =~ ^[0-9]+$ && "$secs" -gt 0 ]] || { echo "fuzz.sh: -t takes whole seconds > 0, not '$secs'" >&2; exit 2; }

rustup run nightly rustc --version >/dev/null 2>&1 || { echo "fuzz.sh: no nightly toolchain: rustup toolchain install nightly" >&2; exit 1; }
cargo fuzz --version >/dev/null 2>&1 || { echo "fuzz.sh: no cargo-fuzz: cargo install cargo-fuzz" >&2; exit 1; }

# One target directory for the whole worktree (the fuzz build lands in target/<triple>/).
export CARGO_TARGET_DIR="$ROOT/target"
FUZZ=(cargo +nightly fuzz)
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd fuzz && "${FUZZ[@]}" list)
fi

echo "== build (nightly, libFuzzer, address sanitizer, debug assertions)"
(cd fuzz && "${FUZZ[@]}" build -O --debug-assertions)

report="$ROOT/target/fuzz-report.txt"
printf '%-18s %12s %9s %7s %7s %s\n' target executions exec/s cov corpus result | tee "$report"
failed=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  log="$ROOT/target/fuzz-$t.log"
  set +e
  (cd fuzz && "${FUZZ[@]}" run -O --debug-assertions "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
    -print_final_stats=1) >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -oP 'stat::number_of_executed_units:\s+\K[0-9]+' "$log" | tail -1 || true)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s+\K[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -oP '(DONE|#[0-9]+)\s+\w+\s+cov: \K[0-9]+' "$log" | tail -1 || true)
  corp=$(find "fuzz/corpus/$t" -type f | wc -l)
  res=ok
  if ((rc != 0)); then
    res="FAILED (log $log; input in fuzz/artifacts/$t/)"
    failed=1
    grep -m3 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | sed 's/^/    /' >&2 || true
  fi
  printf '%-18s %12s %9s %7s %7s %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corp" "$res" | tee -a "$report"
  if ((merge && rc == 0)); then
    (cd fuzz && "${FUZZ[@]}" run -O "$t" "seeds/$t" "corpus/$t" -- -merge=1 -max_len=4096) >/dev/null 2>&1 || true
  fi
done

if ((kernel)); then
  echo "== the sampler's kernel packet parser (BPF_PROG_TEST_RUN, root)"
  require_root
  # frames per program: a minute's worth on this machine by default
  export RTTSCOPE_FUZZ_FRAMES="${RTTSCOPE_FUZZ_FRAMES:-$((secs * 500))}"
  export RTTSCOPE_BIN="$ROOT/target/debug/rttscope" RTTSCOPE_REQUIRE_PRIVILEGED=1
  unset CARGO_TARGET_DIR
  cargo build -q --features rttscope/aya
  cargo test -q -p rttscope-e2e --features rttscope/aya --test fuzz_sampler -- --nocapture --test-threads=1 2>&1 |
    tee -a "$report" | grep -E 'fuzz_sampler|test result|panicked' || failed=1
fi
echo "report: $report"
exit "$failed"

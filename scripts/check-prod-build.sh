#!/usr/bin/env bash
# The production build leaves the lab out: build rttscope as the deploy
# examples do (libbpf loader, no `lab` feature) into its own target directory
# and check that the binary has no `lab` subcommand and that no lab-only
# crate (indicatif) is in its dependency tree. The default build keeps the
# lab (positive control, when target/debug/rttscope exists).
#
#   scripts/check-prod-build.sh              # build + checks
#   CHECK_PROD_TARGET=DIR scripts/...        # target dir (default target/no-lab)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$ROOT"

target="${CHECK_PROD_TARGET:-$ROOT/target/no-lab}"
echo "== cargo build -p rttscope --no-default-features --features libbpf (target: $target)"
cargo build -p rttscope --no-default-features --features libbpf --target-dir "$target"
bin="$target/debug/rttscope"

fail=0
if "$bin" --help | grep -qE '^  lab '; then
  echo "FAIL: the build without the lab feature lists a lab subcommand:" >&2
  "$bin" --help >&2
  fail=1
else
  echo "ok: no lab subcommand in --help"
fi
if err="$("$bin" lab --help 2>&1)"; then
  echo "FAIL: \`rttscope lab --help\` succeeded without the lab feature" >&2
  fail=1
elif grep -q "unrecognized subcommand 'lab'" <<<"$err"; then
  echo "ok: \`rttscope lab\` is an unrecognized subcommand"
else
  echo "FAIL: unexpected error for \`rttscope lab\`: $err" >&2
  fail=1
fi
for cmd in observe serve probe compare bucket chart; do
  if ! "$bin" "$cmd" --help >/dev/null; then
    echo "FAIL: \`rttscope $cmd\` missing from the production build" >&2
    fail=1
  fi
done
tree="$(cargo tree -p rttscope --no-default-features --features libbpf -e normal --prefix none)"
if grep -E '^indicatif ' <<<"$tree"; then
  echo "FAIL: the build without the lab depends on lab-only crates (above)" >&2
  fail=1
else
  echo "ok: no lab-only crate (indicatif) among its dependencies"
fi
# Positive control: the default build has the lab.
control="${CHECK_PROD_CONTROL:-$ROOT/target/debug/rttscope}"
if [ -x "$control" ]; then
  if "$control" --help | grep -qE '^  lab '; then
    echo "ok: control: $control (default features) lists lab"
  else
    echo "FAIL: control: $control lists no lab subcommand: the same check finds nothing anywhere?" >&2
    fail=1
  fi
fi

if [ "$fail" != 0 ]; then
  echo "check-prod-build: FAILED" >&2
  exit 1
fi
echo "check-prod-build: the production build has no lab"

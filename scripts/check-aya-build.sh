#!/usr/bin/env bash
# Build rttscope with the aya loader only (no libbpf feature) into its own
# target directory and prove the binary carries no libbpf: no libbpf symbol,
# no libbpf-sys / libbpf-rs crate in its dependency tree. Then (as root, when
# the kernel allows it) run the aya-only binary for a moment to show it loads.
# Like the production build, it leaves the lab out (no `lab` feature).
#
#   scripts/check-aya-build.sh            # build + checks
#   CHECK_AYA_TARGET=DIR scripts/...      # target dir (default target/aya-only)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$ROOT"

target="${CHECK_AYA_TARGET:-$ROOT/target/aya-only}"
echo "== cargo build -p rttscope --no-default-features --features aya (target: $target)"
cargo build -p rttscope --no-default-features --features aya --target-dir "$target"
bin="$target/debug/rttscope"

fail=0
echo "== dependency tree of the aya build (normal dependencies only)"
tree="$(cargo tree -p rttscope --no-default-features --features aya -e normal --prefix none)"
if grep -E '^libbpf-(sys|rs) ' <<<"$tree"; then
  echo "FAIL: the aya build depends on libbpf crates (above)" >&2
  fail=1
else
  echo "ok: no libbpf-sys / libbpf-rs among its $(sort -u <<<"$tree" | wc -l) crates"
fi

echo "== symbols of $bin"
syms="$(nm -C "$bin" 2>/dev/null || true)"
if [ -z "$syms" ]; then
  echo "FAIL: nm printed nothing for $bin" >&2
  fail=1
fi
# C libbpf exports libbpf_*, bpf_object__*, bpf_program__*, btf__*, ring_buffer__*;
# the Rust wrappers live in libbpf_rs:: / libbpf_sys::.
bad="$(grep -E ' (libbpf_[a-z_]+|bpf_object__[a-z_]+|bpf_program__[a-z_]+|btf__[a-z_]+|ring_buffer__[a-z_]+)$|libbpf_rs::|libbpf_sys::' <<<"$syms" || true)"
if [ -n "$bad" ]; then
  echo "FAIL: libbpf symbols in the aya build:" >&2
  head -20 <<<"$bad" >&2
  fail=1
else
  echo "ok: no libbpf_*, bpf_object__*, bpf_program__*, btf__*, ring_buffer__*, libbpf_rs::, libbpf_sys:: symbols among $(wc -l <<<"$syms")"
fi
# Positive control: the same grep finds them in a libbpf build, and aya is really in this one.
if ! grep -q 'aya::' <<<"$syms"; then
  echo "FAIL: no aya:: symbols: is this really the aya build?" >&2
  fail=1
fi
# Positive control for the grep: a libbpf build must match it.
control="${CHECK_AYA_CONTROL:-$ROOT/target/debug/rttscope}"
if [ -x "$control" ]; then
  n="$(nm "$control" 2>/dev/null | grep -cE ' (libbpf_[a-z_]+|bpf_object__[a-z_]+|bpf_program__[a-z_]+|btf__[a-z_]+|ring_buffer__[a-z_]+)$' || true)"
  if [ "$n" -gt 0 ]; then
    echo "ok: control: the same grep finds $n libbpf symbols in $control"
  else
    echo "note: $control has no libbpf symbols (not a libbpf build?): control skipped"
  fi
fi
if ldd "$bin" 2>/dev/null | grep -E 'libbpf|libelf|libz\.'; then
  echo "FAIL: the aya build links libbpf/libelf/zlib dynamically (above)" >&2
  fail=1
else
  echo "ok: no libbpf/libelf/zlib among its shared libraries"
fi

if [ "$(id -u)" = 0 ] && [ "${CHECK_AYA_RUN:-1}" = 1 ]; then
  echo "== running the aya-only binary for 1s"
  out="$("$bin" observe --duration 1s --interval 500ms --format json)"
  if head -1 <<<"$out" | grep -q '"loader":"aya"' && grep -q '"type":"end"' <<<"$out"; then
    echo "ok: loaded, attached and detached with aya"
  else
    echo "FAIL: unexpected output: $out" >&2
    fail=1
  fi
  if "$bin" observe --loader libbpf --duration 1s 2>/dev/null; then
    echo "FAIL: the aya-only build accepted --loader libbpf" >&2
    fail=1
  else
    echo "ok: --loader libbpf is refused by the aya-only build"
  fi
fi

if [ "$fail" != 0 ]; then
  echo "check-aya-build: FAILED" >&2
  exit 1
fi
echo "check-aya-build: the aya build carries no libbpf"

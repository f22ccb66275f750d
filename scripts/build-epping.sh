#!/usr/bin/env bash
# Builds ePPing (pping/ of xdp-project/bpf-examples) from a checkout of its
# public source, out of tree, for scripts/bench-sampler.sh (the reference
# variant, docs/perf-sampler.md). Nothing of ePPing is kept in this
# repository and the given source is not written to: it is copied (pping/,
# lib/ with the libbpf and xdp-tools submodules, headers/, include/, the
# configure script) into OUT/src and built there with upstream's own
# configure and Makefiles (libbpf and libxdp from the submodules, statically).
#
#   scripts/build-epping.sh /path/to/bpf-examples [OUT]   # OUT: target/epping
#
# The source must have its submodules checked out at the commits it pins:
#   git clone https://github.com/xdp-project/bpf-examples
#   git -C bpf-examples submodule update --init lib/libbpf lib/xdp-tools
# Prints the path of the built pping (OUT/src/pping/pping; it loads
# pping_kern.o from its working directory, so run it from OUT/src/pping).
# Needs: gcc, clang (clang-19 here), bpftool, pkg-config, m4, libelf-dev,
# zlib1g-dev, libcap-dev, libmnl-dev, libpcap-dev (asked for by upstream's
# configure) and libc6-dev-i386 (gnu/stubs-32.h, which a BPF target compile
# of glibc headers includes; upstream's README asks for it): installed with
# apt-get when missing and root. None of this is in scripts/setup.sh: only
# this optional reference needs it.
set -euo pipefail
src=${1:-}
out=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/epping}
if [[ -z "$src" || ! -f "$src/pping/pping_kern.c" ]]; then
  echo "build-epping: give the path of a bpf-examples checkout (with pping/pping_kern.c)" >&2
  exit 2
fi
for sub in lib/libbpf/src/libbpf.c lib/xdp-tools/lib/libxdp/libxdp.c; do
  if [[ ! -f "$src/$sub" ]]; then
    echo "build-epping: $src/$sub is missing: check out the submodules (git submodule update --init lib/libbpf lib/xdp-tools)" >&2
    exit 2
  fi
done

pkgs=(gcc make pkg-config m4 bpftool libelf-dev zlib1g-dev libcap-dev libmnl-dev libpcap-dev libc6-dev-i386)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "build-epping: missing packages ${missing[*]} (install them, or run as root)" >&2
    exit 2
  fi
  echo "build-epping: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
clang=${CLANG:-$(command -v clang-19 || command -v clang || true)}
if [[ -z "$clang" ]]; then
  echo "build-epping: no clang found (set CLANG)" >&2
  exit 2
fi

# the commits built, for the record (the source may not be a git checkout)
rev() { git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown; }
rm -rf "$out/src"
mkdir -p "$out/src"
# also in OUT/revs.txt, which scripts/bench-sampler.sh writes into its record
echo "bpf-examples $(rev "$src"), libbpf $(rev "$src/lib/libbpf"), xdp-tools $(rev "$src/lib/xdp-tools")" >"$out/revs.txt"
echo "build-epping: $(cat "$out/revs.txt")" >&2
# copy what pping's build reads; leave the checkout's .git files and build products behind
tar -C "$src" --exclude=.git --exclude='*.o' --exclude='*.a' --exclude=config.mk \
  -cf - configure Makefile lib headers include pping | tar -C "$out/src" -xf -
cd "$out/src"
# Two changes to upstream's code, made in the copy. The first: pping exits when it cannot raise
# RLIMIT_MEMLOCK to infinity, which needs CAP_SYS_RESOURCE (containers and
# this machine's root lack it). Since Linux 5.11 BPF memory is charged to
# the memory cgroup and the limit plays no part, so the failure is made a
# warning (the message is still printed).
sed -i '/Could not set rlimit to infinity/,/return EXIT_FAILURE;/ s|return EXIT_FAILURE;|/* build-epping.sh: not fatal (memcg-charged BPF memory, Linux >= 5.11) */;|' pping/pping.c
grep -q 'build-epping.sh: not fatal' pping/pping.c ||
  { echo "build-epping: pping.c changed upstream: the RLIMIT_MEMLOCK edit did not apply" >&2; exit 1; }
# The second: with the map cleanup off (`-c 0`), its two programs
# (iter/bpf_map_elem) are not loaded at all. Upstream loads them whatever
# the interval, and kernels that refuse tracing programs (this machine's
# refuses them with EPERM) then refuse the whole object. The per-packet tc
# programs, the ones the benchmark times, are not touched.
sed -i '/^\tset_programs_to_load(\*obj, config);$/a\
\t/* build-epping.sh: cleanup programs not loaded with -c 0 */\
\tif (!config->clean_args.cleanup_interval) {\
\t\tbpf_program__set_autoload(bpf_object__find_program_by_name(*obj, config->cleanup_ts_prog), false);\
\t\tbpf_program__set_autoload(bpf_object__find_program_by_name(*obj, config->cleanup_flow_prog), false);\
\t}' pping/pping.c
grep -q 'build-epping.sh: cleanup programs not loaded' pping/pping.c ||
  { echo "build-epping: pping.c changed upstream: the cleanup-autoload edit did not apply" >&2; exit 1; }
# CLANG reaches both configure scripts (bpf-examples' and, from it, xdp-tools')
CLANG=$clang ./configure >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log" >&2; echo "build-epping: configure failed" >&2; exit 1; }
make -C pping >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log" >&2; echo "build-epping: make failed (log: $out/build.log)" >&2; exit 1; }
test -x pping/pping && test -f pping/pping_kern.o
echo "$out/src/pping/pping"

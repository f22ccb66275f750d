#!/usr/bin/env bash
# A Debian root filesystem as a tarball, made offline-from-here by mmdebstrap
# from the archive the machine's own apt uses, and cached: the package tests
# (tests/tests/package.rs) run the static binary in Debian 11 and install the
# .deb into Debian 12. Prints the tarball's path.
#
#   scripts/rootfs.sh bullseye            # minbase (glibc 2.31, nothing else)
#   scripts/rootfs.sh bookworm systemd    # minbase plus these packages
#
# Cache: $RTTSCOPE_CACHE (default /var/cache/rttscope)/rootfs-<suite>-<packages>.tar;
# delete it to take newer package versions. The archive: the first Debian URI
# of /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list that is not the
# security archive (RTTSCOPE_MIRROR overrides).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

die() { echo "rootfs: $*" >&2; exit 1; }

main() {
  local suite="${1:-}"; shift || true
  [ -n "$suite" ] || die "usage: scripts/rootfs.sh SUITE [PACKAGE...]"
  local cache="${RTTSCOPE_CACHE:-/var/cache/rttscope}" mirror name tar
  mirror="${RTTSCOPE_MIRROR:-$(apt_mirror)}"
  [ -n "$mirror" ] || die "no Debian archive in the machine's apt sources (set RTTSCOPE_MIRROR)"
  name="$suite${*:+-$(IFS=-; echo "$*")}"
  tar="$cache/rootfs-$name.tar"
  if [ ! -s "$tar" ]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (scripts/setup.sh installs it)"
    mkdir -p "$cache"
    local inc=()
    (($#)) && inc=(--include="$(IFS=,; echo "$*")")
    echo "rootfs: mmdebstrap --variant=minbase $suite ${*:-} from $mirror -> $tar" >&2
    mmdebstrap --quiet --format=tar --variant=minbase "${inc[@]}" "$suite" "$tar.tmp" "$mirror" >&2 ||
      { rm -f "$tar.tmp"; die "mmdebstrap $suite failed (is $mirror reachable?)"; }
    mv "$tar.tmp" "$tar"
  fi
  echo "$tar"
}

main "$@"

#!/usr/bin/env bash
# A Debian root filesystem as a tarball, made offline-from-here by mmdebstrap
# from the archive the machine's own apt uses, and cached: the package tests
# (tests/tests/package.rs) run the static binary in Debian 11 and install the
# .deb into Debian 12. Prints the tarball's path.
#
#   scripts/rootfs.sh bullseye            # minbase (glibc 2.31, nothing else)
#   scripts/rootfs.sh bookworm usr-is-merged systemd    # minbase plus these packages
#       (usr-is-merged named: else apt satisfies init-system-helpers' "usrmerge | usr-is-merged",
#       which systemd pulls in, with usrmerge and perl: 51 more MB and its conversion script)
#
# Cache: $RTTSCOPE_CACHE (default /var/cache/rttscope)/rootfs-<suite>-<packages>.tar;
# delete it to take newer package versions. The archive: the first Debian URI
# of /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list that is not the
# security archive (RTTSCOPE_MIRROR overrides).
#
# One build per tarball at a time: a lock (flock on <tarball>.lock) is held while it is made, so
# a second caller (tests/tests/package.rs while scripts/test.sh's background job is still making
# it) waits for that build and prints the same path instead of starting another. dpkg runs with
# --force-unsafe-io (no fsync per file: the tarball is written once, at the end).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

die() { echo "rootfs: $*" >&2; exit 1; }

# mmdebstrap SUITE into tarball $3, with packages $4...
build() {
  local suite="$1" mirror="$2" tar="$3" t0=$SECONDS
  shift 3
  command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (scripts/setup.sh installs it)"
  local inc=() hooks=()
  (($#)) && inc=(--include="$(IFS=,; echo "$*")")
  # usr-is-merged named: mmdebstrap's merged-usr hooks make /usr merged and install it before
  # the packages (naming it alone does not stop apt from taking the first alternative of
  # init-system-helpers' "usrmerge | usr-is-merged", and with usrmerge perl).
  [[ " $* " == *" usr-is-merged "* ]] && hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
  echo "rootfs: mmdebstrap --variant=minbase $suite ${*:-} from $mirror -> $tar" >&2
  mmdebstrap --quiet --format=tar --variant=minbase --dpkgopt=force-unsafe-io "${inc[@]}" "${hooks[@]}" \
    "$suite" "$tar.tmp" "$mirror" >&2 ||
    { rm -f "$tar.tmp"; die "mmdebstrap $suite failed (is $mirror reachable?)"; }
  mv "$tar.tmp" "$tar"
  echo "rootfs: $tar made in $((SECONDS - t0)) s" >&2
}

main() {
  local suite="${1:-}"; shift || true
  [ -n "$suite" ] || die "usage: scripts/rootfs.sh SUITE [PACKAGE...]"
  local cache="${RTTSCOPE_CACHE:-/var/cache/rttscope}" mirror name tar
  mirror="${RTTSCOPE_MIRROR:-$(apt_mirror)}"
  [ -n "$mirror" ] || die "no Debian archive in the machine's apt sources (set RTTSCOPE_MIRROR)"
  name="$suite${*:+-$(IFS=-; echo "$*")}"
  tar="$cache/rootfs-$name.tar"
  if [ ! -s "$tar" ]; then
    mkdir -p "$cache"
    exec 9>"$tar.lock"
    if ! flock -n 9; then
      echo "rootfs: $tar is being made by another process (pid $(cat "$tar.lock.pid" 2>/dev/null || echo '?')): waiting for it" >&2
      local t0=$SECONDS
      flock 9
      echo "rootfs: waited $((SECONDS - t0)) s" >&2
    fi
    echo $$ >"$tar.lock.pid"
    # made meanwhile by the holder of the lock, or still to make
    [ -s "$tar" ] || build "$suite" "$mirror" "$tar" "$@"
    rm -f "$tar.lock.pid"
  fi
  echo "$tar"
}

main "$@"

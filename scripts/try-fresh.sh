#!/usr/bin/env bash
# What a new user does on a fresh Debian 12 machine, tried and timed in a fresh Debian 12 root
# filesystem (mmdebstrap --variant=minbase from this machine's apt archive, with the apt sources
# of a Debian 12 installation), entered with chroot on this machine's kernel, as root, in a
# mount namespace of its own (/proc, /sys, /dev, a /run and /tmp of its own). README's figures
# come from here.
#
#   scripts/try-fresh.sh demo      # this tree (git archive HEAD) copied in; scripts/demo.sh, which
#                                  # runs scripts/setup.sh --for demo first (no cargo there: it
#                                  # installs Debian's cargo-web), then the demo's build and run
#
# README's Install commands are tried the same way by the suite (tests/tests/package.rs: the
# .deb in a fresh Debian 12 root, the tarball in a Debian 11 one).
#
# Each step's wall and CPU time on stdout. The root lives under $RTTSCOPE_FRESH_DIR (default: a new
# directory in /var/tmp), removed at the end unless RTTSCOPE_FRESH_KEEP=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root
cd "$ROOT"

what="${1:-}"
case "$what" in
  demo) ;;
  *) echo "usage: scripts/try-fresh.sh demo" >&2; exit 2 ;;
esac
mirror="${RTTSCOPE_MIRROR:-$(apt_mirror)}"
[ -n "$mirror" ] || { echo "try-fresh: no Debian archive in the machine's apt sources (set RTTSCOPE_MIRROR)" >&2; exit 1; }
dir="${RTTSCOPE_FRESH_DIR:-$(mktemp -d /var/tmp/rttscope-fresh.XXXXXX)}"
root="$dir/root"
mkdir -p "$dir"
[ -n "${RTTSCOPE_FRESH_KEEP:-}" ] || trap 'rm -rf "$dir"' EXIT

step() { # label command...: run it, print its wall and CPU time (its children's included)
  local label="$1" rc=0
  shift
  local TIMEFORMAT="try-fresh: $label: %0R s wall, %0U s user + %0S s system"
  time { "$@" || rc=$?; }
  return $rc
}

# Inside the root, in a mount namespace of its own (gone with it), as root.
ENTER='set -e; r="$0"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
exec chroot "$r" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"'
inside() { unshare --mount --propagation private -- sh -c "$ENTER" "$root" "$@"; }

# The root: Debian 12 minbase (scripts/rootfs.sh: made once, cached), extracted afresh; its apt
# sources those of a Debian 12 installation (bookworm, -updates, -security: Debian's cargo-web
# >= 1.95 is in -security); this machine's own CA certificates (a TLS-intercepting proxy here,
# a new user's machine has its own), taken in when setup.sh installs ca-certificates.
tarball=$("$ROOT/scripts/rootfs.sh" bookworm)
mkdir -p "$root"
step "the fresh root extracted" tar -xf "$tarball" -C "$root"
sec="${mirror%/debian}/debian-security"
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
  "$mirror" "$mirror" "$sec" >"$root/etc/apt/sources.list"
rm -f "$root"/etc/apt/sources.list.d/*
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true

mkdir -p "$root/root/rttscope"
git archive HEAD | tar -x -C "$root/root/rttscope"
# README's first command; demo.sh runs setup.sh --for demo (its own time in its last line)
step "scripts/demo.sh (set-up, build, lab delayed-ack --quick)" \
  inside sh -c 'cd /root/rttscope && scripts/demo.sh' 2>&1 | grep -vE '^\s*$' | tail -40

#!/usr/bin/env bash
# Build the rttscope container image offline, from Debian bookworm's packages
# (docs/deploy.md). The same steps as the Containerfile's, without a registry:
#
#   1. the production binary, static: scripts/package.sh --binary (libbpf
#      loader, no lab; glibc, libelf and zlib linked in), debug info stripped;
#   2. the runtime root: the binary, its config, and the copyright files of
#      the packages whose code it holds (libc6, libelf1, zlib1g, libgcc-s1:
#      `mmdebstrap --variant=extract`, cached as a tarball); no library, no loader;
#   3. one layer (binary + that root, files owned by 0:0, mtimes clamped to
#      SOURCE_DATE_EPOCH, sorted), committed by buildah with
#      --timestamp SOURCE_DATE_EPOCH, tagged localhost/rttscope:<version>.
#
#   scripts/build-image.sh               # build (reuse the image if its inputs are unchanged)
#   scripts/build-image.sh --print-name  # the image name the recipe produces
#   scripts/build-image.sh --root DIR    # steps 1-2 only: the runtime root in DIR (the Containerfile uses this)
#   scripts/build-image.sh --prepare     # the binary and the packages' tarball only (scripts/test.sh
#                                        # does this in the background, at nice 19, while other tests run)
#   scripts/build-image.sh --check-reproducible
#       # build (or reuse), then steps 2-3 again into a scratch name: both
#       # must have the same image id and manifest digest (exit 1 if not)
#
# Environment: RTTSCOPE_IMAGE (name; default localhost/rttscope:<version>),
# RTTSCOPE_CACHE (default /var/cache/rttscope: the mmdebstrap tarball),
# RTTSCOPE_STATIC_TARGET (cargo target dir, default target/static: scripts/package.sh's),
# SOURCE_DATE_EPOCH (default: the last commit's time), RTTSCOPE_IMAGE_REBUILD=1
# (commit even when an image with the same inputs exists),
# RTTSCOPE_MIRROR (default: the Debian archive of the machine's own apt sources).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$ROOT"

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
IMAGE="${RTTSCOPE_IMAGE:-localhost/rttscope:$VERSION}"
if [ "${1:-}" = "--print-name" ]; then
  echo "$IMAGE"
  exit 0
fi
CACHE="${RTTSCOPE_CACHE:-/var/cache/rttscope}"
MIRROR="${RTTSCOPE_MIRROR:-$(apt_mirror)}"
[ -n "$MIRROR" ] || { echo "build-image: no Debian archive in the machine's apt sources (set RTTSCOPE_MIRROR)" >&2; exit 1; }
SUITE=bookworm
RUNTIME_PKGS=(libc6 libelf1 zlib1g libgcc-s1)
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH

die() { echo "build-image: $*" >&2; exit 1; }

build_binary() {
  BIN="$("$ROOT/scripts/package.sh" --binary)"
}

# The runtime packages extracted by mmdebstrap, cached per package list.
rootfs_tar() {
  local key tar
  key="$(echo "$SUITE ${RUNTIME_PKGS[*]} $MIRROR" | sha256sum | cut -c1-12)"
  tar="$CACHE/rootfs-$SUITE-$key.tar"
  if [ ! -s "$tar" ]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (scripts/setup.sh installs it)"
    mkdir -p "$CACHE"
    echo "== mmdebstrap --variant=extract $SUITE: ${RUNTIME_PKGS[*]} -> $tar" >&2
    local inc
    inc="$(IFS=,; echo "${RUNTIME_PKGS[*]}")"
    mmdebstrap --quiet --format=tar --variant=extract --include="$inc" --skip=output/dev --skip=output/mknod \
      "$SUITE" "$tar.tmp" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb ${MIRROR%/debian}/debian-security $SUITE-security main" >&2 ||
      die "mmdebstrap failed (is $MIRROR reachable?)"
    mv "$tar.tmp" "$tar"
  fi
  ROOTFS_TAR="$tar"
}

# Copy a path (and what a symlink points to) from $1 into $2.
copy_rel() {
  local src="$1" dst="$2" rel="$3"
  mkdir -p "$dst/$(dirname "$rel")"
  cp -a "$src/$rel" "$dst/$rel"
  if [ -L "$src/$rel" ]; then
    local t
    t="$(readlink "$src/$rel")"
    case "$t" in
      /*) copy_rel "$src" "$dst" "${t#/}" ;;
      *) copy_rel "$src" "$dst" "$(dirname "$rel")/$t" ;;
    esac
  fi
}

# The runtime root in $1: the static binary, the config, the copyrights of the code linked in.
make_root() {
  local out="$1" full
  full="$(mktemp -d)"
  tar -xf "$ROOTFS_TAR" -C "$full"
  rm -rf "$out" && mkdir -p "$out/usr/local/bin" "$out/etc/rttscope"
  install -m 0755 "$BIN" "$out/usr/local/bin/rttscope"
  local p
  for p in "$full"/usr/share/doc/*/copyright; do
    copy_rel "$full" "$out" "${p#"$full"/}"
  done
  install -m 0644 examples/deploy/rttscope.toml "$out/etc/rttscope/rttscope.toml"
  rm -rf "$full"
  echo "== runtime root: the static binary, its config, ${RUNTIME_PKGS[*]}'s copyrights ($(du -sh "$out" | cut -f1))" >&2
}

# One reproducible layer tarball of root $1 into $2.
pack_layer() {
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --owner=0 --group=0 --numeric-owner \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$2" -C "$1" .
}

commit_image() {
  local layer="$1" inputs="$2" ctr
  command -v buildah >/dev/null || die "buildah is missing (scripts/setup.sh installs it)"
  ctr="$(buildah from scratch)"
  buildah add --quiet "$ctr" "$layer" / >/dev/null
  # Keep in step with the Containerfile's runtime stage.
  buildah config \
    --entrypoint '["/usr/local/bin/rttscope"]' \
    --cmd '["observe", "--config", "/etc/rttscope/rttscope.toml"]' \
    --port 9464/tcp \
    --label org.opencontainers.image.title=rttscope \
    --label org.opencontainers.image.version="$VERSION" \
    --label org.opencontainers.image.source=https://example.invalid/rttscope \
    --label io.rttscope.inputs="$inputs" \
    "$ctr"
  buildah commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$IMAGE" >/dev/null
}

# The root, its layer and the inputs' hash, from scratch in $1.
layer_of() {
  make_root "$1/root"
  pack_layer "$1/root" "$1/layer.tar"
  INPUTS="$(cat "$1/layer.tar" scripts/build-image.sh | sha256sum | cut -c1-16)-$SOURCE_DATE_EPOCH"
}

# Steps 2-3 again (a fresh root, layer and commit) into a scratch name;
# the image id (config digest) and manifest digest must be $IMAGE's.
check_reproducible() {
  local again="${IMAGE%:*}-repro-$$:check" a b
  a="$(podman image inspect --format '{{.Id}} {{.Digest}}' "$IMAGE")"
  mkdir "$WORK/again"
  layer_of "$WORK/again"
  IMAGE="$again" commit_image "$WORK/again/layer.tar" "$INPUTS"
  b="$(podman image inspect --format '{{.Id}} {{.Digest}}' "$again")"
  if [ "$a" != "$b" ]; then
    podman rmi "$again" >/dev/null 2>&1 || true
    die "not reproducible: $IMAGE is $a, the same inputs again gave $b"
  fi
  # The same image: drop only the scratch name (`podman untag IMAGE` alone drops every name).
  podman untag "$again" "$again" >/dev/null
  echo "== reproducible: a second root, layer and commit gave the same id and digest ($a)" >&2
}

main() {
  build_binary
  rootfs_tar
  if [ "${1:-}" = "--prepare" ]; then
    exit 0
  fi
  if [ "${1:-}" = "--root" ]; then
    [ -n "${2:-}" ] || die "--root needs a directory"
    make_root "$2"
    exit 0
  fi
  local have
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  mkdir "$WORK/first"
  layer_of "$WORK/first"
  have="$(podman image inspect --format '{{index .Labels "io.rttscope.inputs"}}' "$IMAGE" 2>/dev/null || true)"
  if [ "$have" = "$INPUTS" ] && [ -z "${RTTSCOPE_IMAGE_REBUILD:-}" ]; then
    echo "== $IMAGE is up to date (inputs $INPUTS)" >&2
  else
    commit_image "$WORK/first/layer.tar" "$INPUTS"
  fi
  local id size
  id="$(podman image inspect --format '{{.Id}}' "$IMAGE")"
  size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
  echo "== $IMAGE id sha256:$id, $size bytes (layer $(stat -c %s "$WORK/first/layer.tar") bytes)" >&2
  if [ "${1:-}" = "--check-reproducible" ]; then
    check_reproducible
  fi
  echo "$IMAGE"
}

main "$@"

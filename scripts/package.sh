#!/usr/bin/env bash
# Release artifacts from one static binary (docs/deploy.md, "Packages"):
#
#   1. the production feature set (libbpf loader, no lab) built with glibc,
#      libelf and zlib linked in: `+crt-static` on the gnu target (explicit
#      --target, so build scripts and proc-macros stay dynamic) and rttscope's
#      `static` feature (libbpf-sys's static-libelf/static-zlib, Debian's .a
#      archives); checked to have no PT_INTERP and no DT_NEEDED; debug info stripped;
#   2. its man pages and completions (`rttscope man`, `rttscope completions`);
#   3. target/dist/rttscope-<version>-x86_64-linux.tar.gz: a tree to extract into
#      /usr/local (bin/, lib/systemd/system/, share/...), with share/doc/rttscope/SHA256SUMS
#      of its files;
#   4. target/dist/rttscope_<version>-1_amd64.deb (dpkg-deb --root-owner-group);
#   5. target/dist/rttscope-<version>-1.x86_64.rpm (rpmbuild, when installed);
#   6. target/dist/SHA256SUMS of the artifacts.
#
#   scripts/package.sh            # all of it; prints the directory of the artifacts
#   scripts/package.sh --binary   # step 1 only; prints the binary's path
#
# Environment: RTTSCOPE_STATIC_TARGET (cargo target dir, default target/static),
# RTTSCOPE_DIST (default target/dist), SOURCE_DATE_EPOCH (default: the last commit's time).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$ROOT"

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
TRIPLE=x86_64-unknown-linux-gnu
TARGET="${RTTSCOPE_STATIC_TARGET:-$ROOT/target/static}"
DIST="${RTTSCOPE_DIST:-$ROOT/target/dist}"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH
SUMMARY="passive RTT observer (eBPF): TCP's own RTT and a packet sampler, as Prometheus metrics"

die() { echo "package: $*" >&2; exit 1; }

# Step 1: the static binary, checked, stripped: $BIN.
build_static() {
  echo "== cargo build --release --target $TRIPLE --no-default-features --features static (+crt-static; target: $TARGET)" >&2
  # libbpf-sys links libelf.a and libz.a from its search path: the C compiler's (multiarch) one.
  local archive
  archive="$(${CC:-cc} -print-file-name=libelf.a)"
  [ -f "$archive" ] || die "no libelf.a (Debian: libelf-dev; scripts/setup.sh installs it)"
  # No debug info compiled (stripped anyway).
  LIBBPF_SYS_LIBRARY_PATH="$(dirname "$archive")" CARGO_PROFILE_RELEASE_DEBUG=0 \
    RUSTFLAGS='-C target-feature=+crt-static' cargo build --release -p rttscope --no-default-features --features static \
    --target "$TRIPLE" --target-dir "$TARGET" >&2
  local built="$TARGET/$TRIPLE/release/rttscope"
  if readelf -lW "$built" | grep -q 'INTERP'; then die "$built has a program interpreter (not static)"; fi
  if readelf -dW "$built" | grep -q '(NEEDED)'; then die "$built needs shared libraries: $(readelf -dW "$built" | grep NEEDED)"; fi
  "$built" lab --help >/dev/null 2>&1 && die "the production build has a lab subcommand"
  BIN="$TARGET/rttscope-static"
  strip --strip-debug -o "$BIN.tmp" "$built" && mv "$BIN.tmp" "$BIN"
}

# Step 2: man pages (gzipped) into $1/man1, completions into $1/{bash,zsh,fish}.
gen_docs() {
  local out="$1"
  "$BIN" man "$out/man1"
  gzip -9n "$out"/man1/*.1
  mkdir -p "$out/bash" "$out/zsh" "$out/fish"
  "$BIN" completions bash >"$out/bash/rttscope"
  "$BIN" completions zsh >"$out/zsh/_rttscope"
  "$BIN" completions fish >"$out/fish/rttscope.fish"
}

# The installed tree under prefix $2 into staging root $1; $3: the unit's directory.
stage_tree() {
  local root="$1" prefix="$2" unitdir="$3" gen="$WORK/gen"
  install -D -m 0755 "$BIN" "$root$prefix/bin/rttscope"
  install -D -m 0644 /dev/stdin "$root$unitdir/rttscope.service" \
    < <(sed "s:/usr/local/bin/rttscope:$prefix/bin/rttscope:g" examples/deploy/rttscope.service)
  install -d "$root$prefix/share/man/man1" "$root$prefix/share/doc/rttscope"
  install -m 0644 "$gen"/man1/*.gz "$root$prefix/share/man/man1/"
  install -D -m 0644 "$gen/bash/rttscope" "$root$prefix/share/bash-completion/completions/rttscope"
  install -D -m 0644 "$gen/fish/rttscope.fish" "$root$prefix/share/fish/vendor_completions.d/rttscope.fish"
  install -m 0644 docs/metrics.md docs/deploy.md "$root$prefix/share/doc/rttscope/"
  install -m 0644 /dev/stdin "$root$prefix/share/doc/rttscope/copyright" <<EOF
rttscope $VERSION
License: GPL-2.0-only OR MIT (the kernel programs: GPL-2.0-only).
The binary is statically linked with the GNU C Library (LGPL-2.1-or-later),
libelf of elfutils (LGPL-3.0-or-later OR GPL-2.0-or-later), zlib (Zlib) and
libbpf (LGPL-2.1 OR BSD-2-Clause), built from Debian's packages of them.
EOF
}

# Step 3: the tarball: the tree under /usr/local (the config under share/doc/rttscope).
make_tarball() {
  local name="rttscope-$VERSION-x86_64-linux" dir="$WORK/tar"
  stage_tree "$WORK/tar-root" /usr/local /usr/local/lib/systemd/system
  mkdir -p "$dir" && mv "$WORK/tar-root/usr/local" "$dir/$name"
  install -D -m 0644 "$WORK/gen/zsh/_rttscope" "$dir/$name/share/zsh/site-functions/_rttscope"
  install -m 0644 examples/deploy/rttscope.toml "$dir/$name/share/doc/rttscope/rttscope.toml"
  (cd "$dir/$name" && find . -type f | LC_ALL=C sort | sed 's:^\./::' |
    xargs sha256sum >"$WORK/sums" && mv "$WORK/sums" share/doc/rttscope/SHA256SUMS)
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --owner=0 --group=0 --numeric-owner \
    -C "$dir" -cf - "$name" | gzip -9n >"$DIST/$name.tar.gz"
}

# Step 4: the .deb from a staged tree.
make_deb() {
  local root="$WORK/deb" deb="$DIST/rttscope_${VERSION}-1_amd64.deb"
  stage_tree "$root" /usr /lib/systemd/system
  install -D -m 0644 "$WORK/gen/zsh/_rttscope" "$root/usr/share/zsh/vendor-completions/_rttscope"
  install -D -m 0644 examples/deploy/rttscope.toml "$root/etc/rttscope/rttscope.toml"
  mkdir -p "$root/DEBIAN"
  cat >"$root/DEBIAN/control" <<EOF
Package: rttscope
Version: ${VERSION}-1
Architecture: amd64
Maintainer: rttscope developers <rttscope@example.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Section: net
Priority: optional
Homepage: https://example.invalid/rttscope
Description: $SUMMARY
 One static binary (no shared libraries): runs on kernels >= 5.10 whatever
 the userland. The systemd unit is installed but not enabled:
 systemctl enable --now rttscope
EOF
  echo /etc/rttscope/rttscope.toml >"$root/DEBIAN/conffiles"
  maint_scripts "$root/DEBIAN"
  find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
}

# The maintainer scripts: reload systemd after install; stop and disable before removal.
maint_scripts() {
  cat >"$1/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
EOF
  cat >"$1/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
  if [ -d /run/systemd/system ]; then systemctl stop rttscope.service || true; fi
  if command -v systemctl >/dev/null; then systemctl disable rttscope.service >/dev/null 2>&1 || true; fi
fi
EOF
  cat >"$1/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
EOF
  chmod 0755 "$1/postinst" "$1/prerm" "$1/postrm"
}

# Step 5: the .rpm, from the same staged tree (units in /usr/lib/systemd/system).
make_rpm() {
  if ! command -v rpmbuild >/dev/null; then
    echo "== no rpmbuild (Debian package rpm): no .rpm" >&2
    return 0
  fi
  local top="$WORK/rpm" root="$WORK/rpm-root"
  stage_tree "$root" /usr /usr/lib/systemd/system
  install -D -m 0644 "$WORK/gen/zsh/_rttscope" "$root/usr/share/zsh/site-functions/_rttscope"
  install -D -m 0644 examples/deploy/rttscope.toml "$root/etc/rttscope/rttscope.toml"
  mkdir -p "$top/SPECS"
  rpm_spec "$root" >"$top/SPECS/rttscope.spec"
  rpmbuild --quiet -bb --define "_topdir $top" --define "_rpmdir $DIST" \
    --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
    "$top/SPECS/rttscope.spec" >&2
}

# The spec: prebuilt files copied from staging root $1; no dependencies, no debuginfo.
rpm_spec() {
  cat <<EOF
Name: rttscope
Version: $VERSION
Release: 1
Summary: $SUMMARY
License: GPL-2.0-only OR MIT
URL: https://example.invalid/rttscope
BuildArch: x86_64
AutoReqProv: no
%global debug_package %{nil}
%global _build_id_links none
%global __os_install_post %{nil}
%description
One static binary (no shared libraries): runs on kernels >= 5.10 whatever the
userland. The systemd unit is installed but not enabled: systemctl enable --now rttscope
%install
cp -a $1/. %{buildroot}/
%files
/usr/bin/rttscope
%dir /etc/rttscope
%config(noreplace) /etc/rttscope/rttscope.toml
/usr/lib/systemd/system/rttscope.service
/usr/share/man/man1/*.1.gz
/usr/share/bash-completion/completions/rttscope
/usr/share/zsh/site-functions/_rttscope
/usr/share/fish/vendor_completions.d/rttscope.fish
/usr/share/doc/rttscope
%post
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
%preun
if [ "\$1" = 0 ]; then
  if [ -d /run/systemd/system ]; then systemctl stop rttscope.service || true; fi
  systemctl disable rttscope.service >/dev/null 2>&1 || true
fi
%postun
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
EOF
}

main() {
  build_static
  if [ "${1:-}" = "--binary" ]; then
    echo "$BIN"
    exit 0
  fi
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  mkdir -p "$DIST"
  rm -f "$DIST"/rttscope[-_]*.{tar.gz,deb,rpm} "$DIST/SHA256SUMS"
  gen_docs "$WORK/gen"
  make_tarball
  make_deb
  make_rpm
  (cd "$DIST" && sha256sum rttscope[-_]* >SHA256SUMS)
  echo "== $(cd "$DIST" && ls rttscope[-_]* | tr '\n' ' ')" >&2
  echo "$DIST"
}

main "$@"

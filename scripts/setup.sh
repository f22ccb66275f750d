#!/usr/bin/env bash
# Install what a fresh Debian 12 machine lacks for what rttscope is to do here:
#   --for demo   scripts/demo.sh: the compiler toolchain and the lab's network tools only
#   --for test   (the default) scripts/test.sh: all of the demo's, and what only the tests need
#                (container tools, QEMU and other kernels, Prometheus, virtme-ng, ...)
#   --part now   (with --for test) what the build and the end-to-end tests need
#   --part late  (with --for test) what only test.sh's last phases need: QEMU, virtme-ng and
#                the other kernels (the VM phase), the Debian 11 and 12 root filesystems (the
#                package tests). scripts/test.sh runs `--part now`, then `--part late` in the
#                background at nice 19 while it builds and tests (docs/kernels.md, "A fresh machine").
#   (default: --part all, both one after the other)
# Idempotent: installs only what is missing. Needs root for apt. Every archive comes from this
# machine's own apt sources; no package registry is named here.
set -euo pipefail

FOR=test
PART=all
usage="usage: setup.sh [--for demo|test] [--part all|now|late]"
while (($#)); do
  case "$1" in
    --for) FOR=${2:-}; shift ;;
    --for=*) FOR=${1#--for=} ;;
    --part) PART=${2:-}; shift ;;
    --part=*) PART=${1#--part=} ;;
    *) echo "setup: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
  shift
done
case "$FOR" in
  demo | test) ;;
  *) echo "setup: --for takes 'demo' or 'test', not '$FOR'" >&2; exit 2 ;;
esac
case "$PART" in
  all | now | late) ;;
  *) echo "setup: --part takes 'all', 'now' or 'late', not '$PART'" >&2; exit 2 ;;
esac
if [ "$FOR" = demo ] && [ "$PART" != all ]; then
  echo "setup: --part is for --for test (the demo's set-up is one part)" >&2; exit 2
fi
T_SETUP=$SECONDS
export PATH="$HOME/.cargo/bin:$PATH"

# What `scripts/demo.sh` needs: cargo build --profile demo, then `rttscope lab delayed-ack --quick`.
DEMO_PKGS=(
  clang-19                    # BPF C compiler (BPF_CLANG overrides)
  libelf-dev zlib1g-dev pkg-config make gcc  # vendored libbpf (libbpf-sys)
  bpftool                     # vmlinux.h generation
  ca-certificates             # cargo fetching the crates
  iproute2 procps             # the lab's namespaces, veth and tc (ip, tc), its sysctls
  nftables iptables           # the lab's link emulator: loss (nft), NFQUEUE steering (iptables)
)
# What only the tests, benchmarks and the image need, on top.
TEST_PKGS=(
  llvm-19                     # llvm-objdump (comparing BPF objects, docs/kernels.md)
  iputils-ping                # ping, for the active probes' comparisons
  irtt iperf3 tcpdump ethtool  # peers and tools for tests, lab and benchmarks
  systemd util-linux          # systemd-analyze verify, setpriv and nsenter (deployment tests)
  strace bsdutils             # syscall counts (probe --spin/--busy-poll test), script's pty (progress, log colour tests)
  prometheus                  # promtool check metrics on a live scrape (metrics tests)
  podman buildah skopeo uidmap mmdebstrap binutils runc  # the container image: scripts/build-image.sh, tests/image.rs (runc: crun refuses hybrid-cgroup hosts)
  python3-yaml                # image test: the rendered manifests as JSON
  rpm                         # scripts/package.sh: rpmbuild makes the .rpm; tests/package.rs lists it
  curl python3
)
# What only test.sh's last phases need (--part late): test-kernels.sh's VM (Debian 12's 6.1
# in it; linux-image-amd64's postinst also builds an initramfs: tens of seconds of CPU).
LATE_PKGS=(
  qemu-system-x86 linux-image-amd64 busybox-static
)

# apt-get update, at most once per run (a fresh machine's demo set-up did it twice: 40 s more).
APT_UPDATED=0
apt_update_once() {
  ((APT_UPDATED)) && return 0
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  APT_UPDATED=1
}

# Install the packages of "$@" that are missing (one apt-get update, only when needed).
apt_install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_update_once
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The time of each step, on stderr (docs/kernels.md, "A fresh machine").
T_STEP=$SECONDS
took() { echo "setup: $1 in $((SECONDS - T_STEP)) s" >&2; T_STEP=$SECONDS; }

# Rust: the machine's cargo, else rustup's under ~/.cargo, else Debian's cargo-web (new enough
# in bookworm-security) from the machine's own apt sources, in the same apt transaction as the
# rest. rustup itself is not fetched here.
RUST_MIN=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml")
RUST_PKGS=()
if [ "$PART" != late ] && ! command -v cargo >/dev/null 2>&1; then
  if [ "$FOR" = test ]; then
    echo "setup: cargo is missing, and the tests need rustfmt and clippy of the same toolchain, which Debian's cargo-web lacks: install Rust >= $RUST_MIN with rustup (stable, components rustfmt and clippy) and run again" >&2
    exit 1
  fi
  apt_update_once
  cand=$(apt-cache policy cargo-web 2>/dev/null | sed -n 's/^ *Candidate: *//p')
  if [ -z "$cand" ] || [ "$cand" = "(none)" ] || ! dpkg --compare-versions "$cand" ge "$RUST_MIN"; then
    echo "setup: cargo is missing and this machine's apt offers no cargo-web >= $RUST_MIN (found: ${cand:-none}): install Rust >= $RUST_MIN (rustup) and run again" >&2
    exit 1
  fi
  RUST_PKGS=(cargo-web rustc-web)
fi

if [ "$PART" != late ]; then
  pkgs=("${DEMO_PKGS[@]}" "${RUST_PKGS[@]}")
  [ "$FOR" = test ] && pkgs+=("${TEST_PKGS[@]}")
  # kubectl renders examples/deploy/ (kustomize, offline) for the image test: any kubectl will
  # do; Debian's is kubernetes-client (in the same apt transaction).
  [ "$FOR" = test ] && ! command -v kubectl >/dev/null 2>&1 && pkgs+=(kubernetes-client)
  [ "$FOR" = test ] && [ "$PART" = all ] && pkgs+=("${LATE_PKGS[@]}")
  apt_install_missing "${pkgs[@]}"
  took "apt (${#pkgs[@]} packages checked)"
fi

# "URI SUITE" for every enabled deb source of this machine's apt: one-line entries of
# sources.list and *.list, deb822 stanzas (`Types:`, `URIs:`, `Suites:`) of *.sources.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    sed -E -n 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+([^[:space:]]+).*/\2 \3/p' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'function flush(  i, j) { if (deb && on) for (i in u) for (j in s) print u[i], s[j]
                                  split("", u); split("", s); deb = 0; on = 1 }
         BEGIN { on = 1 }
         /^[[:space:]]*$/ { flush(); next }
         /^[[:space:]]*#/ { next }
         { k = tolower($1) }
         k == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
         k == "uris:" { for (i = 2; i <= NF; i++) u[i] = $i }
         k == "suites:" { for (i = 2; i <= NF; i++) s[i] = $i }
         k == "enabled:" && tolower($2) == "no" { on = 0 }
         END { flush() }' "$f"
  done
}

# The archive (URI) this machine's apt takes one of SUITES from: the first found, or one
# sentence and a non-zero exit.
archive_for() {
  local s uri
  for s in "$@"; do
    uri=$(apt_sources | awk -v s="$s" '$2 == s { print $1; exit }')
    [ -n "$uri" ] && { echo "${uri%/}"; return 0; }
  done
  echo "setup: no archive in this machine's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/) serves $*: add one, or run on Debian 12 (bookworm)" >&2
  return 1
}

if [ "$PART" != late ]; then
  if [ "$FOR" = test ] && command -v rustup >/dev/null 2>&1; then
    for c in rustfmt clippy; do
      rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >/dev/null 2>&1 || true
    done
  fi
  if [ "$FOR" = demo ]; then
    echo "setup: ok for the demo ($(clang-19 --version | head -1); $(cargo --version)) in $((SECONDS - T_SETUP)) s"
    exit 0
  fi

  # Prometheus with its OTLP receiver for the fleet test's pushed series: Debian
  # builds its prometheus packages (2.53.3 in trixie, 3.5.3 in sid) with the OTLP
  # receiver removed (Debian bug #1080354), so build upstream 2.53.3 from its Go
  # module source (the Go module proxy; once, several minutes on 2 cores). Needs Go >= 1.22:
  # the machine's, else Debian's golang-1.22 from bookworm-backports (dpkg -x, private list).
  PROM_OTLP=/var/cache/rttscope/prometheus-otlp/prometheus
  if [ ! -x "$PROM_OTLP" ]; then
    GO=$(command -v go || true)
    [ -z "$GO" ] && [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go
    if [ -n "$GO" ] && ! "$GO" version | grep -qE 'go1\.(2[2-9]|[3-9][0-9])'; then GO=; fi
    if [ -z "$GO" ]; then
      work=/var/cache/rttscope/apt-bpo
      mkdir -p "$work/lists/partial" "$work/cache/archives/partial" /var/cache/rttscope/golang
      uri=$(archive_for bookworm)
      echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm-backports main" >"$work/sources.list"
      aptopts=(-oDir::Etc::SourceList="$work/sources.list" -oDir::Etc::SourceParts=/dev/null
        -oDir::State::Lists="$work/lists" -oDir::Cache="$work/cache")
      apt-get "${aptopts[@]}" -qq update
      (cd "$work" && apt-get "${aptopts[@]}" -qq download golang-1.22-go golang-1.22-src)
      for d in "$work"/golang-1.22-*.deb; do dpkg -x "$d" /var/cache/rttscope/golang; done
      GO=/var/cache/rttscope/golang/usr/lib/go-1.22/bin/go
      export GOROOT=/var/cache/rttscope/golang/usr/lib/go-1.22
    fi
    echo "setup: building Prometheus 2.53.3 with its OTLP receiver ($("$GO" version))"
    export GOPATH=/var/cache/rttscope/go GOFLAGS=-mod=mod CGO_ENABLED=0
    "$GO" mod download github.com/prometheus/prometheus@v0.53.3
    src=/var/cache/rttscope/prometheus-src
    rm -rf "$src" && cp -r "$GOPATH/pkg/mod/github.com/prometheus/prometheus@v0.53.3" "$src" && chmod -R u+w "$src"
    # Only the minimum service discovery (static, file, http): the cloud SDKs would
    # double the build time and the test needs none of them.
    printf '// Trimmed by rttscope scripts/setup.sh: only the minimum discovery.\n\npackage plugins\n' >"$src/plugins/plugins.go"
    mkdir -p "$(dirname "$PROM_OTLP")"
    (cd "$src" && "$GO" build -o "$PROM_OTLP" ./cmd/prometheus)
    "$PROM_OTLP" --version | head -1
  fi
  took "Prometheus with its OTLP receiver (built once)"
fi
if [ "$PART" = now ]; then
  echo "setup: ok for the build and the end-to-end tests in $((SECONDS - T_SETUP)) s (the rest: setup.sh --part late)"
  exit 0
fi

# Debian 11 and Debian 12 root filesystems for tests/tests/package.rs (mmdebstrap from the
# machine's apt archive, 1-2 min each the first time on a quiet machine; cached under
# /var/cache/rttscope; rootfs.sh holds a lock while it makes one, so the package tests wait
# for a build in progress): first, as the package tests run before the VM phase.
"$(dirname "$0")/rootfs.sh" bullseye >/dev/null
took "the Debian 11 root filesystem"
"$(dirname "$0")/rootfs.sh" bookworm usr-is-merged systemd >/dev/null  # usr-is-merged: not usrmerge and perl
took "the Debian 12 root filesystem (with systemd)"

if [ "$PART" = late ]; then
  apt_install_missing "${LATE_PKGS[@]}"
  took "apt (QEMU, Debian 12's kernel)"
fi
# virtme-ng (vng) boots the other kernels for scripts/test-kernels.sh (docs/kernels.md):
# from pip where a user-managed pip exists (pyenv, venv), else through Debian's pipx.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v vng >/dev/null 2>&1; then
  echo "setup: installing virtme-ng (vng)"
  if ! { command -v pip >/dev/null 2>&1 && pip install -q virtme-ng >/dev/null 2>&1; }; then
    apt_install_missing pipx
    pipx install virtme-ng >/dev/null
  fi
fi

took "virtme-ng"

# More kernels for scripts/test-kernels.sh, from Debian's archive with a private apt
# list (the machine's own sources are not touched): Debian 11's 5.10 and Debian 13's
# 6.12, besides bookworm's 6.1 above. Cached under /var/cache/rttscope/kernels/<suite>;
# the modules and the image go to /lib/modules/<version> (the image as `vmlinuz`, where
# Fedora and Arch keep theirs). Booted from there, virtme-ng takes the host's /lib/modules
# for the guest's; booted from the cache, it links the guest's /lib/modules/<version> into
# /var/cache, which its guest init hides under a tmpfs: no veth, no sch_ingress.
fetch_kernel() { # suite uri package-regex
  local suite=$1 uri=$2 re=$3 dir=/var/cache/rttscope/kernels/$1
  if compgen -G "$dir/root/boot/vmlinuz-*" >/dev/null; then
    local v; v=$(basename "$(ls "$dir"/root/boot/vmlinuz-* | head -1)"); v=${v#vmlinuz-}
    if [ ! -d "/lib/modules/$v" ]; then
      cp -a "$dir/root/lib/modules/$v" /lib/modules/ 2>/dev/null ||
        cp -a "$dir/root/usr/lib/modules/$v" /lib/modules/
    fi
    # dpkg -x runs no postinst: the module index (modprobe veth in the guest) is ours to build
    [ -e "/lib/modules/$v/modules.dep" ] || depmod "$v"
    [ -e "/lib/modules/$v/vmlinuz" ] || cp "$dir/root/boot/vmlinuz-$v" "/lib/modules/$v/vmlinuz"
    return 0
  fi
  echo "setup: fetching a $suite kernel from Debian's archive"
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/root"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$dir/sources.list"
  local o=(-oDir::Etc::SourceList="$dir/sources.list" -oDir::Etc::SourceParts=/dev/null
    -oDir::State::Lists="$dir/lists" -oDir::Cache="$dir/cache" -oAPT::Sandbox::User=root -qq)
  apt-get "${o[@]}" update
  local pkg; pkg=$(apt-cache "${o[@]}" pkgnames linux-image- | grep -E "$re" | sort -V | tail -1)
  [ -n "$pkg" ] || { echo "setup: no $re in $suite" >&2; return 1; }
  (cd "$dir" && apt-get "${o[@]}" download "$pkg")
  dpkg -x "$dir"/"$pkg"_*.deb "$dir/root"
  rm -f "$dir"/"$pkg"_*.deb
  fetch_kernel "$@"
}
# Debian's archives hold every release's suites: bullseye-security comes from the archive this
# machine takes bookworm-security from, trixie from the one it takes bookworm from.
main_archive=$(archive_for bookworm)
security_archive=$(archive_for bookworm-security bookworm/updates)
fetch_kernel bullseye-security "$security_archive" '^linux-image-5\.10\.0-[0-9]+-amd64$'
fetch_kernel trixie "$main_archive" '^linux-image-6\.12\.[0-9.]+\+deb13-amd64$'

took "Debian 11's and 13's kernels"

# BPF run-time statistics are off unless asked for; nothing else is changed on the host.
echo "setup: ok ($(clang-19 --version | head -1); $(cargo --version)) in $((SECONDS - T_SETUP)) s"

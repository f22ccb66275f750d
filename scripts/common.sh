# Sourced by the scripts: environment and the built binary.
export PATH="$HOME/.cargo/bin:/root/.cargo/bin:$PATH"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TERM_COLOR=never
require_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): run as root (or: sudo $0): kernel programs and network namespaces need it" >&2
    exit 1
  fi
}

# The machine's Debian archive URI (deb822 `URIs:` lines and one-line `deb` entries).
apt_mirror() {
  local uris
  uris="$( { sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null
             sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
               /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null; } | tr ' ' '\n')"
  grep -E '^(https?|file)://.*/debian/?$' <<<"$uris" | head -1 | sed 's:/$::'
}

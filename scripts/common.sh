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

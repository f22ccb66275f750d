#!/usr/bin/env bash
# The main job on a fresh machine: build rttscope and show the TCP view on a
# real request/response flow between two network namespaces, with the
# client pausing between requests (the delayed-ACK effect of Google Cloud's RTT article:
# the server side's TCP RTT follows the pause, the client side's does not).
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
"$ROOT/scripts/setup.sh"
cargo build --release -q
BIN="$ROOT/target/release/rttscope"
exec "$BIN" lab delayed-ack --quick "$@"

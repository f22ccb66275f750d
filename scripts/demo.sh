#!/usr/bin/env bash
# The main job on a fresh machine: build rttscope and show the TCP view on a
# real request/response flow between two network namespaces, with the
# client pausing between requests (the delayed-ACK effect of Google Cloud's RTT article:
# the server side's TCP RTT follows the pause, the client side's does not).
set -euo pipefail
source "$(dirname "$0")/common.sh"
require_root
cd "$ROOT"
# Only what the demo needs: the compiler toolchain and the lab's network tools.
"$ROOT/scripts/setup.sh" --for demo
# The binary alone, default features (the libbpf loader and the lab), no debug info: the
# `demo` profile of Cargo.toml.
cargo build --profile demo --bin rttscope -q
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/demo/rttscope"
exec "$BIN" lab delayed-ack --quick "$@"

#!/usr/bin/env bash
# Builds commands of kvgate into directory OUT_DIR:
#
#   hack/build.sh OUT_DIR [PACKAGE...]
#
# PACKAGE defaults to ./cmd/..., every command. The one build line of the
# project: `make build` and the Dockerfile both run it, so that a binary built
# here is the binary of the image. The commands use libzmq through cgo
# (github.com/pebbe/zmq4), so cgo is required and the binaries link
# libzmq.so.5 dynamically; -trimpath keeps build paths out of them and -s -w
# drops the symbol tables, which stack traces do not need.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 OUT_DIR [PACKAGE...]" >&2; exit 2; }
out="$1"
shift
[ $# -gt 0 ] || set -- ./cmd/...
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
CGO_ENABLED=1 "${GO:-go}" build -trimpath -ldflags='-s -w' -o "$out/" "$@"

#!/usr/bin/env bash
# Renders a kustomization of config/ to standard output:
#
#   hack/kustomize-build.sh DIR [IMAGE]
#
# DIR is the kustomization's directory (config/default, config/samples/...).
# When IMAGE is given, it replaces the image named kvgate (kvgate:dev in
# config/), through a temporary overlay so that config/ stays untouched.
# kustomize is the version go.mod pins as a tool, built once into Go's cache.
set -euo pipefail

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 DIR [IMAGE]" >&2; exit 2; }
dir="$(cd "$1" && pwd)"
image="${2:-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
kustomize="$(go -C "$root" tool -n kustomize)"

if [ -z "$image" ]; then
  exec "$kustomize" build "$dir"
fi
case "$dir/" in
  "$root"/*) ;;
  *) echo "$0: $1 is not inside $root" >&2; exit 2 ;;
esac
# kustomize accepts only relative paths to other kustomizations, so the
# overlay lives in the repository, beside config/, for the time of the build.
overlay="$(mktemp -d "$root/.kustomize-build.XXXXXX")"
trap 'rm -rf "$overlay"' EXIT
cd "$overlay"
"$kustomize" create --resources "../${dir#"$root"/}"
"$kustomize" edit set image "kvgate=$image"
"$kustomize" build .

#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each (default
# 10s, as make test uses). `go test -fuzz` takes one target of one package at
# a time, so this lists them and runs them one by one; crashers land in
# testdata/fuzz as usual.
# Minimising a new interesting input is capped, or one large seed can stall a
# target for minutes.
#
# Go's fuzz coordinator can report its own -fuzztime deadline as a failure
# ("context deadline exceeded", go.dev/issue/75804, fixed in Go 1.27). Such a
# run found no failing input and fuzzed for its whole time, so it passes with
# a note; any other failure, and every failing input written, fails.
set -euo pipefail
fuzztime="${1:-10s}"
cd "$(dirname "$0")/.."
targets="$(grep -rH --include='*_test.go' -oE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . || true)"
[ -n "$targets" ] || { echo "fuzz: no fuzz targets"; exit 0; }
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
while IFS=: read -r file decl; do
  pkg="./$(dirname "${file#./}")"
  target="${decl#func }"; target="${target%%(*}"
  echo "fuzz: $pkg $target for $fuzztime"
  if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s "$pkg" 2>&1 | tee "$out"; then
    continue
  fi
  if grep -q 'Failing input written to' "$out" || ! grep -q '^    context deadline exceeded$' "$out"; then
    exit 1
  fi
  echo "fuzz: $pkg $target: no failing input; Go reported its own fuzztime deadline (go.dev/issue/75804)"
done <<< "$targets"

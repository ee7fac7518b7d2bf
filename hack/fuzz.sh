#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each (default
# 15s). `go test -fuzz` takes one target of one package at a time, so this
# lists them and runs them one by one; crashers land in testdata/fuzz as usual.
# Minimising a new interesting input is capped, or one large seed can stall a
# target for minutes.
set -euo pipefail
fuzztime="${1:-15s}"
cd "$(dirname "$0")/.."
targets="$(grep -rH --include='*_test.go' -oE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . || true)"
[ -n "$targets" ] || { echo "fuzz: no fuzz targets"; exit 0; }
while IFS=: read -r file decl; do
  pkg="./$(dirname "${file#./}")"
  target="${decl#func }"; target="${target%%(*}"
  echo "fuzz: $pkg $target for $fuzztime"
  go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s "$pkg"
done <<< "$targets"

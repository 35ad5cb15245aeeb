#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each (default 15s).
# go test -fuzz accepts one target per package run, so targets are run one by one.
set -euo pipefail
fuzztime=${1:-15s}
cd "$(dirname "$0")/.."
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  pkg=./$(dirname "${f#./}")
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -d' ' -f2 | while read -r target; do
    echo "fuzz $pkg $target for $fuzztime"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done

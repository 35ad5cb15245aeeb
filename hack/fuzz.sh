#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each (default 15s).
# go test -fuzz accepts one target per package run, so targets are run one by one.
#
# Go's fuzzing engine sometimes ends a run with a bare "context deadline exceeded" when the fuzz
# time runs out while a worker is still busy with an input (a loaded machine makes it likelier).
# Such a run found nothing: a real failure prints "Failing input written to" and leaves the input
# under testdata/fuzz. Only that bare failure is run once more; any other failure fails at once.
set -euo pipefail
fuzztime=${1:-15s}
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fuzz() {
  go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  pkg=./$(dirname "${f#./}")
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -d' ' -f2 | while read -r target; do
    echo "fuzz $pkg $target for $fuzztime"
    if fuzz "$pkg" "$target"; then continue; fi
    if grep -q 'Failing input written to' "$log" || ! grep -q 'context deadline exceeded' "$log"; then
      exit 1
    fi
    echo "fuzz $pkg $target: the engine timed out a worker without finding anything; running it again"
    fuzz "$pkg" "$target"
  done
done

#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each (default 10s).
# go test -fuzz accepts one target per run, so each package's test binary is built once with the
# fuzzing instrumentation (go test -c -fuzz) and run once per target, with the corpus cache that
# go test -fuzz itself uses: linking a binary per target cost about as much as the fuzzing.
#
# Go's fuzzing engine sometimes ends a run with a bare "context deadline exceeded" when the fuzz
# time runs out while a worker is still busy with an input (a loaded machine makes it likelier).
# Such a run found nothing: a real failure prints "Failing input written to" and leaves the input
# under testdata/fuzz. Only that bare failure is run once more; any other failure fails at once.
set -euo pipefail
fuzztime=${1:-10s}
# FUZZ_WORKERS is how many inputs each target runs at once; every CPU by default.
workers=${FUZZ_WORKERS:-$(nproc)}
cd "$(dirname "$0")/.."
module=$(go list -m)
cache=$(go env GOCACHE)/fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/log
# fuzz runs target $3 of the package in directory $1 with its test binary $2, its output in $log.
fuzz() {
  (cd "$1" && "$2" -test.run='^$' -test.fuzz="^$3\$" -test.fuzztime="$fuzztime" -test.parallel="$workers" \
    -test.fuzzcachedir="$cache/$module/${1#./}") > "$log" 2>&1
}
grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u | while read -r pkg; do
  bin=$work/$(echo "${pkg#./}" | tr / _).test
  "${GO:-go}" test -c -vet=off -fuzz . -o "$bin" "$pkg"
  grep -ho '^func Fuzz[A-Za-z0-9_]*' "$pkg"/*_test.go | cut -d' ' -f2 | while read -r target; do
    echo "fuzz $pkg $target for $fuzztime"
    if fuzz "$pkg" "$bin" "$target"; then cat "$log"; continue; fi
    if grep -q 'Failing input written to' "$log" || ! grep -q 'context deadline exceeded' "$log"; then
      cat "$log"
      exit 1
    fi
    # The engine's own FAIL lines would read as a failing test to whoever scans the log.
    sed -e 's/^--- FAIL: /--- engine timeout, not a failure: /' -e 's/^FAIL$/(not a failure)/' "$log"
    echo "fuzz $pkg $target: the engine timed out a worker without finding anything; running it again"
    if ! fuzz "$pkg" "$bin" "$target"; then
      cat "$log"
      exit 1
    fi
    cat "$log"
  done
done

#!/usr/bin/env bash
# Runs every test package, one at a time (-p 1) in each of two groups that run side by side:
#   - the packages named in ENVTEST_PKGS (a space-separated list of go package patterns), which
#     talk only to their own envtest control plane and spend most of their time waiting on it and
#     on their own timeouts (7-50% of this 2-core machine each);
#   - all the others, which boot guests under TCG, run local clusters and build images, and are
#     CPU-bound.
# The second group's output streams as it comes; the first group's is printed after, in one piece,
# so that neither interleaves with the other. Fails when either group fails.
# LIGHT_THEN, when set, is a command the first group's lane runs once its packages pass (make test:
# the bounded fuzzing, with one worker): the first group ends long before the second, and the
# fuzzing would otherwise add its minutes after both. It is CPU-bound: for those minutes it takes
# one CPU from the second group, whose timeouts allow for a busy machine.
# Usage: ENVTEST_PKGS="./controllers/... ./apiserver/..." [LIGHT_THEN=cmd] hack/test-packages.sh [go test flags]
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

if [[ -z ${ENVTEST_PKGS:-} ]]; then
	echo "hack/test-packages.sh: ENVTEST_PKGS is empty; it names the envtest-only packages" >&2
	exit 2
fi
# shellcheck disable=SC2086 # a list of patterns, split on purpose
light=$($GO list $ENVTEST_PKGS) || exit 2
rest=$($GO list ./... | grep -vxF -e "$light") || exit 2

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# shellcheck disable=SC2086
(
	$GO test "$@" $light || exit 1
	if [[ -n ${LIGHT_THEN:-} ]]; then
		echo "--- the envtest-only packages passed; then: $LIGHT_THEN ---"
		bash -c "$LIGHT_THEN" || exit 2
	fi
) >"$log" 2>&1 &
light_pid=$!
# shellcheck disable=SC2086
$GO test "$@" $rest
rest_rc=$?
wait "$light_pid"
light_rc=$?
echo "--- envtest-only packages (run beside the others) ---"
cat "$log"
if ((light_rc == 2)); then
	echo "hack/test-packages.sh: $LIGHT_THEN failed (after the envtest-only packages passed)" >&2
fi
if ((rest_rc != 0 || light_rc != 0)); then
	echo "hack/test-packages.sh: failed (envtest-only packages${LIGHT_THEN:+ then $LIGHT_THEN}: exit $light_rc; the others: exit $rest_rc)" >&2
	exit 1
fi

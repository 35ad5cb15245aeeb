#!/usr/bin/env bash
# The demo on this machine (make run). Until the local cluster exists it brings up a real control
# plane with qvirt's CRDs, applies the samples and says what is still missing.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBEBUILDER_ASSETS=$(hack/build-tools.sh) exec go run ./test/controlplane "$@"

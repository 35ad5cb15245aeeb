#!/usr/bin/env bash
# The demo on this machine (make run): a two-node local cluster in the foreground with the demo VM
# running on it. Ctrl-C powers the guest off and takes the cluster down.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bin/qvirtctl local up --nodes 2 --emulation-if-needed --demo --tools "$(hack/build-tools.sh)" "$@"

#!/usr/bin/env bash
# Builds what a real kubelet node needs besides the control plane: the kubelet and kube-proxy from
# the upstream k8s.io/kubernetes pinned in test/tools/go.mod, and containerd with its runc shim from
# test/tools/containerd/go.mod (a module of its own: containerd's dependency graph and kubernetes'
# need not agree). runc itself is Debian's package (hack/install-deps.sh). The binaries go into a
# cache directory outside the repository keyed by a hash of both modules' go.{mod,sum}, so later
# clones on this machine reuse them. Idempotent and safe to run concurrently (a lock, then a rename).
# Prints the directory holding the binaries on stdout.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/test/tools"
cache="${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}"
key=$(cat "$tools/go.mod" "$tools/go.sum" "$tools/containerd/go.mod" "$tools/containerd/go.sum" \
  | sha256sum | cut -c1-16)
dest="$cache/node/$key"
bins=(kubelet kube-proxy containerd containerd-shim-runc-v2)

complete() { for b in "${bins[@]}"; do [ -x "$dest/$b" ] || return 1; done; }

if complete; then echo "$dest"; exit 0; fi

mkdir -p "$cache/node"
exec 9>"$cache/node/.lock"
flock 9
if complete; then echo "$dest"; exit 0; fi

tmp=$(mktemp -d "$cache/node/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building kubelet, kube-proxy and containerd into $dest (cold: several minutes on 2 cores)" >&2

ver=k8s.io/component-base/version
kver=$(cd "$tools" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kminor=$(echo "$kver" | cut -d. -f2)
(cd "$tools" && go build -trimpath \
  -ldflags "-s -w -X $ver.gitVersion=$kver -X $ver.gitMajor=1 -X $ver.gitMinor=$kminor -X $ver.gitTreeState=clean" \
  -o "$tmp/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy) >&2
t1=$(date +%s)

cver=$(cd "$tools/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
cpkg=github.com/containerd/containerd/v2
(cd "$tools/containerd" && CGO_ENABLED=0 go build -trimpath -tags no_btrfs \
  -ldflags "-s -w -X $cpkg/version.Version=$cver -X $cpkg/version.Package=$cpkg" \
  -o "$tmp/" $cpkg/cmd/containerd $cpkg/cmd/containerd-shim-runc-v2) >&2

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
end=$(date +%s)
echo "built in $(( end - start ))s (kubelet and kube-proxy $(( t1 - start ))s, containerd $(( end - t1 ))s);" \
  "$(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest"

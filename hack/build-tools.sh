#!/usr/bin/env bash
# Builds the control-plane binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl) from the upstream modules pinned in test/tools/go.mod into a cache directory outside the
# repository, keyed by a hash of test/tools/go.{mod,sum}, so later clones on this machine reuse them.
# Idempotent and safe to run concurrently: builders serialise on a lock and the result appears by
# rename. Prints the directory holding the binaries on stdout (what KUBEBUILDER_ASSETS wants).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/test/tools"
cache="${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}"
key=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -c1-16)
dest="$cache/tools/$key"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

complete() { for b in "${bins[@]}"; do [ -x "$dest/$b" ] || return 1; done; }

if complete; then echo "$dest"; exit 0; fi

mkdir -p "$cache/tools"
exec 9>"$cache/tools/.lock"
flock 9
if complete; then echo "$dest"; exit 0; fi

tmp=$(mktemp -d "$cache/tools/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ver=k8s.io/component-base/version
ldflags="-s -w -X $ver.gitVersion=v1.37.2 -X $ver.gitMajor=1 -X $ver.gitMinor=37 -X $ver.gitTreeState=clean"
start=$(date +%s)
cd "$tools"
echo "building control-plane binaries into $dest (cold: 10-15 min on 2 cores)" >&2
go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 >&2
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "built in $(( $(date +%s) - start ))s; $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest"

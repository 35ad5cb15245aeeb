#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, when they are missing. Go modules come
# through the module proxy when `go` builds; the control-plane binaries are built by build-tools.sh.
set -euo pipefail
# mount brings losetup (the launcher test attaches a block claim as a loop device);
# mmdebstrap, dosfstools, mtools and fdisk build the cloud image (test/guest/cloud/build.sh);
# ovmf is the UEFI firmware, sbsigntool and openssl sign the secure-boot test loader.
# runc runs the containers of real kubelet nodes (containerd is built by hack/build-node.sh).
# swtpm emulates the TPM of instances that have one (launcher/tpm.go).
# qemu-guest-agent: its qemu-ga and the libraries it links go into the test guest (test/guest/build.sh).
# passt is the user-mode network of the passt binding (launcher/passt.go).
# usbredirect exports a USB device for qvirtctl usbredir (its test runs it).
pkgs=(qemu-system-x86 qemu-utils ovmf mtools sbsigntool openssl busybox-static iproute2 nftables cpio kmod mount
  mmdebstrap dosfstools fdisk debian-archive-keyring qemu-guest-agent runc swtpm usbredirect passt)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2

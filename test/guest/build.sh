#!/usr/bin/env bash
# Build the qvirt test guest: OUTDIR/vmlinuz and OUTDIR/initrd.img.
#
# usage: test/guest/build.sh [OUTDIR]
#
# The kernel comes from Debian's linux-image-amd64 (the metapackage is resolved
# to the real linux-image-<abi>-amd64 package), the userland from busybox-static.
# Both .debs are fetched with `apt-get download` and unpacked with `dpkg-deb -x`;
# nothing is installed on the host except missing build tools (cpio, gzip, kmod).
# The initramfs files live next to this script in rootfs/ (see README.md).
#
# Default OUTDIR: ${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}/guest
# Environment:
#   QVIRT_GUEST_KERNEL_PKG  kernel package to use instead of resolving
#                           linux-image-amd64 (e.g. linux-image-6.1.0-57-amd64)
#   QVIRT_GUEST_FORCE=1     rebuild even if the outputs are up to date
#
# Caching: nothing is done when OUTDIR/stamp records the hash of this script and
# of rootfs/ (and QVIRT_GUEST_KERNEL_PKG, when set) and both outputs exist. The
# downloaded .debs (OUTDIR/.debs) and the kernel part (OUTDIR/.kernel: vmlinuz
# plus the selected modules) are kept, so editing rootfs/ rebuilds in seconds.
# Concurrent runs serialise on OUTDIR/.lock; outputs are built in a temp dir
# inside OUTDIR and renamed into place, the stamp last.
#
# On success the absolute OUTDIR is printed on stdout (logs go to stderr):
#   dir=$(test/guest/build.sh) && qemu-system-x86_64 -kernel "$dir/vmlinuz" ...
set -euo pipefail

log() { echo "guest/build.sh: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOTFS_SRC=$(dirname "$SELF")/rootfs

OUT=${1:-${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}/guest}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)

# Modules modprobe'd by /init at boot, in this order. Their dependencies are
# added automatically; modules built into the kernel (e.g. af_packet, which
# udhcpc needs) are skipped.
BOOT_MODULES=(
	virtio_pci virtio_net virtio_blk virtio_scsi virtio_console
	e1000 e1000e
	ahci ata_piix sd_mod sr_mod cdrom isofs
	evdev button af_packet
)
# Modules in the image but loaded only on demand (the kernel runs modprobe for
# `mount -t ext4`, for example; tests modprobe the device drivers of the
# devices they attach: the guest has no udev).
EXTRA_MODULES=(ext4 crc32c_generic efivarfs
	virtio_rng virtio_input xhci_pci usbhid hid_generic i6300esb virtiofs
	virtio_balloon snd_hda_intel snd_hda_codec_generic pvpanic_mmio pvpanic_pci virtio_mem)

# Recommended kernel command line, written to OUTDIR/cmdline.
CMDLINE="console=ttyS0 quiet panic=-1"

# The guest agent: the host's qemu-ga (Debian's qemu-guest-agent, which
# hack/install-deps.sh installs) and the shared libraries it links, resolved with
# ldd. They are part of the cache key (inputs_hash), so an upgraded package
# rebuilds the guest.
QEMU_GA=/usr/sbin/qemu-ga
[ -x "$QEMU_GA" ] || die "$QEMU_GA not found: apt-get install qemu-guest-agent (hack/install-deps.sh)"
# ga_files: qemu-ga, its libraries and the dynamic loader, one absolute path a line.
ga_files() {
	echo "$QEMU_GA"
	ldd "$QEMU_GA" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | LC_ALL=C sort -u
}
GA_FILES=$(ga_files) || die "cannot resolve the libraries of $QEMU_GA"

# --- cache check (under the lock) -------------------------------------------------

inputs_hash() {
	{
		sha256sum <"$SELF"
		# shellcheck disable=SC2086 # one path a line, no spaces
		sha256sum $GA_FILES
		cd "$ROOTFS_SRC"
		find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		find . -type f -perm -u+x | LC_ALL=C sort
	} | sha256sum | cut -d' ' -f1
}

exec 9>"$OUT/.lock"
flock -w 1800 9 || die "timed out waiting for $OUT/.lock"

HASH=$(inputs_hash)
up_to_date() {
	[ "${QVIRT_GUEST_FORCE:-0}" = 1 ] && return 1
	[ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ] && [ -f "$OUT/stamp" ] || return 1
	grep -qx "inputs $HASH" "$OUT/stamp" || return 1
	if [ -n "${QVIRT_GUEST_KERNEL_PKG:-}" ]; then
		grep -q "^kernel-pkg $QVIRT_GUEST_KERNEL_PKG " "$OUT/stamp" || return 1
	fi
	return 0
}
if up_to_date; then
	echo "$OUT"
	exit 0
fi

START=$(date +%s)
log "building the test guest in $OUT"

# Leftovers of killed builds (we hold the lock: nobody else is building).
rm -rf "$OUT"/.build.* "$OUT"/.kernel.new.*
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# --- tools --------------------------------------------------------------------------

IS_ROOT=0
[ "$(id -u)" = 0 ] && IS_ROOT=1

APT_UPDATED=0
apt_update() {
	[ "$APT_UPDATED" = 0 ] || return 1
	APT_UPDATED=1
	[ "$IS_ROOT" = 1 ] || die "apt failed, maybe for lack of package lists; apt-get update needs root"
	log "running apt-get update"
	# A failing third-party source must not stop us: retry with whatever was updated.
	apt-get update -q -o DPkg::Lock::Timeout=600 >&2 || log "apt-get update failed; retrying anyway"
}
# apt_retry CMD...: run CMD; if it fails, run apt-get update (once per build) and retry.
apt_retry() {
	"$@" || { apt_update && "$@"; }
}

command -v dpkg-deb >/dev/null || die "dpkg-deb not found (this needs a Debian host)"
command -v apt-get >/dev/null || die "apt-get not found (this needs a Debian host)"
PATH=$PATH:/usr/sbin:/sbin # depmod and modprobe
need=()
command -v cpio >/dev/null || need+=(cpio)
command -v gzip >/dev/null || need+=(gzip)
{ command -v depmod && command -v modprobe; } >/dev/null || need+=(kmod)
if [ ${#need[@]} -gt 0 ]; then
	[ "$IS_ROOT" = 1 ] || die "missing tools; run: apt-get install ${need[*]}"
	log "installing ${need[*]}"
	apt_retry env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o DPkg::Lock::Timeout=600 "${need[@]}" >&2 || die "cannot install ${need[*]}"
fi

# --- packages -----------------------------------------------------------------------

DEBS=$OUT/.debs
mkdir -p "$DEBS"
APT_DL_OPTS=(-q)
[ "$IS_ROOT" = 1 ] && APT_DL_OPTS+=(-o APT::Sandbox::User=root) # OUTDIR may be private to root

# fetch_debs: resolve the kernel package and download the candidate .debs of it and
# busybox-static into $DEBS, unless already there. Writes "PKG VERSION FILE" lines
# to $TMP/debs. Fails when the package lists are missing or stale.
fetch_debs() {
	local kpkg=${QVIRT_GUEST_KERNEL_PKG:-} p v a f
	if [ -z "$kpkg" ]; then
		kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
		[ -n "$kpkg" ] || return 1
	fi
	apt-cache show --no-all-versions "$kpkg" busybox-static >"$TMP/show" 2>/dev/null || return 1
	awk '/^Package:/ {p=$2} /^Version:/ {v=$2} /^Architecture:/ {a=$2}
		/^$/ {if (p) print p, v, a; p=""} END {if (p) print p, v, a}' "$TMP/show" >"$TMP/pkgs"
	: >"$TMP/debs"
	while read -r p v a; do
		f=$DEBS/${p}_${v//:/%3a}_$a.deb
		if [ ! -s "$f" ]; then
			(cd "$DEBS" && apt-get download "${APT_DL_OPTS[@]}" "$p=$v" >&2) || return 1
			[ -s "$f" ] || return 1
		fi
		echo "$p $v $f" >>"$TMP/debs"
	done <"$TMP/pkgs"
	grep -q "^$kpkg " "$TMP/debs" && grep -q "^busybox-static " "$TMP/debs"
}
apt_retry fetch_debs || die "cannot fetch the kernel and busybox-static packages"
read -r KPKG KDEB_VER KDEB < <(grep -v '^busybox-static ' "$TMP/debs")
read -r _ BDEB_VER BDEB < <(grep '^busybox-static ' "$TMP/debs")
log "kernel package: $KPKG $KDEB_VER"

# --- kernel part (cached in $OUT/.kernel) -------------------------------------------

# build_kernel DIR: unpack the kernel .deb and put vmlinuz, kernel-version and
# lib/modules/KVER (only the wanted modules and their dependencies, depmod'ed)
# into DIR, plus etc/modules (the boot modules that are not built in).
build_kernel() {
	local dir=$1 kroot=$TMP/kernel kver m deps kind path rel boot=1 found
	mkdir -p "$kroot" "$dir/etc"
	log "unpacking $(basename "$KDEB")"
	dpkg-deb -x "$KDEB" "$kroot"
	kver=$(ls "$kroot/lib/modules")
	[ -n "$kver" ] && [ "$(echo "$kver" | wc -l)" = 1 ] || die "expected one kernel in $KDEB, found: $kver"
	[ -f "$kroot/boot/vmlinuz-$kver" ] || die "no boot/vmlinuz-$kver in $KDEB"
	cp "$kroot/boot/vmlinuz-$kver" "$dir/vmlinuz"
	echo "$kver" >"$dir/kernel-version"

	log "selecting modules"
	depmod -b "$kroot" "$kver"
	mkdir -p "$dir/lib/modules/$kver"
	cp "$kroot/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$dir/lib/modules/$kver/"
	: >"$dir/etc/modules"
	for m in "${BOOT_MODULES[@]}" -- "${EXTRA_MODULES[@]}"; do
		if [ "$m" = -- ]; then
			boot=0
			continue
		fi
		deps=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m") || die "module $m not found in $kver"
		found=0
		while read -r kind path _; do
			[ "$kind" = insmod ] || continue # "builtin NAME" lines
			rel=${path#"$kroot"}
			rel=${rel#/}
			[ -f "$kroot/$rel" ] || die "module file $rel (for $m) not found"
			mkdir -p "$dir/${rel%/*}"
			[ -f "$dir/$rel" ] || cp "$kroot/$rel" "$dir/$rel"
			found=1
		done <<<"$deps"
		if [ "$found" = 0 ]; then
			log "module $m is built into $kver"
		elif [ "$boot" = 1 ]; then
			echo "$m" >>"$dir/etc/modules"
		fi
	done
	depmod -b "$dir" "$kver"
	rm -rf "$kroot"
}

KKEY=$(
	{
		echo "$KPKG $KDEB_VER"
		echo "${BOOT_MODULES[*]} -- ${EXTRA_MODULES[*]}"
		declare -f build_kernel
	} | sha256sum | cut -d' ' -f1
)
KDIR=$OUT/.kernel
if [ "$(cat "$KDIR/key" 2>/dev/null)" != "$KKEY" ]; then
	new=$(mktemp -d "$OUT/.kernel.new.XXXXXX")
	chmod 755 "$new"
	build_kernel "$new"
	echo "$KKEY" >"$new/key"
	rm -rf "$KDIR"
	mv "$new" "$KDIR"
else
	log "reusing the kernel part in $KDIR"
fi
KVER=$(cat "$KDIR/kernel-version")

# --- initramfs ----------------------------------------------------------------------

ROOT=$TMP/root
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,var/log,root,www,lib,mnt}
chmod 1777 "$ROOT/tmp"
dpkg-deb -x "$BDEB" "$TMP/busybox"
install -m 0755 "$TMP/busybox/bin/busybox" "$ROOT/bin/busybox"
ln -s busybox "$ROOT/bin/sh" # /init installs the other applet links at boot
cp -a "$KDIR/lib/modules" "$ROOT/lib/"
cp "$KDIR/etc/modules" "$ROOT/etc/modules"
cp -a "$ROOTFS_SRC"/. "$ROOT"/
# qemu-ga and its libraries at their host paths (the loader's, /lib64/ld-linux-x86-64.so.2,
# included); cp -L: the image holds the files, not the host's symlinks.
for f in $GA_FILES; do
	mkdir -p "$ROOT/${f%/*}"
	cp -L "$f" "$ROOT/$f"
done
chmod 0755 "$ROOT/init" "$ROOT/bin/tick" "$ROOT/etc/udhcpc.script" "$ROOT/etc/acpi/PWRF/00000080"

log "packing the initramfs"
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) |
	gzip -9n >"$TMP/initrd.img"
cp "$KDIR/vmlinuz" "$TMP/vmlinuz"
echo "$KVER" >"$TMP/kernel-version"
echo "$CMDLINE" >"$TMP/cmdline"
cat >"$TMP/stamp" <<EOF
inputs $HASH
kernel-pkg $KPKG $KDEB_VER
kernel-version $KVER
busybox-static $BDEB_VER
qemu-guest-agent $(dpkg-query -W -f='${Version}' qemu-guest-agent 2>/dev/null || echo unknown)
EOF

# Publish, the stamp last: an interrupted publish is rebuilt next time.
rm -f "$OUT/stamp"
for f in vmlinuz initrd.img kernel-version cmdline stamp; do
	mv -f "$TMP/$f" "$OUT/$f"
done

# Keep only the .debs this build used.
for f in "$DEBS"/*.deb; do
	[ "$f" = "$KDEB" ] || [ "$f" = "$BDEB" ] || rm -f "$f"
done

log "done in $(($(date +%s) - START))s: kernel $KVER, initrd.img $(du -k "$OUT/initrd.img" | cut -f1) KiB"
echo "$OUT"

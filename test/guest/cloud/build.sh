#!/usr/bin/env bash
# Build the qvirt cloud image: a small Debian bookworm disk, OUTDIR/disk.qcow2.
#
# usage: test/guest/cloud/build.sh [OUTDIR]
#
# The root file system is made by mmdebstrap from Debian packages (the cloud kernel,
# systemd, cloud-init, qemu-guest-agent, openssh-server; no docs, man pages, locales or
# recommends) and written into the disk image's ext4 partition with `mkfs.ext4 -d`; the
# EFI system partition is made with mkfs.fat and mtools. Nothing is loop-mounted. The disk
# (GPT, 2 GiB virtual) boots under BIOS (GRUB's boot.img in the MBR, core.img in the BIOS
# boot partition) and UEFI, also with secure boot (Debian's signed shim and GRUB as
# /EFI/BOOT/BOOTX64.EFI, then Debian's signed kernel). Serial console on ttyS0. cloud-init
# looks for NoCloud and ConfigDrive volumes only; SSH host keys are made at first boot.
# See README.md next to this script.
#
# Default OUTDIR: ${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}/cloud
# Environment:
#   QVIRT_CLOUD_APT_UPDATE=1  refresh the package lists first (picks up new Debian
#                             versions, so the image is rebuilt when one changed)
#   QVIRT_CLOUD_FORCE=1       rebuild even if the image is up to date
#
# Package versions come from package lists this script keeps in OUTDIR/.apt (Debian's
# bookworm, bookworm-updates and bookworm-security, whatever the host's own sources are).
# They are fetched once and refreshed only on request or when a pinned version is gone
# from the mirror, so the image stays the same from run to run. The versions chosen for
# the packages named below are pinned and part of the inputs hash.
#
# Caching: nothing is done when OUTDIR/stamp records the hash of this script, of rootfs/
# and of the pinned versions and disk.qcow2 exists. Downloaded .debs are kept in
# OUTDIR/.debs. Concurrent runs serialise on OUTDIR/.lock; the image is built in a temp dir
# inside OUTDIR and renamed into place, the stamp last. Needs root (mmdebstrap writes a
# root-owned tree) and a Debian host with apt.
#
# A build that ran (not a cached run) leaves OUTDIR/build-info beside the stamp, for
# `make bench` to report: "seconds N" (the whole build), "bootstrap ran|reused" (a build
# that reused OUTDIR/.bootstrap was not cold), "debs-cached N" (.debs already downloaded
# when it started) and "rootfs-mib N" (the root tree written into the ext4 partition).
#
# On success the absolute OUTDIR is printed on stdout (logs go to stderr):
#   dir=$(test/guest/cloud/build.sh) && qemu-img info "$dir/disk.qcow2"
set -euo pipefail

log() { echo "cloud/build.sh: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

SELF=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SELF")

OUT=${1:-${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}/cloud}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap builds a root-owned tree)"

SUITE=bookworm
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# Packages in the image besides the minbase variant (essential + required + apt), each
# pinned to the version resolved below. The kernel metapackage is resolved to its
# linux-image-<abi>-cloud-amd64 package, pinned too. grub-pc-bin supplies the BIOS boot
# code and modules; the UEFI path uses Debian's signed binaries (EFI_PACKAGES).
PACKAGES=(
	linux-image-cloud-amd64 initramfs-tools zstd
	systemd systemd-sysv udev dbus
	ifupdown isc-dhcp-client iproute2 netbase ca-certificates
	cloud-init cloud-guest-utils
	qemu-guest-agent openssh-server openssh-sftp-server sudo
	e2fsprogs procps grub-pc-bin mokutil
)
# Signed UEFI boot chain, fetched as .debs and copied onto the ESP, not installed in the
# image: shim-signed's postinst runs grub-install when the build host itself booted with
# UEFI (the chroot sees the host's /sys/firmware/efi), and nothing in the guest runs it.
EFI_PACKAGES=(shim-signed shim-helpers-amd64-signed grub-efi-amd64-signed)

# What dpkg leaves out of the image (Debian's usual list for minimal images); copyright
# files stay.
DPKG_EXCLUDES=(
	'path-exclude=/usr/share/man/*'
	'path-exclude=/usr/share/info/*'
	'path-exclude=/usr/share/doc/*'
	'path-include=/usr/share/doc/*/copyright'
	'path-exclude=/usr/share/locale/*'
	'path-include=/usr/share/locale/locale.alias'
	# cloud-init depends on locales; the image uses C.UTF-8, which glibc has built in.
	'path-exclude=/usr/share/i18n/charmaps/*'
	'path-exclude=/usr/share/i18n/locales/*'
	'path-exclude=/usr/share/lintian/*'
	'path-exclude=/usr/share/linda/*'
	'path-exclude=/usr/share/groff/*'
)

# Disk layout, in 512-byte sectors (Debian's cloud images use the same partition
# numbers: the root is partition 1 and last on the disk, so growpart can grow it).
DISK_MIB=2048
BIOS_START=2048 BIOS_SECTORS=2048  # p14: BIOS boot, 1 MiB, holds GRUB's core.img
ESP_START=4096 ESP_SECTORS=126976  # p15: EFI system partition, FAT32, 62 MiB
ROOT_START=131072                  # p1: ext4 root, 64 MiB to the end of the disk
# Fixed identifiers: the image is the same from build to build, like a published image.
DISK_GUID=8d2a47a4-3c5f-4d6e-9b1a-7171766972a0
ROOT_UUID=4f1c9a5e-6b7d-4e2f-8a3c-7171766972a1
ROOT_PARTUUID=4f1c9a5e-6b7d-4e2f-8a3c-7171766972a2
ESP_PARTUUID=4f1c9a5e-6b7d-4e2f-8a3c-7171766972a3
BIOS_PARTUUID=4f1c9a5e-6b7d-4e2f-8a3c-7171766972a4
ESP_VOLID=71766972 # shows as UUID 7176-6972
CMDLINE="console=tty0 console=ttyS0,115200n8"

# --- package lists (OUTDIR/.apt) and pinned versions --------------------------------

APTDIR=$OUT/.apt
APT_CONFIG_FILE=$APTDIR/apt.conf
SOURCES=$APTDIR/sources.list

exec 9>"$OUT/.lock"
flock -w 3600 9 || die "timed out waiting for $OUT/.lock"

command -v apt-get >/dev/null || die "apt-get not found (this needs a Debian host)"
[ -f "$KEYRING" ] || die "$KEYRING not found; apt-get install debian-archive-keyring"

mkdir -p "$APTDIR"/{state/lists/partial,cache/archives/partial,sources.list.d,preferences.d}
: >>"$APTDIR/state/status"
cat >"$SOURCES.new" <<EOF
deb [signed-by=$KEYRING] http://deb.debian.org/debian $SUITE main
deb [signed-by=$KEYRING] http://deb.debian.org/debian $SUITE-updates main
deb [signed-by=$KEYRING] http://deb.debian.org/debian-security $SUITE-security main
EOF
cat >"$APT_CONFIG_FILE.new" <<EOF
Dir::State "$APTDIR/state/";
Dir::State::status "$APTDIR/state/status";
Dir::Cache "$APTDIR/cache/";
Dir::Etc::SourceList "$SOURCES";
Dir::Etc::SourceParts "$APTDIR/sources.list.d/";
Dir::Etc::PreferencesParts "$APTDIR/preferences.d/";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
// The host's apt.conf.d still applies (a proxy, say); appstream's metadata is not needed.
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled "false";
EOF
for f in "$SOURCES" "$APT_CONFIG_FILE"; do
	cmp -s "$f.new" "$f" && rm "$f.new" || mv "$f.new" "$f"
done
# aptc APT-COMMAND ARGS...: run apt with the lists above. The binary caches are named on the
# command line because Debian's container images turn them off in apt.conf.d (docker-clean),
# which apt reads after APT_CONFIG; without them every run parses the lists anew (1 s each).
aptc() {
	APT_CONFIG=$APT_CONFIG_FILE "$1" -o Dir::Cache::pkgcache=pkgcache.bin \
		-o Dir::Cache::srcpkgcache=srcpkgcache.bin "${@:2}"
}

APT_UPDATED=0
apt_update() {
	[ "$APT_UPDATED" = 0 ] || return 1
	APT_UPDATED=1
	log "updating the package lists in $APTDIR"
	aptc apt-get update -q >&2 || die "apt-get update (for $SUITE) failed"
}

# resolve FILE: write "PKG VERSION" for every package the image is made of: the candidate
# versions, read from apt's binary cache (apt-cache show would read the lists themselves).
resolve() {
	local kpkg
	kpkg=$(aptc apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | head -n1)
	[ -n "$kpkg" ] || return 1
	aptc apt-cache policy "${PACKAGES[@]}" "$kpkg" "${EFI_PACKAGES[@]}" 2>/dev/null |
		awk '/^[^ ]/ {p=$1; sub(/:$/, "", p)} /^  Candidate: / && $2 != "(none)" {print p, $2}' >"$1" || return 1
	[ "$(wc -l <"$1")" = $((${#PACKAGES[@]} + 1 + ${#EFI_PACKAGES[@]})) ]
}

# efi_deb PKG: the downloaded .deb of PKG at its pinned version ("" if there is none).
efi_deb() {
	local v
	v=$(awk -v p="$1" '$1 == p {print $2}' "$VERSIONS")
	compgen -G "$DEBS/${1}_${v//:/%3a}_*.deb" | head -n1 || true
}

VERSIONS=$OUT/.versions
[ "${QVIRT_CLOUD_APT_UPDATE:-0}" = 1 ] && apt_update
resolve "$VERSIONS" || { apt_update && resolve "$VERSIONS"; } ||
	die "cannot resolve the packages (${PACKAGES[*]} ${EFI_PACKAGES[*]}) in $SUITE"

inputs_hash() {
	{
		sha256sum <"$SELF"
		cd "$HERE/rootfs"
		find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		find . -type f -perm -u+x | LC_ALL=C sort
		cat "$VERSIONS"
	} | sha256sum | cut -d' ' -f1
}
HASH=$(inputs_hash)
if [ "${QVIRT_CLOUD_FORCE:-0}" != 1 ] && [ -s "$OUT/disk.qcow2" ] && [ -f "$OUT/stamp" ] &&
	grep -qx "inputs $HASH" "$OUT/stamp"; then
	echo "$OUT"
	exit 0
fi

START=$(date +%s)
log "building the cloud image in $OUT"
# Leftovers of killed builds (we hold the lock: nobody else is building).
rm -rf "$OUT"/.build.*
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# --- tools --------------------------------------------------------------------------

PATH=$PATH:/usr/sbin:/sbin
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mkfs.fat >/dev/null || need+=(dosfstools)
command -v mcopy >/dev/null || need+=(mtools)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v qemu-img >/dev/null || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o DPkg::Lock::Timeout=600 "${need[@]}" >&2 ||
		{ apt-get update -q -o DPkg::Lock::Timeout=600 >&2 &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
				-o DPkg::Lock::Timeout=600 "${need[@]}" >&2; } ||
		die "cannot install ${need[*]}"
fi

# --- the root file system -----------------------------------------------------------

DEBS=$OUT/.debs
mkdir -p "$DEBS"

# fetch_efi: download the signed boot chain .debs (pinned) into $DEBS.
fetch_efi() {
	local p
	for p in "${EFI_PACKAGES[@]}"; do
		[ -n "$(efi_deb "$p")" ] && continue
		(cd "$DEBS" && aptc apt-get download -q "$p=$(awk -v p="$p" '$1 == p {print $2}' "$VERSIONS")" >&2) || return 1
		[ -n "$(efi_deb "$p")" ] || return 1
	done
}

# bootstrap DIR: run mmdebstrap into DIR with the pinned versions. The package lists and
# the cached .debs are hard-linked in (so mmdebstrap neither updates the lists nor
# downloads what it has), and the .debs it downloaded are linked back out. /usr is merged
# the way debootstrap (and so Debian's own images) does it, with mmdebstrap's hook: the
# usrmerge package would pull in perl, 40 MB.
bootstrap() {
	local dir=$1 include p opts=()
	include=$(grep -v -e "^shim-" -e "^grub-efi-" "$VERSIONS" | awk '{printf "%s%s=%s", (NR > 1 ? "," : ""), $1, $2}')
	for p in "${DPKG_EXCLUDES[@]}"; do
		opts+=("--dpkgopt=$p")
	done
	rm -rf "$dir"
	mkdir "$dir"
	# The hooks read these (mmdebstrap keeps the environment).
	export QVIRT_CLOUD_LISTS=$APTDIR/state/lists QVIRT_CLOUD_DEBS=$DEBS QVIRT_CLOUD_FSTAB=$TMP/fstab
	mmdebstrap --mode=unshare --variant=minbase --format=directory \
		--aptopt='Acquire::Languages "none"' "${opts[@]}" \
		--include="$include" \
		--skip=update --skip=essential/unlink \
		--setup-hook='mkdir -p "$1/var/lib/apt/lists" "$1/var/cache/apt/archives" &&
			find "$QVIRT_CLOUD_LISTS" -maxdepth 1 -type f \( -name "*Packages*" -o -name "*Release*" \) -exec cp -l -t "$1/var/lib/apt/lists/" {} + &&
			find "$QVIRT_CLOUD_DEBS" -maxdepth 1 -name "*.deb" -exec cp -l -t "$1/var/cache/apt/archives/" {} +' \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--essential-hook='cp "$QVIRT_CLOUD_FSTAB" "$1/etc/fstab" && mkdir -p "$1/etc/initramfs-tools/conf.d" &&
			echo RESUME=none >"$1/etc/initramfs-tools/conf.d/resume" &&
			echo FSTYPE=ext4 >"$1/etc/initramfs-tools/conf.d/fstype"' \
		--customize-hook='find "$1/var/cache/apt/archives" -maxdepth 1 -name "*.deb" -exec cp -l -f -t "$QVIRT_CLOUD_DEBS/" {} +' \
		"$SUITE" "$dir" "$SOURCES" >&2
}

apt_retry() { "$@" || { apt_update && resolve "$VERSIONS" && HASH=$(inputs_hash) && "$@"; }; }
apt_retry fetch_efi || die "cannot download ${EFI_PACKAGES[*]}"

# The fstab is in place before the packages are installed. initramfs-tools is told the root's
# type (FSTYPE) and that there is no swap to resume from (RESUME): in a chroot it cannot probe
# the root device, and would leave fsck out of the initrd. The ESP has no fsck (no dosfstools).
cat >"$TMP/fstab" <<EOF
UUID=$ROOT_UUID / ext4 rw,discard,errors=remount-ro 0 1
UUID=${ESP_VOLID:0:4}-${ESP_VOLID:4:4} /boot/efi vfat umask=0077,nofail 0 0
EOF

# The bootstrapped tree is kept in OUTDIR/.bootstrap (about 400 MB) while its inputs stay
# the same, so a change to the configuration below rebuilds in a minute.
bootstrap_key() {
	{
		cat "$VERSIONS" "$TMP/fstab"
		printf '%s\n' "${DPKG_EXCLUDES[@]}"
		declare -f bootstrap
	} | sha256sum | cut -d' ' -f1
}
BDIR=$OUT/.bootstrap
DEBS_CACHED=$(find "$DEBS" -maxdepth 1 -name '*.deb' | wc -l)
BOOTSTRAP=reused
if [ "$(cat "$BDIR.key" 2>/dev/null)" != "$(bootstrap_key)" ]; then
	BOOTSTRAP=ran
	rm -f "$BDIR.key"
	log "running mmdebstrap (the first build downloads about 110 MB)"
	apt_retry bootstrap "$BDIR" || die "mmdebstrap failed"
	bootstrap_key >"$BDIR.key"
else
	log "reusing the bootstrapped tree in $BDIR"
fi
ROOT=$TMP/root
cp -a "$BDIR" "$ROOT"

KVER=$(ls "$ROOT/lib/modules")
[ -n "$KVER" ] && [ "$(echo "$KVER" | wc -l)" = 1 ] || die "expected one kernel in the image, found: $KVER"
[ -e "$ROOT/vmlinuz" ] && [ -e "$ROOT/initrd.img" ] || die "no /vmlinuz or /initrd.img symlink in the image"
dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f '${Package} ${Version}\n' >"$TMP/packages"

# --- configuration ------------------------------------------------------------------

cp -a "$HERE/rootfs/." "$ROOT/"
# Host keys are made at first boot (cloud-init, or ssh.service's fallback), never shipped.
rm -f "$ROOT"/etc/ssh/ssh_host_*
rm -f "$ROOT/etc/resolv.conf"
cp "$TMP/fstab" "$ROOT/etc/fstab"
mkdir -p "$ROOT/boot/efi"

# One grub.cfg for both firmwares: BIOS GRUB (core.img) and the signed UEFI GRUB (through
# /EFI/debian/grub.cfg on the ESP) both end up here. /vmlinuz and /initrd.img are the
# symlinks the kernel package maintains, so a kernel upgrade in the guest keeps booting.
mkdir -p "$ROOT/boot/grub/i386-pc"
cat >"$ROOT/boot/grub/grub.cfg" <<EOF
set default=0
set timeout=1
if [ "\$grub_platform" = pc ]; then
	serial --unit=0 --speed=115200
	terminal_input serial console
	terminal_output serial console
fi
menuentry 'Debian GNU/Linux 12 (bookworm), qvirt cloud image' {
	search --no-floppy --fs-uuid --set=root $ROOT_UUID
	linux /vmlinuz root=UUID=$ROOT_UUID ro $CMDLINE
	initrd /initrd.img
}
EOF
# What grub-install would copy: the modules BIOS GRUB loads from /boot/grub.
cp "$ROOT"/usr/lib/grub/i386-pc/*.mod "$ROOT"/usr/lib/grub/i386-pc/*.lst "$ROOT/boot/grub/i386-pc/"
# core.img, made with the image's own grub-mkimage: find the root by UUID, then load
# normal.mod and grub.cfg from it.
cat >"$ROOT/tmp/early.cfg" <<EOF
search.fs_uuid $ROOT_UUID root
set prefix=(\$root)/boot/grub
EOF
chroot "$ROOT" grub-mkimage -O i386-pc -o /tmp/core.img -c /tmp/early.cfg -p /boot/grub \
	biosdisk part_gpt ext2 search_fs_uuid
mv "$ROOT/tmp/core.img" "$TMP/core.img"
cp "$ROOT/usr/lib/grub/i386-pc/boot.img" "$TMP/boot.img"
rm -rf "${ROOT:?}"/tmp/* "${ROOT:?}"/var/tmp/* "${ROOT:?}"/var/log/*.log "${ROOT:?}"/var/cache/debconf/*-old

# --- the signed UEFI boot chain ------------------------------------------------------

EFI=$TMP/efi
mkdir -p "$EFI/x"
for p in "${EFI_PACKAGES[@]}"; do
	dpkg-deb -x "$(efi_deb "$p")" "$EFI/x"
done
# shim is the removable-media path's loader; it loads grubx64.efi (and mmx64.efi, MOK
# manager, when needed) from its own directory. No fbx64.efi: without it shim boots GRUB
# directly instead of creating boot entries first. Debian's signed GRUB reads
# /EFI/debian/grub.cfg on the partition it came from.
cat >"$EFI/grub.cfg" <<EOF
search.fs_uuid $ROOT_UUID root
set prefix=(\$root)'/boot/grub'
configfile \$prefix/grub.cfg
EOF

# --- the disk -----------------------------------------------------------------------

RAW=$TMP/disk.raw
truncate -s "${DISK_MIB}M" "$RAW"
# The "<device>N :" prefixes number the partitions (sfdisk's dump format).
sfdisk -q --no-reread --no-tell-kernel "$RAW" >&2 <<EOF
label: gpt
label-id: $DISK_GUID
first-lba: 2048
${RAW}1 : start=$ROOT_START, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, uuid=$ROOT_PARTUUID, name=root
${RAW}14 : start=$BIOS_START, size=$BIOS_SECTORS, type=21686148-6449-6E6F-744E-656564454649, uuid=$BIOS_PARTUUID, name=bios
${RAW}15 : start=$ESP_START, size=$ESP_SECTORS, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, uuid=$ESP_PARTUUID, name=esp
EOF
ROOT_SECTORS=$(sfdisk -l -o Start,Sectors "$RAW" | awk -v s=$ROOT_START '$1 == s {print $2}')
[ -n "$ROOT_SECTORS" ] || die "sfdisk did not create the root partition: $(sfdisk -l "$RAW")"

log "writing the ESP"
# (With --offset, mkfs.fat warns that the file is bigger than the file system: it is.)
out=$(mkfs.fat -F 32 -s 1 -n ESP -i "$ESP_VOLID" --offset "$ESP_START" "$RAW" $((ESP_SECTORS / 2)) 2>&1) ||
	die "mkfs.fat: $out"
M="$RAW@@$((ESP_START * 512))"
mmd -i "$M" ::/EFI ::/EFI/BOOT ::/EFI/debian
mcopy -i "$M" "$EFI/x/usr/lib/shim/shimx64.efi.signed" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$M" "$EFI/x/usr/lib/shim/mmx64.efi.signed" ::/EFI/BOOT/mmx64.efi
mcopy -i "$M" "$EFI/x/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed" ::/EFI/BOOT/grubx64.efi
mcopy -i "$M" "$EFI/grub.cfg" ::/EFI/debian/grub.cfg

ROOT_MIB=$(du -sm "$ROOT" | cut -f1)
log "writing the root file system ($ROOT_MIB MiB)"
# lazy_itable_init=0: the inode tables are zeroed here (sparsely), not by the guest kernel
# on every boot of an ephemeral copy.
mkfs.ext4 -q -F -L root -U "$ROOT_UUID" -d "$ROOT" \
	-E "offset=$((ROOT_START * 512)),lazy_itable_init=0,lazy_journal_init=0,nodiscard" \
	"$RAW" $((ROOT_SECTORS / 2))k >&2

# BIOS boot, as grub-bios-setup would do it: core.img at the start of the BIOS boot
# partition, its first sector's block list pointing at the rest; boot.img's code (not the
# partition table) in the MBR, pointing at core.img's first sector.
le64() { printf "$(printf '\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)) 0 0 0 0)"; }
u16at() { od -An -tu2 -j "$2" -N2 "$1" | tr -d ' '; }
CORE_SECTORS=$((($(stat -c %s "$TMP/core.img") + 511) / 512))
[ "$CORE_SECTORS" -le "$BIOS_SECTORS" ] || die "core.img ($CORE_SECTORS sectors) does not fit the BIOS boot partition"
# grub-mkimage leaves the block list at "start 2, length CORE_SECTORS-1, segment 0x820".
[ "$(u16at "$TMP/core.img" 500)" = 2 ] && [ "$(u16at "$TMP/core.img" 508)" = $((CORE_SECTORS - 1)) ] ||
	die "unexpected block list in core.img (GRUB's layout changed?)"
[ "$(od -An -tx1 -j 102 -N1 "$TMP/boot.img" | tr -d ' ')" = eb ] || die "unexpected boot.img (GRUB's layout changed?)"
dd if="$TMP/core.img" of="$RAW" bs=512 seek=$BIOS_START conv=notrunc status=none
le64 $((BIOS_START + 1)) | dd of="$RAW" bs=1 seek=$((BIOS_START * 512 + 500)) conv=notrunc status=none
dd if="$TMP/boot.img" of="$RAW" bs=440 count=1 conv=notrunc status=none
le64 $BIOS_START | dd of="$RAW" bs=1 seek=$((0x5c)) conv=notrunc status=none
printf '\xff' | dd of="$RAW" bs=1 seek=$((0x64)) conv=notrunc status=none     # boot drive: the one the BIOS says
printf '\x90\x90' | dd of="$RAW" bs=1 seek=$((0x66)) conv=notrunc status=none # hard disk: no floppy probe

log "compressing disk.qcow2"
qemu-img convert -f raw -O qcow2 -c -o cluster_size=65536 "$RAW" "$TMP/disk.qcow2"
rm -f "$RAW"

cat >"$TMP/stamp" <<EOF
inputs $HASH
kernel-version $KVER
root-uuid $ROOT_UUID
cmdline root=UUID=$ROOT_UUID ro $CMDLINE
$(sed 's/^/pin /' "$VERSIONS")
EOF

cat >"$TMP/build-info" <<EOF
seconds $(($(date +%s) - START))
bootstrap $BOOTSTRAP
debs-cached $DEBS_CACHED
rootfs-mib $ROOT_MIB
EOF

# Publish, the stamp last: an interrupted publish is rebuilt next time.
rm -f "$OUT/stamp"
mv -f "$TMP/packages" "$OUT/packages"
mv -f "$TMP/build-info" "$OUT/build-info"
mv -f "$TMP/disk.qcow2" "$OUT/disk.qcow2"
mv -f "$TMP/stamp" "$OUT/stamp"

# Keep only the .debs this build used.
cat "$OUT/packages" "$VERSIONS" | while read -r p v _; do echo "${p}_${v//:/%3a}_"; done >"$TMP/keep"
for f in "$DEBS"/*.deb; do
	n=$(basename "$f")
	grep -qxF "${n%_*.deb}_" "$TMP/keep" || rm -f "$f"
done

log "done in $(($(date +%s) - START))s: kernel $KVER, $(grep -c . "$OUT/packages") packages, disk.qcow2 $(du -m "$OUT/disk.qcow2" | cut -f1) MiB"
echo "$OUT"

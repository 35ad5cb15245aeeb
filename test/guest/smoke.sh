#!/usr/bin/env bash
# Boot the test guest under QEMU/TCG and check the console protocol end to end:
# QVIRT-GUEST-READY, a virtio-blk qcow2 disk as /dev/vda (and ext4 on it, which
# loads ext4.ko on demand), a DHCP lease over virtio-net user networking
# (QVIRT-IP), httpd reachable through a host port forward, `tick 3` from the
# shell, and ACPI power-off via QMP system_powerdown (QEMU must exit with 0).
#
# usage: test/guest/smoke.sh [OUTDIR]   (OUTDIR as for build.sh; built if needed)
# Needs bash, qemu-system-x86_64 and qemu-img; curl for the host-side HTTP check.
set -euo pipefail

HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
GUEST=$("$HERE/build.sh" "$@")
CMDLINE="$(cat "$GUEST/cmdline") qvirt.hostname=smoke-guest"

W=$(mktemp -d)
QPID=
cleanup() {
	[ -n "$QPID" ] && kill "$QPID" 2>/dev/null || true
	[ -n "${CATPID:-}" ] && kill "$CATPID" 2>/dev/null || true
	rm -rf "$W"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	echo "--- serial console ---" >&2
	tr -d '\r' <"$W/console.log" >&2 || true
	exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

# wait_for REGEX TIMEOUT: wait until a console line (CR stripped) matches REGEX.
wait_for() {
	local deadline=$((SECONDS + $2))
	while [ $SECONDS -lt $deadline ]; do
		tr -d '\r' <"$W/console.log" | grep -qE "$1" && return 0
		[ -n "$QPID" ] && ! kill -0 "$QPID" 2>/dev/null && fail "QEMU exited while waiting for /$1/"
		sleep 0.2
	done
	fail "timed out after $2s waiting for /$1/"
}
# send LINE: type LINE on the serial console.
send() { printf '%s\n' "$1" >"$W/serial.in"; }

qemu-img create -q -f qcow2 "$W/disk.qcow2" 64M
mkfifo "$W/serial.in" "$W/serial.out" "$W/qmp.in" "$W/qmp.out"
: >"$W/console.log"
cat "$W/serial.out" >>"$W/console.log" &
CATPID=$!
PORT=$((20000 + RANDOM % 20000))

T0=$(now)
qemu-system-x86_64 -machine q35,accel=tcg -m 256 -nodefaults -no-user-config -display none \
	-kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" -append "$CMDLINE" \
	-chardev pipe,id=ser0,path="$W/serial" -serial chardev:ser0 \
	-chardev pipe,id=qmp0,path="$W/qmp" -mon chardev=qmp0,mode=control \
	-drive file="$W/disk.qcow2",if=none,id=d0,format=qcow2 -device virtio-blk-pci,drive=d0 \
	-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:80 -device virtio-net-pci,netdev=n0 &
QPID=$!
# QMP replies are not needed; keep the pipe drained.
cat "$W/qmp.out" >"$W/qmp.log" &

wait_for '^QVIRT-GUEST-READY$' 120
echo "ok: QVIRT-GUEST-READY after $(since "$T0")s"
wait_for '^QVIRT-IP eth0 [0-9.]+$' 60
echo "ok: $(tr -d '\r' <"$W/console.log" | grep -m1 '^QVIRT-IP ') after $(since "$T0")s"
wait_for 'smoke-guest:.*# ' 30

# Command echo contains the expressions unevaluated, so match on the results.
send 'test -b /dev/vda && echo VDA-$((40+2))'
wait_for '^VDA-42$' 30
echo "ok: /dev/vda"
send 'mke2fs /dev/vda >/dev/null && mount -t ext4 /dev/vda /mnt && echo hi >/mnt/f && umount /mnt && echo EXT4-$((40+2))'
wait_for '^EXT4-42$' 60
echo "ok: ext4 on /dev/vda"
send 'wget -qO- http://10.0.2.2:1/ >/dev/null 2>&1; echo GW-$((40+2)) $(cat /etc/resolv.conf | grep -c nameserver)'
wait_for '^GW-42 [1-9]' 30
echo "ok: resolv.conf has a nameserver"

if command -v curl >/dev/null; then
	body=$(curl -fsS --max-time 30 "http://127.0.0.1:$PORT/") || fail "curl http://127.0.0.1:$PORT/ failed"
	[ "$body" = smoke-guest ] || fail "httpd returned '$body', want 'smoke-guest'"
	echo "ok: httpd serves the hostname"
fi

send 'tick 3'
wait_for '^tick 3$' 30
tr -d '\r' <"$W/console.log" | grep -qx 'tick 1' && tr -d '\r' <"$W/console.log" | grep -qx 'tick 2' ||
	fail "missing tick 1/tick 2"
echo "ok: tick 3"

T1=$(now)
printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"system_powerdown"}' >"$W/qmp.in"
for _ in $(seq 600); do
	kill -0 "$QPID" 2>/dev/null || break
	sleep 0.1
done
kill -0 "$QPID" 2>/dev/null && fail "QEMU still running 60s after system_powerdown"
rc=0
wait "$QPID" || rc=$?
QPID=
[ "$rc" = 0 ] || fail "QEMU exited with $rc"
echo "ok: system_powerdown -> guest powered off, QEMU exited 0 after $(since "$T1")s"
echo "PASS (total $(since "$T0")s)"

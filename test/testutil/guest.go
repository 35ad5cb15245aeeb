package testutil

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// GuestDir builds the test guest with test/guest/build.sh (cached: instant after the first build)
// and returns the directory holding vmlinuz and initrd.img. It also checks that QEMU is installed,
// since every caller boots the guest. Call it from TestMain; the error says what to do.
func GuestDir() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "guest", "build.sh")
	out, err := exec.Command(script).Output()
	if err != nil {
		return "", fmt.Errorf("build the test guest with test/guest/build.sh: %w", err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "", fmt.Errorf("qemu-system-x86_64 not found: install qemu-system-x86 (make deps)")
	}
	return strings.TrimSpace(string(out)), nil
}

// CloudImageDir builds the cloud image with test/guest/cloud/build.sh (cached; the first build
// takes several minutes and needs root and the network) and returns the directory holding
// disk.qcow2. Like GuestDir it checks that QEMU is installed; call it from TestMain.
func CloudImageDir() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "guest", "cloud", "build.sh")
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr // a cold build is long: show its progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the cloud image with test/guest/cloud/build.sh: %w", err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "", fmt.Errorf("qemu-system-x86_64 not found: install qemu-system-x86 (make deps)")
	}
	return strings.TrimSpace(string(out)), nil
}

// CloudGuestsAtOnce is how many cloud guests a package boots at once (its parallel tests) unless
// -test.parallel says otherwise: a cloud boot under emulation is largely the guest waiting on
// emulated devices and timers, so three booting together on two cores finish about a minute
// sooner than go test's default (GOMAXPROCS, two here) lets them. Call it after flag.Parse.
func CloudGuestsAtOnce() {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", fmt.Sprint(max(3, runtime.GOMAXPROCS(0))))
	}
}

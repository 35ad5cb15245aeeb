package testutil

import (
	"fmt"
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

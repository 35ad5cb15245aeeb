package provider

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLoopDevicesRecordedAndDetached: a block claim's file is attached to a loop device the pod
// records, and a crashed run's Cleanup (which finds only the record) detaches it.
func TestLoopDevicesRecordedAndDetached(t *testing.T) {
	state := t.TempDir()
	podDir := filepath.Join(PodsDir(state), "11111111-2222-3333-4444-555555555555")
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "block.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 8<<20); err != nil {
		t.Fatal(err)
	}
	dev, rdev, err := attachLoop(file, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = detachLoop(dev, file) })
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil || st.Rdev != rdev || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Fatalf("%s: %v, rdev %d, want the block device %d", dev, err, st.Rdev, rdev)
	}
	backing := func() string {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		return strings.TrimSpace(string(b))
	}
	if got := backing(); got != file {
		t.Fatalf("%s is backed by %q, want %s", dev, got, file)
	}
	if err := recordLoop(podDir, dev, file); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(state); err != nil {
		t.Fatal(err)
	}
	if got := backing(); got != "" {
		t.Errorf("%s still backed by %q after Cleanup", dev, got)
	}
}

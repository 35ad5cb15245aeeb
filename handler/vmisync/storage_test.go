package vmisync

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// TestPrepareHostDisk plays the node agent readying host disk images for a launcher whose root is
// this process's: a DiskOrCreate image is created (with its directories) at its size and given to
// the launcher's user; an existing one is given over too; a link, a hard link or a linked
// directory under the host disk directory is refused, and what it points to is left as it was.
func TestPrepareHostDisk(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("the node agent runs as root, and so must this test (chown)")
	}
	root := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim.img")
	if err := os.WriteFile(victim, []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "existing.img"), make([]byte, 4096), 0o644))
	must(os.Symlink(victim, filepath.Join(root, "link.img")))
	must(os.Symlink(outside, filepath.Join(root, "linkdir")))
	must(os.Link(victim, filepath.Join(root, "hard.img")))
	peer := launcher.Peer{PID: os.Getpid(), UID: 107, GID: 107}
	hf := func(rel string, create int64) *machine.HostFile {
		return &machine.HostFile{Path: filepath.Join(root, rel), Root: root, Format: "raw", CreateBytes: create}
	}

	must(prepareHostDisk(peer, hf("vms/a/new.img", 8<<20)))
	owned := func(rel string, size int64) {
		t.Helper()
		st, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != 107 || sys.Gid != 107 || st.Size() != size {
			t.Errorf("%s: owner %d:%d size %d, want 107:107 and %d bytes", rel, sys.Uid, sys.Gid, st.Size(), size)
		}
	}
	owned("vms/a/new.img", 8<<20)
	must(prepareHostDisk(peer, hf("existing.img", 0)))
	owned("existing.img", 4096)
	// A second start finds the image it created and leaves its content alone.
	must(os.WriteFile(filepath.Join(root, "vms/a/new.img"), []byte("data"), 0o600))
	must(prepareHostDisk(peer, hf("vms/a/new.img", 8<<20)))
	owned("vms/a/new.img", 4)

	for name, tc := range map[string]struct {
		hf   *machine.HostFile
		want string
	}{
		"a link to a file elsewhere":    {hf("link.img", 0), "open " + root + "/link.img"},
		"a link, to be created through": {hf("link.img", 1<<20), "open " + root + "/link.img"},
		"a linked directory":            {hf("linkdir/victim.img", 0), "directory linkdir"},
		"a linked directory, creating":  {hf("linkdir/new.img", 1<<20), "directory linkdir"},
		"a hard link":                   {hf("hard.img", 0), "is not a regular file with one link"},
		"a missing image":               {hf("missing.img", 0), "no such file"},
		"a path outside the root":       {&machine.HostFile{Path: victim, Root: root}, "is not under"},
	} {
		t.Run(name, func(t *testing.T) {
			err := prepareHostDisk(peer, tc.hf)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
	st, err := os.Stat(victim)
	must(err)
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 0 || st.Size() != int64(len("someone else's")) {
		t.Errorf("the file behind the links was changed: owner %d, size %d", sys.Uid, st.Size())
	}
	if _, err := os.Stat(filepath.Join(outside, "new.img")); err == nil {
		t.Errorf("an image was created through the linked directory")
	}
}

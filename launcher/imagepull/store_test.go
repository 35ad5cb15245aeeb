package imagepull

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func pushFiles(t *testing.T, ref string, files map[string][]byte) {
	t.Helper()
	img, err := crane.Image(files)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

// The store cleans what a crash left, keeps under its cap by evicting the least recently used
// image no lease holds, and never evicts one in use.
func TestStoreLeftoversAndEviction(t *testing.T) {
	srv := httptest.NewServer(ggcr.New())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, n := range []string{"a", "b", "c"} {
		pushFiles(t, addr+"/img/"+n+":1", map[string][]byte{"disk/" + n + ".img": make([]byte, 1000)})
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp-123", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(StoreOptions{Dir: dir, Insecure: []string{addr}, MaxBytes: 2500})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tmp-123")); !os.IsNotExist(err) {
		t.Errorf("leftover tmp-123 still there after OpenStore: %v", err)
	}
	ctx := context.Background()
	get := func(n string) *Lease {
		t.Helper()
		l, err := s.Acquire(ctx, addr+"/img/"+n+":1", PullIfNotPresent, nil)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	held := get("a")
	b := get("b")
	b.Release()
	c := get("c") // 3000 bytes > 2500: b, idle and older than c, goes; a is held
	defer c.Release()
	for n, want := range map[string]bool{"a": true, "b": false, "c": true} {
		matches, _ := filepath.Glob(filepath.Join(dir, "sha256-*", "rootfs", "disk", n+".img"))
		if got := len(matches) == 1; got != want {
			t.Errorf("image %s cached = %v, want %v", n, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(held.Dir, "disk", "a.img")); err != nil {
		t.Errorf("held image evicted: %v", err)
	}
	held.Release()

	// A store opened again re-hashes what it holds: a file changed behind its back (here with
	// its stamp restored but for ctime) is removed.
	files, _ := filepath.Glob(filepath.Join(dir, "sha256-*", "rootfs", "disk", "a.img"))
	if len(files) != 1 {
		t.Fatalf("a.img in the cache: %v", files)
	}
	if err := os.WriteFile(files[0], make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStore(StoreOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
		t.Errorf("changed entry kept by OpenStore: %v", err)
	}
}

package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

func writeString(s string) func(*os.File) error {
	return func(f *os.File) error { _, err := f.WriteString(s); return err }
}

func TestWriteReplacesWholeWithTheMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for name, fn := range map[string]func(string, os.FileMode, func(*os.File) error) error{"Write": Write, "WriteDurably": WriteDurably} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ref")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := fn(path, 0o644, writeString("new")); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != "new" {
				t.Fatalf("after the write: %q, %v; want \"new\"", got, err)
			}
			if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
				t.Fatalf("mode %v under umask 077, want 0644", st.Mode().Perm())
			}
			expectOnly(t, dir, "ref")
		})
	}
}

func TestFailedWriteKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "efi-vars.fd")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	err := WriteDurably(path, 0o600, func(f *os.File) error {
		if _, err := f.WriteString("half"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the writer's error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("after a failed write the file holds %q, want the old content", got)
	}
	expectOnly(t, dir, "efi-vars.fd")
}

func TestConcurrentWritersNeverMix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ref")
	contents := []string{"sha256:aaaa\n", "sha256:bbbbbbbbbbbbbbbb\n"}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(s string) {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				if err := Write(path, 0o644, writeString(s)); err != nil {
					t.Error(err)
					return
				}
			}
		}(contents[i%2])
	}
	wg.Wait()
	got, _ := os.ReadFile(path)
	if string(got) != contents[0] && string(got) != contents[1] {
		t.Fatalf("the file holds %q, a mix of the writers", got)
	}
	expectOnly(t, dir, "ref")
}

func TestMissingDirectoryIsAnError(t *testing.T) {
	if err := Write(filepath.Join(t.TempDir(), "no", "such"), 0o600, writeString("x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}

func expectOnly(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != name {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the directory holds %v, want only %s (no temporary files left)", names, name)
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// qvirtctl local hands every argument, flags and --help included, to qvirt-local found on PATH
// (the test binary has none beside it), and says how to build it when there is none.
func TestLocalExecsQvirtLocal(t *testing.T) {
	dir := t.TempDir()
	stand := filepath.Join(dir, LocalBinary)
	if err := os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	var gotPath, gotName string
	var gotArgs []string
	defer func(orig func(string, []string, string) error) { execLocal = orig }(execLocal)
	execLocal = func(path string, args []string, name string) error {
		gotPath, gotArgs, gotName = path, args, name
		return nil
	}
	var out, errOut bytes.Buffer
	if code := Main([]string{"/x/kubectl-qvirt", "local", "up", "--nodes", "3", "--help"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if want := []string{"up", "--nodes", "3", "--help"}; gotPath != stand || !slices.Equal(gotArgs, want) || gotName != "kubectl qvirt local" {
		t.Errorf("exec %q %q as %q, want %q %q as %q", gotPath, gotArgs, gotName, stand, want, "kubectl qvirt local")
	}

	t.Setenv("PATH", t.TempDir())
	errOut.Reset()
	if code := Main([]string{"qvirtctl", "local", "status"}, strings.NewReader(""), &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), LocalBinary+" not found") || !strings.Contains(errOut.String(), "make build") {
		t.Errorf("without qvirt-local: exit %d, %q; want an error naming it and `make build`", code, errOut.String())
	}
}

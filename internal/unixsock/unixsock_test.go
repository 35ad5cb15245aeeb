package unixsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDialLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "launcher.sock")
	if len(path) <= maxPath {
		t.Fatalf("path of %d bytes is not long", len(path))
	}
	// The listener binds through its directory too: it cannot name the long path either.
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", "launcher.sock")
	_ = os.Chdir(wd)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	conn, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatalf("dial %d-byte path: %v", len(path), err)
	}
	defer conn.Close()
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if _, err := Dial(context.Background(), filepath.Join(dir, "missing.sock")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("missing socket: %v, want ENOENT", err)
	}
}

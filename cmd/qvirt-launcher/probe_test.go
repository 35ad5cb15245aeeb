package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher"
)

// TestProbeCommand runs `qvirt-launcher probe` against a launcher that has no guest yet: an exec
// probe fails (exit 1) saying the guest agent is needed, bad flags exit 2.
func TestProbeCommand(t *testing.T) {
	socketDir, err := os.MkdirTemp("", "qvp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(socketDir) })
	const uid = "0e5c1f7a"
	dir := launcher.VMIDir(socketDir, uid)
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	l := launcher.New(string(dir), launcher.HostResolver{}, launcher.Options{Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = launcher.Serve(ctx, dir.Command(), l, logr.Discard())
	}()
	t.Cleanup(func() { cancel(); <-served })
	for deadline := time.Now().Add(5 * time.Second); ; {
		if c, err := net.Dial("unix", dir.Command()); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command socket never accepted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"--socket-dir", socketDir, "--vmi-uid", uid, "--guest-exec", "--timeout", "2s", "--", "cat", "/tmp/ok"}, 1, "needs qemu-guest-agent"},
		{[]string{"--socket-dir", socketDir, "--vmi-uid", uid, "--guest-agent-ping"}, 1, "not connected"},
		{[]string{"--socket-dir", socketDir, "--vmi-uid", uid, "--guest-exec"}, 2, "needs the command after --"},
		{[]string{"--socket-dir", socketDir, "--vmi-uid", uid, "--guest-exec", "--guest-agent-ping", "--", "true"}, 2, "one of"},
		{[]string{"--socket-dir", socketDir, "--vmi-uid", uid, "--guest-agent-ping", "--", "true"}, 2, "takes no command"},
	} {
		var stdout, stderr bytes.Buffer
		code := runProbe(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.say) {
			t.Errorf("probe %q: exit %d, stderr %q; want exit %d saying %q", tc.args, code, stderr.String(), tc.code, tc.say)
		}
	}
}

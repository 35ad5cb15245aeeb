package guestagent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestExecAndStatus: guest-exec sends the path, arguments and capture-output; guest-exec-status's
// base64 output comes back decoded, cut at MaxExecOutput and marked truncated.
func TestExecAndStatus(t *testing.T) {
	big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 3*MaxExecOutput))
	c := fakeAgent(t, func(cmd string, id int64) string {
		switch cmd {
		case "guest-sync-delimited":
			return syncReply(id)
		case "guest-exec":
			return `{"return": {"pid": 42}}` + "\n"
		case "guest-exec-status":
			return fmt.Sprintf(`{"return": {"exited": true, "exitcode": 3, "out-data": %q, "err-data": "b29wcwo="}}`+"\n", big)
		}
		return `{"error": {"class": "CommandNotFound", "desc": "no"}}` + "\n"
	})
	ctx := context.Background()
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	pid, err := c.Exec(ctx, "/bin/sh", []string{"-c", "exit 3"})
	if err != nil || pid != 42 {
		t.Fatalf("exec: pid %d, %v", pid, err)
	}
	st, err := c.ExecStatus(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exited || st.ExitCode != 3 || len(st.Stdout) != MaxExecOutput || !st.StdoutTruncated ||
		string(st.Stderr) != "oops\n" || st.StderrTruncated {
		t.Errorf("status: exited %v code %d, stdout %d bytes (truncated %v), stderr %q (truncated %v)",
			st.Exited, st.ExitCode, len(st.Stdout), st.StdoutTruncated, st.Stderr, st.StderrTruncated)
	}
}

// TestDecodeExecStatusRefusesGarbage: output that is not base64, and a reply without a pid, are
// errors rather than empty output.
func TestDecodeExecStatusRefusesGarbage(t *testing.T) {
	if _, err := DecodeExecStatus(json.RawMessage(`{"exited": true, "out-data": "%%%"}`)); err == nil || !strings.Contains(err.Error(), "out-data") {
		t.Errorf("out-data not base64: %v", err)
	}
	c := fakeAgent(t, func(cmd string, id int64) string {
		if cmd == "guest-sync-delimited" {
			return syncReply(id)
		}
		return `{"return": {}}` + "\n"
	})
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(context.Background(), "true", nil); err == nil || !strings.Contains(err.Error(), "without a pid") {
		t.Errorf("exec reply without a pid: %v", err)
	}
}

package localcli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLocalStatusReadsTheComponents(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := localStatus(&out, dir); err != nil || !strings.Contains(out.String(), "no local cluster in "+dir) {
		t.Fatalf("an empty state dir: %q, %v", out.String(), err)
	}
	states := `[{"name":"etcd","path":"/nonexistent/etcd","pid":999999,"state":"Running","restarts":2,"since":"2026-11-30T01:00:00Z"},
	{"name":"kube-scheduler","path":"/x","state":"CrashLoopBackOff","restarts":5,"lastExit":"exit status 1","since":"2026-11-30T01:00:00Z"}]`
	if err := os.WriteFile(filepath.Join(dir, "components.json"), []byte(states), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := localStatus(&out, dir); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	// etcd's recorded process is gone: it reads as Stopped, not as a lie.
	for _, want := range []string{"local up does not run", "etcd", "Stopped", "kube-scheduler", "CrashLoopBackOff", "exit status 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "999999") {
		t.Errorf("status shows the dead PID:\n%s", text)
	}
}

func TestFindRepo(t *testing.T) {
	repo, err := findRepo("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(repo, "config", "samples", "vm-demo.yaml")); err != nil {
		t.Errorf("repo %s: %v", repo, err)
	}
	if _, err := findRepo(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--repo") {
		t.Errorf("outside the tree: %v, want an error naming --repo", err)
	}
}

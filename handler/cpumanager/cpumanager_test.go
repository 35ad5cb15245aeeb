package cpumanager

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExclusive: the static policy's entry for a container is its CPUs; no entry, another policy
// (none: every container on the shared pool, as on a node whose cpumanager label was set by hand),
// and a checkpoint that is none are errors saying so.
func TestExclusive(t *testing.T) {
	write := func(data string) string {
		path := filepath.Join(t.TempDir(), "cpu_manager_state")
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	st, err := Read(write(`{"policyName":"static","defaultCpuSet":"0","entries":{"uid-1":{"compute":"1-2"}},"checksum":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if cpus, err := st.Exclusive("uid-1", "compute"); err != nil || cpus.String() != "1-2" {
		t.Errorf("the compute container's CPUs: %v, %v; want 1-2", cpus, err)
	}
	if _, err := st.Exclusive("uid-2", "compute"); err == nil || !strings.Contains(err.Error(), "no CPUs of its own") {
		t.Errorf("a pod with no entry: %v, want no CPUs of its own", err)
	}
	st, err = Read(write(`{"policyName":"none","defaultCpuSet":"","checksum":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Exclusive("uid-1", "compute"); err == nil || !strings.Contains(err.Error(), `policy "none"`) {
		t.Errorf("policy none: %v, want a refusal naming the policy", err)
	}
	for _, bad := range []string{`not json`, `{"entries":{}}`} {
		if _, err := Read(write(bad)); err == nil || !strings.Contains(err.Error(), "is no CPU manager checkpoint") {
			t.Errorf("checkpoint %q: %v, want it refused", bad, err)
		}
	}
	if _, err := Read(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("an absent checkpoint read")
	}
}

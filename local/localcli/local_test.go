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

// The demo pushes the cloud image only when it is already built: otherwise it says how to get
// it, and builds nothing.
func TestDemoCloudImageOnlyWhenBuilt(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("QVIRT_CACHE_DIR", cache)
	repo, err := findRepo("")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	dir, err := findCloudImage(t.Context(), &out, repo, false)
	if err != nil || dir != "" || !strings.Contains(out.String(), "--cloud-image") || !strings.Contains(out.String(), cloudSample) {
		t.Fatalf("no image built: dir %q, err %v, said %q; want nothing found and a hint naming --cloud-image and %s", dir, err, out.String(), cloudSample)
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 0 {
		t.Errorf("the demo started building the cloud image: the cache holds %v", entries)
	}
	if err := os.MkdirAll(filepath.Join(cache, "cloud"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "cloud", "disk.qcow2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if built, err := cloudImageCached(); err != nil || !built {
		t.Errorf("with %s/cloud/disk.qcow2: cached %v, %v; want true", cache, built, err)
	}
}

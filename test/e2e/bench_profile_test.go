package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/cluster"
)

var profileDir = flag.String("startup.profile", "", "directory where BenchmarkStartup writes CPU profiles of each qvirt-controller replica and node agent: <component>-startup.pprof over the starts, <component>-idle.pprof over the idle window (go tool pprof reads them)")

// cpuProfiles starts, when -startup.profile is set, a CPU profile of d of every component serving
// /debug/pprof/ (the cluster runs with local mode's Profiling); wait writes each to the directory
// as <component>-<phase>.pprof. A profile that fails is logged, not fatal: the figures stand.
func cpuProfiles(ctx context.Context, b *testing.B, phase string, d time.Duration) (wait func()) {
	if *profileDir == "" {
		return func() {}
	}
	if err := os.MkdirAll(*profileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for name, addr := range lc.PprofAddresses() {
		file := filepath.Join(*profileDir, name+"-"+phase+".pprof")
		wg.Go(func() {
			if err := fetchProfile(ctx, addr, d, file); err != nil {
				b.Logf("CPU profile of %s: %v", name, err)
			}
		})
	}
	return wg.Wait
}

func fetchProfile(ctx context.Context, addr string, d time.Duration, file string) error {
	raw, err := get(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		return err
	}
	return os.WriteFile(file, raw, 0o644)
}

// launcherProfiles, when -startup.profile is set, turns launcherCPUProfile on in qvirt-config so
// every launcher started from now on profiles its own start; collect, called once they all run,
// copies each running launcher's profile into the directory's launchers/ (go tool pprof merges
// the files it is given) and turns the setting off again.
func launcherProfiles(ctx context.Context, b *testing.B) (collect func()) {
	if *profileDir == "" {
		return func() {}
	}
	setLauncherProfiling(ctx, b, true)
	return func() {
		defer setLauncherProfiling(ctx, b, false)
		// Each launcher stops its profile a second after its guest runs.
		time.Sleep(2 * time.Second)
		out := filepath.Join(*profileDir, "launchers")
		if err := os.MkdirAll(out, 0o755); err != nil {
			b.Fatal(err)
		}
		// Each launcher pod's socket directory (an emptyDir) as its node keeps it.
		files, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "pods", "*", "volumes", "kubernetes.io~empty-dir", "*", "*", podlayout.ProfileFile))
		for i, f := range files {
			// The directory is the tenant's too: take only what the launcher wrote, a regular
			// file, never a link this process (root) would follow.
			if fi, err := os.Lstat(f); err != nil || !fi.Mode().IsRegular() {
				b.Fatalf("launcher profile %s is not a regular file (%v)", f, err)
			}
			if err := copyFile(f, filepath.Join(out, fmt.Sprintf("launcher-%03d.pprof", i))); err != nil {
				b.Fatalf("launcher profile: %v", err)
			}
		}
		b.Logf("copied the start-up CPU profiles of %d launchers to %s", len(files), out)
	}
}

func setLauncherProfiling(ctx context.Context, b *testing.B, on bool) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: cluster.Namespace}}
	patch := fmt.Sprintf(`{"data":{"launcherCPUProfile":"%t"}}`, on)
	if err := cl.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		b.Fatalf("set launcherCPUProfile in %s: %v", config.ConfigMapName, err)
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}

// liveHeaps are the bytes in use after a collection in each component serving /debug/pprof/ (its
// heap profile with gc=1), by component name. With -startup.profile each heap profile is also
// written as <component>-heap-<phase>.pprof (go tool pprof -base compares two).
func liveHeaps(ctx context.Context, b *testing.B, phase string) map[string]float64 {
	if *profileDir != "" {
		if err := os.MkdirAll(*profileDir, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	out := map[string]float64{}
	for name, addr := range lc.PprofAddresses() {
		var keep string
		if *profileDir != "" {
			keep = filepath.Join(*profileDir, name+"-heap-"+phase+".pprof")
		}
		n, err := liveHeap(ctx, addr, keep)
		if err != nil {
			b.Fatalf("live heap of %s: %v", name, err)
		}
		out[name] = n
	}
	return out
}

func liveHeap(ctx context.Context, addr, keep string) (float64, error) {
	// debug=1 ends with the runtime's MemStats, read after the collection gc=1 asks for: HeapAlloc
	// is then the live heap exactly (the profile's own figures are sampled every 512 KiB).
	text, err := get(ctx, "http://"+addr+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	_, after, found := strings.Cut(string(text), "\n# HeapAlloc = ")
	if !found {
		return 0, fmt.Errorf("%s: no HeapAlloc in the heap profile", addr)
	}
	n, err := strconv.ParseFloat(strings.Fields(after)[0], 64)
	if err != nil {
		return 0, fmt.Errorf("%s: HeapAlloc: %w", addr, err)
	}
	if keep == "" {
		return n, nil
	}
	raw, err := get(ctx, "http://"+addr+"/debug/pprof/heap")
	if err != nil {
		return 0, err
	}
	return n, os.WriteFile(keep, raw, 0o644)
}

func get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

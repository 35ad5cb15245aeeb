package metrics_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/metrics"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	qvtest "github.com/qvirt/qvirt/test/testutil"
)

// standInDir is the launcher socket directory of vmi, as its pod's sockets volume holds it.
func standInDir(t *testing.T, podsDir string, vmi *v1alpha1.VirtualMachineInstance) launcher.Dir {
	t.Helper()
	dir := launcher.VMIDir(qvtest.PodSocketDir(t, podsDir, podOf(vmi.Name)), vmi.UID)
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hungLauncher accepts on vmi's launcher.sock and never answers.
func hungLauncher(t *testing.T, podsDir string, vmi *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	ln, err := net.Listen("unix", standInDir(t, podsDir, vmi).Command())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
}

// answeringLauncher answers GET /v1/stats on vmi's launcher.sock with st at once.
func answeringLauncher(t *testing.T, podsDir string, vmi *v1alpha1.VirtualMachineInstance, st protocol.Stats) {
	t.Helper()
	ln, err := net.Listen("unix", standInDir(t, podsDir, vmi).Command())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// One scrape has a deadline of its own, not only one per launcher: with sixty launchers that
// accept and never answer (more than were asked at once before), a scrape returns within the
// scrape deadline with the series of the VMIs whose launchers answer, and counts the others as
// errors. A scrape that comes while the hung calls of the last one are still pending does not
// queue behind them: it skips those launchers and returns at once.
func TestScrapeWithHungLaunchersIsBounded(t *testing.T) {
	ns := namespace(t)
	socketDir := podsDir(t)
	const hung = 60
	for i := range hung {
		hungLauncher(t, socketDir, createVMI(t, ns, fmt.Sprintf("hung-%02d", i), node, v1alpha1.Running))
	}
	healthy := []string{"healthy-1", "healthy-2"}
	for i, name := range healthy {
		answeringLauncher(t, socketDir, createVMI(t, ns, name, node, v1alpha1.Running),
			protocol.Stats{PID: 100 + i, MemoryResidentBytes: int64(64+i) << 20, CPU: protocol.CPUTime{User: 3 * time.Second}})
	}
	srv := serve(t, metrics.NewCollector(cp.Client, node, socketDir, testr.New(t)))

	started := time.Now()
	fams := scrape(t, srv)
	took := time.Since(started)
	t.Logf("a scrape with %d hung launchers took %s", hung, took.Round(time.Millisecond))
	// The scrape deadline is 5 s; every launcher is asked at once, so here it ends when the hung
	// calls time out (2 s each).
	if took > 6*time.Second {
		t.Errorf("the scrape took %s, beyond the scrape deadline", took)
	}
	for i, name := range healthy {
		vmi := map[string]string{"node": node, "namespace": ns, "name": name}
		if got := fams.must(t, "qvirt_vmi_memory_resident_bytes", vmi); got != float64(int64(64+i)<<20) {
			t.Errorf("%s: resident memory %v", name, got)
		}
		if got := fams.must(t, "qvirt_vmi_cpu_user_usage_seconds_total", vmi); got != 3 {
			t.Errorf("%s: user CPU %v", name, got)
		}
	}
	for i := range hung {
		if n := fams.seriesOf(fmt.Sprintf("hung-%02d", i)); n != 0 {
			t.Errorf("hung-%02d has %d series", i, n)
		}
	}
	if errs := fams.must(t, "qvirt_handler_scrape_errors_total", nil); errs < hung {
		t.Errorf("scrape errors %v, want at least %d", errs, hung)
	}

	// Two scrapes at once: the second finds the hung launchers still busy with the first's calls
	// and does not wait for them.
	first := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		first <- err
	}()
	time.Sleep(300 * time.Millisecond)
	started = time.Now()
	fams = scrape(t, srv)
	took = time.Since(started)
	t.Logf("a scrape while the hung launchers were busy took %s", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the second scrape took %s: it waited for launchers still busy with the first", took)
	}
	fams.must(t, "qvirt_vmi_memory_resident_bytes", map[string]string{"namespace": ns, "name": healthy[0]})
	if err := <-first; err != nil {
		t.Fatalf("the first scrape: %v", err)
	}
}

// The scrape deadline holds whatever the launchers' own: with launchers allowed longer than the
// scrape, a scrape ends at its deadline with what arrived (the answering launchers' series) and
// counts the launchers still pending as errors.
func TestScrapeDeadlineCutsLongLauncherCalls(t *testing.T) {
	ns := namespace(t)
	socketDir := podsDir(t)
	const hung = 20
	for i := range hung {
		hungLauncher(t, socketDir, createVMI(t, ns, fmt.Sprintf("slow-%02d", i), node, v1alpha1.Running))
	}
	answeringLauncher(t, socketDir, createVMI(t, ns, "quick", node, v1alpha1.Running), protocol.Stats{PID: 7, MemoryResidentBytes: 32 << 20})
	const deadline = time.Second
	srv := serve(t, metrics.NewCollectorWithTimeouts(cp.Client, node, socketDir, testr.New(t), deadline, time.Minute))

	started := time.Now()
	fams := scrape(t, srv)
	took := time.Since(started)
	t.Logf("scrape with a %s deadline and launcher calls of up to a minute took %s", deadline, took.Round(time.Millisecond))
	if took < deadline || took > deadline+time.Second {
		t.Errorf("the scrape took %s, want its deadline %s", took, deadline)
	}
	if got := fams.must(t, "qvirt_vmi_memory_resident_bytes", map[string]string{"namespace": ns, "name": "quick"}); got != 32<<20 {
		t.Errorf("quick: resident memory %v", got)
	}
	if errs := fams.must(t, "qvirt_handler_scrape_errors_total", nil); errs < hung {
		t.Errorf("scrape errors %v, want at least %d", errs, hung)
	}
}

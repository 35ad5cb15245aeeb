// Package e2e drives a whole qvirt on a two-node local cluster the way a user does: kubectl for
// the objects, the status' stateChangeRequests for start/stop/restart, the guests' consoles and
// HTTP servers for what the user sees. One cluster serves every test of the package (TestMain),
// brought up as `qvirtctl local up --emulation --nodes 2` would.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// The shared cluster.
var (
	lc      *cluster.Cluster
	cl      client.Client
	dir     string // the cluster's state directory
	bin     string // qvirt's binaries, qvirtctl among them
	kubectl string
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	flag.Parse()
	if fuzzOnly() {
		return m.Run()
	}
	if testing.Short() {
		fmt.Println("e2e: needs a local cluster (root, QEMU, minutes): not run with -short")
		return 0
	}
	unlock, err := testutil.LockHostNetworkNow()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer unlock()
	cleanup, err := startCluster()
	defer cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: local cluster:", err)
		return 1
	}
	return m.Run()
}

// fuzzOnly is true when go test runs a fuzz target (hack/fuzz.sh): no cluster is needed.
func fuzzOnly() bool {
	for _, a := range os.Args {
		if len(a) > 11 && a[:11] == "-test.fuzz=" {
			return true
		}
	}
	return false
}

// startCluster builds the binaries and the guest and brings a two-node cluster up; the returned
// cleanup takes it down and removes its directory, even after a failure.
func startCluster() (func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	tools, err := envtest.Assets()
	if err != nil {
		return cleanup, err
	}
	kubectl = filepath.Join(tools, "kubectl")
	if bin, err = os.MkdirTemp("", "qve-bin-"); err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { os.RemoveAll(bin) })
	repo := envtest.RepoRoot()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/...")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return cleanup, fmt.Errorf("go build ./cmd/...: %w\n%s", err, out)
	}
	guest, err := testutil.GuestDir()
	if err != nil {
		return cleanup, err
	}
	// Short: socket paths live under it.
	if dir, err = os.MkdirTemp("", "qve-"); err != nil {
		return cleanup, err
	}
	undo = append(undo, func() {
		if os.Getenv("QVIRT_E2E_KEEP") == "" {
			os.RemoveAll(dir)
		}
	})
	cache, err := os.UserCacheDir()
	if err != nil {
		return cleanup, err
	}
	logFile, err := os.Create(filepath.Join(os.TempDir(), "qvirt-e2e-nodes.log"))
	if err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { logFile.Close() })
	nodeLog := funcr.NewJSON(func(obj string) { fmt.Fprintln(logFile, obj) }, funcr.Options{})
	ctrllog.SetLogger(nodeLog)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	lc, err = cluster.Up(ctx, cluster.Options{Dir: dir, Nodes: 2, Emulation: true, Repo: repo, Tools: tools, Bin: bin,
		CNICache: filepath.Join(cache, "qvirt", "cni"), GuestDir: guest, Progress: os.Stderr,
		Log: nodeLog})
	if err != nil {
		return cleanup, err
	}
	undo = append(undo, lc.Down)
	fmt.Fprintf(os.Stderr, "e2e: two-node local cluster up in %.1fs (state in %s)\n", time.Since(started).Seconds(), dir)
	cfg, err := clientcmd.BuildConfigFromFlags("", lc.Kubeconfig)
	if err != nil {
		return cleanup, err
	}
	sch, err := scheme.New()
	if err != nil {
		return cleanup, err
	}
	cl, err = client.New(cfg, client.Options{Scheme: sch})
	return cleanup, err
}

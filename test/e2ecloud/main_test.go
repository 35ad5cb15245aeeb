// Package e2ecloud boots real cloud guests in a local cluster, the way a KubeVirt user runs them:
// the Debian cloud image (test/guest/cloud) as a containerDisk and on filesystem and block
// PersistentVolumeClaims, configured by cloud-init NoCloud and ConfigDrive, under BIOS, UEFI and
// UEFI with secure boot; a user logs in with SSH through the masquerade binding and on the serial
// console through qvirtctl. One cluster serves the package (TestMain), brought up as `qvirtctl
// local up --emulation --nodes 2` would, with the cloud image pushed to its registry.
//
// It is a package of its own, not part of test/e2e, because its guests are a distribution under
// emulation: each boot takes minutes, the image takes minutes to build cold, and test/e2e's
// own tests already fill much of the per-package time budget of `make test`.
package e2ecloud

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/registry"
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
	// cloudDir holds the cloud image (disk.qcow2); cloudImage is its containerDisk in the
	// cluster's registry.
	cloudDir, cloudImage string
	// guestDir holds the small busybox test guest (the helper VM that copies the image onto claims).
	guestDir string
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

// guestsAtOnce is how many parallel tests (guests) run at once unless -test.parallel says: a
// cloud boot under emulation is largely the guest waiting on emulated devices and timers, so
// TestCloudGuests' three guests booting together on two cores finish about a minute sooner than
// go test's default (GOMAXPROCS, two here) lets them.
const guestsAtOnce = 3

func runSuite(m *testing.M) int {
	flag.Parse()
	if !flagGiven("test.parallel") {
		_ = flag.Set("test.parallel", fmt.Sprint(max(guestsAtOnce, runtime.GOMAXPROCS(0))))
	}
	if testing.Short() {
		fmt.Println("e2ecloud: needs a local cluster (root, QEMU, minutes): not run with -short")
		return 0
	}
	var err error
	if cloudDir, err = testutil.CloudImageDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if guestDir, err = testutil.GuestDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
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
		fmt.Fprintln(os.Stderr, "e2ecloud: local cluster:", err)
		return 1
	}
	return m.Run()
}

// flagGiven says whether the command line set the flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// startCluster builds the binaries and brings a two-node cluster up with the demo images and the
// cloud image in its registry; the returned cleanup takes it down and removes its directory, even
// after a failure.
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
	if bin, err = os.MkdirTemp("", "qvc-bin-"); err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { os.RemoveAll(bin) })
	repo := envtest.RepoRoot()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/...")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return cleanup, fmt.Errorf("go build ./cmd/...: %w\n%s", err, out)
	}
	// Short: socket paths live under it.
	if dir, err = os.MkdirTemp("", "qvc-"); err != nil {
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
	logFile, err := os.Create(filepath.Join(os.TempDir(), "qvirt-e2ecloud-nodes.log"))
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
		CNICache: filepath.Join(cache, "qvirt", "cni"), GuestDir: guestDir, Progress: os.Stderr,
		Log: nodeLog})
	if err != nil {
		return cleanup, err
	}
	undo = append(undo, lc.Down)
	if cloudImage, err = registry.PushCloudDisk(ctx, lc.Registry, cloudDir); err != nil {
		return cleanup, err
	}
	fmt.Fprintf(os.Stderr, "e2ecloud: two-node local cluster up with the cloud image in %.1fs (state in %s)\n",
		time.Since(started).Seconds(), dir)
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

// Package e2e drives a whole qvirt on a two-node local cluster the way a user does: kubectl for
// the objects, the status' stateChangeRequests for start/stop/restart, the guests' consoles and
// HTTP servers for what the user sees. One cluster serves every test of the package (TestMain),
// brought up as `qvirtctl local up --emulation --nodes 2` would.
//
// Tests that only use their own namespace run two at a time (t.Parallel): a guest under TCG keeps
// one of the machine's 2 cores busy. Those that act on the whole cluster (component restarts,
// a node drain, node certificates) or whose assertions depend on timing (the probes: the guest
// must handle the power button within its grace period) run alone, before the parallel ones.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/test/e2ecluster"
	"github.com/qvirt/qvirt/test/testutil"
)

// The shared cluster.
var (
	ec      *e2ecluster.Cluster
	lc      *cluster.Cluster
	cl      client.Client
	dir     string // the cluster's state directory
	bin     string // qvirt's binaries, qvirtctl among them
	kubectl string
	// privateRegistry is a registry that serves only with credentials (startPrivateRegistry),
	// which the nodes reach over plain HTTP.
	privateRegistry string
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

// startCluster brings the shared cluster up with the small test guest in its registry.
func startCluster() (func(), error) {
	guest, err := testutil.GuestDir()
	if err != nil {
		return func() {}, err
	}
	private, stopPrivate, err := startPrivateRegistry()
	if err != nil {
		return func() {}, err
	}
	c, stopCluster, err := e2ecluster.Start(e2ecluster.Options{Name: "e2e", GuestDir: guest,
		InsecureRegistries: []string{private}})
	cleanup := func() { stopCluster(); stopPrivate() }
	if err != nil {
		return cleanup, err
	}
	ec, lc, cl, dir, bin, kubectl = c, c.Cluster, c.Client, c.Dir, c.Bin, c.Kubectl
	privateRegistry = private
	return cleanup, nil
}

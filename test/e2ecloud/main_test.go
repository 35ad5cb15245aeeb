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
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/registry"
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
	// cloudDir holds the cloud image (disk.qcow2); cloudImage is its containerDisk in the
	// cluster's registry.
	cloudDir, cloudImage string
	// guestDir holds the small busybox test guest (the helper VM that copies the image onto claims).
	guestDir string
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	flag.Parse()
	testutil.CloudGuestsAtOnce()
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

// startCluster brings the shared cluster up with the cloud image in its registry.
func startCluster() (func(), error) {
	c, cleanup, err := e2ecluster.Start(e2ecluster.Options{Name: "e2ecloud", GuestDir: guestDir,
		Ready: func(ctx context.Context, c *cluster.Cluster) (err error) {
			cloudImage, err = registry.PushCloudDisk(ctx, c.Registry, cloudDir)
			return err
		}})
	if err != nil {
		return cleanup, err
	}
	ec, lc, cl, dir, bin, kubectl = c, c.Cluster, c.Client, c.Dir, c.Bin, c.Kubectl
	return cleanup, nil
}

package localcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/registry"
)

// demoSample is the demo VM `local up --demo` applies; its image is the demo guest in the local
// registry (cluster.RegistryAddress), seeded from the test guest.
const demoSample = "config/samples/vm-demo.yaml"

// cloudSample is the cloud-image VM a user applies once `local up` pushed the cloud image.
const cloudSample = "config/samples/vm-cloud.yaml"

// buildGuest builds the test guest (cached after the first time) and returns its directory.
func buildGuest(ctx context.Context, out io.Writer, repo string) (string, error) {
	fmt.Fprintln(out, "local up: building the demo guest (test/guest/build.sh; cached after the first time)")
	build := exec.CommandContext(ctx, filepath.Join(repo, "test", "guest", "build.sh"))
	build.Stderr = os.Stderr
	guest, err := build.Output()
	if err != nil {
		return "", fmt.Errorf("build the demo guest: %w", err)
	}
	return strings.TrimSpace(string(guest)), nil
}

// findCloudImage returns the directory of the cloud image (test/guest/cloud/build.sh's output).
// With build it runs the script, which builds the image the first time (minutes; it needs root
// and the network) and is instant once it is up to date. Without build it does so only when the
// script's cache already holds an image, and otherwise says how to get one and returns "".
func findCloudImage(ctx context.Context, out io.Writer, repo string, build bool) (string, error) {
	if !build {
		cached, err := cloudImageCached()
		if err != nil {
			return "", err
		}
		if !cached {
			fmt.Fprintf(out, "local up: the cloud image for %s is not built; pass --cloud-image to build it (5-20 minutes the first time) and push it\n", cloudSample)
			return "", nil
		}
	}
	fmt.Fprintln(out, "local up: building the cloud image if needed (test/guest/cloud/build.sh; cached after the first time)")
	script := exec.CommandContext(ctx, filepath.Join(repo, "test", "guest", "cloud", "build.sh"))
	script.Stderr = os.Stderr
	dir, err := script.Output()
	if err != nil {
		return "", fmt.Errorf("build the cloud image: %w", err)
	}
	return strings.TrimSpace(string(dir)), nil
}

// cloudImageCached says whether test/guest/cloud/build.sh's default output directory holds an
// image: ${QVIRT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qvirt}/cloud/disk.qcow2.
func cloudImageCached() (bool, error) {
	cache := os.Getenv("QVIRT_CACHE_DIR")
	if cache == "" {
		user, err := os.UserCacheDir()
		if err != nil {
			return false, err
		}
		cache = filepath.Join(user, "qvirt")
	}
	_, err := os.Stat(filepath.Join(cache, "cloud", "disk.qcow2"))
	return err == nil, nil
}

// pushCloudImage pushes the cloud image in dir to the cluster's registry as the containerDisk
// cloudSample names.
func pushCloudImage(ctx context.Context, out io.Writer, c *cluster.Cluster, dir string) error {
	ref, err := registry.PushCloudDisk(ctx, c.Registry, dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "local up: pushed the cloud image as %s (for %s)\n", ref, cloudSample)
	return nil
}

// runDemo applies the demo VM, waits until its instance runs and says how to reach it, and the
// cloud-image VM when its image was pushed.
func runDemo(ctx context.Context, out io.Writer, repo string, c *cluster.Cluster, cloud bool) error {
	cl, err := scheme.NewClient(c.Kubeconfig)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "local up: kubectl apply -f", demoSample)
	if err := cluster.Apply(ctx, cl, filepath.Join(repo, demoSample)); err != nil {
		return err
	}
	vmi, err := waitRunning(ctx, cl, client.ObjectKey{Namespace: "default", Name: "demo"}, 5*time.Minute)
	if err != nil {
		return err
	}
	ip := ""
	if len(vmi.Status.Interfaces) > 0 {
		ip = vmi.Status.Interfaces[0].IP
	}
	fmt.Fprintf(out, `
VM demo runs on %s at %s. Try:
  curl http://%s/           # the guest's httpd, through the masquerade binding
  qvirtctl console demo     # its serial console (Ctrl+] leaves)
`, vmi.Status.NodeName, ip, ip)
	if cloud {
		fmt.Fprintf(out, `
A real cloud guest (Debian 12 with cloud-init; it takes minutes to boot under emulation):
  kubectl apply -f %s
  qvirtctl console cloud    # watch it boot; log in as debian, password qvirt
  ssh debian@$(kubectl get vmi cloud -o jsonpath='{.status.interfaces[0].ipAddress}')   # password: qvirt
`, filepath.Join(repo, cloudSample))
	}
	return nil
}

func waitRunning(ctx context.Context, cl client.Client, key client.ObjectKey, d time.Duration) (*v1alpha1.VirtualMachineInstance, error) {
	deadline := time.Now().Add(d)
	var vmi v1alpha1.VirtualMachineInstance
	for {
		err := cl.Get(ctx, key, &vmi)
		if err == nil && vmi.Status.Phase == v1alpha1.Running && len(vmi.Status.Interfaces) > 0 && vmi.Status.Interfaces[0].IP != "" {
			return &vmi, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("VMI %s not Running after %s (phase %q): see kubectl describe vmi %s", key, d, vmi.Status.Phase, key.Name)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

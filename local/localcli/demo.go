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

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/cluster"
)

// demoSample is the demo VM `local up --demo` applies; its image is the demo guest in the local
// registry (cluster.RegistryAddress), seeded from the test guest.
const demoSample = "config/samples/vm-demo.yaml"

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

// runDemo applies the demo VM, waits until its instance runs and says how to reach it.
func runDemo(ctx context.Context, out io.Writer, repo string, c *cluster.Cluster) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: sch})
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

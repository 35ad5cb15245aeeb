// Command controlplane is the demo behind `make run` until the local cluster exists: it starts a real
// etcd and kube-apiserver (built by `make tools`) with qvirt's CRDs installed, applies the samples,
// shows them with kubectl, and keeps the control plane up until interrupted (or exits at once with
// -exit, for scripted checks).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/qvirt/qvirt/test/envtest"
)

func main() {
	exit := flag.Bool("exit", false, "stop the control plane after the demo instead of waiting for Ctrl-C")
	flag.Parse()
	if err := run(*exit); err != nil {
		fmt.Fprintf(os.Stderr, "qvirt demo: %v\n", err)
		os.Exit(1)
	}
}

func run(exitAfter bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cp, err := envtest.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()

	samples := filepath.Join(envtest.RepoRoot(), "config", "samples")
	steps := [][]string{
		{"get", "crd"},
		{"apply", "-n", "default", "-k", samples},
		{"get", "vm,vmi,vmim", "-n", "default"},
		{"explain", "vm.spec.runStrategy"},
	}
	for _, args := range steps {
		fmt.Printf("\n$ kubectl %s\n", strings.Join(args, " "))
		out, stderr, err := cp.KubectlCmd(ctx, nil, args...)
		fmt.Print(out, stderr)
		if err != nil {
			return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
		}
	}
	fmt.Printf(`
qvirt's API is installed in a real kube-apiserver at %s.
Not there yet: the controller, node agent and launcher that would turn these VirtualMachines into
running QEMU guests (issues 3-6), and qvirt-api/qvirtctl (issue 7).
Try it yourself:  kubectl --kubeconfig %s get vm
`, cp.Config.Host, cp.Kubeconfig)
	if exitAfter {
		return nil
	}
	fmt.Println("Press Ctrl-C to stop the control plane.")
	<-ctx.Done()
	return nil
}

// Command controlplane is the demo behind `make run` until the local cluster exists: it starts a real
// etcd and kube-apiserver (built by `make tools`) with qvirt's CRDs installed, runs qvirt-controller's
// reconcilers against it, applies the samples and shows what the controller made of them with
// kubectl. It keeps running until interrupted, or exits at once with -exit.
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
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/controllers/config"
	"github.com/qvirt/qvirt/test/envtest"
)

func main() {
	exit := flag.Bool("exit", false, "stop after the demo instead of waiting for Ctrl-C")
	flag.Parse()
	if err := run(*exit); err != nil {
		fmt.Fprintf(os.Stderr, "qvirt demo: %v\n", err)
		os.Exit(1)
	}
}

func run(exitAfter bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctrl.SetLogger(logr.Discard())
	cp, err := envtest.Start()
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	if err := startController(ctx, cp); err != nil {
		return err
	}

	samples := filepath.Join(envtest.RepoRoot(), "config", "samples")
	steps := [][]string{
		{"get", "crd"},
		{"apply", "-n", "default", "-k", samples},
		{"wait", "-n", "default", "--for=jsonpath={.status.phase}=Scheduling", "vmi/testvm", "--timeout=30s"},
		{"get", "vm,vmi,vmim,pods", "-n", "default", "-o", "wide"},
		{"describe", "-n", "default", "vmi", "testvm"},
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
A real kube-apiserver at %s runs qvirt's API and controller: the VirtualMachine made an instance,
and the instance a launcher pod. Nothing runs that pod yet: the node agent (qvirt-handler) exists,
but no node can run pods on this machine until the local cluster's virtual nodes are built
(issue 6); handler/handler_test.go shows a whole VM lifecycle with the test playing the kubelet.
The launcher itself works on its own:
  test/guest/build.sh && make build && bin/qvirt-launcher run --emulation -f test/guest/vmi.yaml
Try the API yourself:  kubectl --kubeconfig %s get vm
`, cp.Config.Host, cp.Kubeconfig)
	if exitAfter {
		return nil
	}
	fmt.Println("Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil
}

// startController runs qvirt-controller's reconcilers in this process, with emulation on since
// KVM does not work on this machine.
func startController(ctx context.Context, cp *envtest.ControlPlane) error {
	ns := "qvirt-system"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	if err := cp.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: ns},
		Data: map[string]string{"useEmulation": "true"}}); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Cache: controllers.CacheOptions(ns),
		Metrics: server.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		return err
	}
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: ns}); err != nil {
		return err
	}
	go func() { _ = mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("controller cache did not sync")
	}
	time.Sleep(100 * time.Millisecond)
	return nil
}

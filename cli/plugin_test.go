package cli

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/test/envtest"
)

// The built binary linked as kubectl-qvirt runs as `kubectl qvirt ...` through the real kubectl,
// with kubectl-style flags passed through and its usage naming `kubectl qvirt`.
func TestKubectlPlugin(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, PluginName), "./cmd/qvirtctl")
	build.Dir = envtest.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build qvirtctl: %v\n%s", err, out)
	}
	kubectl := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cp.Kubectl, args...)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "KUBECONFIG="+kc)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := kubectl("qvirt", "--context", "b", "stop", "vm1", "--grace-period", "7")
	if err != nil || out != "VM vm1 was scheduled to stop\n" {
		t.Fatalf("kubectl qvirt stop: %v, %q", err, out)
	}
	reqs := f.recorded()
	if want := `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-b/virtualmachines/vm1/stop {"gracePeriodSeconds":7}`; len(reqs) == 0 || reqs[len(reqs)-1] != want {
		t.Errorf("kubectl qvirt stop sent %q, want %q", reqs, want)
	}
	out, err = kubectl("qvirt", "--help")
	if err != nil || !strings.Contains(out, "kubectl qvirt [command]") {
		t.Errorf("kubectl qvirt --help: %v, %q", err, out)
	}
	out, err = kubectl("plugin", "list")
	if !strings.Contains(out, filepath.Join(dir, PluginName)) {
		t.Errorf("kubectl plugin list does not show the plugin: %v, %q", err, out)
	}
}

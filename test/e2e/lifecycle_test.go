package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/envtest"
)

// TestDemoVM is README's walk-through: kubectl apply the demo VM, it runs, its console shows the
// guest's banner, kubectl shows its address and node, its httpd answers at the pod's address
// (the masquerade binding end to end), and deleting the VM powers the guest off and leaves
// nothing behind.
func TestDemoVM(t *testing.T) {
	t.Parallel()
	const ns, name = "default", "demo"
	run(t, nil, kubectl, "apply", "-f", filepath.Join(envtest.RepoRoot(), "config", "samples", "vm-demo.yaml"))
	t.Cleanup(func() {
		if t.Failed() {
			ec.DumpLogs(t)
		}
		run(t, nil, kubectl, "delete", "vm", name, "--ignore-not-found", "--wait=false")
	})
	vmi := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	con := console(t, vmi)
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	table := run(t, nil, kubectl, "get", "vmi", name, "-n", ns)
	for _, want := range []string{"Running", vmi.Status.Interfaces[0].IP, vmi.Status.NodeName} {
		if !strings.Contains(table, want) {
			t.Errorf("kubectl get vmi does not show %q:\n%s", want, table)
		}
	}
	if body := httpGet(t, vmi.Status.Interfaces[0].IP, time.Minute); body != name {
		t.Errorf("the guest's page is %q, want its hostname %q", body, name)
	}

	pid, podUID := qemuPID(t, vmi), launcherPod(t, vmi).UID
	run(t, nil, kubectl, "delete", "vm", name, "-n", ns)
	waitVMI(t, ns, name, 2*time.Minute, "gone", gone)
	if text := con.Text(); !strings.Contains(text, "reboot: Power down") {
		t.Errorf("the guest was not powered off gracefully; console ends with %q", tail(text))
	}
	waitGone(t, vmi, pid, string(podUID))
}

// launcherPod is the VMI's (only) launcher pod.
func launcherPod(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(context.Background(), &pods, client.InNamespace(vmi.Namespace),
		client.MatchingLabels{v1alpha1.VMIUIDLabel: string(vmi.UID)}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("launcher pod of VMI %s: %d pods, %v", vmi.Name, len(pods.Items), err)
	}
	return &pods.Items[0]
}

// waitGone checks that a deleted VMI left no QEMU process, launcher pod, pod network namespace
// (which held its tap and bridge) or socket directory on its node behind.
func waitGone(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, pid int, podUID string) {
	t.Helper()
	netns := filepath.Join(dir, "nodes", vmi.Status.NodeName, "netns", podUID)
	sockets := string(podsockets.Dir(provider.PodsDir(filepath.Join(dir, "nodes", vmi.Status.NodeName)), types.UID(podUID), vmi.UID))
	deadline := time.Now().Add(time.Minute)
	for {
		var pods corev1.PodList
		_ = cl.List(context.Background(), &pods, client.InNamespace(vmi.Namespace),
			client.MatchingLabels{v1alpha1.VMIUIDLabel: string(vmi.UID)})
		var left []string
		if alive(pid) {
			left = append(left, "QEMU process")
		}
		if len(pods.Items) > 0 {
			left = append(left, "launcher pod "+pods.Items[0].Name)
		}
		if _, err := os.Stat(netns); err == nil {
			left = append(left, "network namespace "+netns)
		}
		if _, err := os.Stat(sockets); err == nil {
			left = append(left, "socket directory "+sockets)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMI %s deleted, but left behind: %s", vmi.Name, strings.Join(left, ", "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return s[len(s)-300:]
	}
	return s
}

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/local/cluster"
)

// TestPasstBinding is KubeVirt's passt binding as a user writes it (`binding: {name: passt}` on
// the pod network's interface), with the cluster's enablePasstBinding on: the guest gets the pod's own address from passt, the VMI reports
// it, the pod's port 80 (below 1024, which the launcher pod's sysctl lets passt, an unprivileged
// process, bind) reaches the guest's web server, and the VMI is not live-migratable, naming the
// interface.
func TestPasstBinding(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "passt"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default",
		Binding: &v1alpha1.PluginBinding{Name: v1alpha1.PasstBinding}, Ports: []v1alpha1.Port{{Name: "http", Port: 80}}}}
	// The cluster enables the binding (it is off by default); admission refuses the VM until
	// qvirt-controller has read the new configuration. Only passt instances care, so the test
	// runs beside others; it puts the setting back at the end.
	enablePasst(t)
	applyEventually(t, vm)
	_, con := waitBooted(t, ns, name)
	vmi := waitVMI(t, ns, name, time.Minute, "the pod's address in status.interfaces", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].IP != ""
	})
	ip := vmi.Status.Interfaces[0].IP
	con.Expect(t, 0, "QVIRT-IP eth0 "+ip, time.Minute)
	if body := httpGet(t, ip, time.Minute); body != name {
		t.Errorf("GET http://%s/ = %q, want the guest's hostname %q", ip, body, name)
	}
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	if c == nil || c.Status != "False" || c.Reason != v1alpha1.InterfaceNotLiveMigratableReason || !strings.Contains(c.Message, `"default"`) {
		t.Errorf("LiveMigratable condition %+v, want False (%s) naming the interface", c, v1alpha1.InterfaceNotLiveMigratableReason)
	}
}

// TestSlirpBinding is KubeVirt's slirp binding as a user writes it (`binding: {name: slirp}` with
// a port, on the pod network's interface), with no cluster setting: the guest gets QEMU's private
// 10.0.2.15, the VMI reports the pod's address, the pod's port 80 reaches the guest's web server,
// and the VMI is not live-migratable, naming the interface.
func TestSlirpBinding(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "slirp"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default",
		Binding: &v1alpha1.PluginBinding{Name: v1alpha1.SlirpBinding}, Ports: []v1alpha1.Port{{Name: "http", Port: 80}}}}
	applyEventually(t, vm)
	_, con := waitBooted(t, ns, name)
	con.Expect(t, 0, "QVIRT-IP eth0 10.0.2.15", time.Minute)
	vmi := waitVMI(t, ns, name, time.Minute, "the pod's address in status.interfaces", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].IP != ""
	})
	ip := vmi.Status.Interfaces[0].IP
	if body := httpGet(t, ip, time.Minute); body != name {
		t.Errorf("GET http://%s/ = %q, want the guest's hostname %q", ip, body, name)
	}
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	if c == nil || c.Status != "False" || c.Reason != v1alpha1.InterfaceNotLiveMigratableReason || !strings.Contains(c.Message, "slirp") {
		t.Errorf("LiveMigratable condition %+v, want False (%s) naming the slirp binding", c, v1alpha1.InterfaceNotLiveMigratableReason)
	}
}

// enablePasst sets enablePasstBinding in qvirt-config, and puts back what it found when the test
// ends.
func enablePasst(t *testing.T) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: cluster.Namespace, Name: config.ConfigMapName}, &cm); err != nil {
		t.Fatalf("ConfigMap %s: %v", config.ConfigMapName, err)
	}
	var before any // absent: the merge patch removes it
	if v, ok := cm.Data["enablePasstBinding"]; ok {
		before = v
	}
	patchConfig(t, map[string]any{"enablePasstBinding": "true"})
	t.Cleanup(func() { patchConfig(t, map[string]any{"enablePasstBinding": before}) })
}

package e2e

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestUnschedulableVM: a VM asking for more memory than any node has shows Unschedulable in
// `kubectl get vm`, and its VMI carries the scheduler's reason, as with KubeVirt. No guest boots.
func TestUnschedulableVM(t *testing.T) {
	ns := namespace(t)
	vm := demoVM(t, ns, "huge", v1alpha1.RunStrategyAlways)
	huge := resource.MustParse("64Ti")
	vm.Spec.Template.Spec.Domain.Memory = &v1alpha1.Memory{Guest: &huge}
	applyVM(t, vm)

	status := func() string {
		return strings.TrimSpace(run(t, nil, kubectl, "get", "vm", "huge", "-n", ns, "--no-headers", "-o", "custom-columns=STATUS:.status.printableStatus"))
	}
	var last string
	testutil.Eventually(t, time.Minute, "VM huge to show Unschedulable", func() bool {
		last = status()
		return last == string(v1alpha1.PrintableStatusUnschedulable)
	}, func() string { return "status " + last })
	v := waitVMI(t, ns, "huge", 10*time.Second, "PodScheduled=False with the scheduler's reason", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstancePodScheduled)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonUnschedulable &&
			strings.Contains(c.Message, "Insufficient memory")
	})
	if v.Status.Phase != v1alpha1.Scheduling {
		t.Errorf("VMI huge in phase %s, want Scheduling while its pod waits for a node", v.Status.Phase)
	}
}

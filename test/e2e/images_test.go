package e2e

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestContainerDiskImageErrors: a containerDisk image that cannot be pulled shows in `kubectl get
// vm` as ErrImagePull, then ImagePullBackOff, while the virtual node retries the pull; an image
// with no disk under /disk/ gets a Synchronized condition naming the volume and what was
// expected. Neither boots a guest.
func TestContainerDiskImageErrors(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	withDisk := func(name, image string) *v1alpha1.VirtualMachine {
		vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "rootdisk", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "rootdisk", VolumeSource: v1alpha1.VolumeSource{
			ContainerDisk: &v1alpha1.ContainerDiskSource{Image: image}}})
		return vm
	}
	missing := lc.Registry + "/qvirt/no-such-disk:1"
	applyVM(t, withDisk("noimage", missing))
	// The demo's kernelBoot image holds /boot only.
	kernelImage := demoVM(t, ns, "x", v1alpha1.RunStrategyAlways).Spec.Template.Spec.Domain.Firmware.KernelBoot.Container.Image
	applyVM(t, withDisk("nodisk", kernelImage))

	status := func(name string) string {
		return strings.TrimSpace(run(t, nil, kubectl, "get", "vm", name, "-n", ns, "--no-headers", "-o", "custom-columns=STATUS:.status.printableStatus"))
	}
	seen := map[string]bool{}
	testutil.Eventually(t, time.Minute, "VM noimage to show ErrImagePull and then ImagePullBackOff", func() bool {
		seen[status("noimage")] = true
		return seen["ErrImagePull"] && seen["ImagePullBackOff"]
	}, func() string { return "seen " + strings.Join(keys(seen), ", ") })
	if line := run(t, nil, kubectl, "get", "vm", "noimage", "-n", ns, "--no-headers"); !strings.Contains(line, "ErrImagePull") && !strings.Contains(line, "ImagePullBackOff") {
		t.Errorf("kubectl get vm: %q; want its STATUS column to say why the VM does not start", line)
	}
	v := waitVMI(t, ns, "noimage", 10*time.Second, "with an image pull condition", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := syncCondition(v)
		return c != nil && strings.Contains(c.Message, "spec.volumes[rootdisk].containerDisk.image") && strings.Contains(c.Message, missing)
	})
	if v.Status.Phase.Final() {
		t.Errorf("VMI noimage ended (%s) instead of waiting for its image", v.Status.Phase)
	}

	waitVMI(t, ns, "nodisk", 2*time.Minute, "Synchronized=False naming the volume and /disk/", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := syncCondition(v)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "spec.volumes[rootdisk]") &&
			strings.Contains(c.Message, "no /disk directory") && strings.Contains(c.Message, "containerDisk.path")
	})
}

func syncCondition(v *v1alpha1.VirtualMachineInstance) *metav1.Condition {
	if v == nil {
		return nil
	}
	return meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

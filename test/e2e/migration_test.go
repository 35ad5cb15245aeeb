package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestLiveMigration moves a running VM to the other node through a VirtualMachineInstanceMigration:
// the migration succeeds, the guest keeps counting on the target (no reboot), its page answers at
// the new pod's address, and the source pod is gone.
func TestLiveMigration(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "mig"
	vmi, src := startDemo(t, ns, name, v1alpha1.RunStrategyAlways)
	srcPod := launcherPod(t, vmi)
	ctx := context.Background()

	vmim := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "mig-1", Namespace: ns},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: name}}
	if err := cl.Create(ctx, vmim); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	testutil.Eventually(t, 3*time.Minute, "migration mig-1 Succeeded", func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(vmim), vmim)
		return vmim.Status.Phase == v1alpha1.MigrationSucceeded
	}, func() string {
		v, _ := getVMI(t, ns, name)
		return fmt.Sprintf("migration %+v\nVMI %+v", vmim.Status, v.Status)
	})
	t.Logf("migrated in %.1fs", time.Since(started).Seconds())

	moved := waitVMI(t, ns, name, 30*time.Second, "Running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && v.UID == vmi.UID && v.Status.NodeName != vmi.Status.NodeName &&
			v.Status.Interfaces[0].IP != vmi.Status.Interfaces[0].IP
	})
	dst := console(t, moved)
	expectSameGuest(t, src, dst)
	if body := httpGet(t, moved.Status.Interfaces[0].IP, time.Minute); body != name {
		t.Errorf("the guest's page at its new address is %q, want %q", body, name)
	}
	testutil.Eventually(t, time.Minute, "source pod "+srcPod.Name+" gone", func() bool {
		err := cl.Get(ctx, client.ObjectKeyFromObject(srcPod), srcPod)
		return client.IgnoreNotFound(err) == nil && err != nil
	})
}

// TestLiveMigrationCarriesEmptyDisk: a guest writes a marker to its emptyDisk, the VM (which stays
// LiveMigratable) migrates with `qvirtctl migrate`, and the guest reads the marker back from the
// target node's disk: the disk's contents went along (block migration, tunnelled between the node
// agents), they were not left behind on the source node.
func TestLiveMigrationCarriesEmptyDisk(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "blockmig"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "scratch", Serial: "scratch",
		Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
		EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}})
	applyVM(t, vm)
	vmi := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	src := console(t, vmi)
	src.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	// The guest computes the marker so that the typed line's echo does not match it.
	src.Run(t, "echo QVIRT-MARK-$((6*7)) > /dev/vda && sync && echo WROTE-$((2+3))", "WROTE-5", 30*time.Second)
	moved := qvirtctlMigrate(t, vmi)
	dst := console(t, moved)
	// Read the disk, not the page cache that the migration carried along in the guest's memory.
	from := len(dst.Text())
	dst.Send(t, "sync; echo 3 > /proc/sys/vm/drop_caches; head -c 13 /dev/vda; echo; echo READ-$((1+1))")
	end := dst.Expect(t, from, "READ-2", time.Minute)
	if !strings.Contains(dst.Text()[from:end], "QVIRT-MARK-42") {
		t.Errorf("the marker is not on the emptyDisk on node %s: %q", moved.Status.NodeName, dst.Text()[from:end])
	}
	if strings.Contains(dst.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
}

// qvirtctlMigrate moves the running instance vmi to the other node with `qvirtctl migrate`, once it
// is LiveMigratable, and returns it running there.
func qvirtctlMigrate(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	ns, name := vmi.Namespace, vmi.Name
	waitVMI(t, ns, name, 30*time.Second, "LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	})
	mustQvirtctl(t, "migrate", name, "-n", ns, "--wait", "--timeout", "3m")
	return waitVMI(t, ns, name, 30*time.Second, "Running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && v.UID == vmi.UID && v.Status.NodeName != vmi.Status.NodeName
	})
}

// expectSameGuest: the guest that counted on src's console goes on counting on dst's, without a
// boot in between. A failing test logs both whole consoles (a guest that reset says why there).
func expectSameGuest(t *testing.T, src, dst *testutil.Console) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source console:\n%s\ntarget console:\n%s", src.Text(), dst.Text())
		}
	})
	dst.Expect(t, 0, fmt.Sprintf("tick %d\r\n", src.LastTick()+2), time.Minute)
	if strings.Contains(dst.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
}

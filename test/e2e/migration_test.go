package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/registry"
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
// agents), they were not left behind on the source node. A MigrationPolicy picks the VM by label
// and sends its memory over two parallel streams compressed with zstd, which the tunnel carries.
func TestLiveMigrationCarriesEmptyDisk(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "blockmig"
	policy, vm := policyVM(t, ns, name, v1alpha1.MigrationPolicySpec{
		ParallelMigrationThreads:     ptr.To[int32](2),
		ParallelMigrationCompression: ptr.To(v1alpha1.MigrationCompressionZstd),
	})
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "scratch", Serial: "scratch",
		Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
		EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}})
	vmi, src := bootVM(t, vm)
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
	ms := moved.Status.MigrationState
	if ms == nil || ms.MigrationPolicyName != policy.Name || ms.MigrationConfiguration == nil ||
		ptr.Deref(ms.MigrationConfiguration.ParallelMigrationThreads, 0) != 2 || ptr.Deref(ms.DataParallelBytes, 0) == 0 {
		t.Errorf("migration state %+v: want policy %s with 2 parallel streams that carried the memory", ms, policy.Name)
	}
}

// policyVM creates a MigrationPolicy with spec (for the test's life) that selects the demo VM
// name in ns, which it returns unapplied.
func policyVM(t *testing.T, ns, name string, spec v1alpha1.MigrationPolicySpec) (*v1alpha1.MigrationPolicy, *v1alpha1.VirtualMachine) {
	t.Helper()
	spec.Selectors = &v1alpha1.Selectors{VirtualMachineInstanceSelector: v1alpha1.LabelSelector{"qvirt-e2e-policy": ns}}
	policy := &v1alpha1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Spec: spec}
	if err := cl.Create(context.Background(), policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), policy) })
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	if vm.Spec.Template.ObjectMeta.Labels == nil {
		vm.Spec.Template.ObjectMeta.Labels = map[string]string{}
	}
	vm.Spec.Template.ObjectMeta.Labels["qvirt-e2e-policy"] = ns
	return policy, vm
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
	// Any counter past the source's: lines the guest printed on the target before this console
	// attached are not on it, so waiting for one given line could wait forever.
	want := src.LastTick() + 2
	testutil.Eventually(t, time.Minute, fmt.Sprintf("the counter at %d or more on the target", want),
		func() bool { return dst.LastTick() >= want },
		func() string { return fmt.Sprintf("target console ends with %q", testutil.Tail(dst.Text(), 300)) })
	if strings.Contains(dst.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
}

// TestMigrationKeepsTheImageItBootedFrom: a VM's writable containerDisk is named by a tag, which is
// pushed anew while the VM runs; the live migration's target mounts the digest the source's node
// pulled, not the moved tag, and the guest reads the disk it booted with on the target node.
func TestMigrationKeepsTheImageItBootedFrom(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "pinmig"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tag := lc.Registry + "/qvirt/e2e-" + ns + "-disk:v1"
	push := func(marker string) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "disk.img")
		if err := os.WriteFile(f, append([]byte(marker), make([]byte, 1<<20-len(marker))...), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := registry.PushContainerDisk(ctx, tag, f, "/disk/disk.img"); err != nil {
			t.Fatal(err)
		}
	}
	push("QVIRT-DISK-FIRST")
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "root",
		Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "root", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: tag}}})
	applyVM(t, vm)
	vmi := waitVMI(t, ns, name, bootTimeout, "Running with its disk's digest recorded", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && len(v.Status.ContainerDiskStatus) == 1 && v.Status.ContainerDiskStatus[0].ImageRef != ""
	})
	src := console(t, vmi)
	src.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	readDisk := func(c *testutil.Console) string {
		t.Helper()
		// The disk, not the page cache the migration carried along in the guest's memory.
		from := len(c.Text())
		c.Send(t, "sync; echo 3 > /proc/sys/vm/drop_caches; head -c 16 /dev/vda; echo; echo READ-$((1+1))")
		end := c.Expect(t, from, "READ-2", time.Minute)
		return c.Text()[from:end]
	}
	if got := readDisk(src); !strings.Contains(got, "QVIRT-DISK-FIRST") {
		t.Fatalf("the guest reads %q from its containerDisk, want QVIRT-DISK-FIRST", got)
	}

	push("QVIRT-DISK-MOVED")
	moved := qvirtctlMigrate(t, vmi)
	if got := readDisk(console(t, moved)); !strings.Contains(got, "QVIRT-DISK-FIRST") {
		t.Errorf("on node %s the guest reads %q from its containerDisk, want QVIRT-DISK-FIRST: the target pulled the moved tag",
			moved.Status.NodeName, got)
	}
	repo := strings.TrimSuffix(tag, ":v1")
	recorded := vmi.Status.ContainerDiskStatus[0].ImageRef
	want := repo + recorded[strings.LastIndexByte(recorded, '@'):]
	if got := podImage(t, moved, repo); got != want {
		t.Errorf("the target pod mounts %q, want the digest the source's node pulled, %q", got, want)
	}
}

// podImage is the reference vmi's launcher pod on its node mounts from repository repo.
func podImage(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, repo string) string {
	t.Helper()
	for _, p := range ec.LauncherPods(t, vmi) {
		if p.Spec.NodeName != vmi.Status.NodeName || p.DeletionTimestamp != nil {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.Image != nil && strings.HasPrefix(v.Image.Reference, repo) {
				return v.Image.Reference
			}
		}
	}
	t.Fatalf("no launcher pod of %s on node %s mounts an image of %s", vmi.Name, vmi.Status.NodeName, repo)
	return ""
}

package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/cdi"
	"github.com/qvirt/qvirt/internal/config"
	testcdi "github.com/qvirt/qvirt/test/cdi"
)

// createClaim creates a PersistentVolumeClaim of 1Gi with the access mode and volume mode given.
func createClaim(t testing.TB, ns, name string, access corev1.PersistentVolumeAccessMode, mode corev1.PersistentVolumeMode) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{access}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := cp.Client.Create(context.Background(), pvc); err != nil {
		t.Fatalf("create claim %s: %v", name, err)
	}
}

// withVolumes gives v a virtio disk on each volume.
func withVolumes(v *v1alpha1.VirtualMachineInstance, vols ...v1alpha1.Volume) *v1alpha1.VirtualMachineInstance {
	for _, vol := range vols {
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: vol.Name, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	}
	v.Spec.Volumes = append(v.Spec.Volumes, vols...)
	return v
}

func claimVolume(name, claim string) v1alpha1.Volume {
	return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func migratable(t testing.TB, v *v1alpha1.VirtualMachineInstance) *metav1.Condition {
	return meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
}

// TestClaimsAndHostDisksInLauncherPod: a filesystem claim is mounted where the launcher looks for
// its disk.img, a block claim is a device of the pod, an ephemeral volume's claim is mounted
// read-only, and the namespace's host disk directory is a hostPath volume of its own; the pod's
// fsGroup lets the launcher write to the claims.
func TestClaimsAndHostDisksInLauncherPod(t *testing.T) {
	ns := newNamespace(t)
	cfg := config.Default()
	cfg.UseEmulation = true
	cfg.AllowedHostPaths, cfg.HostDiskNamespaces = []string{"/var/lib/qvirt-images"}, []string{ns}
	startManager(t, ns, config.NewStore(cfg), cp.Config)
	createClaim(t, ns, "root-disk", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	createClaim(t, ns, "raw-disk", corev1.ReadWriteMany, corev1.PersistentVolumeBlock)
	createClaim(t, ns, "golden", corev1.ReadOnlyMany, corev1.PersistentVolumeFilesystem)
	v := withVolumes(newVMI(ns, "stored"), claimVolume("root", "root-disk"), claimVolume("raw", "raw-disk"),
		v1alpha1.Volume{Name: "base", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}},
		v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{
			Path: "/var/lib/qvirt-images/" + ns + "/data.img", Type: v1alpha1.HostDiskExists}}})
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, v)

	vols := map[string]corev1.Volume{}
	for _, vol := range pod.Spec.Volumes {
		vols[vol.Name] = vol
	}
	c := pod.Spec.Containers[0]
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	claimAt := func(path, claim string, readOnly bool) {
		t.Helper()
		m, ok := mounts[path]
		if !ok {
			t.Errorf("nothing mounted at %s: %+v", path, c.VolumeMounts)
			return
		}
		src := vols[m.Name].PersistentVolumeClaim
		if src == nil || src.ClaimName != claim || src.ReadOnly != readOnly || m.ReadOnly != readOnly {
			t.Errorf("%s: mount %+v of %+v, want claim %s (read-only %v)", path, m, vols[m.Name].VolumeSource, claim, readOnly)
		}
	}
	claimAt("/var/run/qvirt/claims/root", "root-disk", false)
	claimAt("/var/run/qvirt/claims/base", "golden", true)
	if len(c.VolumeDevices) != 1 || c.VolumeDevices[0].DevicePath != "/dev/qvirt-claims/raw" ||
		vols[c.VolumeDevices[0].Name].PersistentVolumeClaim == nil || vols[c.VolumeDevices[0].Name].PersistentVolumeClaim.ClaimName != "raw-disk" {
		t.Errorf("volumeDevices %+v: want raw-disk at /dev/qvirt-claims/raw", c.VolumeDevices)
	}
	if _, ok := mounts["/var/run/qvirt/claims/raw"]; ok {
		t.Errorf("the block claim is mounted as a filesystem too")
	}
	dir := "/var/lib/qvirt-images/" + ns
	m, ok := mounts["/var/run/qvirt/host-disks"+dir]
	if hp := vols[m.Name].HostPath; !ok || hp == nil || hp.Path != dir || hp.Type == nil || *hp.Type != corev1.HostPathDirectoryOrCreate || m.ReadOnly {
		t.Errorf("host disk directory: mount %+v of %+v, want %s (DirectoryOrCreate) mounted writable", m, vols[m.Name].VolumeSource, dir)
	}
	for _, vol := range pod.Spec.Volumes {
		if hp := vol.HostPath; hp != nil && hp.Path != dir {
			t.Errorf("the pod mounts host path %s besides the namespace's directory", hp.Path)
		}
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != 107 {
		t.Errorf("pod securityContext %+v: want fsGroup 107 (the launcher's)", sc)
	}
}

// TestMissingClaimHoldsInstanceWithCondition: an instance whose claim does not exist gets no pod
// and says why, naming the claimName field and the claim; once the claim exists the pod is made and the
// condition goes.
func TestMissingClaimHoldsInstanceWithCondition(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	v := withVolumes(newVMI(ns, "waiting"), claimVolume("root", "late-disk"))
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Synchronized=False naming the claim", func() (bool, string) {
		c := meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PVCNotFoundReason &&
			strings.Contains(c.Message, `spec.volumes[root].persistentVolumeClaim.claimName: PersistentVolumeClaim "late-disk" does not exist`), fmt.Sprintf("condition %+v", c)
	})
	if pods := podsOf(t, v); len(pods) != 0 {
		t.Fatalf("a launcher pod was made for an instance whose claim is missing: %s", pods[0].Name)
	}
	if got := getVMI(t, v); got.Status.Phase != v1alpha1.Pending {
		t.Errorf("phase %s, want Pending while the claim is missing", got.Status.Phase)
	}

	createClaim(t, ns, "late-disk", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	waitPod(t, v)
	eventually(t, "the condition gone", func() (bool, string) {
		c := meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		return c == nil, fmt.Sprintf("condition %+v", c)
	})
}

// TestReadWriteOnceClaimIsNotLiveMigratable: a claim another node cannot attach at the same time
// keeps the instance where it is, and LiveMigratable names it; a ReadWriteMany claim does not.
func TestReadWriteOnceClaimIsNotLiveMigratable(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	createClaim(t, ns, "local-disk", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	createClaim(t, ns, "shared-disk", corev1.ReadWriteMany, corev1.PersistentVolumeFilesystem)
	rwo := withVolumes(newVMI(ns, "rwo"), claimVolume("shared", "shared-disk"), claimVolume("root", "local-disk"))
	rwx := withVolumes(newVMI(ns, "rwx"), claimVolume("root", "shared-disk"))
	for _, v := range []*v1alpha1.VirtualMachineInstance{rwo, rwx} {
		if err := cp.Client.Create(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "LiveMigratable=False naming the claim", func() (bool, string) {
		c := migratable(t, rwo)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.DisksNotLiveMigratableReason &&
			strings.Contains(c.Message, `"local-disk"`) && strings.Contains(c.Message, "ReadWriteOnce"), fmt.Sprintf("condition %+v", c)
	})
	eventually(t, "LiveMigratable=True with a ReadWriteMany claim", func() (bool, string) {
		c := migratable(t, rwx)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("condition %+v", c)
	})
}

// TestHostDiskOutsideNamespaceDirectoryIsNotRendered: an instance admitted before the
// configuration changed (or created without the webhook) with a host disk outside its namespace's
// directory gets no pod, and an Event naming the field.
func TestHostDiskOutsideNamespaceDirectoryIsNotRendered(t *testing.T) {
	ns := newNamespace(t)
	cfg := config.Default()
	cfg.UseEmulation = true
	cfg.AllowedHostPaths, cfg.HostDiskNamespaces = []string{"/var/lib/qvirt-images"}, []string{ns, "other"}
	startManager(t, ns, config.NewStore(cfg), cp.Config)
	v := withVolumes(newVMI(ns, "trespass"), v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{
		Path: "/var/lib/qvirt-images/other/disk.img", Type: v1alpha1.HostDiskExistsOrCreate, Capacity: ptr.To(resource.MustParse("1Gi"))}}})
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	got := getVMI(t, v)
	waitEvent(t, got, "Warning "+EventFailedCreate+": Cannot render launcher pod: spec.volumes[0].hostDisk.path: Forbidden: /var/lib/qvirt-images/other/disk.img is in none of namespace "+ns+"'s host disk directories")
	if pods := podsOf(t, v); len(pods) != 0 {
		t.Fatalf("a launcher pod was made: %s", pods[0].Name)
	}
}

// TestDataVolumeClaimInLauncherPod: a dataVolume volume is CDI's claim of that name, handled as a
// persistentVolumeClaim volume: while the claim is missing the instance waits with a condition
// naming the dataVolume field, then the pod mounts the claim where the launcher looks for its
// disk, and a ReadWriteOnce claim keeps the instance from live-migrating. (CDI is not needed here:
// the VM controller waits for the DataVolume to succeed before it creates the instance; the test
// creates the claim CDI would have made.)
func TestDataVolumeClaimInLauncherPod(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	v := withVolumes(newVMI(ns, "imported"), v1alpha1.Volume{Name: "root", VolumeSource: v1alpha1.VolumeSource{
		DataVolume: &v1alpha1.DataVolumeSource{Name: "fedora-dv"}}})
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Synchronized=False naming the dataVolume", func() (bool, string) {
		c := meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PVCNotFoundReason &&
			strings.Contains(c.Message, `spec.volumes[root].dataVolume.name: PersistentVolumeClaim "fedora-dv" does not exist`), fmt.Sprintf("condition %+v", c)
	})
	createClaim(t, ns, "fedora-dv", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	pod := waitPod(t, v)
	c := pod.Spec.Containers[0]
	var found bool
	for _, m := range c.VolumeMounts {
		if m.MountPath != "/var/run/qvirt/claims/root" {
			continue
		}
		for _, vol := range pod.Spec.Volumes {
			if vol.Name == m.Name && vol.PersistentVolumeClaim != nil && vol.PersistentVolumeClaim.ClaimName == "fedora-dv" && !m.ReadOnly {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("the pod does not mount claim fedora-dv writable at /var/run/qvirt/claims/root: mounts %+v, volumes %+v", c.VolumeMounts, pod.Spec.Volumes)
	}
	eventually(t, "LiveMigratable=False naming the DataVolume's claim", func() (bool, string) {
		c := migratable(t, v)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.DisksNotLiveMigratableReason &&
			strings.Contains(c.Message, `"fedora-dv"`), fmt.Sprintf("condition %+v", c)
	})
}

// TestDataVolumeHoldsStandaloneInstance: an instance created on its own with a dataVolume volume
// gets no launcher pod while CDI is still importing into the claim (DataVolumesReady=False naming
// the DataVolume and its phase), and gets it once the DataVolume has succeeded. CDI is played: a
// stand-in of its DataVolume CRD (test/cdi) is installed, and the test creates the claim and
// writes the DataVolume's status.phase as CDI's importer would.
func TestDataVolumeHoldsStandaloneInstance(t *testing.T) {
	testcdi.InstallCRDs(t, cp.Config)
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	dv := cdi.New(ns, "golden-dv")
	dv.Object["spec"] = map[string]any{"source": map[string]any{"http": map[string]any{"url": "https://example.com/golden.qcow2"}}}
	if err := cp.Client.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	setPhase := func(phase string) {
		t.Helper()
		dv.Object["status"] = map[string]any{"phase": phase}
		if err := cp.Client.Status().Update(ctx, dv); err != nil {
			t.Fatalf("set DataVolume phase %s: %v", phase, err)
		}
	}
	setPhase("ImportInProgress")
	createClaim(t, ns, "golden-dv", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	v := withVolumes(newVMI(ns, "golden"), v1alpha1.Volume{Name: "root", VolumeSource: v1alpha1.VolumeSource{
		DataVolume: &v1alpha1.DataVolumeSource{Name: "golden-dv"}}})
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	dvReady := func() *metav1.Condition {
		return meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineDataVolumesReady)
	}
	eventually(t, "DataVolumesReady=False naming the DataVolume", func() (bool, string) {
		c := dvReady()
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.NotAllDataVolumesReadyReason &&
			strings.Contains(c.Message, "spec.volumes[root].dataVolume.name: DataVolume golden-dv is ImportInProgress"), fmt.Sprintf("condition %+v", c)
	})
	time.Sleep(time.Second)
	if pods := podsOf(t, v); len(pods) != 0 {
		t.Fatalf("a launcher pod was made while CDI imports into the claim: %s", pods[0].Name)
	}
	setPhase("Succeeded")
	waitPod(t, v)
	eventually(t, "DataVolumesReady=True", func() (bool, string) {
		c := dvReady()
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("condition %+v", c)
	})
}

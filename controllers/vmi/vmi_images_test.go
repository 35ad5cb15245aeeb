package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/test/testutil"
)

var (
	kernelDigest = "sha256:" + strings.Repeat("1", 64)
	diskDigest   = "sha256:" + strings.Repeat("2", 64)
)

// imageVMI is an instance booting a kernel image with a containerDisk behind a hot-pluggable
// volume, so the disk's pod volume is not the first one.
func imageVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	v := newVMI(ns, name)
	v.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{
		Image: "registry.test/kernel:latest", KernelPath: "/boot/vmlinuz",
	}}}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}}
	v.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "registry.test/disk:v1"}}},
	}
	return v
}

// reportImageRefs plays the kubelet reporting, for each image volume of the compute container, the
// digest it pulled: status.containerStatuses[].volumeMounts[].volumeStatus.image.imageRef.
func reportImageRefs(t testing.TB, pod *corev1.Pod, refs map[string]string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		cs := testutil.RunningWithImageRefs(pod.Spec.Containers[0], func(m corev1.VolumeMount) string { return refs[m.MountPath] })
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		return cp.Client.Status().Update(ctx, pod)
	})
	if err != nil {
		t.Fatalf("report image refs of pod %s: %v", pod.Name, err)
	}
}

// The digests the node pulled for the launcher pod's image volumes are pinned in the instance's
// status, where a migration target takes them from.
func TestImageDigestsRecordedInStatus(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	v := imageVMI(ns, "pinned")
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, v)
	runPod(t, &pod, "node-1")
	waitPhase(t, v, v1alpha1.Scheduled)

	reportImageRefs(t, &pod, map[string]string{
		"/var/run/qvirt/kernel-boot":          "registry.test/kernel@" + kernelDigest,
		"/var/run/qvirt/container-disks/root": "registry.test/disk@" + diskDigest,
	})
	eventually(t, "image digests in the instance's status", func() (bool, string) {
		st := getVMI(t, v).Status
		kb := ""
		if st.KernelBootStatus != nil {
			kb = st.KernelBootStatus.ImageRef
		}
		want := []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: "registry.test/disk@" + diskDigest}}
		ok := kb == "registry.test/kernel@"+kernelDigest && fmt.Sprint(st.ContainerDiskStatus) == fmt.Sprint(want)
		return ok, fmt.Sprintf("kernelBootStatus %q containerDiskStatus %+v", kb, st.ContainerDiskStatus)
	})
}

func TestPinnedReference(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	for _, c := range []struct {
		ref, imageRef, want string
	}{
		{"registry.test/disk:v1", "registry.test/disk@" + d, "registry.test/disk@" + d},
		{"registry.test:5000/a/disk", "registry.test:5000/a/disk@" + d, "registry.test:5000/a/disk@" + d},
		// The spec's repository wins over a normalised one: the pull secrets were written for it.
		{"disk:v1", "docker.io/library/disk@" + d, "disk@" + d},
		// A pinned source pod (itself a former target) pins again to the recorded digest.
		{"registry.test/disk:v1@sha256:" + strings.Repeat("0", 64), "registry.test/disk@" + d, "registry.test/disk@" + d},
		// A runtime's bare image ID is no registry's digest.
		{"registry.test/disk:v1", d, ""},
		{"registry.test/disk:v1", "registry.test/disk@sha256:short", ""},
		{"registry.test/disk:v1", "registry.test/disk@sha256:" + strings.Repeat("AB", 32), ""},
		{"registry.test/disk:v1", "", ""},
	} {
		got, ok := pinnedReference(c.ref, c.imageRef)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("pinnedReference(%q, %q) = %q, %v; want %q", c.ref, c.imageRef, got, ok, c.want)
		}
	}
}

// targetWithRefs is a migration target's pod with a kernelBoot image and the containerDisk "root"
// by tag, whose node reports refs (pod volume name to imageRef) for them.
func targetWithRefs(refs map[string]string) *corev1.Pod {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: podlayout.ComputeContainer, VolumeMounts: []corev1.VolumeMount{
			{Name: "kernel-boot", MountPath: podlayout.KernelBootDir, ReadOnly: true},
			{Name: "containerdisk-0", MountPath: podlayout.ContainerDiskMount("root"), ReadOnly: true},
		}}},
		Volumes: []corev1.Volume{
			{Name: "kernel-boot", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.test/kernel:latest"}}},
			{Name: "containerdisk-0", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.test/disk:v1"}}},
		},
	}}
	cs := corev1.ContainerStatus{Name: podlayout.ComputeContainer}
	for name, ref := range refs {
		cs.VolumeMounts = append(cs.VolumeMounts, corev1.VolumeMountStatus{Name: name,
			VolumeStatus: &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: ref}}})
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	return pod
}

// A target that pulled a tag which has moved since the source pulled it is named, so the migration
// fails before the guest runs on other bytes; what cannot be compared is not.
func TestImageMismatches(t *testing.T) {
	other := "sha256:" + strings.Repeat("3", 64)
	recorded := &v1alpha1.VirtualMachineInstanceStatus{
		KernelBootStatus:    &v1alpha1.KernelBootStatus{ImageRef: kernelDigest},
		ContainerDiskStatus: []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: diskDigest}},
	}
	for _, c := range []struct {
		name string
		st   *v1alpha1.VirtualMachineInstanceStatus
		refs map[string]string
		want string
	}{
		{"same image IDs", recorded, map[string]string{"kernel-boot": kernelDigest, "containerdisk-0": diskDigest}, ""},
		{"the disk's tag moved", recorded, map[string]string{"kernel-boot": kernelDigest, "containerdisk-0": other},
			"[containerDisk root: the target's node pulled " + other + " for registry.test/disk:v1, the source runs " + diskDigest + "]"},
		{"both moved", recorded, map[string]string{"kernel-boot": other, "containerdisk-0": other},
			"[kernelBoot: the target's node pulled " + other + " for registry.test/kernel:latest, the source runs " + kernelDigest +
				" containerDisk root: the target's node pulled " + other + " for registry.test/disk:v1, the source runs " + diskDigest + "]"},
		{"repository digests differ", &v1alpha1.VirtualMachineInstanceStatus{
			ContainerDiskStatus: []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: "registry.test/disk@" + diskDigest}}},
			map[string]string{"containerdisk-0": "registry.test/disk@" + other},
			"[containerDisk root: the target's node pulled registry.test/disk@" + other + " for registry.test/disk:v1, the source runs registry.test/disk@" + diskDigest + "]"},
		{"a repository digest and an image ID cannot be compared", &v1alpha1.VirtualMachineInstanceStatus{
			ContainerDiskStatus: []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: "registry.test/disk@" + diskDigest}}},
			map[string]string{"containerdisk-0": other}, ""},
		{"not reported yet", recorded, map[string]string{}, ""},
		{"nothing recorded", &v1alpha1.VirtualMachineInstanceStatus{}, map[string]string{"containerdisk-0": other}, ""},
		{"not a digest", &v1alpha1.VirtualMachineInstanceStatus{
			ContainerDiskStatus: []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: "registry.test/disk:v1"}}},
			map[string]string{"containerdisk-0": "registry.test/disk:v2"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ImageMismatches(targetWithRefs(c.refs), c.st)
			if s := fmt.Sprint(got); (c.want == "" && len(got) > 0) || (c.want != "" && s != c.want) {
				t.Errorf("ImageMismatches = %s\nwant %s", s, c.want)
			}
		})
	}
}

// With no digest recorded, a tag is left as it is and named, and a reference by digest is left as
// it is and not named: it names the same bytes on every node.
func TestPinImageVolumesWithoutRecord(t *testing.T) {
	pod := targetWithRefs(nil)
	byDigest := "registry.test/kernel@" + kernelDigest
	pod.Spec.Volumes[0].Image.Reference = byDigest
	unpinned := PinImageVolumes(pod, &v1alpha1.VirtualMachineInstanceStatus{})
	if fmt.Sprint(unpinned) != "[containerDisk root]" {
		t.Errorf("unpinned = %q, want only the containerDisk by tag", unpinned)
	}
	if got := pod.Spec.Volumes[0].Image.Reference; got != byDigest {
		t.Errorf("kernel reference %q, want %q unchanged", got, byDigest)
	}
	if got := pod.Spec.Volumes[1].Image.Reference; got != "registry.test/disk:v1" {
		t.Errorf("disk reference %q, want the tag unchanged", got)
	}
}

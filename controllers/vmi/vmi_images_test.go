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
		c := pod.Spec.Containers[0]
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
		for _, m := range c.VolumeMounts {
			ms := corev1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly}
			if ref, ok := refs[m.MountPath]; ok {
				ms.VolumeStatus = &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: ref}}
			}
			cs.VolumeMounts = append(cs.VolumeMounts, ms)
		}
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

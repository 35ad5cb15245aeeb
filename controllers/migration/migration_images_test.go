package migration

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

var (
	kernelDigest = "sha256:" + strings.Repeat("1", 64)
	diskDigest   = "sha256:" + strings.Repeat("2", 64)
)

// withImageVolumes gives a source pod the image volumes the pod renderer gives a launcher with a
// kernelBoot container and the containerDisk "root" (the third volume of its spec), by tag.
func withImageVolumes(pod *corev1.Pod) {
	pod.Spec.Containers[0].Name = "compute"
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "kernel-boot", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{
			Reference: "registry.test/kernel:latest", PullPolicy: corev1.PullAlways}}},
		{Name: "containerdisk-2", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{
			Reference: "registry.test:5000/disk:v1"}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "kernel-boot", MountPath: "/var/run/qvirt/kernel-boot", ReadOnly: true},
		{Name: "containerdisk-2", MountPath: "/var/run/qvirt/container-disks/root", ReadOnly: true},
	}
}

// imageVolumes maps a pod's image volumes to "reference policy".
func imageVolumes(pod *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.Image != nil {
			out[v.Name] = v.Image.Reference + " " + string(v.Image.PullPolicy)
		}
	}
	return out
}

// A migration target pulls the digests the source's node pulled, pinned in the instance's status,
// not the spec's tags, which may name other bytes by now.
func TestTargetPodUsesPinnedDigests(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMIWith("pinned", "node-a", false, withImageVolumes)
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.KernelBootStatus = &v1alpha1.KernelBootStatus{ImageRef: "registry.test/kernel@" + kernelDigest}
		s.ContainerDiskStatus = []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: "registry.test:5000/disk@" + diskDigest}}
	})
	m := e.migrate("m1", vmi.Name)
	tp := e.waitTargetPod(m)
	want := map[string]string{
		"kernel-boot":     "registry.test/kernel@" + kernelDigest + " IfNotPresent",
		"containerdisk-2": "registry.test:5000/disk@" + diskDigest + " IfNotPresent",
	}
	if got := imageVolumes(tp); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("target pod image volumes = %v, want %v", got, want)
	}
}

// An instance whose status has no digest yet (started before digests were recorded) migrates with
// its tags, and the migration says so.
func TestTargetPodWithoutDigestKeepsTag(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMIWith("unpinned", "node-a", false, withImageVolumes)
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.KernelBootStatus = &v1alpha1.KernelBootStatus{ImageRef: "registry.test/kernel@" + kernelDigest}
	})
	m := e.migrate("m1", vmi.Name)
	tp := e.waitTargetPod(m)
	want := map[string]string{
		"kernel-boot":     "registry.test/kernel@" + kernelDigest + " IfNotPresent",
		"containerdisk-2": "registry.test:5000/disk:v1 IfNotPresent", // the API server's default
	}
	if got := imageVolumes(tp); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("target pod image volumes = %v, want %v", got, want)
	}
	e.eventually("an ImagesNotPinned event", func() (bool, string) {
		var list corev1.EventList
		if err := cp.Client.List(e.ctx, &list, client.InNamespace(e.ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == m.Name && ev.Reason == "ImagesNotPinned" && strings.Contains(ev.Message, "containerDisk root") {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprintf("events %q", seen)
	})
}

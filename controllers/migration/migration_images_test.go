package migration

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
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

// runPodReporting plays kube-scheduler and a real kubelet: it binds pod to node and reports it
// Running with refs (pod volume name to imageRef) for its image volumes, which a kubelet reports
// as the runtime's image IDs.
func (e *testEnv) runPodReporting(pod *corev1.Pod, node string, refs map[string]string) {
	e.t.Helper()
	e.bind(pod, node)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{
			testutil.RunningWithImageRefs(pod.Spec.Containers[0], func(m corev1.VolumeMount) string { return refs[m.Name] })}
		return cp.Client.Status().Update(e.ctx, pod)
	})
	if err != nil {
		e.t.Fatalf("report pod %s running: %v", pod.Name, err)
	}
}

// On a real kubelet the source's status records image IDs, which cannot be pinned: the target pulls
// the tag, and when the tag has moved the migration fails before it starts, the guest untouched on
// its source, rather than running on other disk bytes than it booted from.
func TestTargetWithMovedTagFails(t *testing.T) {
	e := setup(t, nil)
	vmi, source := e.runningVMIWith("moved", "node-a", false, withImageVolumes)
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.KernelBootStatus = &v1alpha1.KernelBootStatus{ImageRef: kernelDigest}
		s.ContainerDiskStatus = []v1alpha1.ContainerDiskStatus{{Name: "root", ImageRef: diskDigest}}
	})
	m := e.migrate("m1", vmi.Name)
	tp := e.waitTargetPod(m)
	if got := imageVolumes(tp)["containerdisk-2"]; !strings.HasPrefix(got, "registry.test:5000/disk:v1 ") {
		t.Fatalf("target pod's disk image %q: an image ID cannot be pinned, want the tag", got)
	}
	moved := "sha256:" + strings.Repeat("3", 64)
	e.runPodReporting(tp, "node-b", map[string]string{"kernel-boot": kernelDigest, "containerdisk-2": moved})

	e.assertFailed(m, ReasonTargetImageMismatch)
	got, err := e.getMigration(m)
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(got, ConditionFailed); !strings.Contains(c.Message, "containerDisk root: the target's node pulled "+moved) ||
		strings.Contains(c.Message, "kernelBoot") {
		t.Errorf("Failed condition message %q: want the containerDisk named with both digests, not the kernel", c.Message)
	}
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
	after := e.getVMI(vmi)
	if after.Status.NodeName != "node-a" || after.Status.ActivePods[source.UID] != "node-a" {
		t.Errorf("vmi moved: nodeName %q activePods %v", after.Status.NodeName, after.Status.ActivePods)
	}
	if ms := after.Status.MigrationState; ms != nil && ms.MigrationUID == m.UID && (ms.TargetNodeAddress != "" || ms.StartTimestamp != nil) {
		t.Errorf("the migration got under way: %+v", ms)
	}
	if ok, _ := e.podGone(source); ok {
		t.Errorf("source pod was deleted")
	}
}

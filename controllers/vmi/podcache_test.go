package vmi

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

// The cached launcher pod keeps what the controller reads from it (the images it pulled, its node,
// its status) and loses the rest; other objects lose only their managed fields.
func TestCacheTransform(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "uid-1"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain:  v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: resource.NewQuantity(64<<20, resource.BinarySI)}},
			Volumes: []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example/disk:1"}}}},
		},
	}
	v1alpha1.SetDefaults(&vmi.Spec)
	pod, err := RenderLauncherPod(vmi, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	pod.Spec.NodeName = "node-a"
	pod.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready"}}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "compute", ImageID: "example/disk@sha256:1"}}}
	want := pod.DeepCopy()
	images := podImages(pod)

	got, err := CacheTransform(pod)
	if err != nil {
		t.Fatal(err)
	}
	p := got.(*corev1.Pod)
	if p.ManagedFields != nil {
		t.Error("managed fields kept")
	}
	if !reflect.DeepEqual(p.Labels, want.Labels) || p.Spec.NodeName != "node-a" || !reflect.DeepEqual(p.Status, want.Status) {
		t.Errorf("kept labels %v, node %q, status %+v; want them as they were", p.Labels, p.Spec.NodeName, p.Status)
	}
	if len(want.Spec.Volumes) < 2 || len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].Image == nil || p.Spec.Volumes[0].Image.Reference != "example/disk:1" {
		t.Errorf("kept volumes %+v of %d; want the image volume alone", p.Spec.Volumes, len(want.Spec.Volumes))
	}
	if got := podImages(p); !reflect.DeepEqual(got, images) || len(got) == 0 {
		t.Errorf("the trimmed pod's images %+v, want %+v", got, images)
	}
	c := p.Spec.Containers[0]
	if c.Name != want.Spec.Containers[0].Name || c.Image != want.Spec.Containers[0].Image {
		t.Errorf("container %q image %q, want %q %q", c.Name, c.Image, want.Spec.Containers[0].Name, want.Spec.Containers[0].Image)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != p.Spec.Volumes[0].Name || len(want.Spec.Containers[0].VolumeMounts) < 2 {
		t.Errorf("kept mounts %+v of %+v; want the image volume's alone", c.VolumeMounts, want.Spec.Containers[0].VolumeMounts)
	}
	if c.Resources.Requests != nil || c.Command != nil || c.SecurityContext != nil || p.Spec.Tolerations != nil {
		t.Errorf("kept resources %v, command %v, security context %v, tolerations %v", c.Resources.Requests, c.Command, c.SecurityContext, p.Spec.Tolerations)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}, Data: map[string]string{"k": "v"}}
	out, err := CacheTransform(cm)
	if err != nil || out.(*corev1.ConfigMap).ManagedFields != nil || out.(*corev1.ConfigMap).Data["k"] != "v" {
		t.Errorf("a ConfigMap through the transform: %+v, %v", out, err)
	}
}

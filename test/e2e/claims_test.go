package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestClaimErrors: a VM whose disk is a PersistentVolumeClaim that cannot hold its disk image says
// why on its instance, naming the volume's field and the claim, instead of starting: a claim too
// small for any disk.img (1 MiB: less than a MiB is left after the filesystem's 5.5%), a claim
// whose volume has far less room than the claim's capacity promises (local mode's volumes share
// the host's disk, which has less free space than the 1 PiB asked), and a claim that does not
// exist. No guest boots.
func TestClaimErrors(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	claim := func(name, size string) {
		pvc := &corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
		data, err := yaml.Marshal(pvc)
		if err != nil {
			t.Fatal(err)
		}
		run(t, data, kubectl, "apply", "-f", "-")
	}
	withClaim := func(name, claim string) *v1alpha1.VirtualMachine {
		vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "data", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		return vm
	}
	claim("tiny", "1Mi")
	claim("huge", "1Pi")
	applyVM(t, withClaim("tiny", "tiny"))
	applyVM(t, withClaim("huge", "huge"))
	applyVM(t, withClaim("noclaim", "nosuch"))

	for _, tc := range []struct {
		vm     string
		reason string
		want   []string
	}{
		{"tiny", "", []string{"spec.volumes[data].persistentVolumeClaim", "tiny", "too small for a disk image"}},
		{"huge", "", []string{"spec.volumes[data]", "claim huge is too small", "disk.img"}},
		{"noclaim", v1alpha1.PVCNotFoundReason, []string{"spec.volumes[data].persistentVolumeClaim", "nosuch"}},
	} {
		v := waitVMI(t, ns, tc.vm, 2*time.Minute, "Synchronized=False naming the claim", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := syncCondition(v)
			if c == nil || c.Status != metav1.ConditionFalse || (tc.reason != "" && c.Reason != tc.reason) {
				return false
			}
			for _, w := range tc.want {
				if !strings.Contains(c.Message, w) {
					return false
				}
			}
			return true
		})
		if v.Status.Phase == v1alpha1.Running || v.Status.Phase.Final() {
			t.Errorf("VMI %s is %s; want it waiting, not started or ended", tc.vm, v.Status.Phase)
		}
		t.Logf("VMI %s: %s: %s", tc.vm, syncCondition(v).Reason, syncCondition(v).Message)
	}
}

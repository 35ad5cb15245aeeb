package migration

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

func TestWithNodeNotIn(t *testing.T) {
	notIn := corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-a"}}
	zone := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}}
	rack := corev1.NodeSelectorRequirement{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}}
	podAff := &corev1.PodAffinity{}
	cases := []struct {
		name string
		in   *corev1.Affinity
		want *corev1.Affinity
	}{
		{"none", nil, &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{notIn}}}}}}},
		{"pod affinity kept", &corev1.Affinity{PodAffinity: podAff}, &corev1.Affinity{PodAffinity: podAff, NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{notIn}}}}}}},
		{"ANDed into every ORed term", &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{zone}},
				{MatchExpressions: []corev1.NodeSelectorRequirement{rack}}}}}},
			&corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{zone, notIn}},
					{MatchExpressions: []corev1.NodeSelectorRequirement{rack, notIn}}}}}}},
	}
	for _, tc := range cases {
		var before *corev1.Affinity
		if tc.in != nil {
			before = tc.in.DeepCopy()
		}
		got := withNodeNotIn(tc.in, "node-a")
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: withNodeNotIn = %+v, want %+v", tc.name, got, tc.want)
		}
		if !reflect.DeepEqual(tc.in, before) {
			t.Errorf("%s: withNodeNotIn changed its input", tc.name)
		}
	}
}

func TestRenderTargetPod(t *testing.T) {
	vmi := runningVMI()
	vmim := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: "mig-uid"}}
	source := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-vm1-abcde", Namespace: "ns",
			Labels: map[string]string{v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMIUIDLabel: "vmi-uid", "app": "web",
				v1alpha1.MigrationUIDLabel: "previous"},
			Finalizers: []string{"x/y"}},
		Spec: corev1.PodSpec{
			NodeName: "node-a", Priority: ptr.To[int32](10), PriorityClassName: "high",
			// What a former migration target carries: the NotIn of the migration before.
			Affinity:       withNodeNotIn(nil, "node-z"),
			InitContainers: []corev1.Container{{Name: "init", Image: "img:1"}},
			Containers:     []corev1.Container{{Name: podlayout.ComputeContainer, Image: "img:1"}, {Name: "sidecar", Image: "other:1"}},
		},
	}
	pod, unpinned := renderTargetPod(vmim, vmi, source, "img:2")
	if len(unpinned) != 0 {
		t.Errorf("unpinned = %v for a pod without image volumes", unpinned)
	}
	if pod.Spec.NodeName != "" || pod.Spec.Priority != nil || pod.Spec.PriorityClassName != "high" {
		t.Errorf("spec: nodeName %q priority %v class %q", pod.Spec.NodeName, pod.Spec.Priority, pod.Spec.PriorityClassName)
	}
	// The target runs qvirt-config's launcher image (an upgrade's), the rest as the source does.
	if pod.Spec.Containers[0].Image != "img:2" || pod.Spec.InitContainers[0].Image != "img:2" || pod.Spec.Containers[1].Image != "other:1" ||
		source.Spec.NodeName != "node-a" || source.Spec.Containers[0].Image != "img:1" {
		t.Errorf("target containers %+v init %+v: want the launcher image img:2 and the sidecar's own; or source changed",
			pod.Spec.Containers, pod.Spec.InitContainers)
	}
	if pod.GenerateName != "qvirt-launcher-vm1-" || pod.Name != "" || len(pod.Finalizers) != 0 {
		t.Errorf("metadata: generateName %q name %q finalizers %v", pod.GenerateName, pod.Name, pod.Finalizers)
	}
	want := map[string]string{v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMIUIDLabel: "vmi-uid", "app": "web",
		v1alpha1.VMINameLabel: "vm1", v1alpha1.MigrationUIDLabel: "mig-uid"}
	if !reflect.DeepEqual(pod.Labels, want) {
		t.Errorf("labels = %v, want %v", pod.Labels, want)
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != vmi.UID || !*pod.OwnerReferences[0].Controller {
		t.Errorf("owner references = %+v", pod.OwnerReferences)
	}
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Values[0] != "node-a" {
		t.Errorf("affinity = %+v", terms)
	}
}

package migration

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	vmictrl "github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// hostnameLabel is the node label the target pod's anti-affinity uses.
const hostnameLabel = corev1.LabelHostname

// renderTargetPod renders a migration's target launcher pod as a copy of the source launcher pod:
// the same image, resources, volumes and security context guarantee the target can run the guest the
// source runs. It differs in being unbound, in carrying the migration label, and in a required node
// affinity (the instance's spec.affinity plus hostname NotIn [source node]) that keeps it off the
// source node. It is owned by the instance (as the contract asks of
// every launcher pod), not by the migration, so it outlives a successful migration.
//
// Its image volumes pull the digests pinned in the instance's status, not the spec's tags, which
// may name other bytes by now; unpinned names the images left on their tag for want of a digest.
//
// Its launcher is launcherImage, qvirt-config's current one, not the source's: a migration is how
// a running guest moves to the launcher of an upgraded qvirt (KubeVirt's workload update by live
// migration), and launchers of consecutive builds speak the same migration stream (QEMU's).
func renderTargetPod(vmim *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance,
	source *corev1.Pod, launcherImage string) (pod *corev1.Pod, unpinned []string) {
	spec := source.Spec.DeepCopy()
	setLauncherImage(spec, launcherImage)
	spec.NodeName = ""
	spec.EphemeralContainers = nil
	// The priority admission plugin fills these from priorityClassName again.
	spec.Priority, spec.PreemptionPolicy = nil, nil
	// The affinity starts again from the instance's (the launcher pod carries it verbatim): a source
	// pod that was itself a migration target carries the NotIn of the migration before.
	spec.Affinity = withNodeNotIn(vmi.Spec.Affinity, source.Spec.NodeName)

	labels := map[string]string{}
	for k, v := range source.Labels {
		labels[k] = v
	}
	labels[v1alpha1.AppLabel] = v1alpha1.LauncherApp
	labels[v1alpha1.VMINameLabel] = vmi.Name
	labels[v1alpha1.VMIUIDLabel] = string(vmi.UID)
	labels[v1alpha1.MigrationUIDLabel] = string(vmim.UID)
	var annotations map[string]string
	if len(source.Annotations) > 0 {
		annotations = make(map[string]string, len(source.Annotations))
		for k, v := range source.Annotations {
			annotations[k] = v
		}
	}
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "qvirt-launcher-" + vmi.Name + "-",
			Namespace:    vmi.Namespace,
			Labels:       labels,
			Annotations:  annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         v1alpha1.GroupVersion.String(),
				Kind:               "VirtualMachineInstance",
				Name:               vmi.Name,
				UID:                vmi.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *spec,
	}
	return pod, vmictrl.PinImageVolumes(pod, &vmi.Status)
}

// setLauncherImage gives every container of spec that runs the compute container's image image
// instead.
func setLauncherImage(spec *corev1.PodSpec, image string) {
	old := ""
	for _, c := range spec.Containers {
		if c.Name == podlayout.ComputeContainer {
			old = c.Image
		}
	}
	if old == "" || image == "" {
		return
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			if cs[i].Image == old {
				cs[i].Image = image
			}
		}
	}
}

// withNodeNotIn returns a copy of aff whose required node affinity also excludes node. Required
// node selector terms are ORed, so the expression goes into every term.
func withNodeNotIn(aff *corev1.Affinity, node string) *corev1.Affinity {
	out := &corev1.Affinity{}
	if aff != nil {
		out = aff.DeepCopy()
	}
	if node == "" {
		return out
	}
	notIn := corev1.NodeSelectorRequirement{Key: hostnameLabel, Operator: corev1.NodeSelectorOpNotIn, Values: []string{node}}
	if out.NodeAffinity == nil {
		out.NodeAffinity = &corev1.NodeAffinity{}
	}
	req := out.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if req == nil || len(req.NodeSelectorTerms) == 0 {
		out.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notIn}}},
		}
		return out
	}
	for i := range req.NodeSelectorTerms {
		req.NodeSelectorTerms[i].MatchExpressions = append(req.NodeSelectorTerms[i].MatchExpressions, notIn)
	}
	return out
}

// findSourcePod returns the launcher pod the instance runs in: a pod with the instance's UID label
// on status.nodeName that is not being deleted, preferring the one status.activePods names.
func findSourcePod(ctx context.Context, c client.Reader, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pods corev1.PodList
	// The app label too: the cache holds launcher pods only, the API server any pod with the label.
	launchers := client.MatchingLabels{v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMIUIDLabel: string(vmi.UID)}
	if err := c.List(ctx, &pods, client.InNamespace(vmi.Namespace), launchers); err != nil {
		return nil, fmt.Errorf("list launcher pods of %s: %w", vmi.Name, err)
	}
	var found *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || p.Spec.NodeName != vmi.Status.NodeName {
			continue
		}
		if vmi.Status.ActivePods[p.UID] == p.Spec.NodeName {
			return p, nil
		}
		if found == nil {
			found = p
		}
	}
	return found, nil
}

// listTargetPods returns the pods carrying the migration's label.
func listTargetPods(ctx context.Context, c client.Reader, vmim *v1alpha1.VirtualMachineInstanceMigration) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(vmim.Namespace), client.MatchingLabels{v1alpha1.MigrationUIDLabel: string(vmim.UID)}); err != nil {
		return nil, fmt.Errorf("list target pods of migration %s: %w", vmim.Name, err)
	}
	return pods.Items, nil
}

// currentTargetPod picks the migration's target pod: the one not being deleted, else any.
func currentTargetPod(pods []corev1.Pod) *corev1.Pod {
	var gone *corev1.Pod
	for i := range pods {
		if pods[i].DeletionTimestamp == nil {
			return &pods[i]
		}
		gone = &pods[i]
	}
	return gone
}

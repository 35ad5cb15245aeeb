// Package uninstall keeps `kubectl delete -k config/default` from orphaning running guests. Each
// VirtualMachine, VirtualMachineInstance and migration holds a finalizer that only
// qvirt-controller and the node agents clear (graceful shutdown, launcher pod clean-up); an
// uninstall that removed them with the objects would leave the guests running with nothing to
// manage them, and the objects Terminating for ever. So while any exists, the uninstall is
// refused: this is KubeVirt's uninstallStrategy BlockUninstallIfWorkloadsExist, applied to
// qvirt's manifests since qvirt has no operator CR to guard.
//
// A migration counts until it finishes. Two mechanisms, because Kubernetes sends no webhook the deletion of webhook configurations and
// admission policies (rules.IsExemptAdmissionConfigurationResource in k8s.io/apiserver):
//   - Guard, a validating webhook, refuses the deletion of every other installed object (those
//     carrying InstallLabel): the namespace first, by kustomize's order, so the controller stays up
//     to refuse the rest.
//   - Reconciler keeps Finalizer on qvirt's webhook configurations and admission policies while
//     workloads exist, so that their deletion waits (they keep working while Terminating, and
//     tenants' VMs stay validated) until the last workload is gone.
package uninstall

import (
	"context"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Path is where the guard is served.
const Path = "/validate-uninstall"

// InstallLabel marks every object config/default installs (its kustomization's labels, value
// "qvirt"); the guard's objectSelector matches it, so the guard sees no other deletion.
const InstallLabel = "app.kubernetes.io/part-of"

// The guard's failure policy is Ignore: a qvirt-controller that is not running cannot be asked, and
// must not make a broken installation impossible to remove. Its rules name the kinds
// config/default installs (test/manifests checks them), not every kind: Kubernetes copies a
// Service's labels onto its EndpointSlices, whose deletions are the endpoint controller's business.
// +kubebuilder:webhook:path=/validate-uninstall,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="";apps;policy;rbac.authorization.k8s.io;apiextensions.k8s.io;apiregistration.k8s.io,resources=namespaces;serviceaccounts;configmaps;services;deployments;daemonsets;poddisruptionbudgets;roles;rolebindings;clusterroles;clusterrolebindings;customresourcedefinitions;apiservices,verbs=delete,versions=*,name=vuninstall.qvirt.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"objectSelector":{"matchLabels":{"app.kubernetes.io/part-of":"qvirt"}}}`

// Guard refuses to delete an installed object while workloads exist. When it lets a deletion
// through (not a dry run), it first takes Finalizer off every target: the uninstall is under way,
// and a target the reconciler still holds (it has not caught up with the last workload's
// deletion) or one held Terminating since a refused uninstall must go with the rest rather than
// wait for a controller that is about to stop.
type Guard struct {
	// Reader lists workloads and reads the targets from kube-apiserver: a replica that does not
	// lead holds no cache of them (controllers.Setup). An uninstall deletes a few dozen installed
	// objects, a rare administrator's action, and each deletion refused while workloads exist
	// costs three lists.
	Reader client.Reader
	// Client patches the targets.
	Client client.Client
}

// Handle implements admission.Handler.
func (g *Guard) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Delete {
		return admission.Allowed("")
	}
	inUse, err := Workloads(ctx, g.Reader)
	if err != nil {
		return admission.Denied(fmt.Sprintf("qvirt could not tell whether VMs still exist, so it keeps %s %q: %v", req.Kind.Kind, req.Name, err))
	}
	if inUse != "" {
		return admission.Denied(fmt.Sprintf("qvirt is still in use (%s): deleting %s %q would leave their guests running with nothing to manage them; "+
			"delete them first (kubectl delete vm,vmi,vmim --all -A) and run the uninstall again", inUse, req.Kind.Kind, req.Name))
	}
	if req.DryRun != nil && *req.DryRun {
		return admission.Allowed("")
	}
	if err := Release(ctx, g.Reader, g.Client); err != nil {
		return admission.Denied(fmt.Sprintf("qvirt could not release its webhook configurations and admission policies before %s %q goes: %v; try again", req.Kind.Kind, req.Name, err))
	}
	return admission.Allowed("")
}

// Workloads describes the objects that keep qvirt in use ("1 VirtualMachineInstance: default/demo;
// ..."), or is empty when there are none: every VM (its definition would go with the CRD) and VMI,
// and every migration not yet finished (a finished one holds no finalizer and is history, which
// KubeVirt users never delete).
func Workloads(ctx context.Context, r client.Reader) (string, error) {
	kinds := []struct {
		kind   string
		list   client.ObjectList
		counts func(runtime.Object) bool
	}{
		{"VirtualMachine", &v1alpha1.VirtualMachineList{}, nil},
		{"VirtualMachineInstance", &v1alpha1.VirtualMachineInstanceList{}, nil},
		{"VirtualMachineInstanceMigration", &v1alpha1.VirtualMachineInstanceMigrationList{}, counts},
	}
	var parts []string
	for _, k := range kinds {
		opts := []client.ListOption{client.UnsafeDisableDeepCopy}
		if k.counts == nil {
			// Every item counts, so the first few and the API server's count of the rest say it
			// all; the whole list of thousands of VMIs could outlast the guard's 5 s timeout.
			opts = append(opts, client.Limit(shownNames))
		}
		if err := r.List(ctx, k.list, opts...); err != nil {
			return "", fmt.Errorf("list %ss: %w", k.kind, err)
		}
		if names := objectNames(k.list, k.counts); len(names) > 0 {
			parts = append(parts, describe(k.kind, names, k.list.GetRemainingItemCount(), k.counts == nil))
		}
	}
	return strings.Join(parts, "; "), nil
}

// shownNames is how many workloads of a kind a refusal names.
const shownNames = 3

// describe counts names of kind and names the first few. A limited list's rest is the API server's
// remaining count; a cache's limited list gives none, so a full one says "or more".
func describe(kind string, names []string, remaining *int64, limited bool) string {
	switch {
	case remaining != nil && *remaining > 0:
		return fmt.Sprintf("%d %s: %s and %d more", int64(len(names))+*remaining, kind, strings.Join(names, ", "), *remaining)
	case limited && remaining == nil && len(names) == shownNames:
		return fmt.Sprintf("%d or more %s: %s", len(names), kind, strings.Join(names, ", "))
	}
	return fmt.Sprintf("%d %s: %s", len(names), kind, firstNames(names, shownNames))
}

// counts says whether a migration keeps qvirt in use: until it finishes.
func counts(o runtime.Object) bool {
	m, ok := o.(*v1alpha1.VirtualMachineInstanceMigration)
	return ok && m.Status.Phase != v1alpha1.MigrationSucceeded && m.Status.Phase != v1alpha1.MigrationFailed
}

// objectNames lists namespace/name of each item of list that counts (all when counts is nil).
func objectNames(list client.ObjectList, counts func(runtime.Object) bool) []string {
	var names []string
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if m, ok := o.(client.Object); ok && (counts == nil || counts(o)) {
			names = append(names, m.GetNamespace()+"/"+m.GetName())
		}
		return nil
	})
	return names
}

// firstNames joins the first n names, saying how many more there are.
func firstNames(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

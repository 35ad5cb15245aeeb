package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/cdi"
)

// DataVolumes, as KubeVirt's VM controller handles them when it starts a VM (startVMI and
// handleDataVolumes in pkg/virt-controller/watch/vm): before the VM's instance is created, every
// spec.dataVolumeTemplates entry becomes a CDI DataVolume named as the template, in the VM's
// namespace and controlled by the VM, and the instance waits until the DataVolumes of its
// dataVolume volumes have succeeded. CDI then owns the DataVolume and its claim (named as the
// DataVolume), which the instance's dataVolume volume attaches as a persistentVolumeClaim volume
// (v1alpha1.ClaimVolumes). DataVolumes are unstructured objects (package cdi).

// DataVolumeGVK is CDI's DataVolume kind.
var DataVolumeGVK = cdi.DataVolumeGVK

// Reasons of the DataVolumesReady and Failure conditions and of events about DataVolumes;
// KubeVirt's where it has one.
const (
	ReasonAllDVsReady    = v1alpha1.AllDataVolumesReadyReason
	ReasonNotAllDVsReady = v1alpha1.NotAllDataVolumesReadyReason
	// ReasonCDINotInstalled: the cluster serves no cdi.kubevirt.io/v1beta1 DataVolume.
	ReasonCDINotInstalled = "CDINotInstalled"
	// ReasonDataVolumeConflict: a DataVolume of a template's name exists and another owner (or
	// none) controls it; it is not adopted.
	ReasonDataVolumeConflict        = "DataVolumeConflict"
	ReasonFailedDataVolumeCreate    = "FailedDataVolumeCreate"
	ReasonFailedDataVolumeImport    = "FailedDataVolumeImport"
	ReasonDataVolumeNotFound        = "FailedDataVolumeNotFound"
	EventSuccessfulDataVolumeCreate = "SuccessfulDataVolumeCreate"
)

// dataVolumeRecheck is how often a VM waiting for its DataVolumes looks at them again, on top of
// the watch (there is none when CDI was not installed at start-up).
const dataVolumeRecheck = 3 * time.Second

// dataVolumesState is what ensureDataVolumes found: nil when the VM has no DataVolumes.
type dataVolumesState struct {
	// Ready: every DataVolume of the instance's dataVolume volumes can be used.
	Ready bool
	// Waiting describes, for people, each DataVolume not ready yet.
	Waiting []string
	// Failure, when set, stops the start until it is fixed: CDI missing, a DataVolume that failed,
	// is missing or is another owner's.
	Failure *Failure
	// Printable is the VM's printable status while no instance exists.
	Printable v1alpha1.PrintableStatus
}

// condition is the VM's DataVolumesReady condition.
func (s *dataVolumesState) condition() metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.VirtualMachineDataVolumesReady, Status: metav1.ConditionTrue,
		Reason: ReasonAllDVsReady, Message: "all DataVolumes have succeeded"}
	if !s.Ready {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonNotAllDVsReady
		c.Message = strings.Join(s.Waiting, "; ")
		if s.Failure != nil {
			c.Message = s.Failure.Message
		}
	}
	return c
}

// hasDataVolumes says whether spec (the instance's) or vm's templates name DataVolumes.
func hasDataVolumes(vm *v1alpha1.VirtualMachine, spec *v1alpha1.VirtualMachineInstanceSpec) bool {
	return len(vm.Spec.DataVolumeTemplates) > 0 || slices.ContainsFunc(spec.Volumes, func(v v1alpha1.Volume) bool { return v.DataVolume != nil })
}

// ensureDataVolumes creates the DataVolumes of vm's templates that do not exist and reports
// whether those of spec's dataVolume volumes are ready; nil when there are none. Errors are those
// worth a retry (the API server failing); what the user must fix is in the state's Failure.
func (r *Reconciler) ensureDataVolumes(ctx context.Context, vm *v1alpha1.VirtualMachine, spec *v1alpha1.VirtualMachineInstanceSpec) (*dataVolumesState, error) {
	if !hasDataVolumes(vm, spec) {
		return nil, nil
	}
	st := &dataVolumesState{Ready: true, Printable: v1alpha1.PrintableStatusProvisioning}
	templates := map[string]int{}
	for i := range vm.Spec.DataVolumeTemplates {
		t := &vm.Spec.DataVolumeTemplates[i]
		templates[t.ObjectMeta.Name] = i
		dv, err := r.getDataVolume(ctx, vm.Namespace, t.ObjectMeta.Name)
		switch {
		case meta.IsNoMatchError(err):
			return cdiMissing(st, fmt.Sprintf("spec.dataVolumeTemplates[%d] (DataVolume %s)", i, t.ObjectMeta.Name)), nil
		case apierrors.IsNotFound(err):
			if err := r.createDataVolume(ctx, vm, i); err != nil {
				return r.createFailed(st, vm, i, err)
			}
			st.Ready = false
			st.Waiting = append(st.Waiting, fmt.Sprintf("DataVolume %s was created", t.ObjectMeta.Name))
			continue
		case err != nil:
			return nil, err
		}
		if ref := metav1.GetControllerOf(dv); ref == nil || ref.UID != vm.UID {
			st.Ready = false
			st.Failure = &Failure{Reason: ReasonDataVolumeConflict, Message: fmt.Sprintf(
				"DataVolume %s of spec.dataVolumeTemplates[%d] exists and is not controlled by this VM; it is not adopted: delete it or rename the template", t.ObjectMeta.Name, i)}
			return st, nil
		}
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.DataVolume == nil {
			continue
		}
		name := v.DataVolume.Name
		dv, err := r.getDataVolume(ctx, vm.Namespace, name)
		switch {
		case meta.IsNoMatchError(err):
			return cdiMissing(st, fmt.Sprintf("volume %s (DataVolume %s)", v.Name, name)), nil
		case apierrors.IsNotFound(err):
			st.Ready = false
			if _, ok := templates[name]; ok {
				continue // created above, not in the API reader's view yet
			}
			st.Failure = &Failure{Reason: ReasonDataVolumeNotFound, Message: fmt.Sprintf(
				"spec.template.spec.volumes[%s].dataVolume.name: DataVolume %s does not exist in namespace %s and no dataVolumeTemplate creates it", v.Name, name, vm.Namespace)}
			st.Printable = v1alpha1.PrintableStatusDataVolumeNotFound
			return st, nil
		case err != nil:
			return nil, err
		}
		phase := cdi.Phase(dv)
		switch {
		case cdi.Usable(phase):
		case phase == cdi.Failed:
			st.Ready = false
			st.Failure = &Failure{Reason: ReasonFailedDataVolumeImport, Message: fmt.Sprintf(
				"DataVolume %s of volume %s failed%s", name, v.Name, conditionMessages(dv))}
			st.Printable = v1alpha1.PrintableStatusDataVolumeNotReady
			r.Recorder.Eventf(vm, corev1.EventTypeWarning, ReasonFailedDataVolumeImport, "DataVolume %s failed to import disk image", name)
			return st, nil
		case phase == cdi.WaitForFirstConsumer:
			st.Ready = false
			st.Waiting = append(st.Waiting, fmt.Sprintf("DataVolume %s waits for a first consumer, which qvirt does not provide before it has succeeded: "+
				"use a storage class with Immediate binding, or CDI's volume populators", name))
		default:
			st.Ready = false
			w := fmt.Sprintf("DataVolume %s is %s", name, phaseOrPending(phase))
			if p, _, _ := unstructured.NestedString(dv.Object, "status", "progress"); p != "" && p != "N/A" {
				w += " (" + p + ")"
			}
			st.Waiting = append(st.Waiting, w)
		}
	}
	return st, nil
}

func phaseOrPending(phase string) string {
	if phase == "" {
		return "not started by CDI yet"
	}
	return phase
}

// conditionMessages are the messages of dv's status conditions that say something, for a
// failure's message.
func conditionMessages(dv *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(dv.Object, "status", "conditions")
	var msgs []string
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if s, _ := m["message"].(string); s != "" && !slices.Contains(msgs, s) {
			msgs = append(msgs, s)
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return ": " + strings.Join(msgs, "; ")
}

// cdiMissing is the state of a VM whose what needs CDI, which the cluster does not serve.
func cdiMissing(st *dataVolumesState, what string) *dataVolumesState {
	st.Ready = false
	st.Failure = &Failure{Reason: ReasonCDINotInstalled, Message: fmt.Sprintf(
		"CDI is not installed: %s needs CDI's DataVolume API (%s, kind %s), which this cluster does not serve; install CDI or use a persistentVolumeClaim volume",
		what, DataVolumeGVK.GroupVersion(), DataVolumeGVK.Kind)}
	return st
}

// createFailed reports a DataVolume the API server refused to create: a refusal (CDI's admission,
// quota, permissions) is the user's to fix and is reported; anything else is retried.
func (r *Reconciler) createFailed(st *dataVolumesState, vm *v1alpha1.VirtualMachine, i int, err error) (*dataVolumesState, error) {
	name := vm.Spec.DataVolumeTemplates[i].ObjectMeta.Name
	if meta.IsNoMatchError(err) {
		return cdiMissing(st, fmt.Sprintf("spec.dataVolumeTemplates[%d] (DataVolume %s)", i, name)), nil
	}
	if apierrors.IsAlreadyExists(err) {
		// Created meanwhile (by us a moment ago, or by someone else): the next pass looks at it.
		st.Ready = false
		st.Waiting = append(st.Waiting, fmt.Sprintf("DataVolume %s was created", name))
		return st, nil
	}
	r.Recorder.Eventf(vm, corev1.EventTypeWarning, ReasonFailedDataVolumeCreate, "Error creating DataVolume %s: %v", name, err)
	if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		st.Ready = false
		st.Failure = &Failure{Reason: ReasonFailedDataVolumeCreate, Message: fmt.Sprintf(
			"create DataVolume %s from spec.dataVolumeTemplates[%d]: %v", name, i, err)}
		return st, nil
	}
	return nil, fmt.Errorf("create DataVolume %s: %w", name, err)
}

// getDataVolume reads a DataVolume from the API server (unstructured objects are not cached).
func (r *Reconciler) getDataVolume(ctx context.Context, namespace, name string) (*unstructured.Unstructured, error) {
	return cdi.Get(ctx, r.reader(), namespace, name)
}

// createDataVolume creates the DataVolume of vm's template i, as KubeVirt's
// CreateDataVolumeManifest: the template's name, labels, annotations and spec, in the VM's
// namespace, controlled by the VM (so the garbage collector deletes it with the VM).
func (r *Reconciler) createDataVolume(ctx context.Context, vm *v1alpha1.VirtualMachine, i int) error {
	t := &vm.Spec.DataVolumeTemplates[i]
	spec := map[string]any{}
	if len(t.Spec.Raw) > 0 {
		if err := json.Unmarshal(t.Spec.Raw, &spec); err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("spec.dataVolumeTemplates[%d].spec: %v", i, err))
		}
	}
	dv := cdi.New(vm.Namespace, t.ObjectMeta.Name)
	dv.Object["spec"] = spec
	dv.SetLabels(maps.Clone(t.ObjectMeta.Labels))
	dv.SetAnnotations(maps.Clone(t.ObjectMeta.Annotations))
	dv.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(vm, v1alpha1.GroupVersion.WithKind("VirtualMachine"))})
	if err := r.Client.Create(ctx, dv); err != nil {
		return err
	}
	r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventSuccessfulDataVolumeCreate, "Created DataVolume %s", t.ObjectMeta.Name)
	return nil
}

// cdiInstalled says whether the cluster serves CDI's DataVolume kind, as mapper knows it.
func cdiInstalled(mapper meta.RESTMapper) bool {
	_, err := mapper.RESTMapping(DataVolumeGVK.GroupKind(), DataVolumeGVK.Version)
	return err == nil
}

package vmi

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/cdi"
	"github.com/qvirt/qvirt/internal/patch"
)

// dataVolumeRecheck is how often an instance waiting for its DataVolumes looks at them again:
// nothing here watches DataVolumes (CDI may not be installed).
const dataVolumeRecheck = 3 * time.Second

// waitingDataVolumes describes the DataVolumes of the instance's dataVolume volumes that are not
// ready for its launcher pod yet, as KubeVirt's VMI controller waits before it creates the pod (a
// VM's instance is created only once they are, so this matters for an instance created on its
// own): a pod on a claim CDI is still writing would start the guest on half a disk. Where the
// cluster serves no DataVolume kind (CDI not installed) there is nothing to wait for: the claim
// rule applies alone.
func (r *Reconciler) waitingDataVolumes(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) ([]string, error) {
	var out []string
	for _, v := range vmi.Spec.Volumes {
		if v.DataVolume == nil {
			continue
		}
		dv, err := cdi.Get(ctx, r.Client, vmi.Namespace, v.DataVolume.Name)
		switch {
		case meta.IsNoMatchError(err):
			return nil, nil
		case apierrors.IsNotFound(err):
			continue // the missing claim says it (PVCNotFoundReason)
		case err != nil:
			return nil, fmt.Errorf("get DataVolume %s: %w", v.DataVolume.Name, err)
		}
		if p := cdi.Phase(dv); !cdi.Usable(p) {
			if p == "" {
				p = "not started by CDI yet"
			}
			out = append(out, fmt.Sprintf("spec.volumes[%s].dataVolume.name: DataVolume %s is %s", v.Name, v.DataVolume.Name, p))
		}
	}
	return out, nil
}

// setDataVolumesReady records the instance's DataVolumesReady condition (only an instance with
// dataVolume volumes has one).
func setDataVolumesReady(vmi *v1alpha1.VirtualMachineInstance, waiting []string) {
	c := metav1.Condition{Type: v1alpha1.VirtualMachineDataVolumesReady, Status: metav1.ConditionTrue,
		Reason: v1alpha1.AllDataVolumesReadyReason, Message: "all DataVolumes are ready"}
	if len(waiting) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.NotAllDataVolumesReadyReason
		c.Message = strings.Join(waiting, "; ") + ": the launcher pod is created once they have succeeded"
	}
	patch.SetCondition(&vmi.Status.Conditions, vmi, c)
}

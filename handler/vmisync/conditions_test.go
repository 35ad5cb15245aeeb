package vmisync

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// TestConditionsCarryGeneration: every condition the node agent sets says which generation of the
// spec it describes, so a reader can tell "synchronized" about the current spec from a stale one.
func TestConditionsCarryGeneration(t *testing.T) {
	now := metav1.Now()
	paused := protocol.Status{Phase: protocol.PhaseRunning, Paused: true, RunState: "paused"}
	for name, set := range map[string]func(v *v1alpha1.VirtualMachineInstance) []string{
		"Synchronized True": func(v *v1alpha1.VirtualMachineInstance) []string {
			setSynchronized(v, nil, "", now)
			return []string{ConditionSynchronized}
		},
		"Synchronized False": func(v *v1alpha1.VirtualMachineInstance) []string {
			setSynchronized(v, errors.New("boom"), ReasonSyncFailed, now)
			return []string{ConditionSynchronized}
		},
		"Ready and Paused": func(v *v1alpha1.VirtualMachineInstance) []string {
			setGuestConditions(v, nil, &paused, false, now)
			return []string{v1alpha1.VirtualMachineInstanceReady, v1alpha1.VirtualMachineInstancePaused}
		},
	} {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Generation: 4}}
			v.Status.Conditions = []metav1.Condition{
				{Type: ConditionSynchronized, Status: metav1.ConditionTrue, Reason: ReasonSynchronized, ObservedGeneration: 3, LastTransitionTime: now},
			}
			for _, typ := range set(v) {
				c := meta.FindStatusCondition(v.Status.Conditions, typ)
				if c == nil || c.ObservedGeneration != 4 {
					t.Errorf("%s: %+v, want observedGeneration 4", typ, c)
				}
			}
		})
	}
}

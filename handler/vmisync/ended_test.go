package vmisync

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// The launcher streams the guest's end and lingers a moment for the agent to read it; on a loaded
// node the agent's reconcile can come after the kubelet marked the pod ended, or removed the pod
// of a deleted VMI. The streamed end must still be recorded: the VMI's phase and the GuestEnded
// Event (seen missing once in handler's TestInstanceLifecycle under CI load).
func TestStreamedEndIsRecordedAfterThePodEnded(t *testing.T) {
	for name, pod := range map[string]*corev1.Pod{
		"pod marked Succeeded": {Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		"pod removed":          nil,
	} {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", UID: "6f1e2d3c-0000-4000-8000-000000000001"}}
			v.Status.NodeName, v.Status.Phase = "node-a", v1alpha1.Running
			objs := []client.Object{v}
			if pod != nil {
				pod.ObjectMeta = metav1.ObjectMeta{Namespace: "ns", Name: "launcher-vm1", UID: "pod-1",
					Labels: map[string]string{v1alpha1.VMIUIDLabel: string(v.UID)}}
				pod.Spec.NodeName = "node-a"
				v.Status.ActivePods = map[types.UID]string{pod.UID: "node-a"}
				objs = append(objs, pod)
			}
			scheme := runtime.NewScheme()
			if err := clientgoscheme.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			if err := v1alpha1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(v).Build()
			events := record.NewFakeRecorder(10)
			r := &Reconciler{Client: c, NodeName: "node-a", Recorder: events,
				launchers: newLaunchers(launcher.ClientOptions{}, logr.Discard())}
			ended := protocol.Status{UID: string(v.UID), Phase: protocol.PhaseSucceeded,
				Exit: &protocol.Exit{Reason: protocol.ExitGuestShutdown, At: time.Now()}}
			r.launchers.streams[v.UID] = &stream{key: client.ObjectKeyFromObject(v), cancel: func() {}, latest: &ended, ended: true}

			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(v)}); err != nil {
				t.Fatalf("reconcile: %v", err)
			}
			var got v1alpha1.VirtualMachineInstance
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(v), &got); err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != v1alpha1.Succeeded {
				t.Errorf("phase %s, want Succeeded from the streamed end", got.Status.Phase)
			}
			select {
			case e := <-events.Events:
				if !strings.Contains(e, EventGuestEnded) || !strings.Contains(e, "guest shutdown") {
					t.Errorf("Event %q, want %s saying guest shutdown", e, EventGuestEnded)
				}
			default:
				t.Errorf("no %s Event", EventGuestEnded)
			}
		})
	}
}

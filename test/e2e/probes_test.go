package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestReadinessProbe: a VM whose readiness probe reaches the guest's httpd on port 80 (named http
// on its interface, resolved against the launcher pod's container ports) becomes Ready and is a
// ready endpoint of the Service selecting it, and so does one whose probe runs a command in its
// guest through the guest agent (exec: the launcher's probe subcommand asks the launcher to run it)
// while a guestAgentPing liveness probe keeps passing; a VM whose probe asks for port 81,
// where the guest does not listen, runs but stays not Ready, says why, and its endpoint stays not
// ready. The virtual nodes run the probes as the kubelet does, against the pod IP.
func TestReadinessProbe(t *testing.T) {
	ns := namespace(t)
	probe := func(port int32) *v1alpha1.Probe {
		return &v1alpha1.Probe{Handler: v1alpha1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}}, PeriodSeconds: 2}
	}
	open, closed := demoVM(t, ns, "open", v1alpha1.RunStrategyAlways), demoVM(t, ns, "closed", v1alpha1.RunStrategyAlways)
	agent := demoVM(t, ns, "agent", v1alpha1.RunStrategyAlways)
	// The guest's /etc/os-release (ID=qvirt-test), not the launcher pod's, answers the command.
	agent.Spec.Template.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{Exec: &corev1.ExecAction{
		Command: []string{"grep", "-q", "^ID=qvirt-test", "/etc/os-release"}}}, PeriodSeconds: 2, TimeoutSeconds: 5}
	// Lenient: the agent is down until the guest has booted, which takes a while under TCG.
	agent.Spec.Template.Spec.LivenessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{GuestAgentPing: &v1alpha1.GuestAgentPing{}},
		PeriodSeconds: 5, FailureThreshold: 24}
	open.Spec.Template.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{HTTPGet: &corev1.HTTPGetAction{
		Port: intstr.FromString("http"), Path: "/"}}, PeriodSeconds: 2}
	closed.Spec.Template.Spec.ReadinessProbe = probe(81)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "demo"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if err := cl.Create(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			ec.DumpLogs(t)
		}
		run(t, nil, kubectl, "delete", "vm", "--all", "-n", ns, "--ignore-not-found", "--wait=false")
	})
	applyVM(t, open)
	applyVM(t, closed)
	applyVM(t, agent)

	ready := func(want metav1.ConditionStatus, reason string) func(*v1alpha1.VirtualMachineInstance) bool {
		return func(v *v1alpha1.VirtualMachineInstance) bool {
			if !running("")(v) {
				return false
			}
			c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			return c != nil && c.Status == want && c.Reason == reason
		}
	}
	openVMI := waitVMI(t, ns, "open", bootTimeout, "Ready", ready(metav1.ConditionTrue, vmisync.ReasonGuestRunning))
	closedVMI := waitVMI(t, ns, "closed", bootTimeout, "running and not Ready", ready(metav1.ConditionFalse, vmisync.ReasonReadinessProbeFailed))
	// The closed one's guest is up too (it counts on its console; the banner may have gone by
	// before the console is attached): it is the probe that holds it back.
	console(t, closedVMI).Expect(t, 0, "tick ", bootTimeout)
	// The guest agent answers the launcher's guest-ping, which the pod's exec probe asks for.
	agentVMI := waitVMI(t, ns, "agent", bootTimeout, "Ready", ready(metav1.ConditionTrue, vmisync.ReasonGuestRunning))
	stays(t, ns, "closed", 6*time.Second, "not Ready", ready(metav1.ConditionFalse, vmisync.ReasonReadinessProbeFailed))
	c := meta.FindStatusCondition(closedVMI.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	if !strings.Contains(c.Message, "spec.readinessProbe (tcpSocket port 81) has not passed") {
		t.Errorf("closed VMI's Ready message %q does not name the probe", c.Message)
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "open"}, vm); err != nil || !vm.Status.Ready {
		t.Errorf("VM open: status.ready %v (%v), want true", vm.Status.Ready, err)
	}

	// The EndpointSlice controller follows the launcher pods' readiness.
	openIP, closedIP, agentIP := openVMI.Status.Interfaces[0].IP, closedVMI.Status.Interfaces[0].IP, agentVMI.Status.Interfaces[0].IP
	var got map[string]bool
	testutil.Eventually(t, time.Minute, "Service web's endpoints", func() bool {
		got = endpointReadiness(t, ns, "web")
		return len(got) == 3 && got[openIP] && got[agentIP] && !got[closedIP]
	}, func() string {
		return fmt.Sprintf("endpoints (address: ready) %v, want %s and %s ready and %s not", got, openIP, agentIP, closedIP)
	})
	if v, err := getVMI(t, ns, "agent"); err != nil || v.UID != agentVMI.UID {
		t.Errorf("VMI agent was replaced (%v): its guestAgentPing liveness probe failed", err)
	}
}

// endpointReadiness maps the addresses of a Service's EndpointSlices to their ready condition.
func endpointReadiness(t *testing.T, ns, svc string) map[string]bool {
	t.Helper()
	var slices discoveryv1.EndpointSliceList
	if err := cl.List(context.Background(), &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
		t.Fatalf("list EndpointSlices: %v", err)
	}
	out := map[string]bool{}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				out[a] = e.Conditions.Ready != nil && *e.Conditions.Ready
			}
		}
	}
	return out
}

// TestLivenessProbe: a VM whose liveness probe fails (port 81, where the guest does not listen)
// is stopped by the kubelet's liveness kill, its guest powered off, the instance fails saying
// why, and runStrategy RerunOnFailure starts a new instance.
func TestLivenessProbe(t *testing.T) {
	ns := namespace(t)
	vm := demoVM(t, ns, "unhealthy", v1alpha1.RunStrategyRerunOnFailure)
	// Long enough for the guest to boot and handle the ACPI power button the launcher presses.
	vm.Spec.Template.Spec.LivenessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(81)}},
		InitialDelaySeconds: 20, PeriodSeconds: 2, FailureThreshold: 2}
	t.Cleanup(func() {
		if t.Failed() {
			ec.DumpLogs(t)
		}
		run(t, nil, kubectl, "delete", "vm", "unhealthy", "-n", ns, "--ignore-not-found", "--wait=false")
	})
	applyVM(t, vm)
	first := waitVMI(t, ns, "unhealthy", bootTimeout, "Running", running(""))
	con := console(t, first)
	pod := launcherPod(t, first)
	second := waitVMI(t, ns, "unhealthy", bootTimeout+time.Minute, "restarted after the liveness probe failed", running(first.UID))
	if text := con.Text(); !strings.Contains(text, "reboot: Power down") {
		t.Errorf("the first guest was not powered off gracefully; its console ends with %q", tail(text))
	}
	var evs corev1.EventList
	if err := cl.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	killed := false
	for _, e := range evs.Items {
		killed = killed || (e.InvolvedObject.UID == pod.UID && e.Reason == "Killing" &&
			e.Message == "Container compute failed liveness probe, will be restarted")
	}
	if !killed {
		t.Errorf("no Killing Event for the first launcher pod %s", pod.Name)
	}
	failed := false
	for _, e := range evs.Items {
		if e.InvolvedObject.UID == first.UID && e.Reason == vmisync.EventGuestEnded {
			t.Logf("first instance: %s", e.Message)
			failed = failed || strings.Contains(e.Message, "spec.livenessProbe failed")
		}
	}
	if !failed {
		t.Errorf("no GuestEnded Event for the first instance %s naming its liveness probe", first.UID)
	}
	t.Logf("instance %s ended, %s runs", first.UID, second.UID)
}

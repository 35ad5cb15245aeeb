package provider

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podPhase is the kubelet's phase rule over container statuses: Pending while a container has
// never started, Running while one runs or will be restarted, and once all are terminated for
// good, Succeeded if every one exited 0, otherwise Failed. A pod being deleted never restarts.
func podPhase(statuses []corev1.ContainerStatus, policy corev1.RestartPolicy, deleting bool) corev1.PodPhase {
	if deleting {
		policy = corev1.RestartPolicyNever
	}
	var running, waiting, stopped, succeeded int
	for _, cs := range statuses {
		switch {
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil:
			stopped++
			if cs.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case cs.LastTerminationState.Terminated != nil:
			// Waiting for a restart.
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case len(statuses) == 0 || waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case policy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case succeeded == stopped:
		return corev1.PodSucceeded
	case policy == corev1.RestartPolicyOnFailure:
		return corev1.PodRunning
	}
	return corev1.PodFailed
}

// shouldRestart says whether a container that exited with code restarts under policy.
func shouldRestart(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// podConditions are the pod's conditions for a phase and container statuses; a condition keeps
// its transition time while its status stays.
func podConditions(old []corev1.PodCondition, phase corev1.PodPhase, sandboxReady bool, statuses []corev1.ContainerStatus, now metav1.Time) []corev1.PodCondition {
	allReady := len(statuses) > 0
	var unready []string
	for _, cs := range statuses {
		allReady = allReady && cs.Ready
		if !cs.Ready {
			unready = append(unready, cs.Name)
		}
	}
	ready := allReady && phase == corev1.PodRunning
	// The kubelet's reason and message for a pod that is not ready (pkg/kubelet/status,
	// GeneratePodReadyCondition): which containers are not, or that the pod has completed.
	var reason, message string
	switch {
	case ready:
	case phase == corev1.PodSucceeded || phase == corev1.PodFailed:
		reason = "PodCompleted"
	default:
		reason = "ContainersNotReady"
		message = fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	b := func(v bool) corev1.ConditionStatus {
		if v {
			return corev1.ConditionTrue
		}
		return corev1.ConditionFalse
	}
	want := []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: b(sandboxReady)},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue},
		{Type: corev1.ContainersReady, Status: b(ready), Reason: reason, Message: message},
		{Type: corev1.PodReady, Status: b(ready), Reason: reason, Message: message},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
	}
	for i := range want {
		want[i].LastTransitionTime = now
		for _, o := range old {
			if o.Type == want[i].Type && o.Status == want[i].Status {
				want[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
	return want
}

package provider

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func running() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func exited(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

func backingOff(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonBackOff}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}},
	}
}

func creating() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonCreating}}}
}

func TestPodPhase(t *testing.T) {
	const (
		never     = corev1.RestartPolicyNever
		onFailure = corev1.RestartPolicyOnFailure
		always    = corev1.RestartPolicyAlways
	)
	tests := []struct {
		name     string
		statuses []corev1.ContainerStatus
		policy   corev1.RestartPolicy
		deleting bool
		want     corev1.PodPhase
	}{
		{"not started yet", []corev1.ContainerStatus{creating()}, always, false, corev1.PodPending},
		{"one of two not started", []corev1.ContainerStatus{running(), creating()}, never, false, corev1.PodPending},
		{"running", []corev1.ContainerStatus{running()}, never, false, corev1.PodRunning},
		{"one ran to failure, one runs", []corev1.ContainerStatus{exited(1), running()}, never, false, corev1.PodRunning},
		{"never: exit 0", []corev1.ContainerStatus{exited(0)}, never, false, corev1.PodSucceeded},
		{"never: exit 3", []corev1.ContainerStatus{exited(3)}, never, false, corev1.PodFailed},
		{"never: one of two failed", []corev1.ContainerStatus{exited(0), exited(2)}, never, false, corev1.PodFailed},
		{"onFailure: exit 0", []corev1.ContainerStatus{exited(0)}, onFailure, false, corev1.PodSucceeded},
		{"onFailure: backing off", []corev1.ContainerStatus{backingOff(1)}, onFailure, false, corev1.PodRunning},
		{"always: backing off after exit 0", []corev1.ContainerStatus{backingOff(0)}, always, false, corev1.PodRunning},
		{"always: deleted, killed", []corev1.ContainerStatus{exited(143)}, always, true, corev1.PodFailed},
		{"always: deleted, clean exit", []corev1.ContainerStatus{exited(0)}, always, true, corev1.PodSucceeded},
		{"no containers", nil, never, false, corev1.PodPending},
	}
	for _, tt := range tests {
		if got := podPhase(tt.statuses, tt.policy, tt.deleting); got != tt.want {
			t.Errorf("%s: phase = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestPodConditionsKeepTransitionTimes(t *testing.T) {
	t0 := metav1.Unix(1000, 0)
	t1 := metav1.Unix(2000, 0)
	ready := running()
	ready.Ready = true
	first := podConditions(nil, corev1.PodRunning, true, []corev1.ContainerStatus{ready}, t0)
	second := podConditions(first, corev1.PodFailed, false, []corev1.ContainerStatus{exited(1)}, t1)
	for _, c := range second {
		wantTime := t1
		if c.Type == corev1.PodInitialized || c.Type == corev1.PodScheduled {
			wantTime = t0
		}
		if !c.LastTransitionTime.Equal(&wantTime) {
			t.Errorf("condition %s: transition time %v, want %v", c.Type, c.LastTransitionTime, wantTime)
		}
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionFalse {
			t.Errorf("Ready = %s after the pod failed", c.Status)
		}
	}
}

func TestExpandVars(t *testing.T) {
	env := map[string]string{"A": "x", "EMPTY": "", "IP": "10.0.0.2"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := map[string]string{
		"plain":               "plain",
		"$(A)":                "x",
		"http://$(IP):80/":    "http://10.0.0.2:80/",
		"$(UNDEFINED)":        "$(UNDEFINED)",
		"$$(A)":               "$(A)",
		"$(EMPTY)-":           "-",
		"$(A":                 "$(A",
		"cost $5":             "cost $5",
		"trailing $":          "trailing $",
		"$(A)$(A)$$":          "xx$",
		"sh -c 'echo $MY_IP'": "sh -c 'echo $MY_IP'",
	}
	for in, want := range tests {
		if got := expandVars(in, lookup); got != want {
			t.Errorf("expandVars(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzExpandVars(f *testing.F) {
	for _, s := range []string{"$(A)", "$$", "$(", "a$(B)c", "$(A)$(UNDEF)"} {
		f.Add(s)
	}
	lookup := func(k string) (string, bool) {
		if k == "A" {
			return "[a]", true
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := expandVars(s, lookup)
		// Without a $ nothing changes; expansion never invents a reference that was not there.
		if !strings.Contains(s, "$") && out != s {
			t.Fatalf("expandVars(%q) = %q changed a string without $", s, out)
		}
		if !strings.Contains(s, "$(A)") && strings.Contains(out, "[a]") && !strings.Contains(s, "[a]") {
			t.Fatalf("expandVars(%q) = %q expanded a reference that is not there", s, out)
		}
	})
}

func TestResolveEnvDownwardAPI(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "n1", Hostname: "host"},
		Status:     corev1.PodStatus{PodIP: "10.1.1.5", HostIP: "10.1.1.1"},
	}
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	c := &corev1.Container{Env: []corev1.EnvVar{
		{Name: "IP", ValueFrom: field("status.podIP")},
		{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
		{Name: "NODE", ValueFrom: field("spec.nodeName")},
		{Name: "NAME", ValueFrom: field("metadata.name")},
		{Name: "NS", ValueFrom: field("metadata.namespace")},
		{Name: "APP", ValueFrom: field("metadata.labels['app']")},
		{Name: "URL", Value: "http://$(IP):80"},
	}}
	env, err := resolveEnv(pod, c, envSources{extra: map[string]string{"KUBERNETES_SERVICE_HOST": "10.1.1.1", "NODE": "overridden"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=" + defaultPath, "HOSTNAME=host", "KUBERNETES_SERVICE_HOST=10.1.1.1", "NODE=n1", "IP=10.1.1.5", "HOST_IP=10.1.1.1", "NAME=p", "NS=ns", "APP=web", "URL=http://10.1.1.5:80"}
	if !slices.Equal(env, want) {
		t.Errorf("env = %q\nwant  %q", env, want)
	}
	c.Env = []corev1.EnvVar{{Name: "X", ValueFrom: field("status.phase")}}
	if _, err := resolveEnv(pod, c, envSources{}); err == nil || !strings.Contains(err.Error(), "env X") {
		t.Errorf("unsupported fieldRef: err = %v, want one naming env X", err)
	}
}

func TestArgvMapsImageToHostBinary(t *testing.T) {
	images := map[string]string{"reg/qvirt-launcher:latest": "/opt/bin/qvirt-launcher"}
	bin, args, err := argv(images, "reg/qvirt-launcher:latest", []string{"/usr/bin/qvirt-launcher", "serve"}, []string{"--x"})
	if err != nil || bin != "/opt/bin/qvirt-launcher" || !slices.Equal(args, []string{"/usr/bin/qvirt-launcher", "serve", "--x"}) {
		t.Errorf("argv = %q %q %v", bin, args, err)
	}
	bin, args, err = argv(images, "reg/qvirt-launcher:latest", nil, []string{"serve"})
	if err != nil || bin != "/opt/bin/qvirt-launcher" || !slices.Equal(args, []string{"/opt/bin/qvirt-launcher", "serve"}) {
		t.Errorf("argv without command = %q %q %v", bin, args, err)
	}
	if _, _, err := argv(images, "other:1", []string{"x"}, nil); err == nil {
		t.Error("an unmapped image ran")
	}
}

func TestRedirect(t *testing.T) {
	roots := map[string]string{"/var/run/qvirt": "/state/n1/run/qvirt", "/var/run/qvirt/sockets": "/state/n1/sockets"}
	for in, want := range map[string]string{
		"/var/run/qvirt":           "/state/n1/run/qvirt",
		"/var/run/qvirt/private":   "/state/n1/run/qvirt/private",
		"/var/run/qvirt/sockets/x": "/state/n1/sockets/x",
		"/var/run/qvirtual":        "/var/run/qvirtual",
		"/dev/kvm":                 "/dev/kvm",
	} {
		if got := redirect(in, roots); got != want {
			t.Errorf("redirect(%s) = %s, want %s", in, got, want)
		}
	}
}

package provider_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/testutil"
)

// probeWWW is where the probed pods' emptyDir is mounted (the provider creates the mount point on
// the host; the test removes it).
const probeWWW = "/run/qvirt-provider-test/probe-www"

// TestProbes: a virtual node runs containers' readiness and liveness probes as the kubelet does.
// A readiness probe that passes makes the container and the pod Ready only after its initial
// delay; one on a closed port keeps a running pod not Ready, with the kubelet's reason, and an
// Unhealthy Event saying why; a failing liveness probe stops the container, which then ends or
// restarts as the pod's restartPolicy says.
func TestProbes(t *testing.T) {
	testutil.LockHostNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	binDir, err := provider.BuildCNIPlugins(ctx, filepath.Join(cacheHome(t), "qvirt", "cni"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(probeWWW) })
	client := kubernetes.NewForConfigOrDie(cp.Config)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "probes-"}}
	if ns, err = client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	log, dumpLog := fileLogger(t)
	defer dumpLog()
	n := startNode(t, ctx, "vnode-probes", "10.231.7.0/24", "qvt-test-prb", binDir, log)
	defer n.stop(t)
	tc := &testCluster{t: t, ctx: ctx, client: client, ns: ns.Name}
	tc.waitNode(n.name)

	// httpd serves an index page on 8080; nothing listens on 8081.
	httpd := func(name string, restart corev1.RestartPolicy, readiness, liveness *corev1.Probe) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName: n.name, RestartPolicy: restart, TerminationGracePeriodSeconds: ptr.To[int64](2),
				Containers: []corev1.Container{{
					Name: "httpd", Image: busyboxImage,
					Command:        []string{"sh", "-c", "echo up > " + probeWWW + "/index.html && exec httpd -f -p 8080 -h " + probeWWW},
					VolumeMounts:   []corev1.VolumeMount{{Name: "www", MountPath: probeWWW}},
					Ports:          []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}},
					ReadinessProbe: readiness, LivenessProbe: liveness,
				}},
				Volumes: []corev1.Volume{{Name: "www", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		}
	}
	tcp := func(port int32) corev1.ProbeHandler {
		return corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}}
	}

	t.Run("a passing readiness probe makes the pod Ready after its initial delay", func(t *testing.T) {
		tc.t = t
		probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("web"), Path: "/index.html"}},
			InitialDelaySeconds: 3, PeriodSeconds: 1}
		pod := tc.create(httpd("ready", corev1.RestartPolicyAlways, probe, nil))
		running := tc.waitPhase(pod.Name, corev1.PodRunning)
		created := time.Now()
		if c := podCondition(running, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse || running.Status.ContainerStatuses[0].Ready {
			t.Errorf("pod Ready %+v and container ready %v before the probe's initial delay, want False and false",
				c, running.Status.ContainerStatuses[0].Ready)
		}
		tc.waitFor(pod.Name, "Ready", func(p *corev1.Pod) bool {
			c := podCondition(p, corev1.PodReady)
			return c != nil && c.Status == corev1.ConditionTrue && p.Status.ContainerStatuses[0].Ready
		})
		t.Logf("Running → Ready in %s (initial delay 3 s)", time.Since(created).Round(time.Millisecond))
	})

	t.Run("a readiness probe on a closed port keeps the pod running and not Ready", func(t *testing.T) {
		tc.t = t
		pod := tc.create(httpd("closed", corev1.RestartPolicyAlways, &corev1.Probe{ProbeHandler: tcp(8081), PeriodSeconds: 1}, nil))
		pod = tc.waitPhase(pod.Name, corev1.PodRunning)
		want := "Readiness probe failed: dial tcp " + pod.Status.PodIP + ":8081: connect: connection refused"
		tc.waitEvent(pod, "Warning", "Unhealthy", want)
		// Several periods later, still not Ready, still running, never restarted.
		time.Sleep(3 * time.Second)
		p, err := client.CoreV1().Pods(ns.Name).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := podCondition(p, corev1.PodReady)
		if c == nil || c.Status != corev1.ConditionFalse || c.Reason != "ContainersNotReady" || c.Message != "containers with unready status: [httpd]" {
			t.Errorf("pod Ready = %+v, want False, ContainersNotReady, containers with unready status: [httpd]", c)
		}
		if cs := p.Status.ContainerStatuses[0]; p.Status.Phase != corev1.PodRunning || cs.State.Running == nil || cs.RestartCount != 0 {
			t.Errorf("phase %s, container %+v: want Running, not restarted (readiness never stops a container)", p.Status.Phase, cs)
		}
	})

	t.Run("an exec readiness probe runs in the container and passes once its command does", func(t *testing.T) {
		tc.t = t
		marker := probeWWW + "/ready"
		pod := tc.create(httpd("exec", corev1.RestartPolicyAlways, &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			Exec: &corev1.ExecAction{Command: []string{"test", "-f", marker}}}, PeriodSeconds: 1}, nil))
		pod = tc.waitPhase(pod.Name, corev1.PodRunning)
		tc.waitEvent(pod, "Warning", "Unhealthy", `Readiness probe failed: command "test -f `+marker+`" exited with code 1`)
		if p := tc.waitPhase(pod.Name, corev1.PodRunning); p.Status.ContainerStatuses[0].Ready {
			t.Fatalf("container ready before its exec probe passed")
		}
		// The marker appears in the pod's emptyDir, which only the container's mount namespace
		// shows at probeWWW: the host's probeWWW is an empty mount point.
		if err := os.WriteFile(filepath.Join(provider.EmptyDirPath(n.stateDir, pod.UID, "www"), "ready"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s exists on the host: the probe would not show that it runs in the container", marker)
		}
		tc.waitFor(pod.Name, "Ready", func(p *corev1.Pod) bool {
			c := podCondition(p, corev1.PodReady)
			return c != nil && c.Status == corev1.ConditionTrue
		})
	})

	t.Run("a failing liveness probe ends the container of a restartPolicy Never pod", func(t *testing.T) {
		tc.t = t
		pod := tc.create(httpd("dead", corev1.RestartPolicyNever, nil, &corev1.Probe{ProbeHandler: tcp(8081), PeriodSeconds: 1, FailureThreshold: 2}))
		pod = tc.waitPhase(pod.Name, corev1.PodRunning)
		if c := podCondition(pod, corev1.PodReady); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("pod Ready = %+v before liveness fails, want True (no readiness probe)", c)
		}
		failed := tc.waitPhase(pod.Name, corev1.PodFailed)
		term := failed.Status.ContainerStatuses[0].State.Terminated
		// httpd runs as PID 1 of its namespace, as in a real container: it ends at SIGTERM if it
		// handles it, else at SIGKILL once the 2 s grace period is over.
		if term == nil || (term.ExitCode != 143 && term.ExitCode != 137) {
			t.Errorf("container state %+v, want terminated by SIGTERM or SIGKILL (exit code 143 or 137)", failed.Status.ContainerStatuses[0].State)
		}
		tc.waitEvent(pod, "Normal", "Killing", "Container httpd failed liveness probe, will be restarted")
	})

	t.Run("a failing liveness probe restarts the container of a restartPolicy Always pod", func(t *testing.T) {
		tc.t = t
		pod := tc.create(httpd("restarted", corev1.RestartPolicyAlways, nil, &corev1.Probe{ProbeHandler: tcp(8081), PeriodSeconds: 1, FailureThreshold: 2}))
		tc.waitFor(pod.Name, "restarted", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
	})
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// waitEvent waits for an Event about pod with that type and reason whose message holds message.
func (tc *testCluster) waitEvent(pod *corev1.Pod, typ, reason, message string) {
	tc.t.Helper()
	var seen []string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		list, err := tc.client.CoreV1().Events(tc.ns).List(tc.ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		seen = seen[:0]
		for _, e := range list.Items {
			if e.InvolvedObject.Name != pod.Name {
				continue
			}
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Message, message) {
				return
			}
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	tc.t.Fatalf("no Event %s %s %q about pod %s within 60 s; events:\n%s", typ, reason, message, pod.Name, strings.Join(seen, "\n"))
}

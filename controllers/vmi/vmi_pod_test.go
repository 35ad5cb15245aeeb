package vmi

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

var update = flag.Bool("update", false, "rewrite controllers/vmi/testdata/*.yaml from RenderLauncherPod's output")

// baseVMI is the smallest instance the renderer accepts: 512Mi of guest memory via requests.
func baseVMI() *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "demo", Namespace: "default", UID: "11111111-2222-3333-4444-555555555555",
			Labels: map[string]string{"app": "web"},
		},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{
			Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
		}},
	}
}

func goldenCases() []struct {
	name string
	vmi  *v1alpha1.VirtualMachineInstance
	cfg  config.Config
} {
	minimal := baseVMI()

	emulation := baseVMI()
	emulation.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2, Sockets: 1, Threads: 1}
	emulation.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}
	emulation.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
	emuCfg := config.Default()
	emuCfg.UseEmulation = true

	limits := baseVMI()
	limits.Spec.Domain.Resources = v1alpha1.ResourceRequirements{
		Requests:                corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("1")},
		Limits:                  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourceCPU: resource.MustParse("2")},
		OvercommitGuestOverhead: true,
	}

	sched := baseVMI()
	sched.Spec.NodeSelector = map[string]string{"topology.kubernetes.io/zone": "a"}
	sched.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 50,
			PodAffinityTerm: corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				TopologyKey:   "kubernetes.io/hostname",
			},
		}},
	}}
	sched.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "vms", Effect: corev1.TaintEffectNoSchedule}}
	sched.Spec.PriorityClassName = "vm-high"
	sched.Spec.SchedulerName = "vm-scheduler"
	sched.Spec.Hostname = "web-0"
	sched.Spec.Subdomain = "web"
	sched.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)

	owned := baseVMI()
	owned.Name = "db"
	owned.Labels = map[string]string{"app": "db", v1alpha1.VMNameLabel: "db", v1alpha1.MigrationUIDLabel: "must-not-be-inherited"}
	owned.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "db",
		UID: "99999999-8888-7777-6666-555555555555", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}

	configVolumes := baseVMI()
	withConfigVolumes(configVolumes)
	probes := baseVMI()
	probes.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}},
		InitialDelaySeconds: 5, PeriodSeconds: 2}
	probes.Spec.LivenessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(80), Path: "/healthz"}},
		InitialDelaySeconds: 60, FailureThreshold: 5}

	return []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		cfg  config.Config
	}{
		{"config-volumes", configVolumes, config.Default()},
		{"minimal", minimal, config.Default()},
		{"emulation", emulation, emuCfg},
		{"limits-overcommit", limits, config.Default()},
		{"selectors-affinity-tolerations", sched, config.Default()},
		{"vm-owned", owned, emuCfg},
		{"probes", probes, config.Default()},
	}
}

func TestRenderLauncherPodGolden(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := RenderLauncherPod(tc.vmi, tc.cfg, nil)
			if err != nil {
				t.Fatalf("RenderLauncherPod: %v", err)
			}
			// The reconciler adds the owner reference; the golden files show the pod as created.
			if err := controllerutil.SetControllerReference(tc.vmi, pod, scheme); err != nil {
				t.Fatal(err)
			}
			got, err := yaml.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./controllers/vmi -run Golden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("pod differs from %s (rerun with -update if intended):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

func TestRenderLauncherPodResources(t *testing.T) {
	mem := func(pod *corev1.Pod, l corev1.ResourceList) string {
		q := l[corev1.ResourceMemory]
		return q.String()
	}
	// 512Mi guest, 1 vCPU, defaults: overhead = 96Mi + 4Mi*1 + 512Mi/512 = 101Mi.
	pod, err := RenderLauncherPod(baseVMI(), config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := pod.Spec.Containers[0].Resources
	if got := mem(pod, res.Requests); got != "613Mi" {
		t.Errorf("requests.memory = %s, want 613Mi (512Mi guest + 101Mi overhead)", got)
	}
	if _, ok := res.Limits[corev1.ResourceMemory]; ok {
		t.Errorf("limits.memory set although the instance sets no memory limit")
	}
	for _, r := range []corev1.ResourceName{v1alpha1.KVMResource, v1alpha1.TunResource} {
		if q := res.Requests[r]; q.Value() != 1 {
			t.Errorf("requests[%s] = %s, want 1", r, q.String())
		}
		if q := res.Limits[r]; q.Value() != 1 {
			t.Errorf("limits[%s] = %s, want 1", r, q.String())
		}
	}

	// 4 vCPUs, 2Gi guest, limit 3Gi, overcommit, emulation: request is the bare guest, limit keeps
	// the overhead (96 + 16 + 4 = 116Mi, and 48Mi for emulation's translation cache).
	v := baseVMI()
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 2}
	v.Spec.Domain.Resources = v1alpha1.ResourceRequirements{
		Requests:                corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
		Limits:                  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")},
		OvercommitGuestOverhead: true,
	}
	cfg := config.Default()
	cfg.UseEmulation = true
	pod, err = RenderLauncherPod(v, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res = pod.Spec.Containers[0].Resources
	if got := mem(pod, res.Requests); got != "2Gi" {
		t.Errorf("overcommit requests.memory = %s, want 2Gi", got)
	}
	if got := mem(pod, res.Limits); got != "3236Mi" {
		t.Errorf("limits.memory = %s, want 3236Mi (3Gi + 116Mi + 48Mi)", got)
	}
	if _, ok := res.Requests[v1alpha1.KVMResource]; ok {
		t.Errorf("emulation still requests %s", v1alpha1.KVMResource)
	}
	if !strings.Contains(strings.Join(pod.Spec.Containers[0].Command, " "), "--emulation") {
		t.Errorf("emulation not passed to the launcher: %v", pod.Spec.Containers[0].Command)
	}

	// KubeVirt's common 1024M (976.56 MiB) as request and limit: the guest gets 977 MiB, and the
	// pod holds that plus the overhead (96 + 4 + 1.91 = 102Mi rounded up) in both.
	v = baseVMI()
	v.Spec.Domain.Memory = nil
	v.Spec.Domain.Resources = v1alpha1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1024M")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1024M")},
	}
	pod, err = RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatalf("1024M: %v", err)
	}
	res = pod.Spec.Containers[0].Resources
	if got := mem(pod, res.Requests); got != "1079Mi" {
		t.Errorf("1024M requests.memory = %s, want 1079Mi (977Mi guest + 102Mi overhead)", got)
	}
	if got := mem(pod, res.Limits); got != "1079Mi" {
		t.Errorf("1024M limits.memory = %s, want 1079Mi (the guest's 977Mi, not the limit's 976.56, + 102Mi)", got)
	}
}

// The launcher's test-only switch for file:// images is never in a launcher pod, whatever the
// VMI and configuration: a pod must not boot from a path on the node.
func TestRenderLauncherPodNeverAllowsFileImages(t *testing.T) {
	for _, tc := range goldenCases() {
		pod, err := RenderLauncherPod(tc.vmi, tc.cfg, nil)
		if err != nil {
			t.Fatalf("%s: RenderLauncherPod: %v", tc.name, err)
		}
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			for _, arg := range append(c.Command, c.Args...) {
				if strings.Contains(arg, podlayout.FlagAllowFileImagesForTests) {
					t.Errorf("%s: container %s has %q", tc.name, c.Name, arg)
				}
			}
		}
	}
}

func TestRenderLauncherPodRefuses(t *testing.T) {
	cases := []struct {
		name   string
		change func(*v1alpha1.VirtualMachineInstance, *config.Config)
		field  string
	}{
		{"no guest memory", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) {
			v.Spec.Domain.Resources.Requests = nil
		}, "spec.domain.memory.guest"},
		{"limit below guest", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) {
			v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
		}, "spec.domain.resources.limits.memory"},
		{"no uid", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) { v.UID = "" }, "metadata.uid"},
		{"name too long for a label", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) {
			v.Name = strings.Repeat("a", 64)
		}, "metadata.name"},
		{"no image", func(_ *v1alpha1.VirtualMachineInstance, c *config.Config) { c.LauncherImage = "" }, "launcherImage"},
		{"exec probe without a command", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) {
			v.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{Exec: &corev1.ExecAction{}}}
		}, "spec.readinessProbe.exec.command"},
		{"probe without an action", func(v *v1alpha1.VirtualMachineInstance, _ *config.Config) {
			v.Spec.LivenessProbe = &v1alpha1.Probe{PeriodSeconds: 3}
		}, "spec.livenessProbe"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, cfg := baseVMI(), config.Default()
			tc.change(v, &cfg)
			_, err := RenderLauncherPod(v, cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want an error naming %s", err, tc.field)
			}
		})
	}
}

func TestSanitizeHostname(t *testing.T) {
	for in, want := range map[string]string{
		"demo":                         "demo",
		"web.prod":                     "web-prod",
		strings.Repeat("a", 70):        strings.Repeat("a", 63),
		strings.Repeat("a", 62) + ".b": strings.Repeat("a", 62),
	} {
		if got := sanitizeHostname(in); got != want {
			t.Errorf("sanitizeHostname(%q) = %q, want %q", in, got, want)
		}
	}
}

// An instance's images are the pod's image volumes: the kubelet pulls them with the pod's own pull
// secrets and the launcher reads them read-only; no node-wide cache is shared between pods.
func TestRenderLauncherPodImageVolumes(t *testing.T) {
	v := baseVMI()
	v.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{
		Image: "registry.test/kernel:1", ImagePullSecret: "kernel-creds", ImagePullPolicy: corev1.PullAlways, KernelPath: "/boot/vmlinuz",
	}}}
	v.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{
			Image: "registry.test/disk@sha256:" + strings.Repeat("a", 64), ImagePullSecret: "disk-creds"}}},
		{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{
			Image: "registry.test/data:2", ImagePullSecret: "disk-creds", ImagePullPolicy: corev1.PullIfNotPresent}}},
	}
	cfg := config.Default()
	cfg.InsecureRegistries = []string{"registry.test"}
	pod, err := RenderLauncherPod(v, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		ref    string
		policy corev1.PullPolicy
	}{
		podlayout.KernelBootDir:              {"registry.test/kernel:1", corev1.PullAlways},
		podlayout.ContainerDiskMount("root"): {"registry.test/disk@sha256:" + strings.Repeat("a", 64), ""},
		podlayout.ContainerDiskMount("data"): {"registry.test/data:2", corev1.PullIfNotPresent},
	}
	vols := map[string]corev1.Volume{}
	for _, vol := range pod.Spec.Volumes {
		vols[vol.Name] = vol
		if vol.HostPath != nil && strings.Contains(vol.HostPath.Path, "images") {
			t.Errorf("volume %s is a hostPath image cache %s", vol.Name, vol.HostPath.Path)
		}
	}
	c := pod.Spec.Containers[0]
	got := 0
	for _, m := range c.VolumeMounts {
		w, ok := want[m.MountPath]
		if !ok {
			continue
		}
		got++
		vol := vols[m.Name]
		if vol.Image == nil || vol.Image.Reference != w.ref || vol.Image.PullPolicy != w.policy {
			t.Errorf("mount %s: volume %s = %+v, want an image volume of %s (policy %q)", m.MountPath, m.Name, vol.VolumeSource, w.ref, w.policy)
		}
		if !m.ReadOnly {
			t.Errorf("image volume %s is mounted read-write at %s", m.Name, m.MountPath)
		}
	}
	if got != len(want) {
		t.Errorf("%d of %d image mounts found in %+v", got, len(want), c.VolumeMounts)
	}
	secrets := []corev1.LocalObjectReference{{Name: "kernel-creds"}, {Name: "disk-creds"}}
	if !slices.Equal(pod.Spec.ImagePullSecrets, secrets) {
		t.Errorf("imagePullSecrets = %v, want %v (each once)", pod.Spec.ImagePullSecrets, secrets)
	}
	for _, a := range c.Command {
		if strings.Contains(a, "image-cache") || strings.Contains(a, "insecure-registry") {
			t.Errorf("serve mode still gets pull flags: %v", c.Command)
		}
	}
}

// TestGuestAgentPingProbe: a guestAgentPing probe is an exec probe of the launcher's probe
// subcommand for this instance's socket, with a second more for the kubelet than for the ping.
func TestGuestAgentPingProbe(t *testing.T) {
	v := baseVMI()
	v.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{GuestAgentPing: &v1alpha1.GuestAgentPing{}},
		InitialDelaySeconds: 10, TimeoutSeconds: 3, PeriodSeconds: 5}
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := pod.Spec.Containers[0].ReadinessProbe
	want := []string{podlayout.LauncherBinary, "probe", "--socket-dir", podlayout.SocketDir, "--vmi-uid", string(v.UID),
		"--guest-agent-ping", "--timeout", "3s"}
	if got == nil || got.Exec == nil || !slices.Equal(got.Exec.Command, want) || got.TimeoutSeconds != 4 ||
		got.InitialDelaySeconds != 10 || got.PeriodSeconds != 5 || got.TCPSocket != nil || got.HTTPGet != nil {
		t.Fatalf("readinessProbe = %+v, want exec %q with timeoutSeconds 4, initialDelaySeconds 10, periodSeconds 5", got, want)
	}
}

// TestExecProbe: an exec probe is an exec probe of the launcher's probe subcommand with the
// instance's command after "--", run in the guest by the launcher; a timeout left at 0 is the
// API's default of 1 s, plus a second for the kubelet.
func TestExecProbe(t *testing.T) {
	v := baseVMI()
	v.Spec.LivenessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy", "--"}}},
		FailureThreshold: 2}
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := pod.Spec.Containers[0].LivenessProbe
	want := []string{podlayout.LauncherBinary, "probe", "--socket-dir", podlayout.SocketDir, "--vmi-uid", string(v.UID),
		"--guest-exec", "--timeout", "1s", "--", "cat", "/tmp/healthy", "--"}
	if got == nil || got.Exec == nil || !slices.Equal(got.Exec.Command, want) || got.TimeoutSeconds != 2 || got.FailureThreshold != 2 {
		t.Fatalf("livenessProbe = %+v, want exec %q with timeoutSeconds 2, failureThreshold 2", got, want)
	}
}

// TestNamedProbePort: the compute container declares the interfaces' ports (TCP when the
// protocol is left out), so the kubelet resolves a probe's named port against them; the probe
// keeps the name.
func TestNamedProbePort(t *testing.T) {
	v := baseVMI()
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{},
		Ports: []v1alpha1.Port{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: "UDP"}, {Port: 22}}}}
	v.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http"), Path: "/"}}}
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	want := []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {ContainerPort: 22, Protocol: corev1.ProtocolTCP}}
	if !slices.Equal(c.Ports, want) {
		t.Errorf("ports = %+v, want %+v", c.Ports, want)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port != intstr.FromString("http") {
		t.Errorf("readinessProbe = %+v, want httpGet on the port named http", p)
	}
}

// TestRenderLauncherPodDedicatedCPUs: with dedicatedCpuPlacement the compute container is
// Guaranteed with whole CPUs (the vCPUs, one more for an isolated emulator thread) and a memory
// limit equal to its request, so that the kubelet's static CPU manager gives it CPUs of its own, and
// the pod goes to a node labelled cpumanager=true (KubeVirt's WithCPUPinning and node selector).
func TestRenderLauncherPodDedicatedCPUs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		isolate bool
		cpus    string
	}{{"vCPUs only", false, "4"}, {"isolated emulator thread", true, "5"}} {
		t.Run(tc.name, func(t *testing.T) {
			v := baseVMI()
			v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 2, Threads: 1, DedicatedCPUPlacement: true, IsolateEmulatorThread: tc.isolate}
			pod, err := RenderLauncherPod(v, config.Default(), nil)
			if err != nil {
				t.Fatal(err)
			}
			res := pod.Spec.Containers[0].Resources
			for name, l := range map[string]corev1.ResourceList{"requests": res.Requests, "limits": res.Limits} {
				if q := l[corev1.ResourceCPU]; q.String() != tc.cpus {
					t.Errorf("%s.cpu = %s, want %s", name, q.String(), tc.cpus)
				}
			}
			// 512Mi guest + 96Mi + 4*4Mi + 1Mi overhead.
			if r, l := res.Requests[corev1.ResourceMemory], res.Limits[corev1.ResourceMemory]; r.String() != "625Mi" || l.String() != "625Mi" {
				t.Errorf("memory requests %s limits %s, want 625Mi both (Guaranteed)", r.String(), l.String())
			}
			if got := pod.Spec.NodeSelector[v1alpha1.NodeCPUManagerLabel]; got != "true" {
				t.Errorf("nodeSelector %v, want %s=true", pod.Spec.NodeSelector, v1alpha1.NodeCPUManagerLabel)
			}
		})
	}
	pod, err := RenderLauncherPod(baseVMI(), config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Spec.NodeSelector[v1alpha1.NodeCPUManagerLabel]; ok {
		t.Errorf("an instance without dedicated CPUs selects %s: %v", v1alpha1.NodeCPUManagerLabel, pod.Spec.NodeSelector)
	}
}

// TestRenderLauncherPodHugepages: with memory.hugepages the guest's RAM is asked for as
// hugepages-<pageSize> (request and limit), and the container's memory keeps only the overhead, in
// its request and in a limit (KubeVirt's WithHugePages); with dedicated CPUs the pod stays
// Guaranteed.
func TestRenderLauncherPodHugepages(t *testing.T) {
	v := baseVMI() // 512Mi guest, 1 vCPU: 101Mi overhead
	v.Spec.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
	v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := pod.Spec.Containers[0].Resources
	for name, l := range map[string]corev1.ResourceList{"requests": res.Requests, "limits": res.Limits} {
		if q := l["hugepages-2Mi"]; q.String() != "512Mi" {
			t.Errorf("%s[hugepages-2Mi] = %s, want 512Mi", name, q.String())
		}
	}
	if q := res.Requests[corev1.ResourceMemory]; q.String() != "101Mi" {
		t.Errorf("requests.memory = %s, want the 101Mi overhead alone", q.String())
	}
	if q := res.Limits[corev1.ResourceMemory]; q.String() != "613Mi" {
		t.Errorf("limits.memory = %s, want 613Mi (the 1Gi limit less the 512Mi guest, plus 101Mi)", q.String())
	}

	v = baseVMI()
	v.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi")), Hugepages: &v1alpha1.Hugepages{PageSize: "1Gi"}}
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, DedicatedCPUPlacement: true}
	pod, err = RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res = pod.Spec.Containers[0].Resources
	if r, l := res.Requests[corev1.ResourceMemory], res.Limits[corev1.ResourceMemory]; r.String() != "102Mi" || l.String() != "102Mi" {
		t.Errorf("dedicated CPUs with huge pages: memory requests %s limits %s, want the 102Mi overhead in both", r.String(), l.String())
	}
	if q := res.Limits["hugepages-1Gi"]; q.String() != "1Gi" {
		t.Errorf("limits[hugepages-1Gi] = %s, want 1Gi", q.String())
	}
}

// TestMemoryOverheadCountsTheHotplugRoom: with maxSockets the per-vCPU overhead counts the vCPUs
// the guest may reach, since plugging them does not resize the pod.
func TestMemoryOverheadCountsTheHotplugRoom(t *testing.T) {
	d := &baseVMI().Spec.Domain
	d.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 2, Threads: 1}
	fixed, err := MemoryOverhead(d, config.Default())
	if err != nil {
		t.Fatal(err)
	}
	d.CPU.MaxSockets = 4
	room, err := MemoryOverhead(d, config.Default())
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	perVCPU := cfg.MemoryOverhead.PerVCPU.Value()
	if got := room.Value() - fixed.Value(); got != 6*perVCPU {
		t.Errorf("maxSockets 4 of 2 cores adds %d bytes of overhead, want 6 vCPUs' %d", got, 6*perVCPU)
	}
}

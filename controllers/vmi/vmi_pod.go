package vmi

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
)

// The launcher pod's layout (container, paths, user, flags) is podlayout's, shared with the node
// agent and the launcher.
const (
	// GracePeriodMarginSeconds is added to the guest's grace period on the pod so the launcher has
	// time to quit QEMU and clean up after the ACPI shutdown window ends, before the kubelet kills it.
	GracePeriodMarginSeconds int64 = 15

	socketsVolume    = podlayout.SocketsVolume
	privateVolume    = "private"
	kernelBootVolume = "kernel-boot"
)

// RenderLauncherPod renders the launcher pod of an instance: everything but the owner reference,
// which the caller sets (controllerutil.SetControllerReference) because it needs a scheme. It is pure
// and strict: what it cannot render is an error naming the field, never a silently different pod.
// The migration reconciler renders its target pod with it too, then adds its label and affinity.
// claims are the PersistentVolumeClaims the spec's volumes name (Reconciler.claims).
func RenderLauncherPod(vmi *v1alpha1.VirtualMachineInstance, cfg config.Config, claims Claims) (*corev1.Pod, error) {
	if vmi.UID == "" {
		return nil, fmt.Errorf("metadata.uid: the instance has no UID yet")
	}
	if errs := validation.IsValidLabelValue(vmi.Name); len(errs) > 0 {
		return nil, fmt.Errorf("metadata.name: %q cannot be a label value: %s", vmi.Name, strings.Join(errs, "; "))
	}
	if cfg.LauncherImage == "" {
		return nil, fmt.Errorf("configuration launcherImage: no launcher image configured")
	}
	spec := &vmi.Spec
	res, err := launcherResources(&spec.Domain, cfg)
	if err != nil {
		return nil, err
	}

	args := []string{podlayout.LauncherBinary, "serve", "--" + podlayout.FlagSocketDir, podlayout.SocketDir, "--" + podlayout.FlagVMIUID, string(vmi.UID)}
	if cfg.UseEmulation {
		args = append(args, "--"+podlayout.FlagEmulation)
	}
	if cfg.LauncherCPUProfile {
		args = append(args, "--"+podlayout.FlagCPUProfile)
	}
	grace := v1alpha1.TerminationGracePeriodSeconds(spec)
	hostname := spec.Hostname
	if hostname == "" {
		hostname = sanitizeHostname(vmi.Name)
	}
	nodeSelector := maps.Clone(spec.NodeSelector)
	if nodeSelector == nil {
		nodeSelector = map[string]string{}
	}
	nodeSelector[v1alpha1.NodeSchedulableLabel] = "true"
	if dedicatedCPUs(&spec.Domain) {
		nodeSelector[v1alpha1.NodeCPUManagerLabel] = "true"
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "qvirt-launcher-" + vmi.Name + "-",
			Namespace:    vmi.Namespace,
			Labels:       LauncherPodLabels(vmi),
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:      podlayout.ComputeContainer,
				Image:     cfg.LauncherImage,
				Command:   args,
				Resources: res,
				VolumeMounts: []corev1.VolumeMount{
					{Name: socketsVolume, MountPath: podlayout.SocketDir},
					{Name: privateVolume, MountPath: podlayout.PrivateDir},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             ptr.To(true),
					RunAsUser:                ptr.To[int64](podlayout.LauncherUID),
					RunAsGroup:               ptr.To[int64](podlayout.LauncherUID),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			Volumes: []corev1.Volume{
				// The pod's own: no other pod sees its sockets; the node agent reaches them through
				// the kubelet's pod directory (podlayout.HostSocketDir).
				{Name: socketsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: privateVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(grace + GracePeriodMarginSeconds),
			NodeSelector:                  nodeSelector,
			Affinity:                      spec.Affinity.DeepCopy(),
			PriorityClassName:             spec.PriorityClassName,
			SchedulerName:                 spec.SchedulerName,
			Hostname:                      hostname,
			Subdomain:                     spec.Subdomain,
		},
	}
	c := &pod.Spec.Containers[0]
	c.Ports = podPorts(spec)
	if c.ReadinessProbe, err = podProbe(spec.ReadinessProbe, "spec.readinessProbe", vmi.UID); err != nil {
		return nil, err
	}
	if c.LivenessProbe, err = podProbe(spec.LivenessProbe, "spec.livenessProbe", vmi.UID); err != nil {
		return nil, err
	}
	for i := range spec.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, *spec.Tolerations[i].DeepCopy())
	}
	addImageVolumes(pod, spec)
	addCloudInitSecrets(pod, spec)
	addConfigVolumes(pod, spec)
	if err := addClaimVolumes(pod, spec, claims); err != nil {
		return nil, err
	}
	addBackendStorage(pod, vmi)
	if err := addMultusNetworks(pod, vmi); err != nil {
		return nil, err
	}
	if err := addHostDiskVolumes(pod, vmi.Namespace, spec, cfg); err != nil {
		return nil, err
	}
	passt := spec.UsesPasst()
	if len(spec.Domain.Devices.Filesystems) > 0 || passt {
		// The launcher runs virtiofsd in a user namespace of its own (launcher/filesystem.go),
		// and passt sandboxes itself in one (launcher/passt.go), which the runtime's default
		// seccomp profile refuses to a container without CAP_SYS_ADMIN. The container keeps its
		// non-root user, no capabilities and no privilege escalation; only the syscall filter goes.
		c.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	}
	if spec.UsesUserMode() {
		// What KubeVirt's passt binding sets (its CNI plugin): passt, or QEMU's slirp, an
		// unprivileged process, binds the pod's ports below 1024 for the guest and answers its
		// pings with ping sockets.
		// Both are the pod's own network namespace's, and safe sysctls a kubelet allows.
		if pod.Spec.SecurityContext == nil {
			pod.Spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		pod.Spec.SecurityContext.Sysctls = append(pod.Spec.SecurityContext.Sysctls,
			corev1.Sysctl{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"},
			corev1.Sysctl{Name: "net.ipv4.ping_group_range", Value: pingGroups})
	}
	return pod, nil
}

// pingGroups is the ping_group_range of a passt instance's pod: the launcher's group alone, whose
// passt answers the guest's pings with ping sockets.
var pingGroups = fmt.Sprintf("%d %d", podlayout.LauncherUID, podlayout.LauncherUID)

// podProbe is the compute container's probe for an instance's, as KubeVirt's virt-controller
// makes it (pkg/virt-controller/services/template.go): a tcpSocket or httpGet probe is copied, and
// the kubelet runs it against the pod IP, which reaches the guest (masquerade forwards the pod IP's
// ports to it; bridge hands it the pod IP); a named port is the compute container's (podPorts). A
// guestAgentPing probe becomes an exec probe of `qvirt-launcher probe --guest-agent-ping`, which
// asks this pod's launcher to ping the guest agent, and an exec probe one of `qvirt-launcher probe
// --guest-exec -- COMMAND...`, which asks it to run the command in the guest through the agent
// (both KubeVirt's virt-probe), with a second more for the kubelet than for the launcher. The
// timing fields are the instance's; the API server defaults those left at 0 as for any container.
func podProbe(pr *v1alpha1.Probe, path string, vmiUID types.UID) (*corev1.Probe, error) {
	if pr == nil {
		return nil, nil
	}
	out := &corev1.Probe{
		InitialDelaySeconds: pr.InitialDelaySeconds,
		TimeoutSeconds:      pr.TimeoutSeconds,
		PeriodSeconds:       pr.PeriodSeconds,
		SuccessThreshold:    pr.SuccessThreshold,
		FailureThreshold:    pr.FailureThreshold,
	}
	timeout := max(pr.TimeoutSeconds, 1)
	// `qvirt-launcher probe --socket-dir D --vmi-uid U --ACTION --timeout Ns [-- COMMAND...]`
	launcherProbe := func(action string, command ...string) *corev1.ExecAction {
		cmd := []string{podlayout.LauncherBinary, podlayout.ProbeCommand,
			"--" + podlayout.FlagSocketDir, podlayout.SocketDir, "--" + podlayout.FlagVMIUID, string(vmiUID),
			"--" + action, "--" + podlayout.FlagProbeTimeout, fmt.Sprintf("%ds", timeout)}
		if len(command) > 0 {
			cmd = append(append(cmd, "--"), command...)
		}
		out.TimeoutSeconds = timeout + 1
		return &corev1.ExecAction{Command: cmd}
	}
	switch {
	case pr.TCPSocket != nil:
		out.TCPSocket = pr.TCPSocket.DeepCopy()
	case pr.HTTPGet != nil:
		out.HTTPGet = pr.HTTPGet.DeepCopy()
	case pr.GuestAgentPing != nil:
		out.Exec = launcherProbe(podlayout.FlagGuestAgentPing)
	case pr.Exec != nil:
		if len(pr.Exec.Command) == 0 {
			return nil, fmt.Errorf("%s.exec.command: the command to run in the guest is required", path)
		}
		out.Exec = launcherProbe(podlayout.FlagGuestExec, pr.Exec.Command...)
	default:
		return nil, fmt.Errorf("%s: the probe has no action", path)
	}
	return out, nil
}

// podPorts are the compute container's ports: the instance's interfaces' ports, as KubeVirt's
// virt-controller declares them (containerPortsFromVMI), so that a probe's named port resolves
// against them and tools that read container ports see what the guest serves.
func podPorts(spec *v1alpha1.VirtualMachineInstanceSpec) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, in := range spec.Domain.Devices.Interfaces {
		for _, p := range in.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != "" {
				proto = corev1.Protocol(p.Protocol)
			}
			out = append(out, corev1.ContainerPort{Name: p.Name, ContainerPort: p.Port, Protocol: proto})
		}
	}
	return out
}

// imageVolume is one container image the launcher reads files from, as the pod mounts it.
type imageVolume struct {
	volume, mountPath, image, pullSecret string
	policy                               corev1.PullPolicy
}

// instanceImages are the kernelBoot image and the containerDisk images of spec, in spec order.
// Pod volume names are by position: a VMI volume name may already be 63 bytes, the longest a
// pod volume name may be, so it cannot take a prefix.
func instanceImages(spec *v1alpha1.VirtualMachineInstanceSpec) []imageVolume {
	var out []imageVolume
	if fw := spec.Domain.Firmware; fw != nil && fw.KernelBoot != nil && fw.KernelBoot.Container != nil {
		c := fw.KernelBoot.Container
		out = append(out, imageVolume{volume: kernelBootVolume, mountPath: podlayout.KernelBootDir,
			image: c.Image, pullSecret: c.ImagePullSecret, policy: c.ImagePullPolicy})
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if c := v.ContainerDisk; c != nil {
			out = append(out, imageVolume{volume: fmt.Sprintf("containerdisk-%d", i), mountPath: podlayout.ContainerDiskMount(v.Name),
				image: c.Image, pullSecret: c.ImagePullSecret, policy: c.ImagePullPolicy})
		}
	}
	return out
}

// addImageVolumes mounts the instance's images into the compute container as read-only image
// volumes, and gives the pod their pull secrets: the kubelet (or a virtual node's provider) pulls
// and unpacks them with the pod's own credentials, so neither the launcher nor the node agent ever
// pulls or sees a tenant's Secret, and no image files are shared writable between pods.
func addImageVolumes(pod *corev1.Pod, spec *v1alpha1.VirtualMachineInstanceSpec) {
	c := &pod.Spec.Containers[0]
	for _, img := range instanceImages(spec) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: img.volume, VolumeSource: corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: img.image, PullPolicy: img.policy}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: img.volume, MountPath: img.mountPath, ReadOnly: true})
		ref := corev1.LocalObjectReference{Name: img.pullSecret}
		if img.pullSecret != "" && !slices.Contains(pod.Spec.ImagePullSecrets, ref) {
			pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, ref)
		}
	}
}

// LauncherPodLabels are the labels of an instance's launcher pod: the instance's own labels (so a
// Service selecting the VM's labels reaches the launcher) under qvirt's, which cannot be overridden.
// The migration label is never inherited: it marks target pods, which only the migration reconciler
// creates.
func LauncherPodLabels(vmi *v1alpha1.VirtualMachineInstance) map[string]string {
	labels := make(map[string]string, len(vmi.Labels)+4)
	for k, v := range vmi.Labels {
		if k != v1alpha1.MigrationUIDLabel {
			labels[k] = v
		}
	}
	labels[v1alpha1.AppLabel] = v1alpha1.LauncherApp
	labels[v1alpha1.VMINameLabel] = vmi.Name
	labels[v1alpha1.VMIUIDLabel] = string(vmi.UID)
	if vm := owningVM(vmi); vm != "" {
		labels[v1alpha1.VMNameLabel] = vm
	}
	return labels
}

// owningVM is the name of the VirtualMachine controlling the instance, or "".
func owningVM(vmi *v1alpha1.VirtualMachineInstance) string {
	ref := metav1.GetControllerOfNoCopy(vmi)
	if ref == nil || ref.Kind != "VirtualMachine" || !strings.HasPrefix(ref.APIVersion, v1alpha1.GroupVersion.Group+"/") {
		return ""
	}
	return ref.Name
}

// MemoryOverhead is the launcher pod's memory beyond the guest's:
//
//	overhead = Base + PerVCPU * vCPUs + guest / GuestRatio   (the last term only when GuestRatio > 0)
//	           + machine.EmulationOverheadMiB                    (only with useEmulation)
//
// rounded up to a whole MiB. What it covers, measured here: the launcher process holds about
// 14 MiB RSS, and QEMU about 50 MiB beyond guest RAM (device models, per-vCPU threads' stacks,
// its libraries' pages, which the pod's memory cgroup is charged for); page tables and the like
// grow with guest memory. The defaults (96Mi + 4Mi per vCPU + 1/512 of guest memory) leave room
// above those figures. Under emulation QEMU's translation cache comes on top: a Debian kernel's
// boot filled 60 MiB of it, which took a huge-page guest's pod, whose memory limit is the
// overhead alone, past its limit (the kernel's OOM killer ended QEMU on a real kubelet). The
// launcher bounds the cache (machine.TCGTranslationBufferMiB) and the formula counts it.
func MemoryOverhead(d *v1alpha1.DomainSpec, cfg config.Config) (*resource.Quantity, error) {
	guest, err := guestMemory(d)
	if err != nil {
		return nil, err
	}
	o := cfg.MemoryOverhead
	// With CPU hotplug room, the vCPUs it may reach, and with memory hotplug room, the memory:
	// the pod is not resized when they are plugged.
	bytes := o.Base.Value() + o.PerVCPU.Value()*int64(v1alpha1.QueueVCPUs(d.CPU))
	if m := d.Memory; m != nil && m.MaxGuest != nil && m.MaxGuest.Cmp(*guest) > 0 {
		guest = m.MaxGuest
	}
	if o.GuestRatio > 0 {
		bytes += guest.Value() / o.GuestRatio
	}
	if cfg.UseEmulation {
		bytes += machine.EmulationOverheadMiB << 20
	}
	const mib = 1 << 20
	bytes = (bytes + mib - 1) / mib * mib
	return resource.NewQuantity(bytes, resource.BinarySI), nil
}

// guestMemory is the memory QEMU gives the guest (whole MiB, see GuestMemoryMiB), which the pod
// must hold: 1024M asks for 976.56 MiB and the guest gets 977 MiB.
func guestMemory(d *v1alpha1.DomainSpec) (*resource.Quantity, error) {
	mib := v1alpha1.GuestMemoryMiB(d)
	if mib <= 0 {
		return nil, fmt.Errorf("spec.domain.memory.guest: set memory.guest or resources.requests.memory to a positive quantity")
	}
	return resource.NewQuantity(mib<<20, resource.BinarySI), nil
}

// launcherResources are the compute container's requests and limits; see MemoryOverhead.
func launcherResources(d *v1alpha1.DomainSpec, cfg config.Config) (corev1.ResourceRequirements, error) {
	guest, err := guestMemory(d)
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	overhead, err := MemoryOverhead(d, cfg)
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	req := corev1.ResourceList{}
	lim := corev1.ResourceList{}
	// Every resource but memory is the pod's as the instance asks: cpu, ephemeral-storage, ...
	for name, q := range d.Resources.Requests {
		if name != corev1.ResourceMemory {
			req[name] = q.DeepCopy()
		}
	}
	for name, q := range d.Resources.Limits {
		if name != corev1.ResourceMemory {
			lim[name] = q.DeepCopy()
		}
	}

	mem := guest.DeepCopy()
	if !d.Resources.OvercommitGuestOverhead {
		mem.Add(*overhead)
	}
	req[corev1.ResourceMemory] = canonicalMemory(mem)
	if l, ok := d.Resources.Limits[corev1.ResourceMemory]; ok {
		if asked := v1alpha1.GuestMemory(d); l.Cmp(*asked) < 0 {
			return corev1.ResourceRequirements{}, fmt.Errorf("spec.domain.resources.limits.memory: %s is below the guest memory %s", l.String(), asked.String())
		}
		// A limit equal to a guest memory of a fraction of a MiB (1024M) still covers the round-up.
		l = l.DeepCopy()
		if l.Cmp(*guest) < 0 {
			l = guest.DeepCopy()
		}
		l.Add(*overhead)
		lim[corev1.ResourceMemory] = canonicalMemory(l)
	}

	if d.Memory != nil && d.Memory.Hugepages != nil {
		hugePages(req, lim, d.Memory.Hugepages, *guest, *overhead)
	}
	if dedicatedCPUs(d) {
		guaranteed(d, req, lim)
	}

	// Device-plugin resources: extended resources must have requests equal to limits.
	one := resource.MustParse("1")
	req[v1alpha1.TunResource], lim[v1alpha1.TunResource] = one.DeepCopy(), one.DeepCopy()
	if !cfg.UseEmulation {
		req[v1alpha1.KVMResource], lim[v1alpha1.KVMResource] = one.DeepCopy(), one.DeepCopy()
	}
	return corev1.ResourceRequirements{Requests: req, Limits: lim}, nil
}

// hugePages moves the guest's RAM from the container's memory to hugepages-<pageSize> (KubeVirt's
// WithHugePages): QEMU takes it from the node's huge page pool, which the kubelet accounts apart
// and the scheduler places by. The memory request keeps only the overhead, and a memory limit only
// what it allowed beyond the guest.
func hugePages(req, lim corev1.ResourceList, hp *v1alpha1.Hugepages, guest, overhead resource.Quantity) {
	name := corev1.ResourceName(corev1.ResourceHugePagesPrefix + hp.PageSize)
	req[name], lim[name] = guest.DeepCopy(), guest.DeepCopy()
	req[corev1.ResourceMemory] = canonicalMemory(overhead)
	if l, ok := lim[corev1.ResourceMemory]; ok {
		l.Sub(guest)
		lim[corev1.ResourceMemory] = canonicalMemory(l)
	}
}

func dedicatedCPUs(d *v1alpha1.DomainSpec) bool {
	return d.CPU != nil && d.CPU.DedicatedCPUPlacement
}

// guaranteed makes the compute container Guaranteed with whole CPUs, so that the kubelet's static
// CPU manager gives it CPUs of its own (KubeVirt's WithCPUPinning): as many as the guest has vCPUs,
// one more for an isolated emulator thread, and a memory limit equal to the request. Admission
// has checked that the instance's own CPU and memory figures agree with these
// (v1alpha1.validateDedicatedCPUs).
func guaranteed(d *v1alpha1.DomainSpec, req, lim corev1.ResourceList) {
	cpus := int64(v1alpha1.VCPUs(d.CPU))
	if d.CPU.IsolateEmulatorThread {
		cpus++
	}
	req[corev1.ResourceCPU] = *resource.NewQuantity(cpus, resource.DecimalSI)
	lim[corev1.ResourceCPU] = *resource.NewQuantity(cpus, resource.DecimalSI)
	lim[corev1.ResourceMemory] = req[corev1.ResourceMemory].DeepCopy()
}

// canonicalMemory re-expresses a memory sum in binary units (512Mi + 98Mi prints 610Mi, not a byte
// count mixing formats).
func canonicalMemory(q resource.Quantity) resource.Quantity {
	return *resource.NewQuantity(q.Value(), resource.BinarySI)
}

// sanitizeHostname turns an instance name into a valid hostname (a DNS label): dots become dashes
// and it is cut to 63 characters.
func sanitizeHostname(name string) string {
	h := strings.ReplaceAll(name, ".", "-")
	if len(h) > validation.DNS1123LabelMaxLength {
		h = h[:validation.DNS1123LabelMaxLength]
	}
	return strings.TrimRight(h, "-")
}

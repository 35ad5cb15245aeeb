package v1alpha1

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// validVM is the one valid object every case below starts from.
func validVM() *VirtualMachine {
	rs := RunStrategyAlways
	return &VirtualMachine{Spec: VirtualMachineSpec{
		RunStrategy: &rs,
		Template: VirtualMachineInstanceTemplateSpec{Spec: VirtualMachineInstanceSpec{
			Domain: DomainSpec{
				CPU:    &CPU{Cores: 2},
				Memory: &Memory{Guest: ptr.To(resource.MustParse("256Mi"))},
				Devices: Devices{
					Disks: []Disk{
						{Name: "root", Disk: &DiskTarget{Bus: DiskBusVirtio}, BootOrder: ptr.To[uint32](1)},
						{Name: "cidata", CDRom: &CDRomTarget{Bus: DiskBusSATA}},
					},
					Interfaces: []Interface{{Name: "default", Masquerade: &InterfaceMasquerade{}, Ports: []Port{{Port: 80}}}},
				},
			},
			Volumes: []Volume{
				{Name: "root", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "example/disk:1"}}},
				{Name: "cidata", VolumeSource: VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserData: "#cloud-config\n"}}},
			},
			Networks: []Network{{Name: "default", Pod: &PodNetwork{}}},
			ReadinessProbe: &Probe{Handler: Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}},
				InitialDelaySeconds: 5, PeriodSeconds: 2},
			LivenessProbe: &Probe{Handler: Handler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(80), Path: "/healthz",
				HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "1"}}}}, FailureThreshold: 5, SuccessThreshold: 1},
		}},
	}}
}

func TestValidateVirtualMachine(t *testing.T) {
	if errs := ValidateVirtualMachine(validVM()); len(errs) != 0 {
		t.Fatalf("the base object must be valid, got %v", errs)
	}
	cases := []struct {
		name   string
		mutate func(vm *VirtualMachine, s *VirtualMachineInstanceSpec)
		path   string
	}{
		{"running and runStrategy", func(vm *VirtualMachine, _ *VirtualMachineInstanceSpec) { vm.Spec.Running = ptr.To(true) }, "spec.running"},
		{"runStrategy typo", func(vm *VirtualMachine, _ *VirtualMachineInstanceSpec) {
			vm.Spec.RunStrategy = ptr.To(RunStrategy("Allways"))
		}, "spec.runStrategy"},
		{"disk without volume", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "orphan"})
		}, "spec.template.spec.domain.devices.disks[2].name"},
		{"volume without disk", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes = append(s.Volumes, Volume{Name: "extra", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
		}, "spec.template.spec.volumes[2].name"},
		{"duplicate disk", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[1].Name = "root" }, "spec.template.spec.domain.devices.disks[1].name"},
		{"duplicate volume", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Volumes[1].Name = "root" }, "spec.template.spec.volumes[1].name"},
		{"bad disk name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[0].Name = "Root_Disk" }, "spec.template.spec.domain.devices.disks[0].name"},
		{"zero memory", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Memory.Guest = ptr.To(resource.MustParse("0"))
		}, "spec.template.spec.domain.memory.guest"},
		{"no memory at all", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Memory = nil }, "spec.template.spec.domain.memory.guest"},
		{"limit below guest memory", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Resources.Limits = corev1.ResourceList{"memory": resource.MustParse("128Mi")}
		}, "spec.template.spec.domain.resources.limits.memory"},
		{"too many vCPUs", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 16, Cores: 16, Threads: 2}
		}, "spec.template.spec.domain.cpu"},
		{"isolated emulator thread without dedicated CPUs", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, IsolateEmulatorThread: true}
		}, "spec.template.spec.domain.cpu.isolateEmulatorThread"},
		{"dedicated CPUs with a fraction of a CPU", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, DedicatedCPUPlacement: true}
			s.Domain.Resources.Requests = corev1.ResourceList{"cpu": resource.MustParse("1500m")}
		}, "spec.template.spec.domain.resources.requests.cpu"},
		{"dedicated CPUs with a CPU limit other than the vCPUs", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, DedicatedCPUPlacement: true}
			s.Domain.Resources.Limits = corev1.ResourceList{"cpu": resource.MustParse("4")}
		}, "spec.template.spec.domain.resources.limits.cpu"},
		{"dedicated CPUs with memory request below its limit", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, DedicatedCPUPlacement: true}
			s.Domain.Resources.Requests = corev1.ResourceList{"memory": resource.MustParse("1Gi")}
			s.Domain.Resources.Limits = corev1.ResourceList{"memory": resource.MustParse("2Gi")}
		}, "spec.template.spec.domain.resources.requests.memory"},
		{"dedicated CPUs with the overhead overcommitted", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, DedicatedCPUPlacement: true}
			s.Domain.Resources.OvercommitGuestOverhead = true
		}, "spec.template.spec.domain.resources.overcommitGuestOverhead"},
		{"dedicated CPUs with three threads a core", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 1, Cores: 1, Threads: 3, DedicatedCPUPlacement: true}
		}, "spec.template.spec.domain.cpu.threads"},
		{"huge pages of an unknown size", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Memory.Hugepages = &Hugepages{PageSize: "4Mi"}
		}, "spec.template.spec.domain.memory.hugepages.pageSize"},
		{"guest memory not a whole number of huge pages", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Memory.Guest = ptr.To(resource.MustParse("129Mi"))
			s.Domain.Memory.Hugepages = &Hugepages{PageSize: "2Mi"}
		}, "spec.template.spec.domain.memory.hugepages.pageSize"},
		{"unknown bus", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[0].Disk.Bus = "ide" }, "spec.template.spec.domain.devices.disks[0].disk.bus"},
		{"cdrom on virtio", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[1].CDRom.Bus = DiskBusVirtio
		}, "spec.template.spec.domain.devices.disks[1].cdrom.bus"},
		{"disk and cdrom", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[1].Disk = &DiskTarget{} }, "spec.template.spec.domain.devices.disks[1].cdrom"},
		{"CPU feature with an option", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Features: []CPUFeature{{Name: "aes,vmx=on"}}}
		}, "spec.template.spec.domain.cpu.features[0].name"},
		{"CPU feature twice", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Features: []CPUFeature{{Name: "aes"}, {Name: "aes", Policy: CPUFeatureDisable}}}
		}, "spec.template.spec.domain.cpu.features[1].name"},
		{"unknown CPU feature policy", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Features: []CPUFeature{{Name: "aes", Policy: "prefer"}}}
		}, "spec.template.spec.domain.cpu.features[0].policy"},
		{"lun and cdrom", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Domain.Devices.Disks[1].LUN = &LunTarget{} }, "spec.template.spec.domain.devices.disks[1].lun"},
		{"lun on a containerDisk", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[0] = Disk{Name: "root", LUN: &LunTarget{}}
		}, "spec.template.spec.domain.devices.disks[0].lun"},
		{"lun on virtio", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[0] = Disk{Name: "root", LUN: &LunTarget{Bus: DiskBusVirtio}}
			s.Volumes[0].VolumeSource = VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "san"}}
		}, "spec.template.spec.domain.devices.disks[0].lun.bus"},
		{"duplicate bootOrder", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[1].BootOrder = ptr.To[uint32](1)
		}, "spec.template.spec.domain.devices.disks[1].bootOrder"},
		{"native io with writeback", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[0].IO, s.Domain.Devices.Disks[0].Cache = IONative, CacheWriteBack
		}, "spec.template.spec.domain.devices.disks[0].io"},
		{"bad MAC", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].MacAddress = "02:00:00:00:00"
		}, "spec.template.spec.domain.devices.interfaces[0].macAddress"},
		{"multicast MAC", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].MacAddress = "01:00:5e:00:00:01"
		}, "spec.template.spec.domain.devices.interfaces[0].macAddress"},
		{"two bindings", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Bridge = &InterfaceBridge{}
		}, "spec.template.spec.domain.devices.interfaces[0].bridge"},
		{"probe without an action", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe.TCPSocket = nil
		}, "spec.template.spec.readinessProbe"},
		{"probe with two actions", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe.HTTPGet = &corev1.HTTPGetAction{Port: intstr.FromInt32(80)}
		}, "spec.template.spec.readinessProbe.httpGet"},
		{"probe with a negative period", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.PeriodSeconds = -1
		}, "spec.template.spec.livenessProbe.periodSeconds"},
		{"probe with a negative initial delay", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe.InitialDelaySeconds = -5
		}, "spec.template.spec.readinessProbe.initialDelaySeconds"},
		{"liveness probe with a success threshold", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.SuccessThreshold = 2
		}, "spec.template.spec.livenessProbe.successThreshold"},
		{"probe port 0", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe.TCPSocket.Port = intstr.FromInt32(0)
		}, "spec.template.spec.readinessProbe.tcpSocket.port"},
		{"probe port name too long", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.HTTPGet.Port = intstr.FromString("a-much-too-long-port-name")
		}, "spec.template.spec.livenessProbe.httpGet.port"},
		{"probe scheme", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.HTTPGet.Scheme = "FTP"
		}, "spec.template.spec.livenessProbe.httpGet.scheme"},
		{"probe relative path", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.HTTPGet.Path = "healthz"
		}, "spec.template.spec.livenessProbe.httpGet.path"},
		{"probe header name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.LivenessProbe.HTTPGet.HTTPHeaders[0].Name = "X Probe"
		}, "spec.template.spec.livenessProbe.httpGet.httpHeaders[0].name"},
		{"exec probe without a command", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe = &Probe{Handler: Handler{Exec: &corev1.ExecAction{}}}
		}, "spec.template.spec.readinessProbe.exec.command"},
		{"probe port name of no interface port", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Ports[0].Name = "http"
			s.LivenessProbe.HTTPGet.Port = intstr.FromString("web")
		}, "spec.template.spec.livenessProbe.httpGet.port"},
		{"tcpSocket probe port name without interface ports", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.ReadinessProbe.TCPSocket.Port = intstr.FromString("http")
		}, "spec.template.spec.readinessProbe.tcpSocket.port"},
		{"interface port name no IANA service name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Ports[0].Name = "HTTP_1"
		}, "spec.template.spec.domain.devices.interfaces[0].ports[0].name"},
		{"interface port names twice", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Ports = []Port{{Name: "http", Port: 80}, {Name: "http", Port: 8080}}
		}, "spec.template.spec.domain.devices.interfaces[0].ports[1].name"},
		{"port out of range", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Ports[0].Port = 70000
		}, "spec.template.spec.domain.devices.interfaces[0].ports[0].port"},
		{"interface without network", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Networks[0].Name = "other" }, "spec.template.spec.domain.devices.interfaces[0].name"},
		{"masquerade on multus", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Networks[0] = Network{Name: "default", Multus: &MultusNetwork{NetworkName: "ns/net"}}
		}, "spec.template.spec.domain.devices.interfaces[0].masquerade"},
		{"masquerade on a secondary multus network", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, Interface{Name: "lab", Masquerade: &InterfaceMasquerade{}})
			s.Networks = append(s.Networks, Network{Name: "lab", Multus: &MultusNetwork{NetworkName: "lab"}})
		}, "spec.template.spec.domain.devices.interfaces[1].masquerade"},
		{"a binding plugin qvirt does not have", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Masquerade = nil
			s.Domain.Devices.Interfaces[0].Binding = &PluginBinding{Name: "macvtap"}
		}, "spec.template.spec.domain.devices.interfaces[0].binding.name"},
		{"passt and masquerade", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces[0].Masquerade = &InterfaceMasquerade{}
			s.Domain.Devices.Interfaces[0].Binding = &PluginBinding{Name: PasstBinding}
		}, "spec.template.spec.domain.devices.interfaces[0].binding"},
		{"passt on a secondary multus network", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, Interface{Name: "lab", Binding: &PluginBinding{Name: PasstBinding}})
			s.Networks = append(s.Networks, Network{Name: "lab", Multus: &MultusNetwork{NetworkName: "lab"}})
		}, "spec.template.spec.domain.devices.interfaces[1].binding"},
		{"pod network and a default multus network", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, Interface{Name: "lab", Bridge: &InterfaceBridge{}})
			s.Networks = append(s.Networks, Network{Name: "lab", Multus: &MultusNetwork{NetworkName: "lab", Default: true}})
		}, "spec.template.spec.networks[1].multus.default"},
		{"multus networkName not a name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, Interface{Name: "lab", Bridge: &InterfaceBridge{}})
			s.Networks = append(s.Networks, Network{Name: "lab", Multus: &MultusNetwork{NetworkName: "a/b/c"}})
		}, "spec.template.spec.networks[1].multus.networkName"},
		{"maxSockets below sockets", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, MaxSockets: 1}
		}, "spec.template.spec.domain.cpu.maxSockets"},
		{"maxSockets beyond the vCPU limit", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 1, Cores: 2, MaxSockets: 128}
		}, "spec.template.spec.domain.cpu.maxSockets"},
		{"maxSockets with dedicated CPUs", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 1, MaxSockets: 2, DedicatedCPUPlacement: true}
		}, "spec.template.spec.domain.cpu.maxSockets"},
		{"pod and multus", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Networks[0].Multus = &MultusNetwork{NetworkName: "x"}
		}, "spec.template.spec.networks[0]"},
		{"bad vm CIDR", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Networks[0].Pod.VMNetworkCIDR = "10.0.2.0/31"
		}, "spec.template.spec.networks[0].pod.vmNetworkCIDR"},
		{"two sources", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].EmptyDisk = &EmptyDiskSource{Capacity: resource.MustParse("1Gi")}
		}, "spec.template.spec.volumes[0]"},
		{"bad base64", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud = &CloudInitNoCloudSource{UserDataBase64: "not base64!"}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud.userDataBase64"},
		{"user data over 2048 bytes", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud = &CloudInitNoCloudSource{UserData: strings.Repeat("x", CloudInitMaxUserData+1)}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud.userData"},
		{"base64 user data over 2048 bytes decoded", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].VolumeSource = VolumeSource{CloudInitConfigDrive: &CloudInitConfigDriveSource{
				UserDataBase64: base64.StdEncoding.EncodeToString(make([]byte, CloudInitMaxUserData+1))}}
		}, "spec.template.spec.volumes[1].cloudInitConfigDrive.userDataBase64"},
		{"network data over 2048 bytes", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud.NetworkData = strings.Repeat("x", CloudInitMaxNetworkData+1)
		}, "spec.template.spec.volumes[1].cloudInitNoCloud.networkData"},
		{"two user data sources", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud.UserDataSecretRef = &corev1.LocalObjectReference{Name: "ud"}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud"},
		{"two network data sources", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].VolumeSource = VolumeSource{CloudInitConfigDrive: &CloudInitConfigDriveSource{
				NetworkData: "version: 2", NetworkDataSecretRef: &corev1.LocalObjectReference{Name: "nd"}}}
		}, "spec.template.spec.volumes[1].cloudInitConfigDrive"},
		{"no cloud-init data at all", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud = &CloudInitNoCloudSource{}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud"},
		{"secretRef without a name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud = &CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{}}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud.secretRef.name"},
		{"networkDataSecretRef with a bad name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitNoCloud.NetworkDataSecretRef = &corev1.LocalObjectReference{Name: "Bad_Name"}
		}, "spec.template.spec.volumes[1].cloudInitNoCloud.networkDataSecretRef.name"},
		{"noCloud and configDrive in one volume", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[1].CloudInitConfigDrive = &CloudInitConfigDriveSource{UserData: "#cloud-config"}
		}, "spec.template.spec.volumes[1]"},
		{"a second cloud-init volume", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "config", CDRom: &CDRomTarget{}})
			s.Volumes = append(s.Volumes, Volume{Name: "config", VolumeSource: VolumeSource{
				CloudInitConfigDrive: &CloudInitConfigDriveSource{UserData: "#cloud-config"}}})
		}, "spec.template.spec.volumes[2].cloudInitConfigDrive"},
		{"hostDisk relative path", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].VolumeSource = VolumeSource{HostDisk: &HostDisk{Path: "disk.img", Type: HostDiskExists}}
		}, "spec.template.spec.volumes[0].hostDisk.path"},
		{"hostDisk dot-dot", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].VolumeSource = VolumeSource{HostDisk: &HostDisk{Path: "/var/lib/../../etc/shadow", Type: HostDiskExists}}
		}, "spec.template.spec.volumes[0].hostDisk.path"},
		{"hostDisk create without capacity", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].VolumeSource = VolumeSource{HostDisk: &HostDisk{Path: "/var/lib/qvirt/d.img", Type: HostDiskExistsOrCreate}}
		}, "spec.template.spec.volumes[0].hostDisk.capacity"},
		{"bad hostname", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) { s.Hostname = "My_Host" }, "spec.template.spec.hostname"},
		{"kernel boot without paths", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{KernelBoot: &KernelBoot{Container: &KernelBootContainer{Image: "k:1"}}}
		}, "spec.template.spec.domain.firmware.kernelBoot.container"},
		{"machine type", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Machine = &Machine{Type: "pc-i440fx-7.2"}
		}, "spec.template.spec.domain.machine.type"},
		{"negative grace period", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.TerminationGracePeriodSeconds = ptr.To[int64](-1)
		}, "spec.template.spec.terminationGracePeriodSeconds"},
		{"memory beyond 1Ei", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Memory.Guest = ptr.To(resource.MustParse("2Ei"))
		}, "spec.template.spec.domain.memory.guest"},
		{"requested memory beyond 1Ei", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Memory = nil
			s.Domain.Resources.Requests = corev1.ResourceList{"memory": resource.MustParse("1e30")}
		}, "spec.template.spec.domain.resources.requests.memory"},
		{"firmware uuid", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{UUID: "not-a-uuid"}
		}, "spec.template.spec.domain.firmware.uuid"},
		{"NUL in kernelArgs", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{KernelBoot: &KernelBoot{KernelArgs: "quiet\x00rm", Container: &KernelBootContainer{Image: "k:1", KernelPath: "/vmlinuz"}}}
		}, "spec.template.spec.domain.firmware.kernelBoot.kernelArgs"},
		{"kernel pull policy", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{KernelBoot: &KernelBoot{Container: &KernelBootContainer{Image: "k:1", KernelPath: "/vmlinuz", ImagePullPolicy: "Sometimes"}}}
		}, "spec.template.spec.domain.firmware.kernelBoot.container.imagePullPolicy"},
		{"container disk pull policy", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].ContainerDisk.ImagePullPolicy = "always"
		}, "spec.template.spec.volumes[0].containerDisk.imagePullPolicy"},
		{"input on a PS/2 bus", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Inputs = []Input{{Name: "kbd", Bus: "ps2"}}
		}, "spec.template.spec.domain.devices.inputs[0].bus"},
		{"input that is no tablet", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Inputs = []Input{{Name: "kbd", Type: "keyboard"}}
		}, "spec.template.spec.domain.devices.inputs[0].type"},
		{"two inputs of one name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Inputs = []Input{{Name: "t"}, {Name: "t", Bus: InputBusVirtio}}
		}, "spec.template.spec.domain.devices.inputs[1].name"},
		{"watchdog without a name", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Watchdog = &Watchdog{}
		}, "spec.template.spec.domain.devices.watchdog.name"},
		{"watchdog action", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Watchdog = &Watchdog{Name: "wd", I6300ESB: &I6300ESBWatchdog{Action: "pause"}}
		}, "spec.template.spec.domain.devices.watchdog.i6300esb.action"},
		{"read-only sata disk", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks[0].Disk = &DiskTarget{Bus: DiskBusSATA, ReadOnly: true}
		}, "spec.template.spec.domain.devices.disks[0].disk.readonly"},
		{"bios and efi", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{BIOS: &BIOS{}, EFI: &EFI{SecureBoot: ptr.To(false)}}}
		}, "spec.template.spec.domain.firmware.bootloader"},
		{"secure boot by default without smm", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{}}}
		}, "spec.template.spec.domain.features.smm"},
		{"secure boot without smm", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(true)}}}
			s.Domain.Features = &Features{ACPI: &FeatureState{}}
		}, "spec.template.spec.domain.features.smm"},
		{"secure boot with smm turned off", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(true)}}}
			s.Domain.Features = &Features{SMM: &FeatureState{Enabled: ptr.To(false)}}
		}, "spec.template.spec.domain.features.smm.enabled"},
		{"seven sata devices", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			// The cdrom at 1 is sata by default; six more sata disks overflow the AHCI ports at 7.
			for i := range 6 {
				n := fmt.Sprintf("sata%d", i)
				s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: n, Disk: &DiskTarget{Bus: DiskBusSATA}})
				s.Volumes = append(s.Volumes, Volume{Name: n, VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}})
			}
		}, "spec.template.spec.domain.devices.disks[7].disk.bus"},
	}
	dvRoot := func(vm *VirtualMachine, s *VirtualMachineInstanceSpec, names ...string) {
		s.Volumes[0].VolumeSource = VolumeSource{DataVolume: &DataVolumeSource{Name: "root-dv"}}
		for _, n := range names {
			vm.Spec.DataVolumeTemplates = append(vm.Spec.DataVolumeTemplates, DataVolumeTemplateSpec{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	}
	cases = append(cases, []struct {
		name   string
		mutate func(vm *VirtualMachine, s *VirtualMachineInstanceSpec)
		path   string
	}{
		{"dataVolume name not a claim's", func(_ *VirtualMachine, s *VirtualMachineInstanceSpec) {
			s.Volumes[0].VolumeSource = VolumeSource{DataVolume: &DataVolumeSource{Name: "Root_DV"}}
		}, "spec.template.spec.volumes[0].dataVolume.name"},
		{"dataVolumeTemplate without a name", func(vm *VirtualMachine, s *VirtualMachineInstanceSpec) { dvRoot(vm, s, "root-dv", "") },
			"spec.dataVolumeTemplates[1].metadata.name"},
		{"dataVolumeTemplate no volume uses", func(vm *VirtualMachine, s *VirtualMachineInstanceSpec) { dvRoot(vm, s, "root-dv", "spare") },
			"spec.dataVolumeTemplates[1].metadata.name"},
		{"dataVolumeTemplate twice", func(vm *VirtualMachine, s *VirtualMachineInstanceSpec) { dvRoot(vm, s, "root-dv", "root-dv") },
			"spec.dataVolumeTemplates[1].metadata.name"},
		{"dataVolumeTemplate in another namespace", func(vm *VirtualMachine, s *VirtualMachineInstanceSpec) {
			dvRoot(vm, s, "root-dv")
			vm.Namespace, vm.Spec.DataVolumeTemplates[0].ObjectMeta.Namespace = "tenant", "other"
		}, "spec.dataVolumeTemplates[0].metadata.namespace"},
	}...)
	t.Run("dataVolumeTemplates used by a volume", func(t *testing.T) {
		vm := validVM()
		dvRoot(vm, &vm.Spec.Template.Spec, "root-dv")
		if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
			t.Fatalf("refused: %v", errs)
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm := validVM()
			tc.mutate(vm, &vm.Spec.Template.Spec)
			errs := ValidateVirtualMachine(vm)
			if !hasPath(errs, tc.path) {
				t.Fatalf("want an error at %s, got %v", tc.path, errs)
			}
		})
	}
}

// TestFirmwareCombinationsAccepted: what KubeVirt accepts of the bootloader and SMM, qvirt accepts.
func TestFirmwareCombinationsAccepted(t *testing.T) {
	cases := map[string]func(s *VirtualMachineInstanceSpec){
		"bios": func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{BIOS: &BIOS{UseSerial: ptr.To(true)}}}
		},
		"efi without secure boot": func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(false)}}}
		},
		"efi with secure boot by default and smm": func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{}}}
			s.Domain.Features = &Features{SMM: &FeatureState{}}
		},
		"efi with secure boot and smm enabled": func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(true)}}}
			s.Domain.Features = &Features{SMM: &FeatureState{Enabled: ptr.To(true)}}
		},
		"smm without efi": func(s *VirtualMachineInstanceSpec) { s.Domain.Features = &Features{SMM: &FeatureState{}} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			vm := validVM()
			mutate(&vm.Spec.Template.Spec)
			if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
				t.Fatalf("refused: %v", errs)
			}
		})
	}
}

func hasPath(errs field.ErrorList, path string) bool {
	for _, e := range errs {
		if e.Field == path {
			return true
		}
	}
	return false
}

func TestSamplesValidate(t *testing.T) {
	for _, f := range sampleFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(data, &meta); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var errs field.ErrorList
		switch meta.Kind {
		case "VirtualMachine":
			var vm VirtualMachine
			mustUnmarshalStrict(t, f, data, &vm)
			errs = ValidateVirtualMachine(&vm)
		case "VirtualMachineInstance":
			var vmi VirtualMachineInstance
			mustUnmarshalStrict(t, f, data, &vmi)
			errs = ValidateVirtualMachineInstanceSpec(&vmi.Spec, field.NewPath("spec"))
		case "VirtualMachineClusterInstancetype":
			var it VirtualMachineClusterInstancetype
			mustUnmarshalStrict(t, f, data, &it)
			errs = NotRealisedInstancetype(&it.Spec, field.NewPath("spec"))
		case "VirtualMachineClusterPreference":
			var pref VirtualMachineClusterPreference
			mustUnmarshalStrict(t, f, data, &pref)
			errs = NotRealisedPreference(&pref.Spec, field.NewPath("spec"))
		default:
			continue
		}
		if len(errs) != 0 {
			t.Errorf("%s: %v", filepath.Base(f), errs)
		}
	}
}

func mustUnmarshalStrict(t testing.TB, name string, data []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func sampleFiles(t testing.TB) []string {
	files, err := filepath.Glob("../../config/samples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples under config/samples: %v", err)
	}
	var out []string
	for _, f := range files {
		if !strings.HasSuffix(f, "kustomization.yaml") {
			out = append(out, f)
		}
	}
	return out
}

// FuzzValidateVirtualMachine feeds arbitrary manifests to the validation functions and NotRealised:
// they must never panic, every error must name a field, and validation must be deterministic. A spec
// that passes stays valid once defaulted (SetDefaults), and defaulting twice changes nothing. The
// seeds are the samples and the manifests this version refuses (test/refused).
func FuzzValidateVirtualMachine(f *testing.F) {
	refused, _ := filepath.Glob("../../test/refused/*.yaml")
	for _, file := range append(sampleFiles(f), refused...) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	base, _ := json.Marshal(validVM())
	f.Add(base)
	withConfig := validVM()
	withConfigVolumes(&withConfig.Spec.Template.Spec)
	config, _ := json.Marshal(withConfig)
	f.Add(config)
	withDV := validVM()
	withDV.Spec.Template.Spec.Volumes[0].VolumeSource = VolumeSource{DataVolume: &DataVolumeSource{Name: "root-dv"}}
	withDV.Spec.DataVolumeTemplates = []DataVolumeTemplateSpec{{ObjectMeta: metav1.ObjectMeta{Name: "root-dv"},
		Spec: runtime.RawExtension{Raw: []byte(`{"source":{"http":{"url":"https://example.com/disk.qcow2"}}}`)}}}
	dv, _ := json.Marshal(withDV)
	f.Add(dv)
	withFS := validVM()
	withFilesystems(&withFS.Spec.Template.Spec)
	fs, _ := json.Marshal(withFS)
	f.Add(fs)
	f.Add([]byte(`{"spec":{"template":{"spec":{"domain":{"devices":{},"features":{"hypervPassthrough":{},"hyperv":{"synic":{},"vendorid":{"vendorid":"a,b"}}},` +
		`"clock":{"utc":{"offsetSeconds":-86400},"timezone":"Europe/Paris","timer":{"hpet":{"present":false,"tickPolicy":"merge"},"pit":{"tickPolicy":"discard"}}}}}}}}`))
	f.Add([]byte(`{"spec":{"template":{"spec":{"domain":{"cpu":{"sockets":2,"threads":2,"dedicatedCpuPlacement":true,"isolateEmulatorThread":true},` +
		`"memory":{"guest":"1Gi","hugepages":{"pageSize":"1Gi"}},"resources":{"requests":{"cpu":"4","memory":"1Gi"},"limits":{"cpu":"3500m","memory":"2Gi"}}}}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var vm VirtualMachine
		if err := yaml.Unmarshal(data, &vm); err != nil {
			return
		}
		check := func(vm *VirtualMachine) field.ErrorList {
			return append(ValidateVirtualMachine(vm), NotRealised(&vm.Spec.Template.Spec, field.NewPath("spec", "template", "spec"))...)
		}
		errs := check(&vm)
		for _, e := range errs {
			if e.Field == "" {
				t.Fatalf("error without a field path: %v", e)
			}
		}
		if again := check(&vm); len(again) != len(errs) {
			t.Fatalf("validation is not deterministic: %d then %d errors", len(errs), len(again))
		}
		if len(errs) > 0 {
			return
		}
		SetDefaults(&vm.Spec.Template.Spec)
		if errs := check(&vm); len(errs) > 0 {
			t.Fatalf("valid before defaulting, invalid after: %v", errs.ToAggregate())
		}
		once := vm.Spec.Template.Spec.DeepCopy()
		SetDefaults(&vm.Spec.Template.Spec)
		if !equality.Semantic.DeepEqual(once, &vm.Spec.Template.Spec) {
			t.Fatalf("defaulting is not idempotent:\n%+v\n%+v", once, vm.Spec.Template.Spec)
		}
	})
}

// TestCloudInitLimits: KubeVirt's limits hold to the byte (2048 accepted, 2049 refused; base64 by
// its decoded size) and the refusal says where larger data goes.
func TestCloudInitLimits(t *testing.T) {
	p := field.NewPath("v")
	for _, tc := range []struct {
		name  string
		src   CloudInitSource
		field string
		fix   string
	}{
		{"userData", CloudInitSource{UserData: strings.Repeat("a", CloudInitMaxUserData)}, "v.userData", "secretRef"},
		{"userDataBase64", CloudInitSource{UserDataBase64: base64.StdEncoding.EncodeToString(make([]byte, CloudInitMaxUserData))}, "v.userDataBase64", "secretRef"},
		{"networkData", CloudInitSource{NetworkData: strings.Repeat("a", CloudInitMaxNetworkData)}, "v.networkData", "networkDataSecretRef"},
		{"networkDataBase64", CloudInitSource{NetworkDataBase64: base64.StdEncoding.EncodeToString(make([]byte, CloudInitMaxNetworkData))}, "v.networkDataBase64", "networkDataSecretRef"},
	} {
		if errs := validateCloudInit(tc.src, p); len(errs) != 0 {
			t.Errorf("%s at the limit: %v", tc.name, errs)
		}
		over := tc.src
		switch tc.name {
		case "userData":
			over.UserData += "a"
		case "userDataBase64":
			over.UserDataBase64 = base64.StdEncoding.EncodeToString(make([]byte, CloudInitMaxUserData+1))
		case "networkData":
			over.NetworkData += "a"
		case "networkDataBase64":
			over.NetworkDataBase64 = base64.StdEncoding.EncodeToString(make([]byte, CloudInitMaxNetworkData+1))
		}
		errs := validateCloudInit(over, p)
		if len(errs) != 1 || errs[0].Field != tc.field || errs[0].Type != field.ErrorTypeTooLong ||
			!strings.Contains(errs[0].Detail, "2049") || !strings.Contains(errs[0].Detail, "("+tc.fix+")") {
			t.Errorf("%s one byte over: want one TooLong at %s naming %s, got %v", tc.name, tc.field, tc.fix, errs)
		}
	}
}

// FuzzValidateCloudInit: whatever a user writes in a cloud-init volume, validation names a field,
// and what it accepts is something the launcher can write: one user data source at most, one
// network data source at most, one of them at least, inline data decodable and within the limits.
func FuzzValidateCloudInit(f *testing.F) {
	f.Add("#cloud-config\n", "", "", "", "", "", uint8(0))
	f.Add("", base64.StdEncoding.EncodeToString([]byte("#cloud-config\n")), "ud", "version: 2", "", "", uint8(1))
	f.Add("", "", "", "", "!!", "Bad_Name", uint8(2))
	f.Fuzz(func(t *testing.T, ud, ud64, udSecret, nd, nd64, ndSecret string, flags uint8) {
		c := CloudInitSource{UserData: ud, UserDataBase64: ud64, NetworkData: nd, NetworkDataBase64: nd64}
		if flags&1 != 0 {
			c.UserDataSecretRef = &corev1.LocalObjectReference{Name: udSecret}
		}
		if flags&2 != 0 {
			c.NetworkDataSecretRef = &corev1.LocalObjectReference{Name: ndSecret}
		}
		errs := validateCloudInit(c, field.NewPath("spec", "volumes").Index(0).Child("cloudInitNoCloud"))
		for _, e := range errs {
			if !strings.HasPrefix(e.Field, "spec.volumes[0].cloudInitNoCloud") {
				t.Fatalf("error outside the volume: %v", e)
			}
		}
		if len(errs) > 0 {
			return
		}
		users := countSet(ud != "", ud64 != "", c.UserDataSecretRef != nil)
		nets := countSet(nd != "", nd64 != "", c.NetworkDataSecretRef != nil)
		if users > 1 || nets > 1 || users+nets == 0 {
			t.Fatalf("accepted %d user and %d network data sources", users, nets)
		}
		for _, v := range []struct {
			s       string
			encoded bool
			limit   int
		}{{ud, false, CloudInitMaxUserData}, {ud64, true, CloudInitMaxUserData}, {nd, false, CloudInitMaxNetworkData}, {nd64, true, CloudInitMaxNetworkData}} {
			data := []byte(v.s)
			if v.encoded {
				var err error
				if data, err = base64.StdEncoding.DecodeString(v.s); err != nil {
					t.Fatalf("accepted bad base64 %q", v.s)
				}
			}
			if len(data) > v.limit {
				t.Fatalf("accepted %d bytes over a limit of %d", len(data), v.limit)
			}
		}
	})
}

// A huge quantity is refused naming the field without spelling the number out: Quantity.String
// takes seconds on 99999999999999999999e99999, which made a webhook call that slow.
func TestHugeQuantityRefusedQuickly(t *testing.T) {
	vm := validVM()
	vm.Spec.Template.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("99999999999999999999e99999"))
	errs := ValidateVirtualMachine(vm)
	if len(errs) != 1 || errs[0].Field != "spec.template.spec.domain.memory.guest" || !strings.Contains(errs[0].Error(), "above 2^63") {
		t.Fatalf("errors %v, want one naming domain.memory.guest as above 2^63", errs)
	}
}

// TestNICQueues: networkInterfaceMultiqueue gives a virtio interface a queue pair per vCPU, up to a
// tap's 256; other models, one vCPU, or the setting off keep one queue.
func TestNICQueues(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		name  string
		mq    *bool
		cpu   *CPU
		model string
		want  uint32
	}{
		{"virtio, 4 vCPUs", &on, &CPU{Sockets: 2, Cores: 2}, "", 4},
		{"explicit virtio", &on, &CPU{Cores: 3}, "virtio", 3},
		{"e1000 stays single-queue", &on, &CPU{Cores: 4}, "e1000", 0},
		{"one vCPU", &on, nil, "", 0},
		{"off", &off, &CPU{Cores: 4}, "", 0},
		{"unset", nil, &CPU{Cores: 4}, "", 0},
		{"capped at a tap's queues", &on, &CPU{Sockets: 2, Cores: 200}, "", MaxNICQueues},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &DomainSpec{CPU: tc.cpu}
			d.Devices.NetworkInterfaceMultiQueue = tc.mq
			if got := NICQueues(d, &Interface{Model: tc.model}); got != tc.want {
				t.Errorf("NICQueues = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestTransitionalDevicesFitPCIe0: with useVirtioTransitional every virtio disk and interface takes
// a conventional PCI slot of its own, so an instance with more than MaxTransitionalDevices is
// refused at admission, naming the field, rather than by the launcher after scheduling.
func TestTransitionalDevicesFitPCIe0(t *testing.T) {
	spec := func(disks int) *VirtualMachineInstanceSpec {
		s := realisedSpec()
		s.Domain.Devices.UseVirtioTransitional = ptr.To(true)
		s.Domain.Devices.Disks, s.Volumes = nil, nil
		for i := range disks {
			name := fmt.Sprintf("d%d", i)
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: name, Disk: &DiskTarget{Bus: DiskBusVirtio}})
			s.Volumes = append(s.Volumes, Volume{Name: name, VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
		}
		return s
	}
	p := field.NewPath("spec")
	if errs := ValidateVirtualMachineInstanceSpec(spec(MaxTransitionalDevices-1), p); len(errs) != 0 {
		t.Fatalf("%d disks and an interface: %v", MaxTransitionalDevices-1, errs)
	}
	errs := ValidateVirtualMachineInstanceSpec(spec(MaxTransitionalDevices), p)
	if len(errs) != 1 || errs[0].Field != "spec.domain.devices.useVirtioTransitional" {
		t.Fatalf("%d disks and an interface: %v, want one error at spec.domain.devices.useVirtioTransitional", MaxTransitionalDevices, errs)
	}
}

// TestMultusNetworksAccepted: KubeVirt's secondary networks (bridge-bound multus networks besides
// the pod network, a NetworkAttachmentDefinition of another namespace) and a default multus
// network in place of the pod network validate and are realised.
func TestMultusNetworksAccepted(t *testing.T) {
	vm := validVM()
	s := &vm.Spec.Template.Spec
	s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces,
		Interface{Name: "lab", Bridge: &InterfaceBridge{}}, Interface{Name: "storage", Bridge: &InterfaceBridge{}})
	s.Networks = append(s.Networks, Network{Name: "lab", Multus: &MultusNetwork{NetworkName: "lab"}},
		Network{Name: "storage", Multus: &MultusNetwork{NetworkName: "infra/storage-net"}})
	if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
		t.Fatalf("secondary networks refused: %v", errs)
	}
	if errs := NotRealised(s, field.NewPath("spec")); len(errs) != 0 {
		t.Fatalf("secondary networks not realised: %v", errs)
	}
	vm = validVM()
	s = &vm.Spec.Template.Spec
	s.Networks[0] = Network{Name: s.Networks[0].Name, Multus: &MultusNetwork{NetworkName: "flat", Default: true}}
	if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
		t.Fatalf("a default multus network refused: %v", errs)
	}
	if a, b := MultusInterfaceName("lab"), MultusInterfaceName("storage"); len(a) != 14 || a == b || a[:3] != "pod" {
		t.Errorf("pod interface names %q and %q: want distinct pod<11 hex digits>", a, b)
	}
}

// KubeVirt's passt binding plugin, as its user guide writes it: accepted, kept as written (no
// masquerade added by default), and refused for hotplug, naming the field.
func TestPasstBindingAccepted(t *testing.T) {
	vm := validVM()
	s := &vm.Spec.Template.Spec
	s.Domain.Devices.Interfaces[0] = Interface{Name: s.Networks[0].Name, Binding: &PluginBinding{Name: PasstBinding}}
	SetDefaults(s)
	in := s.Domain.Devices.Interfaces[0]
	if in.Masquerade != nil || in.Bridge != nil || !in.IsPasst() || in.IsMasquerade() {
		t.Fatalf("defaults changed the passt interface: %+v", in)
	}
	if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
		t.Fatalf("passt refused: %v", errs)
	}
	if errs := NotRealised(s, field.NewPath("spec")); len(errs) != 0 {
		t.Fatalf("passt not realised: %v", errs)
	}
	errs := ValidateHotplugInterface(&in, field.NewPath("spec", "domain", "devices", "interfaces").Index(1))
	if len(errs) != 1 || errs[0].Field != "spec.domain.devices.interfaces[1].binding" {
		t.Fatalf("hotplug of a passt interface: %v, want one error at its binding", errs)
	}
}

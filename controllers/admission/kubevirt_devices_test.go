package admission_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/machine"
	"sigs.k8s.io/yaml"
)

// kvLun is KubeVirt's user guide example of a lun disk (Disks and Volumes: lun), with only the
// apiVersion changed.
const kvLun = `
metadata:
  name: testvmi-lun
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
spec:
  domain:
    resources:
      requests:
        memory: 64M
    devices:
      disks:
      - name: mypvcdisk
        # This makes it a lun device
        lun: {}
  volumes:
    - name: mypvcdisk
      persistentVolumeClaim:
        claimName: mypvc
`

// TestKubeVirtLun: KubeVirt's lun manifest is accepted through kube-apiserver with the webhooks
// installed and stored with the lun on the scsi bus; it translates to a passed-through LUN over a
// block-mode claim, and to a refusal naming the disk over a filesystem-mode one. Persistent
// reservations and luns on other buses or volumes are refused, naming the field.
func TestKubeVirtLun(t *testing.T) {
	startWebhook(t)
	createByKubectl(t, []byte(kvLun), "vmi", "testvmi-lun")
	var vmi v1alpha1.VirtualMachineInstance
	get(t, "vmi", "testvmi-lun", &vmi)
	if got, want := diskList(vmi.Spec.Domain.Devices.Disks), "mypvcdisk:lun:scsi"; got != want {
		t.Errorf("stored disks %q, want %q", got, want)
	}
	host := func(block bool) translate.Host {
		return translate.Host{Emulation: true, NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}},
			Pod: &translate.PodVolumes{Claims: map[string]translate.Claim{"mypvc": {CapacityBytes: 1 << 30, Block: block}}}}
	}
	m, err := translate.Machine(&vmi, host(true))
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Disks[0]; !d.LUN || d.Bus != machine.BusSCSI || d.Source.Claim == nil || d.Source.Claim.Device == "" {
		t.Errorf("the lun translates to %+v, want a LUN on scsi over the claim's device", d)
	}
	_, err = translate.Machine(&vmi, host(false))
	if err == nil || !strings.Contains(err.Error(), "spec.domain.devices.disks[0].lun") || !strings.Contains(err.Error(), "claim mypvc has volumeMode Filesystem") {
		t.Errorf("a lun over a filesystem-mode claim: %v, want a refusal naming the disk and the claim's mode", err)
	}

	for name, tc := range map[string]struct {
		mutate func(disk, vol map[string]any)
		want   string
	}{
		"persistent reservation": {func(disk, _ map[string]any) { disk["lun"] = map[string]any{"reservation": true} },
			"spec.domain.devices.disks[0].lun.reservation"},
		"a lun on virtio": {func(disk, _ map[string]any) { disk["lun"] = map[string]any{"bus": "virtio"} },
			"a lun is passed through on the scsi bus"},
		"a lun on a containerDisk": {func(_, vol map[string]any) {
			delete(vol, "persistentVolumeClaim")
			vol["containerDisk"] = map[string]any{"image": "quay.io/containerdisks/fedora:latest"}
		}, "spec.domain.devices.disks[0].lun"},
		"a lun that is a cdrom too": {func(disk, _ map[string]any) { disk["cdrom"] = map[string]any{} },
			"a disk is one of disk, cdrom or lun"},
	} {
		t.Run(name, func(t *testing.T) {
			var o map[string]any
			if err := yaml.Unmarshal([]byte(kvLun), &o); err != nil {
				t.Fatal(err)
			}
			spec := o["spec"].(map[string]any)
			disk := spec["domain"].(map[string]any)["devices"].(map[string]any)["disks"].([]any)[0].(map[string]any)
			vol := spec["volumes"].([]any)[0].(map[string]any)
			tc.mutate(disk, vol)
			if _, stderr, err := apply(t, o, "testvmi-lun-refused"); err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: %s; want a refusal with %q", err, stderr, tc.want)
			}
		})
	}
}

// TestKubeVirtTPM: KubeVirt's vTPM manifest (the user guide's "Trusted Platform Module" example,
// devices.tpm: {}) is accepted and translates to a TPM, and so is a persistent one (its state goes
// on the backend-storage claim, controllers/vmi TestBackendStorage); enabled: false leaves it out.
func TestKubeVirtTPM(t *testing.T) {
	startWebhook(t)
	vmi := func(tpm map[string]any) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["tpm"] = tpm
		return o
	}
	if _, stderr, err := apply(t, vmi(map[string]any{}), "vmi-tpm"); err != nil {
		t.Fatalf("tpm: {} refused: %v: %s", err, stderr)
	}
	if _, stderr, err := apply(t, vmi(map[string]any{"persistent": true}), "vmi-tpm-persistent"); err != nil {
		t.Errorf("a persistent TPM refused: %v: %s", err, stderr)
	}
	for _, tc := range []struct {
		tpm  *v1alpha1.TPMDevice
		want bool
	}{{&v1alpha1.TPMDevice{}, true}, {&v1alpha1.TPMDevice{Enabled: ptr.To(false)}, false}, {nil, false}} {
		spec := v1alpha1.VirtualMachineInstance{}
		spec.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}
		spec.Spec.Domain.Devices.TPM = tc.tpm
		m, err := translate.Machine(&spec, translate.Host{Emulation: true})
		if err != nil {
			t.Fatal(err)
		}
		if m.TPM != tc.want {
			t.Errorf("tpm %+v translates to TPM %v, want %v", tc.tpm, m.TPM, tc.want)
		}
	}
}

// TestKubeVirtPanicDevices: KubeVirt's panicDevices are accepted and stored with the model
// defaulted to isa (libvirt's x86 default), and translate to QEMU's ISA and PCI pvpanic; a model
// KubeVirt does not know, or one given twice, is refused naming the device.
func TestKubeVirtPanicDevices(t *testing.T) {
	startWebhook(t)
	vmi := func(devices ...any) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["panicDevices"] = devices
		return o
	}
	o := vmi(map[string]any{}, map[string]any{"model": "pvpanic"})
	o["metadata"].(map[string]any)["name"] = "vmi-panic"
	data, _ := yaml.Marshal(o)
	createByKubectl(t, data, "vmi", "vmi-panic")
	var stored v1alpha1.VirtualMachineInstance
	get(t, "vmi", "vmi-panic", &stored)
	var models []string
	for _, pd := range stored.Spec.Domain.Devices.PanicDevices {
		models = append(models, string(ptr.Deref(pd.Model, "")))
	}
	if got := strings.Join(models, ","); got != "isa,pvpanic" {
		t.Errorf("stored panic device models %q, want isa,pvpanic", got)
	}
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(m.Panic, ","); got != machine.PanicISA+","+machine.PanicPCI {
		t.Errorf("the panic devices translate to %q, want QEMU's ISA and PCI pvpanic", got)
	}

	for name, tc := range map[string]struct {
		devices []any
		want    string
	}{
		"s390's model":    {[]any{map[string]any{"model": "s390"}}, "spec.domain.devices.panicDevices[0].model"},
		"two isa devices": {[]any{map[string]any{"model": "isa"}, map[string]any{}}, "spec.domain.devices.panicDevices[1].model: Duplicate value"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := apply(t, vmi(tc.devices...), "vmi-panic-refused"); err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: %s; want a refusal with %q", err, stderr, tc.want)
			}
		})
	}
}

// TestKubeVirtDiskBlockSize: a disk's blockSize.custom and blockSize.matchVolume, as KubeVirt's
// user guide writes them, are accepted, stored and translated to the disk's sizes (matchVolume's
// to be read by the launcher); both at once, sizes QEMU does not take, a cdrom's block size and
// large logical blocks on sata are refused naming the field.
func TestKubeVirtDiskBlockSize(t *testing.T) {
	startWebhook(t)
	vmi := func(mutate func(disk map[string]any)) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["disks"] = []any{map[string]any{"name": "scratch"}}
		o["spec"].(map[string]any)["volumes"] = []any{map[string]any{"name": "scratch", "emptyDisk": map[string]any{"capacity": "64Mi"}}}
		mutate(o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["disks"].([]any)[0].(map[string]any))
		return o
	}
	custom := func(logical, physical int) map[string]any {
		return map[string]any{"custom": map[string]any{"logical": logical, "physical": physical}}
	}
	m := storedMachine(t, vmi(func(d map[string]any) { d["blockSize"] = custom(512, 4096) }), "vmi-blocksize")
	if bs := m.Disks[0].BlockSize; bs == nil || bs.Logical != 512 || bs.Physical != 4096 {
		t.Errorf("the disk translates with block size %+v, want 512/4096", bs)
	}

	m = storedMachine(t, vmi(func(d map[string]any) {
		d["blockSize"] = map[string]any{"matchVolume": map[string]any{"enabled": true}}
	}), "vmi-matchvolume")
	if d := m.Disks[0]; !d.MatchVolumeBlockSize || d.BlockSize != nil {
		t.Errorf("matchVolume translates to %+v, want a disk whose sizes the launcher reads from its volume", d)
	}

	for name, tc := range map[string]struct {
		mutate func(d map[string]any)
		want   string
	}{
		"matchVolume and custom": {func(d map[string]any) {
			d["blockSize"] = map[string]any{"matchVolume": map[string]any{}, "custom": map[string]any{"logical": 512, "physical": 512}}
		}, "give either custom or matchVolume"},
		"matchVolume on a cdrom": {func(d map[string]any) {
			d["cdrom"] = map[string]any{}
			d["blockSize"] = map[string]any{"matchVolume": map[string]any{}}
		}, "spec.domain.devices.disks[0].blockSize"},
		"physical not a power of two": {func(d map[string]any) { d["blockSize"] = custom(512, 3000) },
			"spec.domain.devices.disks[0].blockSize.custom.physical"},
		"logical above physical": {func(d map[string]any) { d["blockSize"] = custom(4096, 512) },
			"spec.domain.devices.disks[0].blockSize.custom.logical"},
		"a cdrom's block size": {func(d map[string]any) { d["cdrom"] = map[string]any{}; d["blockSize"] = custom(2048, 2048) },
			"spec.domain.devices.disks[0].blockSize"},
		"4 KiB logical blocks on sata": {func(d map[string]any) {
			d["disk"] = map[string]any{"bus": "sata"}
			d["blockSize"] = custom(4096, 4096)
		}, "spec.domain.devices.disks[0].blockSize.custom.logical"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := apply(t, vmi(tc.mutate), "vmi-bs-refused"); err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: %s; want a refusal with %q", err, stderr, tc.want)
			}
		})
	}
}

// TestKubeVirtVirtioTransitional: KubeVirt's useVirtioTransitional (its user guide's example for
// old guests) is accepted, stored, and translates to a machine with transitional virtio devices.
func TestKubeVirtVirtioTransitional(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["useVirtioTransitional"] = true
	m := storedMachine(t, o, "vmi-transitional")
	if !m.VirtioTransitional {
		t.Error("useVirtioTransitional: true translates to a machine without transitional virtio devices")
	}
}

// TestKubeVirtDownwardMetrics: KubeVirt's downwardMetrics device (its user guide's virtio-serial
// example) is refused, naming the field and the key, until the cluster enables it; then accepted
// and translated to the metrics port, with the node's name for the guest.
func TestKubeVirtDownwardMetrics(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["downwardMetrics"] = map[string]any{}
	if _, stderr, err := apply(t, o, "vmi-metrics-off"); err == nil || !strings.Contains(stderr, "spec.domain.devices.downwardMetrics") ||
		!strings.Contains(stderr, "enableDownwardMetrics") {
		t.Fatalf("with downward metrics not enabled: %v: %s; want a refusal naming spec.domain.devices.downwardMetrics and enableDownwardMetrics", err, stderr)
	}
	cfg := config.Default()
	cfg.EnableDownwardMetrics = true
	store.Set(cfg)
	t.Cleanup(func() { store.Set(config.Default()) })
	o["metadata"].(map[string]any)["name"] = "vmi-metrics"
	data, _ := yaml.Marshal(o)
	createByKubectl(t, data, "vmi", "vmi-metrics")
	var stored v1alpha1.VirtualMachineInstance
	get(t, "vmi", "vmi-metrics", &stored)
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NodeName: "node-a",
		NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m.DownwardMetrics == nil || m.DownwardMetrics.NodeName != "node-a" {
		t.Errorf("downwardMetrics translates to %+v, want the metrics port reporting node-a", m.DownwardMetrics)
	}
}

// TestKubeVirtRefusedDevices: KubeVirt's devices qvirt cannot give are refused through
// kube-apiserver naming the field and why, not as unknown fields: GPUs and host devices (the user
// guide's examples) and VSOCK.
func TestKubeVirtRefusedDevices(t *testing.T) {
	startWebhook(t)
	for name, tc := range map[string]struct {
		field string
		value any
		want  []string
	}{
		"gpus": {"gpus", []any{map[string]any{"name": "gpu1", "deviceName": "nvidia.com/TU104GL_Tesla_T4"}},
			[]string{"spec.domain.devices.gpus", "device plugin"}},
		"hostDevices": {"hostDevices", []any{map[string]any{"name": "quickaccess", "deviceName": "intel.com/qat"}},
			[]string{"spec.domain.devices.hostDevices", "device plugin"}},
		"autoattachVSOCK": {"autoattachVSOCK", true, []string{"spec.domain.devices.autoattachVSOCK", "CID space"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := sample(t, "vmi_testguest.yaml")
			o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)[tc.field] = tc.value
			wantRefused(t, o, "vmi-refused-device", tc.want...)
		})
	}
}

// TestKubeVirtClientPassthrough: KubeVirt's clientPassthrough, as its user guide writes it, is
// accepted, stored, and translates to a machine with USB redirection slots.
func TestKubeVirtClientPassthrough(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	o["spec"].(map[string]any)["domain"].(map[string]any)["devices"].(map[string]any)["clientPassthrough"] = map[string]any{}
	m := storedMachine(t, o, "vmi-usbredir")
	if m.USBRedirSlots != machine.MaxUSBRedirSlots {
		t.Errorf("clientPassthrough translates to %d USB redirection slots, want %d", m.USBRedirSlots, machine.MaxUSBRedirSlots)
	}
}

// storedMachine creates the instance o as name with kubectl, reads back what kube-apiserver stored
// and translates it as a node agent would (under emulation, its interface on tap0).
func storedMachine(t *testing.T, o map[string]any, name string) *machine.Machine {
	t.Helper()
	o["metadata"].(map[string]any)["name"] = name
	data, _ := yaml.Marshal(o)
	createByKubectl(t, data, "vmi", name)
	var stored v1alpha1.VirtualMachineInstance
	get(t, "vmi", name, &stored)
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKubeVirtDedicatedCPUs: KubeVirt's user guide example of dedicated CPUs with an isolated
// emulator thread (dedicatedCpuPlacement and isolateEmulatorThread, the vCPUs from
// resources.limits.cpu) is accepted, stored with its defaulted topology, and translates to a
// machine that pins two vCPUs and the emulator; the combinations KubeVirt refuses are refused
// naming the field.
func TestKubeVirtDedicatedCPUs(t *testing.T) {
	startWebhook(t)
	vmi := func(cpu map[string]any, resources map[string]any) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		d := o["spec"].(map[string]any)["domain"].(map[string]any)
		d["cpu"] = cpu
		if resources != nil {
			d["resources"] = resources
		}
		return o
	}
	m := storedMachine(t, vmi(map[string]any{"dedicatedCpuPlacement": true, "isolateEmulatorThread": true},
		map[string]any{"limits": map[string]any{"cpu": 2}}), "vmi-dedicated")
	if c := m.CPU; !c.DedicatedCPUs || !c.IsolateEmulatorThread || c.VCPUs != 2 {
		t.Errorf("the machine's CPU is %+v, want 2 dedicated vCPUs and an isolated emulator thread", c)
	}
	for name, tc := range map[string]struct {
		cpu       map[string]any
		resources map[string]any
		want      string
	}{
		"isolateEmulatorThread alone": {map[string]any{"isolateEmulatorThread": true}, nil, "spec.domain.cpu.isolateEmulatorThread"},
		"a fraction of a CPU": {map[string]any{"dedicatedCpuPlacement": true},
			map[string]any{"requests": map[string]any{"cpu": "1500m"}}, "spec.domain.resources.requests.cpu"},
		"sockets and another CPU limit": {map[string]any{"dedicatedCpuPlacement": true, "sockets": 2},
			map[string]any{"limits": map[string]any{"cpu": 4}}, "spec.domain.resources.limits.cpu"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := apply(t, vmi(tc.cpu, tc.resources), "vmi-dedicated-refused"); err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: %s; want a refusal naming %q", err, stderr, tc.want)
			}
		})
	}
}

// TestKubeVirtHugepages: KubeVirt's user guide example of huge pages (memory.hugepages.pageSize
// 2Mi) is accepted and translates to a machine whose RAM is of 2 MiB pages; a page size x86 has
// not, or a guest memory that is no whole number of pages, is refused naming the field.
func TestKubeVirtHugepages(t *testing.T) {
	startWebhook(t)
	vmi := func(memory map[string]any) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		o["spec"].(map[string]any)["domain"].(map[string]any)["memory"] = memory
		return o
	}
	m := storedMachine(t, vmi(map[string]any{"guest": "128Mi", "hugepages": map[string]any{"pageSize": "2Mi"}}), "vmi-hugepages")
	if m.HugePageKiB != 2048 || m.MemoryMiB != 128 {
		t.Errorf("the machine has %d MiB of %d KiB pages, want 128 MiB of 2048 KiB pages", m.MemoryMiB, m.HugePageKiB)
	}
	for name, memory := range map[string]map[string]any{
		"4Mi pages":              {"guest": "128Mi", "hugepages": map[string]any{"pageSize": "4Mi"}},
		"no whole number of 1Gi": {"guest": "1536Mi", "hugepages": map[string]any{"pageSize": "1Gi"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := apply(t, vmi(memory), "vmi-hugepages-refused"); err == nil || !strings.Contains(stderr, "spec.domain.memory.hugepages.pageSize") {
				t.Errorf("%v: %s; want a refusal naming spec.domain.memory.hugepages.pageSize", err, stderr)
			}
		})
	}
}

// TestKubeVirtMemoryHotplug: KubeVirt's memory hotplug (memory.guest 1Gi, maxGuest 2Gi) is
// accepted through kubectl and translates to a machine with room up to 2 GiB; kubectl patch may
// then raise the running instance's memory.guest within maxGuest, and is refused, naming
// spec.domain.memory.guest, going past it or down.
func TestKubeVirtMemoryHotplug(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	o["spec"].(map[string]any)["domain"].(map[string]any)["memory"] = map[string]any{"guest": "1Gi", "maxGuest": "2Gi"}
	m := storedMachine(t, o, "vmi-memhp")
	if m.MemoryMiB != 1024 || m.MaxMemoryMiB != 2048 || m.MemoryHotplugRoomMiB() != 1024 {
		t.Errorf("the machine has %d MiB up to %d MiB, want 1024 up to 2048", m.MemoryMiB, m.MaxMemoryMiB)
	}
	patch := func(guest string) string { return `{"spec":{"domain":{"memory":{"guest":"` + guest + `"}}}}` }
	if _, stderr, err := kubectlDefault(nil, "patch", "vmi", "vmi-memhp", "--type=merge", "-p", patch("1536Mi")); err != nil {
		t.Fatalf("raise memory.guest to 1536Mi: %v: %s", err, stderr)
	}
	for guest, want := range map[string]string{"3Gi": "must be at most maxGuest", "1Gi": "memory cannot be unplugged"} {
		if _, stderr, err := kubectlDefault(nil, "patch", "--dry-run=server", "vmi", "vmi-memhp", "--type=merge", "-p", patch(guest)); err == nil ||
			!strings.Contains(stderr, "spec.domain.memory.guest") || !strings.Contains(stderr, want) {
			t.Errorf("memory.guest %s: %v: %s; want a refusal naming spec.domain.memory.guest: %s", guest, err, stderr, want)
		}
	}
}

// TestKubeVirtRealtime: KubeVirt's real-time guest as its user guide writes it (dedicated CPUs, an
// isolated emulator thread, the guest NUMA mapping, huge pages, realtime with a mask) is accepted
// through kubectl and becomes a machine with vCPU 0 real-time on one guest NUMA node; a mask naming
// a vCPU the guest lacks, and the NUMA mapping without huge pages, are refused naming the field.
func TestKubeVirtRealtime(t *testing.T) {
	startWebhook(t)
	vmi := func(mask string, hugepages bool) map[string]any {
		o := sample(t, "vmi_testguest.yaml")
		d := o["spec"].(map[string]any)["domain"].(map[string]any)
		d["cpu"] = map[string]any{"cores": 2, "dedicatedCpuPlacement": true, "isolateEmulatorThread": true,
			"numa": map[string]any{"guestMappingPassthrough": map[string]any{}}, "realtime": map[string]any{"mask": mask}}
		if hugepages {
			d["memory"] = map[string]any{"guest": "128Mi", "hugepages": map[string]any{"pageSize": "2Mi"}}
		}
		return o
	}
	m := storedMachine(t, vmi("0-1,^1", true), "vmi-realtime")
	if !m.CPU.NUMAPassthrough || !slices.Equal(m.CPU.RealtimeVCPUs, []uint32{0}) || !m.CPU.DedicatedCPUs || m.HugePageKiB != 2048 {
		t.Errorf("the machine's CPU %+v, huge pages %d KiB; want vCPU 0 real-time on the NUMA mapping, dedicated CPUs, 2 MiB pages", m.CPU, m.HugePageKiB)
	}
	wantRefused(t, vmi("0-2", true), "vmi-realtime-refused", "spec.domain.cpu.realtime.mask", "names a vCPU the guest does not have")
	wantRefused(t, vmi("0", false), "vmi-realtime-refused", "spec.domain.memory.hugepages",
		"must be requested when NUMA topology strategy is set in spec.domain.cpu.numa.guestMappingPassthrough")
}

// TestKubeVirtRefusedCPUAndMemory: real-time vCPUs without the guest NUMA mapping, CPU hotplug
// with dedicated CPUs and memory hotplug of a guest below KubeVirt's 1Gi are refused through
// kube-apiserver naming the field and why, as KubeVirt refuses them.
func TestKubeVirtRefusedCPUAndMemory(t *testing.T) {
	startWebhook(t)
	for name, tc := range map[string]struct {
		section, field string
		value          any
		want           []string
	}{
		"realtime without the NUMA mapping": {"cpu", "realtime", map[string]any{"mask": "0"}, []string{"spec.domain.cpu.numa.guestMappingPassthrough", "must be defined when spec.domain.cpu.realtime is used"}},
		"maxSockets with dedicated CPUs":    {"cpu", "maxSockets", 4, []string{"spec.domain.cpu.maxSockets", "dedicatedCpuPlacement"}},
		"maxGuest with less than 1Gi":       {"memory", "maxGuest", "1Gi", []string{"spec.domain.memory.guest", "must be at least 1Gi with memory.maxGuest"}},
	} {
		t.Run(name, func(t *testing.T) {
			o := sample(t, "vmi_testguest.yaml")
			d := o["spec"].(map[string]any)["domain"].(map[string]any)
			sec, _ := d[tc.section].(map[string]any)
			if sec == nil {
				sec = map[string]any{}
				d[tc.section] = sec
			}
			sec[tc.field] = tc.value
			if tc.field == "maxSockets" || tc.field == "realtime" {
				sec["dedicatedCpuPlacement"] = true
			}
			wantRefused(t, o, "vmi-refused-cpu", tc.want...)
		})
	}
}

// wantRefused applies o as name and wants it refused with every one of want in the refusal.
func wantRefused(t *testing.T, o map[string]any, name string, want ...string) {
	t.Helper()
	_, stderr, err := apply(t, o, name)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("refusal does not say %q: %s", w, stderr)
		}
	}
}

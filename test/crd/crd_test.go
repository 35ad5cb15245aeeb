// Package crd tests the generated CRDs inside a real kube-apiserver: they install, the samples are
// accepted, and invalid manifests are refused with messages naming the offending field, exactly as a
// user running kubectl sees them.
package crd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

func kubectl(t *testing.T, stdin []byte, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cp.KubectlCmd(ctx, stdin, args...)
}

func TestCRDsInstalled(t *testing.T) {
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := cp.Client.List(context.Background(), &crds); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"virtualmachines.qvirt.io": false, "virtualmachineinstances.qvirt.io": false,
		"virtualmachineinstancemigrations.qvirt.io": false,
		"virtualmachineinstancetypes.qvirt.io":      false, "virtualmachineclusterinstancetypes.qvirt.io": false,
		"virtualmachinepreferences.qvirt.io": false, "virtualmachineclusterpreferences.qvirt.io": false,
	}
	for _, c := range crds.Items {
		if _, ok := want[c.Name]; ok {
			want[c.Name] = true
			for _, v := range c.Spec.Versions {
				if v.Schema.OpenAPIV3Schema.XPreserveUnknownFields != nil && *v.Schema.OpenAPIV3Schema.XPreserveUnknownFields {
					t.Errorf("%s preserves unknown fields; unsupported KubeVirt fields would be dropped silently", c.Name)
				}
			}
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("CRD %s not installed", name)
		}
	}
	out, stderr, err := kubectl(t, nil, "get", "crd")
	if err != nil {
		t.Fatalf("kubectl get crd: %v: %s", err, stderr)
	}
	for name := range want {
		if !strings.Contains(out, name) {
			t.Errorf("kubectl get crd does not list %s:\n%s", name, out)
		}
	}
}

func TestExplain(t *testing.T) {
	cases := map[string][]string{
		"vmi.spec.domain.devices.disks":                           {"bootOrder", "cdrom", "attaches the volume of the same name"},
		"vm.spec.template.spec.domain.devices.disks.disk.bus":     {"Bus is virtio (the default), sata or scsi"},
		"vm.spec.runStrategy":                                     {"RerunOnFailure", "Halted"},
		"vm.spec.instancetype.inferFromVolume":                    {"instancetype.kubevirt.io/default-instancetype"},
		"vmcf.spec.cpu.guest":                                     {"number of vCPUs"},
		"vmim.spec.vmiName":                                       {"VirtualMachineInstance to migrate"},
		"vmi.spec.domain.devices.interfaces.macAddress":           {"stable across restarts"},
		"virtualmachineinstance.status.phaseTransitionTimestamps": {"when each phase was entered"},
	}
	for path, wants := range cases {
		out, stderr, err := explain(t, path)
		if err != nil {
			t.Errorf("kubectl explain %s: %v: %s", path, err, stderr)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("kubectl explain %s lacks %q:\n%s", path, w, out)
			}
		}
	}
}

// explain runs kubectl explain, retrying for a while: the API server publishes a new CRD's OpenAPI
// schema a moment after the CRD is established, later still on a loaded machine.
func explain(t *testing.T, path string) (out, stderr string, err error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, stderr, err = kubectl(t, nil, "explain", path)
		if err == nil || time.Now().After(deadline) {
			return out, stderr, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func sampleFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(envtest.RepoRoot(), "config", "samples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("samples under config/samples: %v (found %d)", err, len(files))
	}
	var out []string
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			out = append(out, f)
		}
	}
	return out
}

func TestSamplesAccepted(t *testing.T) {
	for _, f := range sampleFiles(t) {
		out, stderr, err := kubectl(t, nil, "apply", "--dry-run=server", "-n", "default", "-f", f)
		if err != nil {
			t.Errorf("%s refused: %v: %s", filepath.Base(f), err, stderr)
			continue
		}
		if !strings.Contains(out, "(server dry run)") {
			t.Errorf("%s: unexpected kubectl output %q", filepath.Base(f), out)
		}
	}
}

// TestVolumeWithoutDiskInTemplateAccepted: a VM template may leave a volume without a disk, a
// cdrom may say readonly: false, and rng, inputs, watchdog and features.apic may leave their
// fields to the defaults, as in KubeVirt: the schema accepts them (the instance gets a disk when
// admission creates it, controllers/admission's TestDefaultsRecorded).
func TestVolumeWithoutDiskInTemplateAccepted(t *testing.T) {
	o := load(t, "vm_testguest.yaml")
	o.appendTo(t, "spec.template.spec.volumes", map[string]any{"name": "extra", "emptyDisk": map[string]any{"capacity": "1Gi"}})
	o.appendTo(t, "spec.template.spec.volumes", map[string]any{"name": "iso", "emptyDisk": map[string]any{"capacity": "1Mi"}})
	o.appendTo(t, "spec.template.spec.domain.devices.disks", map[string]any{"name": "iso", "cdrom": map[string]any{"readonly": false}})
	// KubeVirt's devices with what they leave to the defaults left out.
	o.set(t, "spec.template.spec.domain.devices.rng", map[string]any{})
	o.set(t, "spec.template.spec.domain.devices.inputs", []any{map[string]any{"name": "tablet"}, map[string]any{"name": "vtablet", "bus": "virtio", "type": "tablet"}})
	o.set(t, "spec.template.spec.domain.devices.watchdog", map[string]any{"name": "wd", "i6300esb": map[string]any{"action": "poweroff"}})
	o.set(t, "spec.template.spec.domain.features", map[string]any{"apic": map[string]any{"endOfInterrupt": true}})
	manifest, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-"); err != nil {
		t.Fatalf("refused: %v: %s", err, stderr)
	}
}

// TestFilesystemVolumeWithoutDiskAccepted: an instance's volume shared by a filesystem needs no
// disk (the schema's volume rule counts filesystems, as KubeVirt's defaulting does); a filesystem
// without its type is refused by the schema, as KubeVirt's is.
func TestFilesystemVolumeWithoutDiskAccepted(t *testing.T) {
	o := load(t, "vmi_testguest.yaml")
	o.appendTo(t, "spec.volumes", map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "shared"}})
	o.set(t, "spec.domain.devices.filesystems", []any{map[string]any{"name": "data", "virtiofs": map[string]any{}}})
	manifest, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-"); err != nil {
		t.Fatalf("refused: %v: %s", err, stderr)
	}
	o.set(t, "spec.domain.devices.filesystems", []any{map[string]any{"name": "data"}})
	manifest, _ = json.Marshal(o)
	_, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-")
	if err == nil || !strings.Contains(stderr, "spec.domain.devices.filesystems[0].virtiofs: Required value") {
		t.Fatalf("a filesystem without virtiofs: %v %s, want it refused at spec.domain.devices.filesystems[0].virtiofs", err, stderr)
	}
}

// TestFirmwareAccepted: the bootloaders and SMM in KubeVirt's shape pass the schema and its rules.
func TestFirmwareAccepted(t *testing.T) {
	for name, firmware := range map[string]struct{ bootloader, features map[string]any }{
		"bios on serial":                   {map[string]any{"bios": map[string]any{"useSerial": true}}, nil},
		"efi without secure boot":          {map[string]any{"efi": map[string]any{"secureBoot": false, "persistent": false}}, nil},
		"efi, secure boot by default":      {map[string]any{"efi": map[string]any{}}, map[string]any{"smm": map[string]any{}}},
		"efi, secure boot and smm enabled": {map[string]any{"efi": map[string]any{"secureBoot": true}}, map[string]any{"smm": map[string]any{"enabled": true}}},
	} {
		t.Run(name, func(t *testing.T) {
			o := load(t, "vm_testguest.yaml")
			o.set(t, "spec.template.spec.domain.firmware.bootloader", firmware.bootloader)
			if firmware.features != nil {
				o.set(t, "spec.template.spec.domain.features", firmware.features)
			}
			manifest, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			if _, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-"); err != nil {
				t.Fatalf("refused: %v: %s", err, stderr)
			}
		})
	}
}

// TestWindowsPlatformAccepted: KubeVirt's Windows platform (its vmi-windows example and common
// templates: Hyper-V enlightenments, KVM features, a clock in a time zone with its timers) passes
// the CRD's schema as written.
func TestWindowsPlatformAccepted(t *testing.T) {
	o := load(t, "vm_testguest.yaml")
	var features, clock map[string]any
	if err := yaml.Unmarshal([]byte(`
acpi: {}
apic: {}
smm: {}
kvm: {hidden: true}
pvspinlock: {enabled: false}
hyperv:
  relaxed: {}
  vapic: {}
  spinlocks: {spinlocks: 8191}
  vpindex: {}
  runtime: {}
  synic: {}
  synictimer: {direct: {}}
  reset: {}
  vendorid: {vendorid: KVM Hv}
  frequencies: {}
  reenlightenment: {}
  tlbflush: {direct: {}, extended: {}}
  ipi: {}
  evmcs: {}
`), &features); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(`
timezone: Europe/Berlin
timer:
  hpet: {present: false}
  pit: {tickPolicy: delay}
  rtc: {tickPolicy: catchup, track: guest}
  hyperv: {}
  kvm: {present: true}
`), &clock); err != nil {
		t.Fatal(err)
	}
	o.set(t, "spec.template.spec.domain.features", features)
	o.set(t, "spec.template.spec.domain.clock", clock)
	manifest, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-"); err != nil {
		t.Fatalf("refused: %v: %s", err, stderr)
	}
}

// obj is a manifest as a user writes it, edited by path in the cases below.
type obj map[string]any

func load(t *testing.T, sample string) obj {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "samples", sample))
	if err != nil {
		t.Fatal(err)
	}
	var o obj
	if err := yaml.Unmarshal(data, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// at walks a dotted path ("spec.domain.devices.disks.0") and returns the map or list element there.
func (o obj) at(t *testing.T, path string) any {
	t.Helper()
	var cur any = map[string]any(o)
	for _, key := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[key]
		case []any:
			i := int(key[0] - '0')
			cur = c[i]
		default:
			t.Fatalf("path %s: %q is not a map or list", path, key)
		}
	}
	return cur
}

func (o obj) set(t *testing.T, path string, v any) {
	t.Helper()
	i := strings.LastIndex(path, ".")
	key := path[i+1:]
	switch parent := o.at(t, path[:i]).(type) {
	case map[string]any:
		if v == nil {
			delete(parent, key)
			return
		}
		parent[key] = v
	case []any:
		parent[int(key[0]-'0')] = v
	default:
		t.Fatalf("path %s has no parent map or list", path)
	}
}

func (o obj) appendTo(t *testing.T, path string, v any) {
	t.Helper()
	list, _ := o.at(t, path).([]any)
	o.set(t, path, append(list, v))
}

func TestInvalidManifestsRejected(t *testing.T) {
	const (
		vm  = "vm_testguest.yaml"
		vmi = "vmi_testguest.yaml"
	)
	d := "spec.domain.devices"
	td := "spec.template.spec.domain.devices"
	cases := []struct {
		name, sample string
		mutate       func(t *testing.T, o obj)
		// field and message must both appear in kubectl's error.
		field, message string
	}{
		{"disk without volume", vmi, func(t *testing.T, o obj) {
			o.set(t, d+".disks", []any{map[string]any{"name": "orphan", "disk": map[string]any{}}})
		}, "spec.domain.devices.disks", "must name a volume"},
		// Admission gives a volume without a disk one (KubeVirt's default), so that only an
		// instance's spec must have it: here, without the webhooks, a VMI's volume without a disk is
		// refused; a VM template's is accepted (TestVolumeWithoutDiskInTemplateAccepted).
		{"volume without disk", vmi, func(t *testing.T, o obj) {
			o.appendTo(t, "spec.volumes", map[string]any{"name": "extra", "emptyDisk": map[string]any{"capacity": "1Gi"}})
		}, "spec.volumes", "every volume must be attached by a disk"},
		{"duplicate disk names", vm, func(t *testing.T, o obj) {
			o.appendTo(t, td+".disks", map[string]any{"name": "scratch"})
		}, "spec.template.spec.domain.devices.disks[1]", "Duplicate value"},
		{"duplicate volume names", vm, func(t *testing.T, o obj) {
			o.appendTo(t, "spec.template.spec.volumes", map[string]any{"name": "scratch", "emptyDisk": map[string]any{"capacity": "1Gi"}})
		}, "spec.template.spec.volumes[1]", "Duplicate value"},
		{"duplicate interface names", vmi, func(t *testing.T, o obj) {
			o.appendTo(t, d+".interfaces", map[string]any{"name": "default", "bridge": map[string]any{}})
		}, "spec.domain.devices.interfaces[1]", "Duplicate value"},
		{"interface without network", vmi, func(t *testing.T, o obj) {
			o.set(t, "spec.networks", []any{map[string]any{"name": "other", "pod": map[string]any{}}})
		}, "spec.domain.devices.interfaces", "must name a network"},
		{"network without interface", vm, func(t *testing.T, o obj) {
			o.appendTo(t, "spec.template.spec.networks", map[string]any{"name": "second", "multus": map[string]any{"networkName": "net1"}})
		}, "spec.template.spec.networks", "needs exactly one interface"},
		{"bad memory quantity", vmi, func(t *testing.T, o obj) { o.set(t, "spec.domain.memory.guest", "12XB") }, "spec.domain.memory.guest", "quantities must match"},
		{"zero memory", vmi, func(t *testing.T, o obj) { o.set(t, "spec.domain.memory.guest", "0") }, "spec.domain.memory.guest", "positive"},
		{"negative memory", vm, func(t *testing.T, o obj) { o.set(t, "spec.template.spec.domain.memory.guest", "-256Mi") }, "spec.template.spec.domain.memory.guest", "positive"},
		{"runStrategy typo", vm, func(t *testing.T, o obj) { o.set(t, "spec.runStrategy", "Allways") }, "spec.runStrategy", `Unsupported value: "Allways"`},
		{"running and runStrategy", vm, func(t *testing.T, o obj) { o.set(t, "spec.running", true) }, "spec", "set either running (deprecated) or runStrategy"},
		{"input on a PS/2 bus", vm, func(t *testing.T, o obj) {
			o.set(t, td+".inputs", []any{map[string]any{"name": "kbd", "bus": "ps2"}})
		}, "spec.template.spec.domain.devices.inputs[0].bus", `Unsupported value: "ps2"`},
		{"watchdog action KubeVirt has not", vmi, func(t *testing.T, o obj) {
			o.set(t, d+".watchdog", map[string]any{"name": "wd", "i6300esb": map[string]any{"action": "pause"}})
		}, "spec.domain.devices.watchdog.i6300esb.action", `Unsupported value: "pause"`},
		{"KubeVirt-only field launchSecurity", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.launchSecurity", map[string]any{"sev": map[string]any{}})
		}, "spec.template.spec.domain.launchSecurity", "unknown field"},
		{"KubeVirt-only field dataVolumeTemplates[].status", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.dataVolumeTemplates", []any{map[string]any{"metadata": map[string]any{"name": "dv"}, "status": map[string]any{}}})
		}, "spec.dataVolumeTemplates[0].status", "unknown field"},
		{"unknown bus", vm, func(t *testing.T, o obj) { o.set(t, td+".disks.0.disk.bus", "ide") }, "spec.template.spec.domain.devices.disks[0].disk.bus", `Unsupported value: "ide"`},
		{"cdrom on virtio", vm, func(t *testing.T, o obj) {
			o.set(t, td+".disks.0", map[string]any{"name": "scratch", "cdrom": map[string]any{"bus": "virtio"}})
		}, "spec.template.spec.domain.devices.disks[0].cdrom.bus", "cannot use the virtio bus"},
		{"disk and cdrom", vm, func(t *testing.T, o obj) { o.set(t, td+".disks.0.cdrom", map[string]any{}) }, "spec.template.spec.domain.devices.disks[0]", "one of disk, cdrom or lun"},
		{"disk and lun", vm, func(t *testing.T, o obj) { o.set(t, td+".disks.0.lun", map[string]any{}) }, "spec.template.spec.domain.devices.disks[0]", "one of disk, cdrom or lun"},
		{"lun on sata", vm, func(t *testing.T, o obj) {
			o.set(t, td+".disks.0", map[string]any{"name": "root", "lun": map[string]any{"bus": "sata"}})
		}, "spec.template.spec.domain.devices.disks[0].lun.bus", "a lun is passed through on the scsi bus"},
		{"bad MAC", vmi, func(t *testing.T, o obj) { o.set(t, d+".interfaces.0.macAddress", "02:00:00:00:00") }, "spec.domain.devices.interfaces[0].macAddress", "should match"},
		{"two bindings", vm, func(t *testing.T, o obj) { o.set(t, td+".interfaces.0.bridge", map[string]any{}) }, "spec.template.spec.domain.devices.interfaces[0]", "masquerade, bridge or binding, not two"},
		{"a binding plugin beside masquerade", vm, func(t *testing.T, o obj) {
			o.set(t, td+".interfaces.0.binding", map[string]any{"name": "passt"})
		}, "spec.template.spec.domain.devices.interfaces[0]", "masquerade, bridge or binding, not two"},
		{"unknown NIC model", vm, func(t *testing.T, o obj) { o.set(t, td+".interfaces.0.model", "ne2k_pci") }, "spec.template.spec.domain.devices.interfaces[0].model", "Unsupported value"},
		{"port out of range", vm, func(t *testing.T, o obj) { o.set(t, td+".interfaces.0.ports.0.port", 70000) }, "spec.template.spec.domain.devices.interfaces[0].ports[0].port", "less than or equal to 65535"},
		{"zero cores", vm, func(t *testing.T, o obj) { o.set(t, "spec.template.spec.domain.cpu.cores", 0) }, "spec.template.spec.domain.cpu.cores", "greater than or equal to 1"},
		{"zero bootOrder", vm, func(t *testing.T, o obj) { o.set(t, td+".disks.0.bootOrder", 0) }, "spec.template.spec.domain.devices.disks[0].bootOrder", "greater than or equal to 1"},
		{"volume with two sources", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.volumes.0.containerDisk", map[string]any{"image": "x:1"})
		}, "spec.template.spec.volumes[0]", "exactly one source"},
		{"network with pod and multus", vmi, func(t *testing.T, o obj) {
			o.set(t, "spec.networks.0.multus", map[string]any{"networkName": "net1"})
		}, "spec.networks[0]", "exactly one of pod and multus"},
		{"hostDisk DiskOrCreate without capacity", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.volumes.0", map[string]any{"name": "scratch", "hostDisk": map[string]any{"path": "/var/lib/qvirt/d.img", "type": "DiskOrCreate"}})
		}, "spec.template.spec.volumes[0].hostDisk.capacity", "capacity is required"},
		{"hostDisk relative path", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.volumes.0", map[string]any{"name": "scratch", "hostDisk": map[string]any{"path": "d.img", "type": "Disk"}})
		}, "spec.template.spec.volumes[0].hostDisk.path", "should match"},
		{"hostname not a DNS label", vm, func(t *testing.T, o obj) { o.set(t, "spec.template.spec.hostname", "My_Host") }, "spec.template.spec.hostname", "should match"},
		{"evictionStrategy typo", vm, func(t *testing.T, o obj) { o.set(t, "spec.template.spec.evictionStrategy", "Migrate") }, "spec.template.spec.evictionStrategy", "Unsupported value"},
		{"kernelBoot without paths", vmi, func(t *testing.T, o obj) {
			o.set(t, "spec.domain.firmware.kernelBoot.container", map[string]any{"image": "k:1"})
		}, "spec.domain.firmware.kernelBoot.container", "at least one of kernelPath and initrdPath"},
		{"emptyDisk without capacity", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.volumes.0.emptyDisk", map[string]any{})
		}, "spec.template.spec.volumes[0].emptyDisk.capacity", "Required value"},
		{"migration without vmiName", "vmim_testvm.yaml", func(t *testing.T, o obj) { o.set(t, "spec.vmiName", nil) }, "spec.vmiName", "Required value"},
		{"bios and efi", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.firmware.bootloader", map[string]any{"bios": map[string]any{}, "efi": map[string]any{"secureBoot": false}})
		}, "spec.template.spec.domain.firmware.bootloader", "bios and efi are mutually exclusive"},
		{"efi secure boot (by default) without smm", vmi, func(t *testing.T, o obj) {
			o.set(t, "spec.domain.firmware.bootloader", map[string]any{"efi": map[string]any{}})
		}, "spec.domain.features.smm", "EFI secure boot"},
		{"efi secure boot with smm off", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.firmware.bootloader", map[string]any{"efi": map[string]any{"secureBoot": true}})
			o.set(t, "spec.template.spec.domain.features", map[string]any{"smm": map[string]any{"enabled": false}})
		}, "spec.template.spec.domain.features.smm", "needs SMM"},
		{"too few Hyper-V spinlock retries", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.features", map[string]any{"hyperv": map[string]any{"spinlocks": map[string]any{"spinlocks": 100}}})
		}, "spec.template.spec.domain.features.hyperv.spinlocks.spinlocks", "4096"},
		{"Hyper-V vendor id over 12 characters", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.features", map[string]any{"hyperv": map[string]any{"vendorid": map[string]any{"vendorid": "thirteen-char"}}})
		}, "spec.template.spec.domain.features.hyperv.vendorid.vendorid", "12"},
		{"clock at utc and in a time zone", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.clock", map[string]any{"utc": map[string]any{}, "timezone": "Europe/Berlin"})
		}, "spec.template.spec.domain.clock", "mutually exclusive"},
		{"PIT merging ticks", vm, func(t *testing.T, o obj) {
			o.set(t, "spec.template.spec.domain.clock", map[string]any{"timer": map[string]any{"pit": map[string]any{"tickPolicy": "merge"}}})
		}, "spec.template.spec.domain.clock.timer.pit.tickPolicy", "merge"},
	}
	if len(cases) < 20 {
		t.Fatalf("the issue asks for at least 20 invalid manifests, have %d", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := load(t, tc.sample)
			tc.mutate(t, o)
			manifest, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			out, stderr, err := kubectl(t, manifest, "create", "--dry-run=server", "-n", "default", "-f", "-")
			if err == nil {
				t.Fatalf("accepted, want refusal at %s; kubectl said %q", tc.field, out)
			}
			if !strings.Contains(stderr, tc.field) || !strings.Contains(stderr, tc.message) {
				t.Fatalf("want refusal naming %s with %q, got:\n%s", tc.field, tc.message, stderr)
			}
		})
	}
}

// TestVMISpecImmutableButDisks checks the CRD's own rules (no webhook here): every spec field but
// the disks, volumes, interfaces and networks is frozen once the instance exists, with a message
// naming the field; adding and removing a disk with its volume, or an interface with its network,
// is accepted, and an attached interface or its network cannot change (the webhook adds the
// per-disk and per-NIC rules).
func TestVMISpecImmutableButDisks(t *testing.T) {
	o := load(t, "vmi_testguest.yaml")
	o.set(t, "metadata.name", "immutable")
	manifest, _ := json.Marshal(o)
	if _, stderr, err := kubectl(t, manifest, "create", "-n", "default", "-f", "-"); err != nil {
		t.Fatalf("create: %v: %s", err, stderr)
	}
	t.Cleanup(func() { _, _, _ = kubectl(t, nil, "delete", "-n", "default", "vmi", "immutable", "--wait=false") })

	refused := []struct {
		name, patchType, patch, field string
	}{
		{"memory", "merge", `{"spec":{"domain":{"memory":{"guest":"512Mi"}}}}`, "spec.domain.memory"},
		{"cpu added", "merge", `{"spec":{"domain":{"cpu":{"cores":2}}}}`, "spec.domain.cpu"},
		{"kernel args", "merge", `{"spec":{"domain":{"firmware":{"kernelBoot":{"kernelArgs":"quiet"}}}}}`, "spec.domain.firmware"},
		{"graphics device removed", "merge", `{"spec":{"domain":{"devices":{"autoattachGraphicsDevice":null}}}}`, "spec.domain.devices.autoattachGraphicsDevice"},
		{"node selector added", "merge", `{"spec":{"nodeSelector":{"disk":"ssd"}}}`, "spec.nodeSelector"},
		{"hostname added", "merge", `{"spec":{"hostname":"other"}}`, "spec.hostname"},
		{"grace period added", "merge", `{"spec":{"terminationGracePeriodSeconds":5}}`, "spec.terminationGracePeriodSeconds"},
		{"tolerations added", "merge", `{"spec":{"tolerations":[{"operator":"Exists"}]}}`, "spec.tolerations"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, stderr, err := kubectl(t, nil, "patch", "--dry-run=server", "-n", "default", "vmi", "immutable", "--type="+tc.patchType, "-p", tc.patch)
			want := tc.field + " is immutable; only volumes, disks, interfaces and networks can be hot-plugged"
			if err == nil || !strings.Contains(stderr, tc.field+": Invalid value") || !strings.Contains(stderr, want) {
				t.Fatalf("want a refusal naming %s with %q, got %v: %s", tc.field, want, err, stderr)
			}
		})
	}

	t.Run("a disk and its volume can be added and removed", func(t *testing.T) {
		add := `[{"op":"add","path":"/spec/domain/devices/disks","value":[{"name":"data","disk":{"bus":"virtio"},"serial":"DATA1"}]},` +
			`{"op":"add","path":"/spec/volumes","value":[{"name":"data","emptyDisk":{"capacity":"64Mi"}}]}]`
		if _, stderr, err := kubectl(t, nil, "patch", "-n", "default", "vmi", "immutable", "--type=json", "-p", add); err != nil {
			t.Fatalf("adding a disk refused: %v: %s", err, stderr)
		}
		out, stderr, err := kubectl(t, nil, "get", "-n", "default", "vmi", "immutable", "-o", "jsonpath={.spec.volumes[0].name}/{.spec.domain.devices.disks[0].serial}")
		if err != nil || out != "data/DATA1" {
			t.Fatalf("after adding: %q %v %s", out, err, stderr)
		}
		// A disk alone (without its volume) is still refused by the pairing rule.
		_, stderr, err = kubectl(t, nil, "patch", "--dry-run=server", "-n", "default", "vmi", "immutable", "--type=json",
			"-p", `[{"op":"add","path":"/spec/domain/devices/disks/-","value":{"name":"orphan"}}]`)
		if err == nil || !strings.Contains(stderr, "must name a volume") {
			t.Fatalf("a disk without a volume: want a refusal, got %v: %s", err, stderr)
		}
		remove := `[{"op":"remove","path":"/spec/domain/devices/disks"},{"op":"remove","path":"/spec/volumes"}]`
		if _, stderr, err := kubectl(t, nil, "patch", "-n", "default", "vmi", "immutable", "--type=json", "-p", remove); err != nil {
			t.Fatalf("removing the disk refused: %v: %s", err, stderr)
		}
	})

	t.Run("an attached interface and its network cannot change", func(t *testing.T) {
		for _, tc := range []struct{ patch, field, msg string }{
			{`[{"op":"replace","path":"/spec/domain/devices/interfaces/0/macAddress","value":"02:00:00:00:00:02"}]`,
				"spec.domain.devices.interfaces", "an attached interface cannot change"},
			{`[{"op":"add","path":"/spec/domain/devices/interfaces/0/ports","value":[{"port":22}]}]`,
				"spec.domain.devices.interfaces", "an attached interface cannot change"},
			{`[{"op":"add","path":"/spec/networks/0/pod/vmNetworkCIDR","value":"10.1.0.0/24"}]`,
				"spec.networks", "the network of an attached interface cannot change"},
		} {
			_, stderr, err := kubectl(t, nil, "patch", "--dry-run=server", "-n", "default", "vmi", "immutable", "--type=json", "-p", tc.patch)
			if err == nil || !strings.Contains(stderr, tc.field+": Invalid value") || !strings.Contains(stderr, tc.msg) {
				t.Errorf("%s: want a refusal naming %s with %q, got %v: %s", tc.patch, tc.field, tc.msg, err, stderr)
			}
		}
	})

	t.Run("an interface and its network can be added and removed", func(t *testing.T) {
		add := `[{"op":"add","path":"/spec/domain/devices/interfaces/-","value":{"name":"hot","masquerade":{},"macAddress":"02:00:00:00:00:03"}},` +
			`{"op":"add","path":"/spec/networks/-","value":{"name":"hot","pod":{}}}]`
		if _, stderr, err := kubectl(t, nil, "patch", "-n", "default", "vmi", "immutable", "--type=json", "-p", add); err != nil {
			t.Fatalf("adding an interface refused: %v: %s", err, stderr)
		}
		out, stderr, err := kubectl(t, nil, "get", "-n", "default", "vmi", "immutable", "-o",
			"jsonpath={.spec.domain.devices.interfaces[1].macAddress}/{.spec.networks[1].name}")
		if err != nil || out != "02:00:00:00:00:03/hot" {
			t.Fatalf("after adding: %q %v %s", out, err, stderr)
		}
		// An interface alone (without its network) is still refused by the pairing rule.
		_, stderr, err = kubectl(t, nil, "patch", "--dry-run=server", "-n", "default", "vmi", "immutable", "--type=json",
			"-p", `[{"op":"add","path":"/spec/domain/devices/interfaces/-","value":{"name":"orphan"}}]`)
		if err == nil || !strings.Contains(stderr, "must name a network") {
			t.Fatalf("an interface without a network: want a refusal, got %v: %s", err, stderr)
		}
		remove := `[{"op":"remove","path":"/spec/domain/devices/interfaces/1"},{"op":"remove","path":"/spec/networks/1"}]`
		if _, stderr, err := kubectl(t, nil, "patch", "-n", "default", "vmi", "immutable", "--type=json", "-p", remove); err != nil {
			t.Fatalf("removing the interface refused: %v: %s", err, stderr)
		}
	})

	// Labels and status are not frozen: the controller and node agent update them.
	if _, stderr, err := kubectl(t, nil, "label", "-n", "default", "vmi", "immutable", "team=a"); err != nil {
		t.Fatalf("label change refused: %v: %s", err, stderr)
	}
}

func TestPrinterColumns(t *testing.T) {
	cases := []struct {
		sample, kind string
		headers      []string
	}{
		{"vm_testguest.yaml", "vm", []string{"NAME", "AGE", "STATUS", "READY"}},
		{"vmi_testguest.yaml", "vmi", []string{"NAME", "AGE", "PHASE", "IP", "NODENAME", "READY"}},
		{"vmim_testvm.yaml", "vmim", []string{"NAME", "PHASE", "VMI", "AGE"}},
	}
	for _, tc := range cases {
		o := load(t, tc.sample)
		o.set(t, "metadata.name", "columns")
		manifest, _ := json.Marshal(o)
		if _, stderr, err := kubectl(t, manifest, "create", "-n", "default", "-f", "-"); err != nil {
			t.Fatalf("create %s: %v: %s", tc.kind, err, stderr)
		}
		t.Cleanup(func() { _, _, _ = kubectl(t, nil, "delete", "-n", "default", tc.kind, "columns", "--wait=false") })
		out, stderr, err := kubectl(t, nil, "get", tc.kind, "columns", "-n", "default")
		if err != nil {
			t.Fatalf("kubectl get %s: %v: %s", tc.kind, err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], "columns ") {
			t.Fatalf("kubectl get %s columns printed:\n%s", tc.kind, out)
		}
		if header := strings.Fields(lines[0]); strings.Join(header, " ") != strings.Join(tc.headers, " ") {
			t.Errorf("kubectl get %s header = %v, want %v", tc.kind, header, tc.headers)
		}
	}
}

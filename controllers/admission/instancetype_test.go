package admission_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/cli"
)

// itVM is the test guest VM sized by an instancetype instead of its own CPU and memory.
func itVM(t *testing.T, instancetype map[string]any) map[string]any {
	t.Helper()
	vm := sample(t, "vm_testguest.yaml")
	spec := vm["spec"].(map[string]any)
	d := spec["template"].(map[string]any)["spec"].(map[string]any)["domain"].(map[string]any)
	delete(d, "cpu")
	delete(d, "memory")
	delete(d, "resources")
	spec["instancetype"] = instancetype
	return vm
}

func templateSpec(vm map[string]any) map[string]any {
	return vm["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
}

// TestWebhookInstancetypes: the VM webhooks resolve and expand instancetypes and preferences as
// KubeVirt's do: a VM that sets what its instancetype sets is refused naming the field, a missing
// instancetype is refused, inferFromVolume is resolved from the claim's labels into the stored
// reference (or refused naming it), the preference's machine type is the one recorded; and
// instancetypes and preferences asking for what qvirt cannot run are refused at creation.
func TestWebhookInstancetypes(t *testing.T) {
	startWebhook(t)
	createByKubectl(t, []byte(`apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineClusterInstancetype
metadata: {name: wh-small}
spec:
  cpu: {guest: 2}
  memory: {guest: 128Mi}
`), "virtualmachineclusterinstancetype", "wh-small")
	createByKubectl(t, []byte(`apiVersion: qvirt.io/v1alpha1
kind: VirtualMachinePreference
metadata: {name: wh-pref}
spec:
  machine: {preferredMachineType: pc-q35-7.2}
  devices: {preferredDiskBus: sata}
`), "virtualmachinepreference", "wh-pref")
	createByKubectl(t, []byte(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: labelled
  labels:
    instancetype.kubevirt.io/default-instancetype: wh-small
    instancetype.kubevirt.io/default-preference: wh-pref
    instancetype.kubevirt.io/default-preference-kind: VirtualMachinePreference
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`), "persistentvolumeclaim", "labelled")
	createByKubectl(t, []byte(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bare}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`), "persistentvolumeclaim", "bare")

	refusals := []struct {
		name     string
		manifest func() []byte
		want     []string
	}{
		{"the VM sets the sockets its instancetype sets", func() []byte {
			vm := itVM(t, map[string]any{"name": "wh-small"})
			templateSpec(vm)["domain"].(map[string]any)["cpu"] = map[string]any{"sockets": 2}
			return mustJSON(t, vm, "clash-cpu")
		}, []string{"spec.template.spec.domain.cpu.sockets", "conflicts with selected instance type"}},
		{"the VM sets memory.guest and a memory request", func() []byte {
			vm := itVM(t, map[string]any{"name": "wh-small"})
			d := templateSpec(vm)["domain"].(map[string]any)
			d["memory"] = map[string]any{"guest": "256Mi"}
			d["resources"] = map[string]any{"requests": map[string]any{"memory": "256Mi"}}
			return mustJSON(t, vm, "clash-mem")
		}, []string{"spec.template.spec.domain.memory.guest", "spec.template.spec.domain.resources.requests.memory"}},
		{"a missing instancetype", func() []byte {
			return mustJSON(t, itVM(t, map[string]any{"name": "absent"}), "missing")
		}, []string{"spec.instancetype", "Failure to find instancetype", `VirtualMachineClusterInstancetype "absent" not found`}},
		{"a missing preference", func() []byte {
			vm := itVM(t, map[string]any{"name": "wh-small"})
			vm["spec"].(map[string]any)["preference"] = map[string]any{"name": "absent", "kind": "VirtualMachinePreference"}
			return mustJSON(t, vm, "missing-pref")
		}, []string{"spec.preference", "Failure to find preference", `VirtualMachinePreference "absent" not found in namespace default`}},
		{"inferFromVolume on a claim without the label", func() []byte {
			vm := itVM(t, map[string]any{"inferFromVolume": "data"})
			templateSpec(vm)["volumes"] = append(templateSpec(vm)["volumes"].([]any), map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "bare"}})
			return mustJSON(t, vm, "infer-bare")
		}, []string{"spec.instancetype.inferFromVolume", `PersistentVolumeClaim "bare" of volume "data" has no instancetype.kubevirt.io/default-instancetype label`}},
		{"inferFromVolume on a volume that is no claim", func() []byte {
			return mustJSON(t, itVM(t, map[string]any{"inferFromVolume": "scratch"}), "infer-empty")
		}, []string{"spec.instancetype.inferFromVolume", `volume "scratch" is not a persistentVolumeClaim`}},
		{"an instancetype with GPUs", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachineInstancetype","metadata":{"name":"gpu"},
				"spec":{"cpu":{"guest":1},"memory":{"guest":"1Gi"},"gpus":[{"name":"gpu1","deviceName":"nvidia.com/TU104GL_Tesla_T4"}]}}`)
		}, []string{"spec.gpus", "GPU passthrough is not supported by this version of qvirt"}},
		{"an instancetype with memory hotplug on huge pages and dedicated CPUs", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachineClusterInstancetype","metadata":{"name":"pinned"},
				"spec":{"cpu":{"guest":1,"dedicatedCPUPlacement":true},"memory":{"guest":"1Gi","hugepages":{"pageSize":"2Mi"},"maxGuest":"4Gi"}}}`)
		}, []string{"spec.memory.maxGuest", "cannot be combined with memory.hugepages", "cannot be combined with dedicatedCpuPlacement"}},
		{"an instancetype with maxGuest below its guest memory", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachineInstancetype","metadata":{"name":"small"},
				"spec":{"cpu":{"guest":1},"memory":{"guest":"2Gi","maxGuest":"1Gi"}}}`)
		}, []string{"spec.memory.maxGuest", "must be at least memory.guest"}},
		{"a preferred panic device of s390", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachinePreference","metadata":{"name":"s390"},
				"spec":{"devices":{"preferredPanicDeviceModel":"s390"}}}`)
		}, []string{"spec.devices.preferredPanicDeviceModel", `"hyperv", "isa", "pvpanic"`}},
		{"a preferred clock with both utc and a timezone", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachineClusterPreference","metadata":{"name":"clock"},
				"spec":{"clock":{"preferredClockOffset":{"utc":{},"timezone":"UTC"}}}}`)
		}, []string{"spec.clock.preferredClockOffset", "utc and timezone are mutually exclusive"}},
		{"a preferred lun bus other than scsi", func() []byte {
			return []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachinePreference","metadata":{"name":"lun"},
				"spec":{"devices":{"preferredLunBus":"sata"}}}`)
		}, []string{"spec.devices.preferredLunBus", "a lun is passed through on the scsi bus"}},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := kubectlDefault(tc.manifest(), "create", "--dry-run=server", "-f", "-")
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("refusal does not say %q: %s", w, stderr)
				}
			}
		})
	}

	t.Run("a Windows preference's Hyper-V enlightenments and clock accepted", func(t *testing.T) {
		// As KubeVirt's common-instancetypes write them for Windows.
		windows := []byte(`{"apiVersion":"qvirt.io/v1alpha1","kind":"VirtualMachineClusterPreference","metadata":{"name":"windows.2k22"},
			"spec":{"clock":{"preferredClockOffset":{"utc":{}},"preferredTimer":{"hpet":{"present":false},"hyperv":{},"pit":{"tickPolicy":"delay"},"rtc":{"tickPolicy":"catchup"}}},
			"features":{"preferredAcpi":{},"preferredApic":{},"preferredSmm":{},"preferredHyperv":{"frequencies":{},"ipi":{},"reenlightenment":{},"relaxed":{},"reset":{},
				"runtime":{},"spinlocks":{"spinlocks":8191},"synic":{},"synictimer":{"direct":{}},"tlbflush":{},"vapic":{},"vpindex":{}}},
			"devices":{"preferredDiskBus":"sata","preferredInterfaceModel":"e1000e","preferredLunBus":"scsi","preferredTPM":{},"preferredVideoType":"virtio","preferredPanicDeviceModel":"hyperv","preferredUseVirtioTransitional":true}}}`)
		if _, stderr, err := kubectlDefault(windows, "create", "--dry-run=server", "-f", "-"); err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
	})

	t.Run("accepted, with the preference's machine type recorded", func(t *testing.T) {
		vm := itVM(t, map[string]any{"name": "wh-small"})
		vm["spec"].(map[string]any)["preference"] = map[string]any{"name": "wh-pref", "kind": "VirtualMachinePreference"}
		out, stderr, err := kubectlDefault(mustJSON(t, vm, "sized"), "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		var got struct {
			Spec struct {
				Template struct {
					Spec struct {
						Domain struct {
							Machine struct{ Type string }
						}
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		if mt := got.Spec.Template.Spec.Domain.Machine.Type; mt != "pc-q35-7.2" {
			t.Errorf("stored machine type %q, want the preference's pc-q35-7.2", mt)
		}
	})

	t.Run("qvirtctl create vm's manifest accepted", func(t *testing.T) {
		root := cli.New("qvirtctl")
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{"create", "vm", "--name", "from-cli", "--instancetype", "wh-small",
			"--preference", "virtualmachinepreference/wh-pref", "--volume-containerdisk", "src:example.com/disk:1,bootorder:1"})
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := kubectlDefault(out.Bytes(), "create", "--dry-run=server", "-f", "-"); err != nil {
			t.Fatalf("refused: %v: %s\n%s", err, stderr, out.String())
		}
	})

	t.Run("the preference's storage class recorded in the templates that name none", func(t *testing.T) {
		createByKubectl(t, []byte(`apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineClusterPreference
metadata: {name: wh-ceph}
spec:
  volumes: {preferredStorageClassName: ceph}
`), "virtualmachineclusterpreference", "wh-ceph")
		vm := itVM(t, map[string]any{"name": "wh-small"})
		vm["spec"].(map[string]any)["preference"] = map[string]any{"name": "wh-ceph"}
		size := map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}}
		local := map[string]any{"storageClassName": "local", "accessModes": []any{"ReadWriteOnce"}, "resources": size["resources"]}
		vm["spec"].(map[string]any)["dataVolumeTemplates"] = []any{
			map[string]any{"metadata": map[string]any{"name": "a"}, "spec": map[string]any{"source": map[string]any{"blank": map[string]any{}}, "storage": size}},
			map[string]any{"metadata": map[string]any{"name": "b"}, "spec": map[string]any{"source": map[string]any{"blank": map[string]any{}}, "pvc": local}},
		}
		templateSpec(vm)["volumes"] = append(templateSpec(vm)["volumes"].([]any),
			map[string]any{"name": "a", "dataVolume": map[string]any{"name": "a"}}, map[string]any{"name": "b", "dataVolume": map[string]any{"name": "b"}})
		out, stderr, err := kubectlDefault(mustJSON(t, vm, "storage-pref"), "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		var got struct {
			Spec struct {
				DataVolumeTemplates []struct {
					Spec struct{ Storage, PVC map[string]any }
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		if dvt := got.Spec.DataVolumeTemplates; len(dvt) != 2 || dvt[0].Spec.Storage["storageClassName"] != "ceph" || dvt[1].Spec.PVC["storageClassName"] != "local" {
			t.Errorf("stored templates %+v, want ceph where none was named and local kept", dvt)
		}
	})

	t.Run("inferFromVolume resolved from the claim's labels", func(t *testing.T) {
		vm := itVM(t, map[string]any{"inferFromVolume": "data"})
		vm["spec"].(map[string]any)["preference"] = map[string]any{"inferFromVolume": "data"}
		templateSpec(vm)["volumes"] = append(templateSpec(vm)["volumes"].([]any), map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "labelled"}})
		out, stderr, err := kubectlDefault(mustJSON(t, vm, "inferred"), "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		var got struct {
			Spec struct {
				Instancetype, Preference map[string]any
			}
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		if it := got.Spec.Instancetype; it["name"] != "wh-small" || it["inferFromVolume"] != nil {
			t.Errorf("stored spec.instancetype %v, want name wh-small and no inferFromVolume", it)
		}
		if p := got.Spec.Preference; p["name"] != "wh-pref" || p["kind"] != "VirtualMachinePreference" {
			t.Errorf("stored spec.preference %v, want wh-pref of kind VirtualMachinePreference", p)
		}
	})
}

func mustJSON(t *testing.T, o map[string]any, name string) []byte {
	t.Helper()
	o["metadata"].(map[string]any)["name"] = name
	data, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

package cli

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
)

func runCreateVM(t *testing.T, args ...string) (*v1alpha1.VirtualMachine, error) {
	t.Helper()
	root := New("qvirtctl")
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"create", "vm"}, args...))
	if err := root.Execute(); err != nil {
		return nil, err
	}
	var vm v1alpha1.VirtualMachine
	if err := yaml.UnmarshalStrict(out.Bytes(), &vm); err != nil {
		t.Fatalf("output is not a VirtualMachine: %v\n%s", err, out.String())
	}
	if vm.APIVersion != "qvirt.io/v1alpha1" || vm.Kind != "VirtualMachine" {
		t.Fatalf("output has apiVersion %q kind %q", vm.APIVersion, vm.Kind)
	}
	return &vm, nil
}

// TestCreateVM: the printed VM refers to the instancetype and preference given, carries the
// volumes in order with their boot order, and is valid once expanded with an instancetype; without
// an instancetype it has --memory and is valid as it is.
func TestCreateVM(t *testing.T) {
	vm, err := runCreateVM(t, "--name", "web", "--instancetype", "u1.small", "--preference", "virtualmachinepreference/linux",
		"--volume-containerdisk", "src:quay.io/containerdisks/fedora:40,bootorder:1", "--volume-pvc", "src:data", "--run-strategy", "Halted")
	if err != nil {
		t.Fatal(err)
	}
	if m := vm.Spec.Instancetype; m == nil || m.Name != "u1.small" || m.Kind != "" {
		t.Errorf("spec.instancetype %+v, want u1.small of the default (cluster) kind", m)
	}
	if m := vm.Spec.Preference; m == nil || m.Name != "linux" || m.Kind != v1alpha1.SingularPreferenceKind {
		t.Errorf("spec.preference %+v", m)
	}
	vols := vm.Spec.Template.Spec.Volumes
	if len(vols) != 2 || vols[0].ContainerDisk == nil || vols[0].ContainerDisk.Image != "quay.io/containerdisks/fedora:40" || vols[0].Name != "containerdisk-0" ||
		vols[1].PersistentVolumeClaim == nil || vols[1].Name != "data" {
		t.Fatalf("volumes %+v", vols)
	}
	if d := vm.Spec.Template.Spec.Domain.Devices.Disks; len(d) != 1 || d[0].Name != "containerdisk-0" || *d[0].BootOrder != 1 {
		t.Errorf("disks %+v, want the boot disk with bootOrder 1", d)
	}
	if vm.Spec.Template.Spec.Domain.Memory != nil {
		t.Errorf("memory %+v set beside an instancetype (a conflict)", vm.Spec.Template.Spec.Domain.Memory)
	}
	it := &v1alpha1.VirtualMachineInstancetypeSpec{CPU: v1alpha1.CPUInstancetype{Guest: 1}, Memory: v1alpha1.MemoryInstancetype{Guest: resource.MustParse("2Gi")}}
	spec, _, errs := instancetype.Expand(vm, &instancetype.Resolution{Instancetype: it, InstancetypeRef: &v1alpha1.InstancetypeStatusRef{Name: "u1.small"}})
	if len(errs) > 0 {
		t.Fatalf("does not expand: %v", errs)
	}
	v1alpha1.SetDefaults(spec) // as the instance's admission does
	if errs := v1alpha1.ValidateVirtualMachineInstanceSpec(spec, field.NewPath("spec")); len(errs) > 0 {
		t.Fatalf("expanded, not valid: %v", errs)
	}

	plain, err := runCreateVM(t, "--volume-containerdisk", "src:example.com/disk", "--memory", "1Gi")
	if err != nil {
		t.Fatal(err)
	}
	if plain.GenerateName != "vm-" || plain.Spec.Template.Spec.Domain.Memory.Guest.String() != "1Gi" {
		t.Errorf("generateName %q memory %+v", plain.GenerateName, plain.Spec.Template.Spec.Domain.Memory)
	}
	v1alpha1.SetDefaults(&plain.Spec.Template.Spec) // as the VM admitter checks a template
	if errs := v1alpha1.ValidateVirtualMachine(plain); len(errs) > 0 {
		t.Errorf("not valid: %v", errs)
	}

	inferred, err := runCreateVM(t, "--volume-pvc", "src:root-disk,name:root", "--infer-instancetype", "--infer-preference-from", "root")
	if err != nil {
		t.Fatal(err)
	}
	if inferred.Spec.Instancetype == nil || inferred.Spec.Instancetype.InferFromVolume != "root" ||
		inferred.Spec.Preference == nil || inferred.Spec.Preference.InferFromVolume != "root" {
		t.Errorf("references %+v %+v, want both inferred from root", inferred.Spec.Instancetype, inferred.Spec.Preference)
	}
}

// TestCreateVMImports: each --volume-import becomes a dataVolumeTemplate with CDI's spec for its
// type and a dataVolume volume of the same name, after the containerdisks and claims, as virtctl
// writes them; the VM is valid.
func TestCreateVMImports(t *testing.T) {
	vm, err := runCreateVM(t, "--name", "imported", "--volume-import", "type:ds,src:os-images/fedora,name:root,bootorder:1",
		"--volume-pvc", "src:data", "--volume-import", "type:blank,size:10Gi,name:scratch",
		"--volume-import", "type:http,url:https://example.com/disk.qcow2,size:5Gi,secretref:creds,name:web",
		"--volume-import", "type:registry,url:docker://quay.io/containerdisks/fedora:40,pullmethod:node,size:5Gi,name:reg",
		"--volume-import", "type:pvc,src:golden/base,name:clone")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"root":    `{"sourceRef":{"kind":"DataSource","name":"fedora","namespace":"os-images"},"storage":{}}`,
		"scratch": `{"source":{"blank":{}},"storage":{"resources":{"requests":{"storage":"10Gi"}}}}`,
		"web":     `{"source":{"http":{"secretRef":"creds","url":"https://example.com/disk.qcow2"}},"storage":{"resources":{"requests":{"storage":"5Gi"}}}}`,
		"reg":     `{"source":{"registry":{"pullMethod":"node","url":"docker://quay.io/containerdisks/fedora:40"}},"storage":{"resources":{"requests":{"storage":"5Gi"}}}}`,
		"clone":   `{"source":{"pvc":{"name":"base","namespace":"golden"}},"storage":{}}`,
	}
	if len(vm.Spec.DataVolumeTemplates) != len(want) {
		t.Fatalf("%d dataVolumeTemplates, want %d", len(vm.Spec.DataVolumeTemplates), len(want))
	}
	for _, dvt := range vm.Spec.DataVolumeTemplates {
		if got := string(dvt.Spec.Raw); got != want[dvt.ObjectMeta.Name] {
			t.Errorf("dataVolumeTemplate %s spec %s, want %s", dvt.ObjectMeta.Name, got, want[dvt.ObjectMeta.Name])
		}
	}
	var order []string
	for _, v := range vm.Spec.Template.Spec.Volumes {
		order = append(order, v.Name)
		if v.Name != "data" && (v.DataVolume == nil || v.DataVolume.Name != v.Name) {
			t.Errorf("volume %s is not the dataVolume of its template: %+v", v.Name, v.VolumeSource)
		}
	}
	if got := strings.Join(order, ","); got != "data,root,scratch,web,reg,clone" {
		t.Errorf("volumes in order %s, want the claim first, then the imports in the order given", got)
	}
	if d := vm.Spec.Template.Spec.Domain.Devices.Disks; len(d) != 1 || d[0].Name != "root" || *d[0].BootOrder != 1 {
		t.Errorf("disks %+v, want root with bootOrder 1", d)
	}
	v1alpha1.SetDefaults(&vm.Spec.Template.Spec)
	if errs := v1alpha1.ValidateVirtualMachine(vm); len(errs) > 0 {
		t.Errorf("not valid: %v", errs)
	}

	unnamed, err := runCreateVM(t, "--volume-import", "type:blank,size:1Gi")
	if err != nil {
		t.Fatal(err)
	}
	if n := unnamed.Spec.DataVolumeTemplates[0].ObjectMeta.Name; !strings.HasPrefix(n, "imported-volume-") || unnamed.Spec.Template.Spec.Volumes[0].Name != n {
		t.Errorf("unnamed import %q, volume %q: want imported-volume-<random> for both, as virtctl names it", n, unnamed.Spec.Template.Spec.Volumes[0].Name)
	}
}

func TestCreateVMRefusals(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--volume-import", "url:http://example.com/disk.img,size:10Gi"}, `--volume-import "url:http://example.com/disk.img,size:10Gi": type "" must be one of blank, ds, gcs, http, pvc, registry, s3, snapshot`},
		{[]string{"--volume-import", "type:vddk,size:1Gi"}, `type "vddk" must be one of`},
		{[]string{"--volume-import", "type:http,size:10Gi"}, "url is required for type http"},
		{[]string{"--volume-import", "type:http,url:http://x/d.img"}, "size is required for type http"},
		{[]string{"--volume-import", "type:blank,size:-1Gi"}, `size "-1Gi" must be a positive quantity`},
		{[]string{"--volume-import", "type:blank,size:1Gi,url:http://x"}, "url does not apply to type blank"},
		{[]string{"--volume-import", "type:pvc,src:disk"}, `src "disk" must be NAMESPACE/NAME for type pvc`},
		{[]string{"--volume-import", "type:registry,size:1Gi"}, "give exactly one of url and imagestream"},
		{[]string{"--volume-import", "type:registry,url:docker://x,pullmethod:fast,size:1Gi"}, `pullmethod "fast" must be pod or node`},
		{[]string{"--volume-import", "type:blank,size:1Gi,name:Root_Disk"}, `name "Root_Disk"`},
		{[]string{"--volume-pvc", "src:root", "--volume-import", "type:blank,size:1Gi,name:root"}, `already a volume named "root"`},
		{[]string{"--instancetype", "virtualmachinepreference/x"}, "--instancetype \"virtualmachinepreference/x\": kind must be"},
		{[]string{"--instancetype", "a", "--infer-instancetype", "--volume-pvc", "src:c"}, "give one"},
		{[]string{"--infer-preference"}, "--infer-preference needs a volume"},
		{[]string{"--volume-pvc", "name:x"}, "src is required"},
		{[]string{"--volume-pvc", "src:a,size:1Gi"}, `unknown key "size"`},
		{[]string{"--volume-pvc", "src:a", "--volume-pvc", "src:a"}, `already a volume named "a"`},
		{[]string{"--volume-containerdisk", "src:img,bootorder:0"}, "bootorder \"0\" must be a whole number from 1"},
		{[]string{"--run-strategy", "Sometimes"}, "--run-strategy \"Sometimes\""},
		{[]string{"--memory", "lots"}, "--memory \"lots\""},
	}
	for _, tc := range cases {
		_, err := runCreateVM(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

// FuzzParseVolumeParams: the parser either refuses a value naming the flag, or returns only
// allowed keys whose pairs rebuild a value with the same pairs.
func FuzzParseVolumeParams(f *testing.F) {
	for _, s := range []string{"src:a", "src:quay.io/x:1,name:b,bootorder:2", "", ",", "src", ":x", "src:a,src:b", "name:a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseVolumeParams("--volume-pvc", s, "src", "name", "bootorder")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--volume-pvc ") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		n := 0
		for k, v := range p {
			if k != "src" && k != "name" && k != "bootorder" {
				t.Fatalf("key %q accepted", k)
			}
			if !strings.Contains(","+s+",", ","+k+":"+v+",") {
				t.Fatalf("%s:%s is not a pair of %q", k, v, s)
			}
			n++
		}
		if n != strings.Count(s, ",")+1 {
			t.Fatalf("%q gave %d pairs", s, n)
		}
	})
}

// FuzzVolumeImport: a --volume-import value is either refused naming the flag, or gives one
// dataVolumeTemplate with a DNS label name and a dataVolume volume of that name.
func FuzzVolumeImport(f *testing.F) {
	for _, s := range []string{"type:blank,size:1Gi", "type:ds,src:ns/x,name:a", "type:pvc,src:a/b", "type:http,url:u,size:1", "type:registry,imagestream:s,size:1Gi", "", "type:", "type:pvc,src:/", "type:blank,size:1Ei,bootorder:3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		vm := &v1alpha1.VirtualMachine{}
		if err := addImport(vm, map[string]bool{}, s); err != nil {
			if !strings.HasPrefix(err.Error(), "--volume-import ") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		if len(vm.Spec.DataVolumeTemplates) != 1 || len(vm.Spec.Template.Spec.Volumes) != 1 {
			t.Fatalf("%q: %d templates, %d volumes", s, len(vm.Spec.DataVolumeTemplates), len(vm.Spec.Template.Spec.Volumes))
		}
		name := vm.Spec.DataVolumeTemplates[0].ObjectMeta.Name
		if v := vm.Spec.Template.Spec.Volumes[0]; v.Name != name || v.DataVolume == nil || v.DataVolume.Name != name {
			t.Fatalf("%q: volume %+v does not use template %q", s, v, name)
		}
	})
}

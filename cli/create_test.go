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

func TestCreateVMRefusals(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--volume-import", "type:http,url:http://example.com/disk.img,size:10Gi"}, "--volume-import: it creates a CDI DataVolume"},
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

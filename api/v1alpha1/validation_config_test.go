package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// withConfigVolumes adds one volume of each config kind, each on a cdrom, to s (volumes[2] to [5]).
func withConfigVolumes(s *VirtualMachineInstanceSpec) {
	for _, v := range []Volume{
		{Name: "sec", VolumeSource: VolumeSource{Secret: &SecretVolumeSource{SecretName: "app", Optional: ptr.To(true), VolumeLabel: "APPSECRET"}}},
		{Name: "cm", VolumeSource: VolumeSource{ConfigMap: &ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}},
		{Name: "sa", VolumeSource: VolumeSource{ServiceAccount: &ServiceAccountVolumeSource{ServiceAccountName: "default"}}},
		{Name: "info", VolumeSource: VolumeSource{DownwardAPI: &DownwardAPIVolumeSource{Fields: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
	} {
		s.Volumes = append(s.Volumes, v)
		s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: v.Name, CDRom: &CDRomTarget{Bus: DiskBusSATA}})
	}
}

// TestValidateConfigVolumes: secret, configMap, serviceAccount and downwardAPI volumes in KubeVirt's
// shape are valid and realised; each broken field is refused at its path.
func TestValidateConfigVolumes(t *testing.T) {
	check := func(vm *VirtualMachine) field.ErrorList {
		return append(ValidateVirtualMachine(vm), NotRealised(&vm.Spec.Template.Spec, field.NewPath("spec", "template", "spec"))...)
	}
	vm := validVM()
	withConfigVolumes(&vm.Spec.Template.Spec)
	if errs := check(vm); len(errs) != 0 {
		t.Fatalf("config volumes must be valid, got %v", errs)
	}
	vp := "spec.template.spec.volumes"
	cases := []struct {
		name   string
		mutate func(s *VirtualMachineInstanceSpec)
		path   string
		detail string
	}{
		{"secret without a name", func(s *VirtualMachineInstanceSpec) { s.Volumes[2].Secret.SecretName = "" }, vp + "[2].secret.secretName", "Secret's name"},
		{"secret name not a DNS subdomain", func(s *VirtualMachineInstanceSpec) { s.Volumes[2].Secret.SecretName = "App_Secret" }, vp + "[2].secret.secretName", "RFC 1123"},
		{"label longer than ISO 9660's", func(s *VirtualMachineInstanceSpec) { s.Volumes[2].Secret.VolumeLabel = strings.Repeat("L", 33) }, vp + "[2].secret.volumeLabel", "32"},
		{"label with a newline", func(s *VirtualMachineInstanceSpec) { s.Volumes[3].ConfigMap.VolumeLabel = "cfg\ndata" }, vp + "[3].configMap.volumeLabel", "printable ASCII"},
		{"configMap without a name", func(s *VirtualMachineInstanceSpec) { s.Volumes[3].ConfigMap.Name = "" }, vp + "[3].configMap.name", "ConfigMap's name"},
		{"serviceAccount without a name", func(s *VirtualMachineInstanceSpec) { s.Volumes[4].ServiceAccount.ServiceAccountName = "" }, vp + "[4].serviceAccount.serviceAccountName", "service account"},
		{"two serviceAccount volumes", func(s *VirtualMachineInstanceSpec) {
			s.Volumes = append(s.Volumes, Volume{Name: "sa2", VolumeSource: VolumeSource{ServiceAccount: &ServiceAccountVolumeSource{ServiceAccountName: "other"}}})
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "sa2", CDRom: &CDRomTarget{Bus: DiskBusSATA}})
		}, vp + "[6].serviceAccount", "at most one serviceAccount volume"},
		{"downwardAPI path leaving the volume", func(s *VirtualMachineInstanceSpec) { s.Volumes[5].DownwardAPI.Fields[0].Path = "../labels" }, vp + "[5].downwardAPI.fields[0].path", "'..'"},
		{"downwardAPI path like the kubelet's own", func(s *VirtualMachineInstanceSpec) { s.Volumes[5].DownwardAPI.Fields[0].Path = "..data" }, vp + "[5].downwardAPI.fields[0].path", "'..'"},
		{"downwardAPI absolute path", func(s *VirtualMachineInstanceSpec) { s.Volumes[5].DownwardAPI.Fields[0].Path = "/labels" }, vp + "[5].downwardAPI.fields[0].path", "relative"},
		{"downwardAPI field without a source", func(s *VirtualMachineInstanceSpec) { s.Volumes[5].DownwardAPI.Fields[0].FieldRef = nil }, vp + "[5].downwardAPI.fields[0]", "exactly one of fieldRef and resourceFieldRef"},
		{"downwardAPI duplicate path", func(s *VirtualMachineInstanceSpec) {
			f := s.Volumes[5].DownwardAPI.Fields
			s.Volumes[5].DownwardAPI.Fields = append(f, f[0])
		}, vp + "[5].downwardAPI.fields[1].path", "Duplicate"},
		{"secret and configMap in one volume", func(s *VirtualMachineInstanceSpec) {
			s.Volumes[2].ConfigMap = &ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}
		}, vp + "[2]", "exactly one source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm := validVM()
			withConfigVolumes(&vm.Spec.Template.Spec)
			tc.mutate(&vm.Spec.Template.Spec)
			errs := check(vm)
			if len(errs) != 1 || errs[0].Field != tc.path || !strings.Contains(errs[0].Error(), tc.detail) {
				t.Fatalf("want one error at %s saying %q, got %v", tc.path, tc.detail, errs)
			}
		})
	}
}

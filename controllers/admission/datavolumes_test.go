package admission_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// kvDataVolume is the DataVolume example of KubeVirt's user guide (Disks and Volumes,
// dataVolumeTemplates), with only its apiVersion changed: CDI imports the disk into a new claim
// from an HTTP URL, and the VM's volume uses that DataVolume.
const kvDataVolume = `apiVersion: qvirt.io/v1alpha1
kind: VirtualMachine
metadata:
  labels:
    kubevirt.io/vm: vm-alpine-datavolume
  name: vm-alpine-datavolume
spec:
  runStrategy: Halted
  template:
    metadata:
      labels:
        kubevirt.io/vm: vm-alpine-datavolume
    spec:
      domain:
        devices:
          disks:
          - disk:
              bus: virtio
            name: datavolumedisk1
        resources:
          requests:
            memory: 64M
      volumes:
      - dataVolume:
          name: alpine-dv
        name: datavolumedisk1
  dataVolumeTemplates:
  - metadata:
      name: alpine-dv
    spec:
      pvc:
        accessModes:
        - ReadWriteOnce
        resources:
          requests:
            storage: 2Gi
      source:
        http:
          url: http://cdi-http-import-server.kubevirt/images/alpine.iso
`

// TestKubeVirtDataVolumeTemplates: KubeVirt's dataVolumeTemplates manifest is accepted through
// kube-apiserver with the webhooks installed, its CDI spec stored as written; a template no
// volume uses is refused naming it, as KubeVirt's VM admitter does.
func TestKubeVirtDataVolumeTemplates(t *testing.T) {
	startWebhook(t)
	createByKubectl(t, []byte(kvDataVolume), "vm", "vm-alpine-datavolume")
	var vm v1alpha1.VirtualMachine
	get(t, "vm", "vm-alpine-datavolume", &vm)
	if len(vm.Spec.DataVolumeTemplates) != 1 || vm.Spec.DataVolumeTemplates[0].ObjectMeta.Name != "alpine-dv" {
		t.Fatalf("stored dataVolumeTemplates %+v", vm.Spec.DataVolumeTemplates)
	}
	var spec struct {
		PVC    struct{ AccessModes []string }      `json:"pvc"`
		Source struct{ HTTP struct{ URL string } } `json:"source"`
	}
	if err := json.Unmarshal(vm.Spec.DataVolumeTemplates[0].Spec.Raw, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Source.HTTP.URL != "http://cdi-http-import-server.kubevirt/images/alpine.iso" || len(spec.PVC.AccessModes) != 1 {
		t.Errorf("stored DataVolume spec %s: want the manifest's", vm.Spec.DataVolumeTemplates[0].Spec.Raw)
	}

	unused := strings.Replace(kvDataVolume, "name: vm-alpine-datavolume\nspec:", "name: vm-alpine-unused\nspec:", 1)
	unused = strings.Replace(unused, "  - metadata:\n      name: alpine-dv", "  - metadata:\n      name: alpine-extra\n    spec: {}\n  - metadata:\n      name: alpine-dv", 1)
	_, stderr, err := kubectlDefault([]byte(unused), "create", "--dry-run=server", "-f", "-")
	if err == nil || !strings.Contains(stderr, "spec.dataVolumeTemplates[0].metadata.name") || !strings.Contains(stderr, "no volume of spec.template.spec.volumes uses this DataVolume") {
		t.Errorf("a template no volume uses: err %v, stderr %s; want a refusal naming spec.dataVolumeTemplates[0].metadata.name", err, stderr)
	}
}

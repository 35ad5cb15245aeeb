package admission_test

import (
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/machine"
)

// kvConfigVolumes is KubeVirt's user guide example of config volumes (Disks and Volumes:
// configMap, secret, serviceAccount, downwardAPI), with only the apiVersion changed (its memory,
// 64M, is 61.04 MiB: the guest gets 62 MiB, as libvirt rounds it for KubeVirt): a configMap on a disk with a serial, the others without a disk.
const kvConfigVolumes = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: kv-config-volumes
spec:
  domain:
    resources:
      requests:
        memory: 64M
    devices:
      disks:
      - name: containerdisk
        disk: {}
      - name: app-config-disk
        disk: {}
        serial: CVLY623300HK240D
  volumes:
  - name: containerdisk
    containerDisk:
      image: quay.io/kubevirt/cirros-container-disk-demo:v1.4.0
  - name: app-config-disk
    configMap:
      name: app-config
  - name: app-secret-disk
    secret:
      secretName: app-secret
      volumeLabel: APPSECRET
  - name: serviceaccount-disk
    serviceAccount:
      serviceAccountName: default
  - name: podinfo-disk
    downwardAPI:
      fields:
      - path: labels
        fieldRef:
          fieldPath: metadata.labels
`

// TestKubeVirtConfigVolumes: KubeVirt's config volume manifest is accepted through kube-apiserver
// with the webhooks installed, the volumes without a disk get one (KubeVirt's defaulting), and
// the stored instance translates into config disks with their labels.
func TestKubeVirtConfigVolumes(t *testing.T) {
	startWebhook(t)
	createByKubectl(t, []byte(kvConfigVolumes), "vmi", "kv-config-volumes")
	var vmi v1alpha1.VirtualMachineInstance
	get(t, "vmi", "kv-config-volumes", &vmi)
	want := "containerdisk:disk:virtio app-config-disk:disk:virtio app-secret-disk:disk:virtio serviceaccount-disk:disk:virtio podinfo-disk:disk:virtio"
	if got := diskList(vmi.Spec.Domain.Devices.Disks); got != want {
		t.Errorf("stored disks %q, want %q", got, want)
	}
	m, err := translate.Machine(&vmi, translate.Host{Emulation: true, NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m.MemoryMiB != 62 {
		t.Errorf("memory 64M gives the guest %d MiB, want 62 (rounded up to a whole MiB)", m.MemoryMiB)
	}
	labels := map[string]string{}
	for _, d := range m.Disks {
		if c := d.Source.Config; c != nil {
			labels[d.Name] = c.Kind + ":" + c.Label
		}
	}
	for name, w := range map[string]string{"app-config-disk": "configMap:cfgdata", "app-secret-disk": "secret:APPSECRET",
		"serviceaccount-disk": "serviceAccount:cfgdata", "podinfo-disk": "downwardAPI:cfgdata"} {
		if labels[name] != w {
			t.Errorf("disk %s: config %q, want %q", name, labels[name], w)
		}
	}
}

package admission_test

import (
	"strings"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/machine"
	"sigs.k8s.io/yaml"
)

// kvVirtiofs is KubeVirt's user guide example of sharing a PersistentVolumeClaim and a ConfigMap
// with virtiofs (Disks and Volumes: filesystems), with only the apiVersion changed: the shared
// volumes have no disk.
const kvVirtiofs = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: testvmi-fs
spec:
  domain:
    devices:
      disks:
        - disk:
            bus: virtio
          name: containerdisk
      filesystems:
        - name: virtiofs-disk
          virtiofs: {}
        - name: config-fs
          virtiofs: {}
    resources:
      requests:
        memory: 1024Mi
  volumes:
    - name: containerdisk
      containerDisk:
        image: quay.io/containerdisks/fedora:latest
    - name: virtiofs-disk
      persistentVolumeClaim:
        claimName: mypvc
    - name: config-fs
      configMap:
        name: app-config
`

// TestKubeVirtVirtiofs: KubeVirt's virtiofs manifest is accepted through kube-apiserver with the
// webhooks installed, the shared volumes get no disk from the defaults (as KubeVirt's), and the
// stored instance translates into two shared directories where the launcher pod mounts them.
func TestKubeVirtVirtiofs(t *testing.T) {
	startWebhook(t)
	// Off by default, naming the field and the key that turns it on.
	var o map[string]any
	if err := yaml.Unmarshal([]byte(kvVirtiofs), &o); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := apply(t, o, "testvmi-fs-off"); err == nil || !strings.Contains(stderr, "spec.domain.devices.filesystems") || !strings.Contains(stderr, "enableVirtiofs") {
		t.Fatalf("with virtiofs not enabled: %v: %s; want a refusal naming spec.domain.devices.filesystems and enableVirtiofs", err, stderr)
	}
	cfg := config.Default()
	cfg.EnableVirtiofs = true
	store.Set(cfg)
	t.Cleanup(func() { store.Set(config.Default()) })
	createByKubectl(t, []byte(kvVirtiofs), "vmi", "testvmi-fs")
	var vmi v1alpha1.VirtualMachineInstance
	get(t, "vmi", "testvmi-fs", &vmi)
	if got, want := diskList(vmi.Spec.Domain.Devices.Disks), "containerdisk:disk:virtio"; got != want {
		t.Errorf("stored disks %q, want %q", got, want)
	}
	if fss := vmi.Spec.Domain.Devices.Filesystems; len(fss) != 2 || fss[0].Virtiofs == nil || fss[1].Name != "config-fs" {
		t.Errorf("stored filesystems %+v, want the manifest's two with virtiofs", fss)
	}
	m, err := translate.Machine(&vmi, translate.Host{Emulation: true,
		NICs: map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}},
		Pod:  &translate.PodVolumes{Claims: map[string]translate.Claim{"mypvc": {CapacityBytes: 1 << 30}}}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range m.Filesystems {
		got[f.Name] = f.Kind + ":" + f.Dir
	}
	want := map[string]string{"virtiofs-disk": "persistentVolumeClaim:/var/run/qvirt/claims/virtiofs-disk",
		"config-fs": "configMap:/var/run/qvirt/config-volumes/config-fs"}
	if len(got) != len(want) || got["virtiofs-disk"] != want["virtiofs-disk"] || got["config-fs"] != want["config-fs"] {
		t.Errorf("machine filesystems %v, want %v", got, want)
	}
}

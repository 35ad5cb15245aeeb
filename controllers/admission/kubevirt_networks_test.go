package admission_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/machine"
)

// TestKubeVirtMultusNetworks: the KubeVirt user guide's secondary network (a bridge interface on a
// multus network besides the pod network) is accepted through kube-apiserver and kubectl; an
// interface on a multus network that names no binding is stored with bridge, and the instance
// translates to a machine with both NICs.
func TestKubeVirtMultusNetworks(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	spec := o["spec"].(map[string]any)
	devices := spec["domain"].(map[string]any)["devices"].(map[string]any)
	devices["interfaces"] = []any{map[string]any{"name": "default", "masquerade": map[string]any{}},
		map[string]any{"name": "ptp", "bridge": map[string]any{}}, map[string]any{"name": "lab"}}
	spec["networks"] = []any{map[string]any{"name": "default", "pod": map[string]any{}},
		map[string]any{"name": "ptp", "multus": map[string]any{"networkName": "ptp-conf"}},
		map[string]any{"name": "lab", "multus": map[string]any{"networkName": "default/lab"}}}
	stored := createVMI(t, o, "vmi-multus")
	if got := ifaceList(stored.Spec.Domain.Devices.Interfaces); got != "default:virtio:masquerade ptp:virtio:bridge lab:virtio:bridge" {
		t.Errorf("stored interfaces %s, want lab defaulted to bridge", got)
	}
	nics := map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"},
		"ptp": {Tap: "qvt1", MAC: "02:00:00:00:00:02"}, "lab": {Tap: "qvt2", MAC: "02:00:00:00:00:03"}}
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.NICs) != 3 || m.NICs[1].Name != "ptp" || m.NICs[1].Tap != "qvt1" || m.NICs[2].Tap != "qvt2" {
		t.Errorf("machine NICs %+v, want default, ptp and lab in the spec's order", m.NICs)
	}
	// Another tenant's attachment is refused, as a secondary and as the default network (which
	// Multus's namespace isolation does not check).
	for name, net := range map[string]map[string]any{
		"secondary": {"name": "ptp", "multus": map[string]any{"networkName": "victim/ptp-conf"}},
		"default":   {"name": "ptp", "multus": map[string]any{"networkName": "victim/flat", "default": true}},
	} {
		t.Run("another namespace's attachment as "+name, func(t *testing.T) {
			o := sample(t, "vmi_testguest.yaml")
			spec := o["spec"].(map[string]any)
			spec["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{map[string]any{"name": "ptp", "bridge": map[string]any{}}}
			spec["networks"] = []any{net}
			_, stderr, err := apply(t, o, "vmi-multus-victim")
			if err == nil || !strings.Contains(stderr, "spec.networks[0].multus.networkName") || !strings.Contains(stderr, `namespace "victim"`) {
				t.Errorf("%v: %s; want a refusal naming spec.networks[0].multus.networkName", err, stderr)
			}
		})
	}
}

// TestKubeVirtPasstBinding: the passt binding as KubeVirt's user guide writes it, through kubectl:
// refused until the cluster enables it, then stored as written (no masquerade added), translated to a passt NIC; another binding plugin,
// passt on a multus network, and passt beside masquerade are refused naming the field.
func TestKubeVirtPasstBinding(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	spec := o["spec"].(map[string]any)
	spec["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{
		map[string]any{"name": "passtnet", "binding": map[string]any{"name": "passt"}}}
	spec["networks"] = []any{map[string]any{"name": "passtnet", "pod": map[string]any{}}}
	o["metadata"].(map[string]any)["name"] = "vmi-passt"
	// Off by default, naming the field and the key that turns it on.
	if _, stderr, err := apply(t, o, "vmi-passt"); err == nil || !strings.Contains(stderr, "spec.domain.devices.interfaces[0].binding") ||
		!strings.Contains(stderr, "enablePasstBinding") {
		t.Fatalf("with passt not enabled: %v: %s; want a refusal naming the binding and enablePasstBinding", err, stderr)
	}
	cfg := config.Default()
	cfg.EnablePasstBinding = true
	store.Set(cfg)
	t.Cleanup(func() { store.Set(config.Default()) })
	stored := createVMI(t, o, "vmi-passt")
	if got := ifaceList(stored.Spec.Domain.Devices.Interfaces); got != "passtnet:virtio:binding=passt" {
		t.Errorf("stored interfaces %s, want passtnet with the passt binding alone", got)
	}
	nics := map[string]machine.NIC{"passtnet": {MAC: "02:00:00:00:00:01", Passt: &machine.Passt{Interface: "eth0"}}}
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.NICs) != 1 || m.NICs[0].Passt == nil || m.NICs[0].Tap != "" || m.NICs[0].Model != machine.NICVirtio {
		t.Errorf("machine NICs %+v, want one virtio NIC on passt", m.NICs)
	}
	for name, tc := range map[string]struct {
		iface, net map[string]any
		field      string
	}{
		"another binding plugin": {map[string]any{"name": "n", "binding": map[string]any{"name": "macvtap"}},
			map[string]any{"name": "n", "pod": map[string]any{}}, "spec.domain.devices.interfaces[0].binding.name"},
		"passt on a multus network": {map[string]any{"name": "n", "binding": map[string]any{"name": "passt"}},
			map[string]any{"name": "n", "multus": map[string]any{"networkName": "flat", "default": true}}, "spec.domain.devices.interfaces[0].binding"},
	} {
		t.Run(name, func(t *testing.T) {
			o := sample(t, "vmi_testguest.yaml")
			spec := o["spec"].(map[string]any)
			spec["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{tc.iface}
			spec["networks"] = []any{tc.net}
			_, stderr, err := apply(t, o, "vmi-passt-refused")
			if err == nil || !strings.Contains(stderr, tc.field) {
				t.Errorf("%v: %s; want a refusal naming %s", err, stderr, tc.field)
			}
		})
	}
}

// TestKubeVirtSlirpBinding: KubeVirt's slirp binding plugin, as its user guide writes the
// interface (with a port), is accepted through kubectl with no cluster setting (QEMU runs it: the
// pod keeps its seccomp profile) and becomes a machine NIC on QEMU's user network forwarding the
// port; on a multus network it is refused naming the binding.
func TestKubeVirtSlirpBinding(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	spec := o["spec"].(map[string]any)
	spec["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{
		map[string]any{"name": "slirpnet", "binding": map[string]any{"name": "slirp"}, "ports": []any{map[string]any{"name": "http", "port": 80}}}}
	spec["networks"] = []any{map[string]any{"name": "slirpnet", "pod": map[string]any{}}}
	stored := createVMI(t, o, "vmi-slirp")
	if got := ifaceList(stored.Spec.Domain.Devices.Interfaces); got != "slirpnet:virtio:binding=slirp" {
		t.Errorf("stored interfaces %s, want slirpnet with the slirp binding alone", got)
	}
	nics := map[string]machine.NIC{"slirpnet": {MAC: "02:00:00:00:00:01", Slirp: &machine.Slirp{TCPPorts: []int32{80}}}}
	m, err := translate.Machine(&stored, translate.Host{Emulation: true, NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.NICs) != 1 || m.NICs[0].Slirp == nil || m.NICs[0].Tap != "" || m.NICs[0].Model != machine.NICVirtio {
		t.Errorf("machine NICs %+v, want one virtio NIC on slirp", m.NICs)
	}
	o = sample(t, "vmi_testguest.yaml")
	spec = o["spec"].(map[string]any)
	spec["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{map[string]any{"name": "n", "binding": map[string]any{"name": "slirp"}}}
	spec["networks"] = []any{map[string]any{"name": "n", "multus": map[string]any{"networkName": "flat", "default": true}}}
	if _, stderr, err := apply(t, o, "vmi-slirp-refused"); err == nil || !strings.Contains(stderr, "spec.domain.devices.interfaces[0].binding") ||
		!strings.Contains(stderr, "the slirp binding is for the pod network only") {
		t.Errorf("slirp on a multus network: %v: %s; want a refusal naming the binding", err, stderr)
	}
}

// createVMI creates the instance o as name with kubectl and returns it as stored.
func createVMI(t *testing.T, o map[string]any, name string) v1alpha1.VirtualMachineInstance {
	t.Helper()
	o["metadata"].(map[string]any)["name"] = name
	data, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	createByKubectl(t, data, "vmi", name)
	var stored v1alpha1.VirtualMachineInstance
	get(t, "vmi", name, &stored)
	return stored
}

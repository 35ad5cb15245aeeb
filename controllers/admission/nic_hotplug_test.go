package admission_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestWebhookNICHotplugUpdates drives VMI interface updates through the API server and the webhook
// as qvirtctl addinterface/removeinterface will: an added NIC must be a virtio NIC on the pod
// network, into an instance that has no pod NIC yet; a NIC can go once the node agent reported it
// hot-plugged (status.interfaces[].hotplugged).
func TestWebhookNICHotplugUpdates(t *testing.T) {
	startWebhook(t)
	o := sample(t, "vmi_testguest.yaml")
	spec := o["spec"].(map[string]any)
	devices := spec["domain"].(map[string]any)["devices"].(map[string]any)
	delete(devices, "interfaces")
	delete(spec, "networks")
	// Without this, the instance gets an interface on the pod network at creation (KubeVirt's
	// default), and no NIC could be added on it.
	devices["autoattachPodInterface"] = false
	o["metadata"].(map[string]any)["name"] = "nichotplug"
	data, _ := json.Marshal(o)
	kubectl := kubectlDefault
	createByKubectl(t, data, "vmi", "nichotplug")

	// The instance has no interface and no network, so the first NIC creates both lists.
	addNIC := func(iface, network string) string {
		return `[{"op":"add","path":"/spec/domain/devices/interfaces","value":[` + iface + `]},` +
			`{"op":"add","path":"/spec/networks","value":[` + network + `]}]`
	}
	const pod = `{"name":"hot","pod":{}}`
	refused := []struct{ name, patch, field, msg string }{
		{"multus network", addNIC(`{"name":"hot","bridge":{}}`, `{"name":"hot","multus":{"networkName":"lab"}}`),
			"spec.networks[0].multus", "a multus network cannot be hot-plugged"},
		{"e1000e model", addNIC(`{"name":"hot","model":"e1000e"}`, pod),
			"spec.domain.devices.interfaces[0].model", `Unsupported value: "e1000e"`},
		{"two pod NICs at once", `[{"op":"add","path":"/spec/domain/devices/interfaces","value":[{"name":"hot"},{"name":"hot2"}]},` +
			`{"op":"add","path":"/spec/networks","value":[` + pod + `,{"name":"hot2","pod":{}}]}]`,
			"spec.networks[1].pod", "only one network may be the pod network"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vmi", "nichotplug", "--type=json", "-p", tc.patch)
			if err == nil || !strings.Contains(stderr, tc.field) || !strings.Contains(stderr, tc.msg) {
				t.Fatalf("want a refusal naming %s with %q, got %v: %s", tc.field, tc.msg, err, stderr)
			}
		})
	}

	t.Run("a bridge NIC is added with a migration warning, and removed once hot-plugged", func(t *testing.T) {
		_, stderr, err := kubectl(nil, "patch", "vmi", "nichotplug", "--type=json", "-p",
			addNIC(`{"name":"hot","bridge":{},"macAddress":"02:00:00:00:00:07"}`, pod))
		if err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		if !strings.Contains(stderr, "cannot be live-migrated") || !strings.Contains(stderr, `interface "hot"`) {
			t.Errorf("no live-migration warning naming the bridge interface: %s", stderr)
		}
		second := `[{"op":"add","path":"/spec/domain/devices/interfaces/-","value":{"name":"hot2"}},` +
			`{"op":"add","path":"/spec/networks/-","value":{"name":"hot2","pod":{}}}]`
		if _, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vmi", "nichotplug", "--type=json", "-p", second); err == nil ||
			!strings.Contains(stderr, "spec.domain.devices.interfaces[1]") || !strings.Contains(stderr, `interface "hot" already uses the pod network`) {
			t.Fatalf("a second pod NIC: want a refusal, got %v: %s", err, stderr)
		}
		remove := `[{"op":"remove","path":"/spec/domain/devices/interfaces"},{"op":"remove","path":"/spec/networks"}]`
		// Before the node agent reports it hot-plugged, the NIC counts as one the guest booted with.
		if _, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vmi", "nichotplug", "--type=json", "-p", remove); err == nil ||
			!strings.Contains(stderr, "spec.domain.devices.interfaces[hot]") || !strings.Contains(stderr, "status.interfaces[].hotplugged") {
			t.Fatalf("removal without a hotplugged interface status: want a refusal, got %v: %s", err, stderr)
		}
		status := `{"status":{"interfaces":[{"name":"hot","mac":"02:00:00:00:00:07","hotplugged":true}]}}`
		if _, stderr, err := kubectl(nil, "patch", "vmi", "nichotplug", "--subresource=status", "--type=merge", "-p", status); err != nil {
			t.Fatalf("status patch: %v: %s", err, stderr)
		}
		if _, stderr, err := kubectl(nil, "patch", "vmi", "nichotplug", "--type=json", "-p", remove); err != nil {
			t.Fatalf("removing a hot-plugged NIC refused: %v: %s", err, stderr)
		}
	})
}

package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/controllers/admission"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/refused"
)

var cp *envtest.ControlPlane

// TestMain starts the control plane with the webhook configurations installed, and the webhook
// server of a manager, as qvirt-controller runs it.
func TestMain(m *testing.M) {
	envtest.MainWith(m, &cp, envtest.Options{Webhooks: true})
}

var store = config.NewStore(config.Default())

func startWebhook(t *testing.T) {
	t.Helper()
	cp.StartWebhookManager(t, func(mgr ctrl.Manager) error { return admission.Setup(mgr, store) })
	// Wait until the API server reaches the webhook: a dry-run create of a valid VM succeeds.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, stderr, err := apply(t, sample(t, "vm_testguest.yaml"), "webhook-probe"); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("webhook never answered: %s", stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func sample(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(envtest.RepoRoot() + "/config/samples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var o map[string]any
	if err := yaml.Unmarshal(data, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

func apply(t *testing.T, o map[string]any, name string) (string, string, error) {
	t.Helper()
	o["metadata"].(map[string]any)["name"] = name
	data, _ := json.Marshal(o)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cp.KubectlCmd(ctx, data, "create", "--dry-run=server", "-n", "default", "-f", "-")
}

func TestWebhookRefusesWithFieldPaths(t *testing.T) {
	startWebhook(t)
	hostDisk := func(path string) map[string]any {
		return map[string]any{"name": "scratch", "hostDisk": map[string]any{"path": path, "type": "Disk"}}
	}
	cases := []struct {
		name, sample string
		allowed      string
		emulation    bool
		mutate       func(spec map[string]any)
		field, msg   string
	}{
		{"host disk with no allowed paths", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/var/lib/images/disk.img")}
		}, "spec.template.spec.volumes[0].hostDisk.path", "hostDisk volumes are not enabled: no allowedHostPaths"},
		{"host disk in a namespace not enabled", "vm_testguest.yaml", "/var/lib/qvirt", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/var/lib/qvirt/default/disk.img")}
		}, "spec.template.spec.volumes[0].hostDisk.path", `not enabled for namespace "default" (hostDiskNamespaces`},
		{"host disk outside the allowed paths", "vm_testguest.yaml", "/var/lib/qvirt:default", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/etc/shadow")}
		}, "spec.template.spec.volumes[0].hostDisk.path", "inside this namespace's host disk directories (/var/lib/qvirt/default/)"},
		{"host disk in another namespace's directory", "vm_testguest.yaml", "/var/lib/qvirt:default,other", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/var/lib/qvirt/other/disk.img")}
		}, "spec.template.spec.volumes[0].hostDisk.path", "/var/lib/qvirt/other/disk.img is not a clean path inside this namespace's"},
		{"host disk path that is not clean", "vm_testguest.yaml", "/var/lib/qvirt:default", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/var/lib/qvirt/default/./disk.img")}
		}, "spec.template.spec.volumes[0].hostDisk.path", "is not a clean path"},
		{"host disk that is its namespace's directory", "vm_testguest.yaml", "/var/lib/qvirt:default", false, func(s map[string]any) {
			s["volumes"] = []any{hostDisk("/var/lib/qvirt/default")}
		}, "spec.template.spec.volumes[0].hostDisk.path", "is not a clean path inside"},
		{"a dataVolume volume with a name that is not a claim's", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["volumes"] = []any{map[string]any{"name": "scratch", "dataVolume": map[string]any{"name": "Fedora_DV"}}}
		}, "spec.template.spec.volumes[0].dataVolume.name", "lowercase RFC 1123 subdomain"},
		{"empty disk of zero capacity", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["volumes"] = []any{map[string]any{"name": "scratch", "emptyDisk": map[string]any{"capacity": "0"}}}
		}, "spec.template.spec.volumes[0].emptyDisk.capacity", "must be a positive quantity"},
		{"user data that is not base64", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["volumes"] = []any{map[string]any{"name": "scratch", "cloudInitNoCloud": map[string]any{"userDataBase64": "***"}}}
		}, "spec.template.spec.volumes[0].cloudInitNoCloud.userDataBase64", "not valid base64"},
		{"memory limit below guest memory", "vm_testguest.yaml", "", false, func(s map[string]any) {
			d := s["domain"].(map[string]any)
			d["resources"] = map[string]any{"limits": map[string]any{"memory": "64Mi"}}
		}, "spec.template.spec.domain.resources.limits.memory", "must be at least memory.guest"},
		{"masquerade on a multus network", "vmi_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["devices"].(map[string]any)["interfaces"] = []any{map[string]any{"name": "default", "masquerade": map[string]any{}}}
			s["networks"] = []any{map[string]any{"name": "default", "multus": map[string]any{"networkName": "net1"}}}
		}, "spec.domain.devices.interfaces[0].masquerade", "needs the pod network"},
		{"synic with vpindex disabled", "vmi_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["features"] = map[string]any{"hyperv": map[string]any{
				"synic": map[string]any{}, "vpindex": map[string]any{"enabled": false}}}
		}, "spec.domain.features.hyperv.synic", "requires 'spec.domain.features.hyperv.vpindex', which was disabled"},
		{"synthetic timers without the Hyper-V clock", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["features"] = map[string]any{"hyperv": map[string]any{"synictimer": map[string]any{}}}
		}, "spec.template.spec.domain.clock.timer.hyperv", "hv-time"},
		{"an unknown time zone", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["clock"] = map[string]any{"timezone": "Mars/Olympus_Mons"}
		}, "spec.template.spec.domain.clock.timezone", "tz database"},
		{"memory beyond 1Ei", "vmi_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["memory"] = map[string]any{"guest": "2Ei"}
		}, "spec.domain.memory.guest", "must be at most 1Ei"},
		{"user data over 2048 characters (the schema)", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["volumes"] = []any{map[string]any{"name": "scratch", "cloudInitNoCloud": map[string]any{"userData": strings.Repeat("x", 2049)}}}
		}, "spec.template.spec.volumes[0].cloudInitNoCloud.userData", "2048"},
		{"user data over 2048 bytes (the webhook)", "vm_testguest.yaml", "", false, func(s map[string]any) {
			// 1025 two-byte characters pass the schema's character count.
			s["volumes"] = []any{map[string]any{"name": "scratch", "cloudInitConfigDrive": map[string]any{"userData": strings.Repeat("é", 1025)}}}
		}, "spec.template.spec.volumes[0].cloudInitConfigDrive.userData", "2050 bytes is over the limit of 2048 bytes: put larger data in a Secret (secretRef)"},
		{"the host CPU model under emulation", "vm_testguest.yaml", "", true, func(s map[string]any) {
			s["domain"].(map[string]any)["cpu"] = map[string]any{"model": "host-passthrough"}
		}, "spec.template.spec.domain.cpu.model", "needs KVM, and this cluster runs guests under emulation"},
		{"host-model under emulation", "vmi_testguest.yaml", "", true, func(s map[string]any) {
			s["domain"].(map[string]any)["cpu"] = map[string]any{"model": "host-model"}
		}, "spec.domain.cpu.model", "host-model needs KVM, and this cluster runs guests under emulation"},
		{"efi secure boot without smm", "vmi_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["firmware"].(map[string]any)["bootloader"] = map[string]any{"efi": map[string]any{}}
		}, "spec.domain.features.smm", "EFI secure boot"},
		{"bios and efi", "vm_testguest.yaml", "", false, func(s map[string]any) {
			s["domain"].(map[string]any)["firmware"].(map[string]any)["bootloader"] = map[string]any{"bios": map[string]any{}, "efi": map[string]any{"secureBoot": false}}
		}, "spec.template.spec.domain.firmware.bootloader", "mutually exclusive"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			if tc.allowed != "" {
				dir, nss, _ := strings.Cut(tc.allowed, ":")
				cfg.AllowedHostPaths = []string{dir}
				if nss != "" {
					cfg.HostDiskNamespaces = strings.Split(nss, ",")
				}
			}
			cfg.UseEmulation = tc.emulation
			store.Set(cfg)
			t.Cleanup(func() { store.Set(config.Default()) })
			o := sample(t, tc.sample)
			spec := o["spec"].(map[string]any)
			if tmpl, ok := spec["template"]; ok {
				spec = tmpl.(map[string]any)["spec"].(map[string]any)
			}
			tc.mutate(spec)
			_, stderr, err := apply(t, o, fmt.Sprintf("case-%d", i))
			if err == nil {
				t.Fatal("accepted")
			}
			// The messages are the webhook's own (the CRD schema has no such rules).
			if !strings.Contains(stderr, tc.field) || !strings.Contains(stderr, tc.msg) {
				t.Fatalf("want the webhook to refuse %s with %q, got:\n%s", tc.field, tc.msg, stderr)
			}
		})
	}
	t.Run("a host disk in its namespace's directory is accepted", func(t *testing.T) {
		cfg := config.Default()
		cfg.AllowedHostPaths, cfg.HostDiskNamespaces = []string{"/var/lib/qvirt"}, []string{"default"}
		store.Set(cfg)
		t.Cleanup(func() { store.Set(config.Default()) })
		o := sample(t, "vm_testguest.yaml")
		o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"] = []any{hostDisk("/var/lib/qvirt/default/images/disk.img")}
		if _, stderr, err := apply(t, o, "allowed"); err != nil {
			t.Fatalf("refused: %s", stderr)
		}
	})
}

// TestWebhookHotplugUpdates drives VMI spec updates through the API server and the webhook as
// qvirtctl addvolume/removevolume will: added disks must be virtio disks on hostDisk (under the
// allowed paths) or emptyDisk volumes; disks the guest booted with cannot go; hot-plugged ones can.
func TestWebhookHotplugUpdates(t *testing.T) {
	startWebhook(t)
	cfg := config.Default()
	cfg.AllowedHostPaths, cfg.HostDiskNamespaces = []string{"/var/lib/qvirt"}, []string{"default"}
	store.Set(cfg)
	t.Cleanup(func() { store.Set(config.Default()) })

	o := sample(t, "vmi_testguest.yaml")
	spec := o["spec"].(map[string]any)
	spec["domain"].(map[string]any)["devices"].(map[string]any)["disks"] = []any{
		map[string]any{"name": "boot", "disk": map[string]any{"bus": "virtio"}}}
	spec["volumes"] = []any{map[string]any{"name": "boot", "emptyDisk": map[string]any{"capacity": "16Mi"}}}
	o["metadata"].(map[string]any)["name"] = "hotplug"
	data, _ := json.Marshal(o)
	kubectl := kubectlDefault
	createByKubectl(t, data, "vmi", "hotplug")

	addDisk := func(disk, volume string) string {
		return `[{"op":"add","path":"/spec/domain/devices/disks/-","value":` + disk + `},` +
			`{"op":"add","path":"/spec/volumes/-","value":` + volume + `}]`
	}
	const virtio = `{"name":"data","disk":{"bus":"virtio"}}`
	refused := []struct{ name, patch, field, msg string }{
		{"host disk outside the allowed paths", addDisk(virtio, `{"name":"data","hostDisk":{"path":"/etc/shadow","type":"Disk"}}`),
			"spec.volumes[1].hostDisk.path", "not a clean path inside this namespace's host disk directories"},
		{"cdrom", addDisk(`{"name":"data","cdrom":{"bus":"sata"}}`, `{"name":"data","emptyDisk":{"capacity":"1Mi"}}`),
			"spec.domain.devices.disks[1].cdrom", "only hard disks can be hot-plugged"},
		{"sata disk", addDisk(`{"name":"data","disk":{"bus":"sata"}}`, `{"name":"data","emptyDisk":{"capacity":"1Mi"}}`),
			"spec.domain.devices.disks[1].disk.bus", `Unsupported value: "sata"`},
		{"container disk", addDisk(virtio, `{"name":"data","containerDisk":{"image":"x:1"}}`),
			"spec.volumes[1].containerDisk", "only hostDisk and emptyDisk volumes"},
		{"boot disk changed", `[{"op":"add","path":"/spec/domain/devices/disks/0/serial","value":"X1"}]`,
			"spec.domain.devices.disks[0].serial", `disk "boot" is attached`},
		{"boot disk removed", `[{"op":"remove","path":"/spec/domain/devices/disks/0"},{"op":"remove","path":"/spec/volumes/0"}]`,
			"spec.domain.devices.disks[boot]", "was attached at start and cannot be removed"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vmi", "hotplug", "--type=json", "-p", tc.patch)
			if err == nil || !strings.Contains(stderr, tc.field) || !strings.Contains(stderr, tc.msg) {
				t.Fatalf("want a refusal naming %s with %q, got %v: %s", tc.field, tc.msg, err, stderr)
			}
		})
	}

	t.Run("a host disk under an allowed path is added, and removed once hot-plugged", func(t *testing.T) {
		patch := addDisk(virtio, `{"name":"data","hostDisk":{"path":"/var/lib/qvirt/default/data.img","type":"Disk"}}`)
		if _, stderr, err := kubectl(nil, "patch", "vmi", "hotplug", "--type=json", "-p", patch); err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		remove := `[{"op":"remove","path":"/spec/domain/devices/disks/1"},{"op":"remove","path":"/spec/volumes/1"}]`
		// Before the node agent reports it hot-plugged, the disk counts as one the guest booted with.
		if _, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vmi", "hotplug", "--type=json", "-p", remove); err == nil ||
			!strings.Contains(stderr, "spec.domain.devices.disks[data]") {
			t.Fatalf("removal without a hotplugged volume status: want a refusal, got %v: %s", err, stderr)
		}
		status := `{"status":{"volumeStatus":[{"name":"boot","phase":"Ready"},{"name":"data","phase":"Ready","hotplugged":true}]}}`
		if _, stderr, err := kubectl(nil, "patch", "vmi", "hotplug", "--subresource=status", "--type=merge", "-p", status); err != nil {
			t.Fatalf("status patch: %v: %s", err, stderr)
		}
		if _, stderr, err := kubectl(nil, "patch", "vmi", "hotplug", "--type=json", "-p", remove); err != nil {
			t.Fatalf("removing a hot-plugged disk refused: %v: %s", err, stderr)
		}
	})

	t.Run("metadata updates pass even when the allowed paths shrank", func(t *testing.T) {
		if _, stderr, err := kubectl(nil, "label", "vmi", "hotplug", "team=a"); err != nil {
			t.Fatalf("label refused: %v: %s", err, stderr)
		}
	})
}

// TestWebhookRefusesWhatCannotRun sends every manifest of test/refused through kube-apiserver to the
// webhook: each is refused naming every field its "# refused at:" lines give.
func TestWebhookRefusesWhatCannotRun(t *testing.T) {
	startWebhook(t)
	manifests, err := refused.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range manifests {
		t.Run(filepath.Base(m.File), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, stderr, err := cp.KubectlCmd(ctx, m.Data, "create", "--dry-run=server", "-n", "default", "-f", "-")
			if err == nil {
				t.Fatal("accepted")
			}
			for _, f := range m.Fields {
				if !strings.Contains(stderr, f+":") {
					t.Errorf("the refusal does not name %s:\n%s", f, stderr)
				}
			}
		})
	}
}

// TestWebhookRatchetsUpdates: a VirtualMachine admitted under another configuration (the host CPU
// model, before the cluster turned to emulation) can still be changed in what does not add a
// problem (labels, its run strategy, its template's other fields), but not given a new problem.
func TestWebhookRatchetsUpdates(t *testing.T) {
	startWebhook(t)
	store.Set(config.Default())
	t.Cleanup(func() { store.Set(config.Default()) })
	o := sample(t, "vm_testguest.yaml")
	o["metadata"].(map[string]any)["name"] = "ratchet"
	spec := o["spec"].(map[string]any)
	spec["runStrategy"] = "Halted"
	spec["template"].(map[string]any)["spec"].(map[string]any)["domain"].(map[string]any)["cpu"] = map[string]any{"model": "host-passthrough"}
	data, _ := json.Marshal(o)
	kubectl := kubectlDefault
	createByKubectl(t, data, "vm", "ratchet")

	cfg := config.Default()
	cfg.UseEmulation = true
	store.Set(cfg)
	for _, args := range [][]string{
		{"label", "vm", "ratchet", "team=a"},
		{"patch", "vm", "ratchet", "--type=merge", "-p", `{"spec":{"runStrategy":"Manual"}}`},
		{"patch", "vm", "ratchet", "--type=merge", "-p", `{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":60}}}}`},
	} {
		if _, stderr, err := kubectl(nil, args...); err != nil {
			t.Errorf("%v refused: %v: %s", args, err, stderr)
		}
	}
	patch := `{"spec":{"template":{"spec":{"domain":{"clock":{"timezone":"Mars/Olympus_Mons"}}}}}}`
	_, stderr, err := kubectl(nil, "patch", "--dry-run=server", "vm", "ratchet", "--type=merge", "-p", patch)
	if err == nil || !strings.Contains(stderr, "spec.template.spec.domain.clock.timezone") || strings.Contains(stderr, "cpu.model") {
		t.Fatalf("want a refusal naming only the added clock.timezone, got %v: %s", err, stderr)
	}
}

// kubectlDefault runs kubectl against the test's API server in namespace default, for at most 30 s.
func kubectlDefault(stdin []byte, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cp.KubectlCmd(ctx, stdin, append([]string{"-n", "default"}, args...)...)
}

// createByKubectl creates the object in data with kubectl, as a user would, and deletes kind/name
// when the test ends.
func createByKubectl(t *testing.T, data []byte, kind, name string) {
	t.Helper()
	if _, stderr, err := kubectlDefault(data, "create", "-f", "-"); err != nil {
		t.Fatalf("create: %v: %s", err, stderr)
	}
	t.Cleanup(func() { _, _, _ = kubectlDefault(nil, "delete", kind, name, "--wait=false") })
}

// Package samples checks that everything qvirt ships as an example starts: each manifest under
// config/samples and the test guest's VMI passes the webhook's validators, translates to a machine
// description and builds a QEMU command line with the launcher's builder. What this version refuses lives in test/refused instead.
package samples

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/admission"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// startable are the VM and VMI manifests of the repository that users run.
func startable(t *testing.T) []string {
	root := filepath.Join("..", "..") // go test runs in the package's directory
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	return append(files, filepath.Join(root, "test", "guest", "vmi.yaml"))
}

func TestSamplesStart(t *testing.T) {
	store := config.NewStore(config.Default())
	seen := 0
	for _, f := range startable(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(data, &meta); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if meta.Kind != "VirtualMachine" && meta.Kind != "VirtualMachineInstance" {
			continue // kustomization, migrations
		}
		seen++
		t.Run(filepath.Base(f), func(t *testing.T) {
			ctx := context.Background()
			if meta.Kind == "VirtualMachine" {
				var vm v1alpha1.VirtualMachine
				mustDecode(t, data, &vm)
				if err := (admission.VMDefaulter{}).Default(ctx, &vm); err != nil {
					t.Fatal(err)
				}
				if _, err := (&admission.VMValidator{Config: store}).ValidateCreate(ctx, &vm); err != nil {
					t.Fatalf("the webhook refuses it: %v", err)
				}
			} else {
				var vmi v1alpha1.VirtualMachineInstance
				mustDecode(t, data, &vmi)
				if err := (admission.VMIDefaulter{}).Default(ctx, &vmi); err != nil {
					t.Fatal(err)
				}
				if _, err := (&admission.VMIValidator{Config: store}).ValidateCreate(ctx, &vmi); err != nil {
					t.Fatalf("the webhook refuses it: %v", err)
				}
			}
			// Run mode's reading of it (qvirtctl machine), then the node agent's translation and the
			// launcher's argv builder.
			vmi, err := translate.LoadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := launcher.BuildArgv(resolved(t, vmi))
			if err != nil {
				t.Fatalf("admitted but the launcher cannot build its QEMU command line: %v", err)
			}
			if len(argv) == 0 {
				t.Fatal("empty argv")
			}
		})
	}
	if seen < 3 {
		t.Fatalf("only %d VM and VMI manifests found", seen)
	}
}

// resolved is vmi's machine as the node agent describes it on a node under emulation, with every
// image, kernel and tap resolved to a plausible absolute path or name as the launcher would.
func resolved(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *launcher.Machine {
	t.Helper()
	nics := map[string]machine.NIC{}
	for i, in := range vmi.Spec.Domain.Devices.Interfaces {
		nics[in.Name] = machine.NIC{Tap: fmt.Sprintf("tap%d", i), MAC: fmt.Sprintf("02:00:00:00:01:%02x", i)}
	}
	m, err := translate.Machine(vmi, translate.Host{Emulation: true, NICs: nics})
	if err != nil {
		t.Fatalf("admitted but the node agent cannot describe its machine: %v", err)
	}
	lm := &launcher.Machine{Machine: *m, RunDir: "/var/run/qvirt/sockets/" + string(vmi.UID)[:8], Images: map[string]launcher.DiskImage{}}
	if m.Kernel != nil {
		lm.KernelFile, lm.InitrdFile = "/var/lib/qvirt/images/kernel/vmlinuz", "/var/lib/qvirt/images/kernel/initrd.img"
	}
	for _, d := range m.Disks {
		lm.Images[d.Name] = launcher.DiskImage{Path: "/var/lib/qvirt/images/" + d.Name + ".raw", Format: "raw"}
	}
	return lm
}

func mustDecode(t *testing.T, data []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatal(err)
	}
}

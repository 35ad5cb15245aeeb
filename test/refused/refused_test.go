package refused_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/admission"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/refused"
)

// TestRefusedAtAdmission runs the webhooks' own defaulters and validators (as qvirt-controller runs
// them, with the default configuration) on every manifest here: each must be refused at exactly the fields its
// "# refused at:" lines name, and run mode (`qvirtctl machine`) must refuse it too.
func TestRefusedAtAdmission(t *testing.T) {
	manifests, err := refused.Load()
	if err != nil {
		t.Fatal(err)
	}
	// What this version refuses whatever the cluster enables: virtiofs is on, so that a
	// filesystem is refused for what it is, not for the cluster's switch.
	cfg := config.Default()
	cfg.EnableVirtiofs = true
	store := config.NewStore(cfg)
	for _, m := range manifests {
		t.Run(filepath.Base(m.File), func(t *testing.T) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(m.Data, &meta); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			switch meta.Kind {
			case "VirtualMachine":
				var vm v1alpha1.VirtualMachine
				if err := yaml.UnmarshalStrict(m.Data, &vm); err != nil {
					t.Fatal(err)
				}
				// As kube-apiserver calls them: the mutating webhook, then the validating one.
				if err := (admission.VMDefaulter{}).Default(ctx, &vm); err != nil {
					t.Fatal(err)
				}
				_, err = (&admission.VMValidator{Config: store}).ValidateCreate(ctx, &vm)
			case "VirtualMachineInstance":
				var vmi v1alpha1.VirtualMachineInstance
				if err := yaml.UnmarshalStrict(m.Data, &vmi); err != nil {
					t.Fatal(err)
				}
				if err := (admission.VMIDefaulter{}).Default(ctx, &vmi); err != nil {
					t.Fatal(err)
				}
				_, err = (&admission.VMIValidator{Config: store}).ValidateCreate(ctx, &vmi)
			default:
				t.Fatalf("kind %q: want VirtualMachine or VirtualMachineInstance", meta.Kind)
			}
			var status *apierrors.StatusError
			if !errors.As(err, &status) || status.ErrStatus.Details == nil {
				t.Fatalf("want an Invalid status from the webhook, got %v", err)
			}
			var got []string
			for _, c := range status.ErrStatus.Details.Causes {
				got = append(got, c.Field)
			}
			if !slices.Equal(sorted(got), sorted(m.Fields)) {
				t.Errorf("refused at %q, the manifest says %q:\n%v", got, m.Fields, err)
			}

			_, err = translate.LoadFile(m.File)
			if err == nil {
				t.Fatal("qvirtctl machine accepts it")
			}
			// Run mode reads the template of a VirtualMachine as the instance's spec.
			for _, f := range m.Fields {
				if f = strings.Replace(f, "spec.template.spec.", "spec.", 1); !strings.Contains(err.Error(), f) {
					t.Errorf("qvirtctl machine does not name %s: %v", f, err)
				}
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

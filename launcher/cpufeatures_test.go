package launcher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestCPUFeatures boots the test guest under emulation with KubeVirt's cpu.features on
// QEMU's qemu64 model: a required feature the model lacks (aes) and an optional one (abm) show in
// the guest's /proc/cpuinfo, a disabled one the model has (svm) does not; a required
// feature the host cannot give (vmx, which TCG does not emulate) and a forbidden one it has (sse2)
// fail the start, naming the feature's policy.
func TestGuestCPUFeatures(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.CPU = &v1alpha1.CPU{Model: "qemu64", Features: []v1alpha1.CPUFeature{
		{Name: "aes"}, {Name: "abm", Policy: v1alpha1.CPUFeatureOptional}, {Name: "svm", Policy: v1alpha1.CPUFeatureDisable}}}
	_, c := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	ctx := context.Background()
	from := len(c.Text())
	c.Send(t, `f=$(grep -m1 '^flags' /proc/cpuinfo); for x in aes abm svm; do case " $f " in *" $x "*) echo "CPUF-$x-on";; *) echo "CPUF-$x-off";; esac; done; echo CPUF-DONE-$((1+1))`)
	c.Expect(t, from, "CPUF-DONE-2", time.Minute)
	out := c.Text()[from:]
	for _, want := range []string{"CPUF-aes-on", "CPUF-abm-on", "CPUF-svm-off"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest's flags: want %s in %q", want, out)
		}
	}

	for _, tc := range []struct {
		feature v1alpha1.CPUFeature
		want    string
	}{
		{v1alpha1.CPUFeature{Name: "vmx"}, "cannot give the guest CPU feature vmx"},
		{v1alpha1.CPUFeature{Name: "sse2", Policy: v1alpha1.CPUFeatureForbid}, "the host has CPU feature sse2"},
	} {
		t.Run(tc.feature.Name, func(t *testing.T) {
			vmi := guestVMI(t)
			vmi.Spec.Domain.CPU = &v1alpha1.CPU{Model: "qemu64", Features: []v1alpha1.CPUFeature{tc.feature}}
			v := newLauncher(t)
			_, err := v.client.Sync(ctx, testutil.SyncRequest(t, vmi, nil))
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Msg, tc.want) || apiErr.Field != "machine.cpu.features[0].policy" {
				t.Fatalf("sync: %v (field %q), want a refusal at machine.cpu.features[0].policy saying %q", err, fieldOf(apiErr), tc.want)
			}
			if st, err := v.client.Status(ctx); err != nil || (st.Exit == nil && st.PID != 0) {
				t.Errorf("after the refusal: %+v, %v; want no QEMU running", st, err)
			}
		})
	}
}

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestCloudInitFromSecret: a VM whose cloudInitNoCloud user data comes from a Secret that does not
// exist yet says so on the VMI and the VM (Synchronized=False, SecretNotFound, naming the field
// and the Secret) instead of starting; once `kubectl create secret` makes it, the guest boots and
// reads the Secret's user data from the cidata cdrom. The whole way: the controller's Secret
// volume, the virtual node's Secret volume, the launcher's ISO image in its pod.
func TestCloudInitFromSecret(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name, secret = "ci", "ci-user"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "cidata", CDRom: &v1alpha1.CDRomTarget{}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "cidata", VolumeSource: v1alpha1.VolumeSource{
		CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: secret}}}})
	applyVM(t, vm)

	const field = `spec.volumes[0].cloudInitNoCloud.secretRef: Secret "ci-user" not found`
	secretNotFound := func(conds []metav1.Condition) bool {
		c := meta.FindStatusCondition(conds, v1alpha1.VirtualMachineInstanceSynchronized)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "SecretNotFound" && strings.Contains(c.Message, field)
	}
	waitVMI(t, ns, name, time.Minute, "Synchronized=False SecretNotFound", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && secretNotFound(v.Status.Conditions)
	})
	testutil.Eventually(t, time.Minute, "the VM showing the missing Secret", func() bool {
		var got v1alpha1.VirtualMachine
		return cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &got) == nil && secretNotFound(got.Status.Conditions)
	})

	run(t, nil, kubectl, "create", "secret", "generic", secret, "-n", ns,
		"--from-literal=userdata=#cloud-config\n# QVIRT-E2E-USERDATA-FROM-SECRET\n")
	vmi := waitVMI(t, ns, name, bootTimeout, "Running once the Secret exists", running(""))
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized); c != nil && c.Reason == "SecretNotFound" {
		t.Errorf("still %+v", c)
	}
	con := console(t, vmi)
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	con.Run(t, "mkdir -p /mnt/ci && mount -t iso9660 -o ro /dev/sr0 /mnt/ci && cat /mnt/ci/user-data", "# QVIRT-E2E-USERDATA-FROM-SECRET", time.Minute)
	con.Run(t, "cat /mnt/ci/meta-data; echo", `"local-hostname":"ci"`, time.Minute)
}

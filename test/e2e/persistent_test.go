package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestPersistentTPM: a VM with KubeVirt's `tpm: {persistent: true}` gets its backend-storage
// claim (persistent-state-for-<vm>, bound by the cluster's default StorageClass, controlled by the
// VM), and after a restart of the VM its guest finds the same TPM powered on again (its
// resetCount went up), not a new one. On local mode's ReadWriteMany claim it live-migrates first,
// with `qvirtctl migrate`: the guest finds the same TPM on the other node, not powered on again,
// and the restart after it starts from the state the other node kept. Deleting the VM deletes
// the claim.
func TestPersistentTPM(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "tpm"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyManual)
	vm.Spec.Template.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
	applyVM(t, vm)
	request(t, ns, name, startReq)
	first := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	c := console(t, first)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	before := testutil.TPMResetCount(t, c)

	pvc := &corev1.PersistentVolumeClaim{}
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "persistent-state-for-" + name}, pvc); err != nil {
		t.Fatalf("the VM's backend-storage claim: %v", err)
	}
	if owner := metav1.GetControllerOf(pvc); pvc.Status.Phase != corev1.ClaimBound || owner == nil || owner.Kind != "VirtualMachine" || owner.Name != name {
		t.Errorf("claim %s: phase %s, controller %+v; want Bound, controlled by VirtualMachine %s", pvc.Name, pvc.Status.Phase, owner, name)
	}
	moved := qvirtctlMigrate(t, first) // local mode's claims are ReadWriteMany
	if got := testutil.TPMResetCount(t, console(t, moved)); got != before {
		t.Errorf("the TPM's resetCount is %s on the other node, %s before: want the same TPM, not powered on again", got, before)
	}

	request(t, ns, name, stopReq(first.UID), startReq)
	second := waitVMI(t, ns, name, bootTimeout, "Running after the restart", running(first.UID))
	c = console(t, second)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	if after := testutil.TPMResetCount(t, c); after <= before {
		t.Errorf("the TPM's resetCount is %s after the restart, %s before: want it higher (the same TPM)", after, before)
	} else {
		t.Logf("TPM resetCount %s, then %s after the restart", before, after)
	}

	run(t, nil, kubectl, "delete", "vm", name, "-n", ns, "--wait=false")
	testutil.Eventually(t, 3*time.Minute, "the backend-storage claim to go with the VM", func() bool {
		err := cl.Get(context.Background(), client.ObjectKeyFromObject(pvc), &corev1.PersistentVolumeClaim{})
		return apierrors.IsNotFound(err)
	})
}

// TestPersistentEFIMigrates: a VM with `efi: {persistent: true}` on local mode's shared
// (ReadWriteMany) backend-storage claim is LiveMigratable and migrates with `qvirtctl migrate`:
// the guest reads on the other node the EFI variable it wrote before, a variable it writes there
// lands in the VM's store on the claim, and after a restart of the VM the guest reads both.
func TestPersistentEFIMigrates(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "efimig"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyManual)
	vm.Spec.Template.Spec.Domain.Firmware.Bootloader = &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}
	applyVM(t, vm)
	request(t, ns, name, startReq)
	vmi := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	c := console(t, vmi)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	testutil.MountEFIVars(t, c)
	testutil.WriteEFIVar(t, c, "QvirtBefore", "QVIRT-BEFORE")
	moved := qvirtctlMigrate(t, vmi)
	dc := console(t, moved)
	testutil.ExpectEFIVar(t, dc, "QvirtBefore", "QVIRT-BEFORE")
	testutil.WriteEFIVar(t, dc, "QvirtAfter", "QVIRT-AFTER")

	request(t, ns, name, stopReq(vmi.UID), startReq)
	again := waitVMI(t, ns, name, bootTimeout, "Running after the restart", running(vmi.UID))
	ac := console(t, again)
	ac.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	testutil.MountEFIVars(t, ac)
	testutil.ExpectEFIVar(t, ac, "QvirtBefore", "QVIRT-BEFORE")
	testutil.ExpectEFIVar(t, ac, "QvirtAfter", "QVIRT-AFTER")
}

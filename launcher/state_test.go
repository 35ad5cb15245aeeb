package launcher_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestPersistentStateAcrossInstances: a VM whose TPM and EFI variables persist (KubeVirt's
// tpm.persistent and efi.persistent) keeps them in its state directory (the backend-storage
// claim, in a pod): an EFI variable the guest wrote is there in the next instance, and the next
// instance's TPM is the same TPM powered on again (its resetCount went up), not a new one.
func TestPersistentStateAcrossInstances(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vmi := efiVMI(t, false)
	vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
	start := func() (*vm, *console) {
		t.Helper()
		v, c := bootRequest(t, onState(t, vmi, machine.State{Dir: dir, EFIVars: true, TPM: true}))
		testutil.MountEFIVars(t, c)
		return v, c
	}

	first, c := start()
	testutil.WriteEFIVar(t, c, testVar, testVarData)
	before := testutil.TPMResetCount(t, c)
	if _, err := first.client.Shutdown(context.Background(), nil); err != nil {
		t.Fatalf("shut the first instance down: %v", err)
	}
	for _, f := range []string{machine.EFIVarsFile, machine.TPMStateDir} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the state directory has no %s after the first instance: %v", f, err)
		}
	}

	_, c = start()
	testutil.ExpectEFIVar(t, c, testVar, testVarData)
	if after := testutil.TPMResetCount(t, c); after <= before {
		t.Errorf("the TPM's resetCount is %s after a new start, %s before: want it higher (the same TPM powered on again)", after, before)
	} else {
		t.Logf("TPM resetCount %s, then %s", before, after)
	}
}

// TestPersistentEFIFollowsSecureBoot: turning Secure Boot on for a VM whose EFI variables persist
// gives it a variable store with Secure Boot's keys, made afresh from the Secure Boot template:
// the guest sees Secure Boot on and enforced, not the setup mode (no keys, anything boots) of the
// store its earlier instance made without Secure Boot, which is the same size and so looks usable.
func TestPersistentEFIFollowsSecureBoot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, secureBoot := range []bool{false, true} {
		v, c := bootRequest(t, onState(t, efiVMI(t, secureBoot), machine.State{Dir: dir, EFIVars: true}))
		testutil.MountEFIVars(t, c)
		if secureBoot {
			c.Run(t, secureBootStateCmd, "SB-1-SM-0", time.Minute)
		}
		if _, err := v.client.Shutdown(context.Background(), nil); err != nil {
			t.Fatalf("shut the instance down (secureBoot %v): %v", secureBoot, err)
		}
	}
}

// TestPersistentEFIMigrates: a VM whose EFI variables persist migrates with its store on the
// shared (ReadWriteMany) backend-storage claim, which source and target both mount: the target's
// QEMU opens the store the source still holds (inactive until it takes the guest over), the guest
// reads the variable it wrote before the migration, a variable it writes on the target is in the
// store, and the next instance, started on the store after the target, reads both.
func TestPersistentEFIMigrates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vmi := efiVMI(t, false)
	vmi.Spec.Domain.Devices.Disks, vmi.Spec.Volumes = nil, nil // no local disk to copy
	request := func() *protocol.SyncRequest { return onState(t, vmi, machine.State{Dir: dir, EFIVars: true}) }
	ctx := context.Background()
	src, c := bootRequest(t, request())
	testutil.MountEFIVars(t, c)
	testutil.WriteEFIVar(t, c, testVar, testVarData)

	dst := incomingTarget(t, src, request()) // on the shared state directory
	dc := attach(t, dst.runDir)
	liveMigrate(t, src, dst)
	testutil.ExpectEFIVar(t, dc, testVar, testVarData)
	testutil.WriteEFIVar(t, dc, migratedVar, migratedVarData)
	if _, err := dst.client.Shutdown(ctx, nil); err != nil {
		t.Fatalf("shut the target down: %v", err)
	}

	_, nc := bootRequest(t, request()) // the next instance
	testutil.MountEFIVars(t, nc)
	testutil.ExpectEFIVar(t, nc, testVar, testVarData)
	testutil.ExpectEFIVar(t, nc, migratedVar, migratedVarData)
}

// A variable the guest writes after its migration.
const (
	migratedVar     = "QvirtMigrated"
	migratedVarData = "QVIRT-ON-TARGET"
)

// TestPersistentTPMMigrates: a VM whose TPM persists migrates with its state directory shared by
// source and target (the ReadWriteMany backend-storage claim). The target's swtpm cannot open the
// source's state (swtpm 0.7 locks it), so it starts on a state of its own that QEMU fills from the
// migration stream, and that state becomes the VM's when the target takes the guest over: the
// guest finds on the target the TPM it had (its resetCount did not move), a reset there powers
// the TPM on again (resetCount 2, written to the target's state), and the next instance, started
// on the state directory after the target, counts a third power-on, not a second. Nothing of the
// source's state is left in the directory.
func TestPersistentTPMMigrates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks, vmi.Spec.Volumes = nil, nil // no local disk to copy
	vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
	request := func() *protocol.SyncRequest { return onState(t, vmi, machine.State{Dir: dir, TPM: true}) }
	ctx := context.Background()
	src, c := bootRequest(t, request())
	if got := testutil.TPMResetCount(t, c); got != "00000001" {
		t.Fatalf("resetCount %s on the source's first start, want 00000001", got)
	}

	dst := incomingTarget(t, src, request()) // on the shared state directory
	dc := attach(t, dst.runDir)
	liveMigrate(t, src, dst)
	if got := testutil.TPMResetCount(t, dc); got != "00000001" {
		t.Errorf("resetCount %s on the target, want 00000001 (the source's TPM, not powered on again)", got)
	}
	from := len(dc.Text())
	if err := dst.client.Reset(ctx); err != nil {
		t.Fatalf("reset the guest on the target: %v", err)
	}
	dc.Expect(t, from, "QVIRT-GUEST-READY", bootTimeout)
	if got := testutil.TPMResetCount(t, dc); got != "00000002" {
		t.Errorf("resetCount %s after a reset on the target, want 00000002", got)
	}
	if _, err := dst.client.Shutdown(ctx, nil); err != nil {
		t.Fatalf("shut the target down: %v", err)
	}

	_, nc := bootRequest(t, request()) // the next instance
	if got := testutil.TPMResetCount(t, nc); got != "00000003" {
		t.Errorf("resetCount %s in the next instance, want 00000003 (the target's TPM state, powered on a third time)", got)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, e := range entries {
		if e.IsDir() {
			states = append(states, e.Name())
		}
	}
	if len(states) != 1 {
		t.Errorf("the state directory holds TPM states %v; want only the current one", states)
	}
}

// onState is the sync request of vmi with its persistent state kept as st says.
func onState(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, st machine.State) *protocol.SyncRequest {
	t.Helper()
	req := testutil.SyncRequest(t, vmi, nil)
	req.Machine.State = &st
	return req
}
